"""Operator commands over gates and rate limits: `!gates`, `!gate`, `!limits`.

They are operator-only (the console, or an operator token); from proxy, Slack and client-token
sessions they answer "not permitted". No tool the model can call reaches any of this.
`--save` writes the TOML file back into the user's config dir with tomli-w.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiops.engine.commands import Command, CommandContext, CommandError

if TYPE_CHECKING:
    from aiops.engine.commands import CommandHost

DECISIONS = ("allow", "ask", "deny")


def write_toml(path: Path, data: dict[str, Any]) -> None:
    """Atomic: a crash mid-write never leaves a half-written config file."""
    import tomli_w

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            tomli_w.dump(data, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _rules_text(engine: CommandHost) -> list[str]:
    rules = engine.gatekeeper.rules
    d = rules.to_toml_dict()
    lines = ["Rules (gates.toml):"]
    dflt = d.get("defaults", {})
    lines.append(f"  defaults              read={dflt.get('read')} write={dflt.get('write')}")
    for name, r in sorted(d.get("tools", {}).items()):
        lines.append(f"  tool {name:<16} " + " ".join(f"{k}={v}" for k, v in r.items()))
    for name, r in sorted(d.get("db", {}).get("tables", {}).items()):
        lines.append(f"  db:{name:<18} " + " ".join(f"{k}={v}" for k, v in r.items()))
    unk = d.get("db", {}).get("unknown", {})
    if unk:
        lines.append("  db (no table named)   " + " ".join(f"{k}={v}" for k, v in unk.items()))
    wait = d.get("wait", {})
    if wait:
        lines.append("  wait (s, 0 = forever) " + " ".join(f"{k}={v}" for k, v in wait.items()))
    return lines


def _actor(ctx: CommandContext) -> str:
    return f"operator:{ctx.client_kind}"


def _invalid_target(engine: CommandHost, target: str) -> str | None:
    """Why `target` names nothing a rule could apply to, or None when it is valid.

    A typo would otherwise be saved as a rule that never matches while the operator believes
    the tool is now denied.
    """
    if target.startswith("db:"):
        return None  # set_rule checks the table name
    known = set(engine.tools.names())
    # Rules already in gates.toml stay editable while their plugin is not running.
    known.update(engine.gatekeeper.rules.tools)
    if target.startswith("mcp:"):
        parts = target.split(":")
        if len(parts) in (2, 3) and all(p.strip() for p in parts[1:]):
            return None
        what = f"{target!r} is not a valid MCP target"
    elif target in known:
        return None
    else:
        what = f"unknown tool {target!r}"
    tools = ", ".join(sorted(known)) or "none"
    return (f"{what}; valid targets are a tool ({tools}), mcp:SERVER, mcp:SERVER:TOOL, "
            f"or db:TABLE (db:* for every table)")


async def _gates(ctx: CommandContext, argv: list[str], raw: str) -> str:
    engine = ctx.engine
    broker = engine.gatekeeper.broker
    if argv[:1] == ["revoke"]:
        if len(argv) != 2:
            raise CommandError("expected: !gates revoke GRANT_ID")
        grant = await engine.gatekeeper.revoke_grant(argv[1], by=_actor(ctx), session_id=ctx.session_id)
        return f"revoked {argv[1]}" if grant is not None else f"no session approval {argv[1]!r}"
    lines = _rules_text(engine)
    pending = broker.pending()
    lines.append(f"\nPending gates ({len(pending)}):")
    now = time.time()
    for g in pending:
        left = f"{int(g.expires_at - now)}s left" if g.expires_at else "no timeout"
        lines.append(f"  {g.id}  {g.client_kind:<7} {g.session_id:<18} {g.summary}  ({left})")
    grants = broker.grants()
    lines.append(f"\nSession approvals ({len(grants)}):  revoke with !gates revoke ID")
    for gr in grants:
        gd = gr.to_dict()
        tables = ", ".join(gd.get("tables") or []) or "-"
        kinds = f" ({' + '.join(k.upper() for k in gd['kinds'])} only)" if gd.get("kinds") else ""
        lines.append(f"  {gd['id']}  {gd['session_id']:<18} {gd['tool']} {gd['operation']}{kinds} on {tables}")
    return "\n".join(lines)


async def _gate(ctx: CommandContext, argv: list[str], raw: str) -> str:
    save = "--save" in argv
    args = [a for a in argv if a != "--save"]
    if len(args) != 3 or args[1] not in ("read", "write") or args[2] not in DECISIONS:
        raise CommandError("expected: TOOL|db:TABLE read|write allow|ask|deny [--save]")
    target, op, decision = args
    engine = ctx.engine
    why = _invalid_target(engine, target)
    if why:
        raise CommandError(why)
    try:
        engine.gatekeeper.rules = engine.gatekeeper.rules.set_rule(target, op, decision)  # type: ignore[arg-type]
    except ValueError as e:
        raise CommandError(str(e)) from None
    out = f"{target} {op} → {decision} (this process)"
    if save:
        path = engine.config.paths.config_dir / "gates.toml"
        write_toml(path, engine.gatekeeper.rules.to_toml_dict())
        out += f"; saved to {path}"
    await engine.store.add_audit("rule_changed", session_id=await ctx.audit_session_id(), tool=target, operation=op,
                                 decision=decision, actor=ctx.client_kind, data={"saved": save})
    return out


async def _limits(ctx: CommandContext, argv: list[str], raw: str) -> str:
    engine = ctx.engine
    limiter = engine.gatekeeper.limiter
    if not argv:
        cfg = limiter.config
        lines = [f"max_tool_iterations = {engine.limits.max_tool_iterations}",
                 f"max_agent_call_depth = {engine.limits.max_agent_call_depth}", "Rates:"]
        for ttype, rule in sorted(cfg.rate.items()):
            lines.append(f"  {ttype:<10} {rule.calls} calls / {rule.window_seconds:g}s"
                         f"{'  auto_disable' if rule.auto_disable else ''}")
        usage = limiter.usage()
        if usage:
            lines.append("Usage:")
            for u in usage:
                flag = "  DISABLED" if u.disabled else ""
                lines.append(f"  {u.session_id:<18} {u.tool_type:<10} {u.used}/{u.limit} in "
                             f"{u.window_seconds:g}s{flag}")
        return "\n".join(lines)
    sub = argv[0]
    if sub == "set":
        save = "--save" in argv
        args = [a for a in argv[1:] if a != "--save"]
        if len(args) != 3:
            raise CommandError("expected: !limits set TYPE CALLS WINDOW [--save]")
        try:
            calls, window = int(args[1]), float(args[2])
            if calls < 1 or not 0 < window < math.inf:  # not "nan" or "inf": a window no clock ends
                raise ValueError
        except ValueError:
            raise CommandError("CALLS must be a positive integer and WINDOW positive seconds") from None
        limiter.set_rule(args[0], calls, window)
        out = f"rate {args[0]}: {calls} calls / {window:g}s (this process)"
        if save:
            path = engine.config.paths.config_dir / "limits.toml"
            write_toml(path, limiter.config.to_toml_dict())
            out += f"; saved to {path}"
        await engine.store.add_audit("limit_changed", session_id=await ctx.audit_session_id(), tool=args[0],
                                     actor=ctx.client_kind, data={"calls": calls, "window": window})
        return out
    if sub == "enable":
        if len(argv) not in (2, 3):
            raise CommandError("expected: !limits enable TYPE [SESSION]")
        target = ctx.session_id
        if len(argv) == 3:
            live = await engine.session(argv[2])
            if live is None:
                raise CommandError(f"no session {argv[2]!r}")
            target = live.id
        ok = limiter.enable(target, argv[1])
        return f"{argv[1]} re-enabled for {target}" if ok else f"{argv[1]} was not disabled for {target}"
    raise CommandError(f"unknown sub-command {sub!r}")


def register_gate_commands(engine: CommandHost) -> None:
    for cmd in (
        Command("gates", "!gates [revoke ID]", "rules, pending gates, session approvals", _gates,
                operator_only=True),
        Command("gate", "!gate TOOL|db:TABLE read|write allow|ask|deny [--save]", "change a gate rule",
                _gate, operator_only=True),
        Command("limits", "!limits [set TYPE CALLS WINDOW [--save]|enable TYPE [SESSION]]",
                "rate limits and usage", _limits, operator_only=True),
    ):
        engine.commands.register(cmd)
