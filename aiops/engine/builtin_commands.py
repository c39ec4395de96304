"""The engine's own `!commands`: help, model, session, reset, stop."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from aiops.engine.commands import Command, CommandContext, CommandError

if TYPE_CHECKING:
    from aiops.engine.engine import Engine


def ago(ts: float) -> str:
    s = max(0, int(time.time() - ts))
    if s < 60:
        return f"{s}s ago"
    if s < 3600:
        return f"{s // 60}m ago"
    if s < 86400:
        return f"{s // 3600}h ago"
    return f"{s // 86400}d ago"


async def _help(ctx: CommandContext, argv: list[str], raw: str) -> str:
    return ctx.engine.commands.help_text(ctx.is_operator)


async def _model(ctx: CommandContext, argv: list[str], raw: str) -> str:
    engine = ctx.engine
    live = await engine.session(ctx.session_id)
    current = live.model_key(engine) if live else engine.config.models.default_model
    if not argv:
        lines = ["Models (* = this session, d = default):"]
        for key, m in engine.config.models.models.items():
            mark = ("*" if key == current else " ") + ("d" if key == engine.config.models.default_model else " ")
            state = "" if m.enabled else "  [disabled]"
            lines.append(f" {mark} {key:<14} {m.type:<7} {m.model_id:<28} {m.description}{state}")
        return "\n".join(lines)
    key = argv[0].lstrip("@")
    try:
        await engine.set_session_model(ctx.session_id, key)
    except Exception as e:  # noqa: BLE001
        raise CommandError(str(e)) from None
    return f"this session now uses {key}"


async def _session(ctx: CommandContext, argv: list[str], raw: str) -> str:
    engine = ctx.engine
    if not argv:
        rows = await engine.list_sessions()
        if not rows:
            return "no sessions"
        lines = [f"{'id':>5}  {'kind':<8} {'model':<12} {'msgs':>5}  {'last':<9} title"]
        for r in rows:
            mark = "*" if r["client_id"] == ctx.session_id else " "
            lines.append(f"{mark}{r['short_id']:>4}  {r['kind']:<8} {r['model'] or '':<12} "
                         f"{r['message_count']:>5}  {ago(r['updated_at']):<9} {r['title']}")
        return "\n".join(lines)
    if len(argv) == 2 and argv[1] == "delete":
        if not ctx.is_operator and argv[0] not in (ctx.session_id,):
            live = await engine.session(argv[0])
            if live is None or live.id != ctx.session_id:
                return "not permitted: only an operator may delete another session"
        live = await engine.session(argv[0])
        if live is None:
            raise CommandError(f"no session {argv[0]!r}")
        label = f"{live.row.short_id} ({live.id})"
        await engine.delete_session(live.id)
        return f"deleted session {label}"
    raise CommandError("expected no argument, or ID delete")


async def _reset(ctx: CommandContext, argv: list[str], raw: str) -> str:
    await ctx.engine.reset_session(ctx.session_id)
    return "session reset: the model starts afresh (the old history stays archived)"


async def _stop(ctx: CommandContext, argv: list[str], raw: str) -> str:
    target = argv[0] if argv else ctx.session_id
    if argv and not ctx.is_operator:
        live = await ctx.engine.session(target)
        if live is None or live.id != ctx.session_id:
            return "not permitted: only an operator may stop another session"
    live = await ctx.engine.session(target)
    if live is None:
        raise CommandError(f"no session {target!r}")
    return "stopping the running turn" if ctx.engine.stop_turn(live.id) else "no turn is running"


def register_builtin_commands(engine: Engine) -> None:
    for cmd in (
        Command("help", "!help", "this list", _help),
        Command("model", "!model [KEY]", "list models / switch this session's model", _model),
        Command("session", "!session [ID delete]", "list sessions / delete one", _session),
        Command("reset", "!reset", "start this session afresh (history archived)", _reset),
        Command("stop", "!stop [ID]", "cancel the running turn", _stop),
    ):
        engine.commands.register(cmd)
