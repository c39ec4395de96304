"""The engine's own `!commands`: help, model, session, reset, stop."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from aiops.engine.commands import Command, CommandContext, CommandError
from aiops.engine.errors import EngineError

if TYPE_CHECKING:
    from aiops.engine.commands import CommandHost

# Commands that act on "this session" say so when the message that carries them is the first
# (command-only messages do not create a session).
NO_SESSION = "this session does not exist yet (it starts with its first message)"

# When a command fails (CommandError: `aiops chat` exits 1, the notice says ok: false): when what
# was asked cannot be done — an unknown command or argument, one not permitted, or one that names
# something that does not exist (a page past the last, a session id, a model). A command whose
# end state already holds succeeds: `!reset` of a session with no history yet, `!stop` with no
# turn running.


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
    live = await ctx.session()
    current = live.model_key(engine) if live else engine.config.models.default_model
    if not argv:
        lines = ["Models (* = this session, d = default):"]
        for key, m in engine.config.models.models.items():
            mark = ("*" if key == current else " ") + ("d" if key == engine.config.models.default_model else " ")
            state = "" if m.enabled else "  [disabled]"
            lines.append(f" {mark} {key:<14} {m.type:<7} {m.model_id:<28} {m.description}{state}")
        return "\n".join(lines)
    key = argv[0].lstrip("@")
    if why := engine.check_model(key):
        raise CommandError(why)
    if live is None:
        raise CommandError(NO_SESSION + "; a new session's model comes with that message "
                                        "(`aiops chat --model KEY`, \"model\" in the API)")
    try:
        await engine.set_session_model(live.id, key)
    except EngineError as e:
        raise CommandError(str(e)) from None
    return f"this session now uses {key}"


# `!session` shows the most recently active sessions a page at a time: a store of thousands would
# otherwise print thousands of lines.
SESSION_PAGE = 30


# Clients that are the holder of their token (a script, `aiops chat`), not one of the many users a
# chat UI, Slack or an MCP host serve with one token.
_TOKEN_HOLDER_KINDS = frozenset({"api", "cli"})


async def _session(ctx: CommandContext, argv: list[str], raw: str) -> str:
    engine = ctx.engine
    if not ctx.is_operator and (not argv or argv[0] in ("all", "page")):
        # Other sessions' titles are other people's conversations: a script or `aiops chat` (the
        # token's holder) sees those its token made, as GET /api/v1/sessions lists them; a chat UI
        # or Slack, whose one token serves all their users, only the session it writes in.
        head = f"{'id':>5}  {'kind':<8} {'model':<12} {'msgs':>5}  {'last':<9} title"
        if ctx.owner is not None and ctx.client_kind in _TOKEN_HOLDER_KINDS:
            rows = await engine.list_sessions(owner=ctx.owner, limit=SESSION_PAGE)
            if not rows:
                return "no session yet: this message starts none"
            lines = [head] + [f"{'*' if r['client_id'] == ctx.session_id else ' '}{r['short_id']:>4}  "
                              f"{r['kind']:<8} {r['model'] or '':<12} {r['message_count']:>5}  "
                              f"{ago(r['updated_at']):<9} {r['title']}" for r in rows]
            return "\n".join([*lines, "(your sessions; operators see every session)"])
        own = await ctx.session() if ctx.session_id else None
        if own is None:
            return "no session yet: this message starts none"
        r = own.row
        return "\n".join([head, f"*{r.short_id:>4}  {r.kind:<8} {own.model_key(engine):<12} "
                                 f"{r.message_count:>5}  {ago(r.updated_at):<9} {r.title}",
                          "(operators see every session)"])
    if not argv or argv[0] in ("all", "page"):
        page = 1
        if argv and argv[0] == "page":
            if len(argv) != 2 or not (argv[1].isascii() and argv[1].isdigit()) or int(argv[1]) < 1:
                raise CommandError("expected: !session page N (N = 1, 2, ...)")
            page = int(argv[1])
        elif len(argv) > 1:
            raise CommandError("expected: !session all")
        total = await engine.store.count_sessions()
        if argv and argv[0] == "all":
            rows = await engine.list_sessions(limit=max(total, 1))
            first = 0
        else:
            first = (page - 1) * SESSION_PAGE
            rows = await engine.list_sessions(limit=SESSION_PAGE, offset=first)
        if not total and page == 1:
            return "no sessions"
        if not rows:
            # A page that does not exist: an error (see above), even when no page does.
            raise CommandError(f"no page {page}: there are no sessions" if not total else
                               f"no page {page}: {total} sessions make {-(-total // SESSION_PAGE)} page(s)")
        lines = [f"{'id':>5}  {'kind':<8} {'model':<12} {'msgs':>5}  {'last':<9} title"]
        for r in rows:
            mark = "*" if r["client_id"] == ctx.session_id else " "
            lines.append(f"{mark}{r['short_id']:>4}  {r['kind']:<8} {r['model'] or '':<12} "
                         f"{r['message_count']:>5}  {ago(r['updated_at']):<9} {r['title']}")
        if first > 0:
            lines.append(f"… {first} more recent (`!session page {page - 1}`)")
        if (rest := total - first - len(rows)) > 0:
            lines.append(f"… {rest} more (`!session page {page + 1}`, or `!session all`)")
        return "\n".join(lines)
    if len(argv) == 2 and argv[1] == "delete":
        live = await engine.session(argv[0])
        if not ctx.is_operator:
            own = await ctx.session()
            if own is None or live is None or live.id != own.id:
                raise CommandError("not permitted: only an operator may delete another session")
        if live is None:
            raise CommandError(f"no session {argv[0]!r}")
        label = f"{live.row.short_id} ({live.id})"
        await engine.delete_session(live.id)
        return f"deleted session {label}"
    raise CommandError("expected no argument, all, page N, or ID delete")


async def _reset(ctx: CommandContext, argv: list[str], raw: str) -> str:
    if await ctx.session() is None:
        # Afresh already: what was asked holds, as `!stop` with no turn running (see above).
        return NO_SESSION + ": nothing to reset"
    await ctx.engine.reset_session(ctx.session_id)
    return "session reset: the model starts afresh (the old history stays archived)"


async def _stop(ctx: CommandContext, argv: list[str], raw: str) -> str:
    live = await ctx.engine.session(argv[0]) if argv else await ctx.session()
    if argv and not ctx.is_operator:
        own = await ctx.session()
        if own is None or live is None or live.id != own.id:
            raise CommandError("not permitted: only an operator may stop another session")
    if live is None:
        if not argv:
            return "no turn is running"  # this session has not started yet
        raise CommandError(f"no session {argv[0]!r}")
    if ctx.engine.stop_turn(live.id):
        return "stopping the running turn"
    return "the running turn is already being stopped" if live.current is not None else "no turn is running"


async def _plugins(ctx: CommandContext, argv: list[str], raw: str) -> str:
    """Every plugin's state, as `aiops plugins` prints it: in any chat, the operator sees why a
    tool is missing or a bot is not answering without leaving the console."""
    rows = ctx.engine.plugin_status
    if not rows:
        return "no plugins"
    width = max(len(p.name) for p in rows)
    return "\n".join(f"{p.name:<{width}}  {p.state:<8} {p.reason}".rstrip() for p in rows)


def register_builtin_commands(engine: CommandHost) -> None:
    for cmd in (
        Command("help", "!help", "this list", _help),
        Command("model", "!model [KEY]", "list models / switch this session's model", _model),
        Command("session", "!session [all | page N | ID delete]",
                "list sessions (most recent first) / delete one", _session),
        Command("reset", "!reset", "start this session afresh (history archived)", _reset),
        Command("stop", "!stop [ID]", "cancel the running turn", _stop),
        Command("plugins", "!plugins", "every plugin's state and why (started, disabled, skipped, failed)",
                _plugins, operator_only=True),
    ):
        engine.commands.register(cmd)
