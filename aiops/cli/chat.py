"""`aiops chat`: one turn streamed to stdout, its gates asked about on the terminal."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from aiops.cli.common import CliError, setup_file_logging
from aiops.cli.terminal import TerminalAsker, shown

if TYPE_CHECKING:
    from aiops.engine.engine import Engine
    from aiops.engine.events import GateInfo, GateOpened
    from aiops.engine.lock import DataDirLock


def _rule_hint(gate: GateInfo | Mapping[str, Any], rule_name: str | None = None) -> str:
    """The gates.toml rule that decided `gate`, phrased as the setting that would allow it.
    `rule_name`: what rules call the tool, when the gate does not say (a gate from an older server
    has no `rule_target`; an MCP server's `SERVER__TOOL` is `mcp:SERVER:TOOL` in gates.toml)."""
    from aiops.engine.events import GateInfo

    if not isinstance(gate, GateInfo):
        gate = GateInfo.from_dict(gate)
    op = gate.operation
    if gate.tool_type == "db":
        if not gate.tables:  # the statement names no table: the unknown rule decides
            return f'[db.unknown] {op} = "allow"'
        rules = " and ".join(f'[db.tables."{t}"] {op} = "allow"' for t in gate.tables)
        return f"{rules} (and [db.unknown] {op}, if the statement does more than touch its tables)"
    return f'[tools."{rule_name or gate.target}"] {op} = "allow"'


def cmd_chat(args: argparse.Namespace) -> int:
    if args.text == "-":
        # `git log -1 | aiops chat -`: the message is what the pipe holds, read before anything
        # starts (so a usage error never leaves an engine half up).
        args.text = sys.stdin.read()
        if not args.text.strip():
            raise CliError("aiops chat -: nothing to send (stdin was empty)")
    from aiops.paths import load_env, resolve_paths

    # An aiops running on this data dir (or --url): the message goes to it (aiops/cli/remote_chat.py).
    # It needs the paths (for the run file) and `.env` (for a token), not the configuration: that
    # is the running aiops's, and validating it here would cost pydantic's import and more.
    paths = resolve_paths(args.config_dir, args.data_dir)
    load_env(paths)
    from aiops.cli.remote_chat import chat_remote, remote_url

    if (url := remote_url(paths, args)) is not None:
        return chat_remote(args, url, paths)
    from aiops.config import load_config

    cfg = load_config(paths, load_dotenv=False)
    setup_file_logging(cfg, args.verbose)
    from aiops.engine.lock import AlreadyRunning, DataDirLock

    # Another aiops on this data dir owns its sessions and gates: talk to it, don't share its files.
    lock = DataDirLock(cfg.paths.lock_path)
    try:
        lock.acquire()
    except AlreadyRunning as e:
        raise CliError(f"{e}; send the message through its API instead "
                       f"(POST /api/v1/submit, or aiops.client.AgentClient)") from None
    try:
        return asyncio.run(_chat(cfg, args, lock))
    finally:
        lock.release()


TOOLS_NOTICE_AFTER = 1.0  # seconds of waiting for plugins' tools before saying so on stderr


async def _tools_ready(engine: Engine) -> None:
    """Wait (bounded by each plugin) for the tools plugins register in the background; a wait
    that is long enough to notice is said on stderr, so a run that seems to hang says why."""
    waiting = asyncio.ensure_future(engine.tools_ready())
    done, _ = await asyncio.wait({waiting}, timeout=TOOLS_NOTICE_AFTER)
    if not done:
        print("[waiting for plugins' tools: MCP servers connecting…]", file=sys.stderr, flush=True)
    await waiting


def _waiting_line(opened: GateOpened) -> dict[str, Any]:
    """The "waiting for approval" notice that follows a gate in `aiops chat --json`, derived from
    the gate itself (the line, its keys and their order as the engine's notice had them)."""
    from aiops.gates.broker import waiting_notice

    line: dict[str, Any] = {"event": "notice", "text": waiting_notice(opened.gate), "gate_id": opened.gate.id,
                            "session_id": opened.session_id}
    if opened.turn_id is not None:
        line["turn_id"] = opened.turn_id
    return line


async def _chat(cfg: Any, args: argparse.Namespace, lock: DataDirLock | None = None) -> int:
    import uuid

    from aiops.engine import events as ev
    from aiops.engine.engine import Engine, EngineError
    from aiops.gates.broker import GateError

    engine = Engine(cfg)
    # Only the model this turn asks for (a session's own model, or an `@model` line, is imported
    # when its turn needs it): no provider SDK this run does not use.
    await engine.start(warm=[args.model or cfg.models.default_model], one_turn=True)
    await engine.close_left_open(lock)
    out = sys.stdout
    status = 0
    # The data-dir lock keeps the console and `aiops serve` out while this runs, so a gate can only
    # be answered here: on the terminal, or (without one) refused at once rather than waited on.
    asker = TerminalAsker() if sys.stdin.isatty() else None
    asking: dict[str, asyncio.Task[None]] = {}
    say = sys.stderr if args.json else out  # keeps --json output to JSON lines

    async def answer(gate: ev.GateInfo) -> None:
        decision: Literal["approved", "denied"]
        scope: Literal["once", "session"]
        if asker is None:
            decision, scope, by = "denied", "once", "aiops chat (no terminal)"
        else:
            decision, scope = await asker.ask(gate.target)  # as gates.toml names it
            by = "aiops chat (terminal)"
        try:
            engine.resolve_gate(gate.id, decision, scope, by=by)
        except GateError as e:
            say.write(f"[gate {gate.id}: {e}]\n")
            return
        if asker is None and gate.tool.startswith("mcp:"):
            # Not a tool call (no tool is named with a colon): an MCP server's question during a
            # call, which no rule answers, only an operator.
            say.write(f"[declined: {gate.summary}: aiops chat has no terminal to ask on, and no rule in "
                      f"gates.toml answers an MCP server's question; send the message through a running "
                      f"aiops (the console, or `aiops serve` and its API) to answer it there]\n")
        elif asker is None:
            gates_toml = cfg.paths.config_dir / "gates.toml"
            say.write(f"[denied: aiops chat has no terminal to ask for approval on. To allow "
                      f"{gate.tool} {gate.operation}, set {_rule_hint(gate)} in {gates_toml} "
                      f"(`aiops config init` copies the defaults there), or send the message through "
                      f"a running aiops (the console, or `aiops serve` and its API) and approve it "
                      f"there]\n")
        else:
            say.write(f"[{decision}{' for this session' if scope == 'session' else ''}]\n")
        say.flush()

    def show(e: ev.Event) -> None:
        """One event as text on the terminal (the waiting notice is not shown: we ask instead)."""
        match e:
            case ev.Tok(text=text):
                out.write(shown(text))
            case ev.ToolCalled():
                out.write(f"\n→ {shown(e.tool)}({json.dumps(e.arguments)[:200]})\n")
            case ev.ToolReturned():
                first = (e.content.strip().splitlines() or [""])[0][:200]
                mark = "✗" if e.is_error else "←"
                out.write(f"{mark} {shown(e.tool)}: {shown(first)} ({e.duration_ms:.0f} ms)\n")
            case ev.Notice(command=str(command)) if command:
                out.write(f"{shown(e.text)}\n")  # a command's output, as is
            case ev.Notice():
                out.write(f"\n[{shown(e.text)}]\n")
            case ev.GateOpened(gate=gate):
                out.write(f"\n[gate {gate.id}: {shown(gate.summary)}]\n")
            case ev.ErrorEvent():
                out.write(f"\nerror: {shown(e.message)}\n")

    try:
        # The turn's model is offered the tools registered when the turn starts; an MCP server's
        # are registered once it connects, in the background. Without this wait the one turn of
        # this run never saw them (QA: "unknown tool"). No plugin with such tools: no wait at all.
        await _tools_ready(engine)
        for p in engine.plugin_status:
            if p.state == "failed":
                print(f"[plugin {p.name} failed: {p.reason}]", file=sys.stderr)
        if skipped := [p.name for p in engine.plugin_status if p.state == "skipped"]:
            # A tool without its key is skipped at every run: one line, not one each (a QA pass
            # counted six with the shipped config), as `aiops serve` says it.
            print(f"[plugins skipped (`aiops plugins` says why): {', '.join(skipped)}]", file=sys.stderr)
        session = args.session
        if session:
            live = await engine.session(session)
            if live is None:
                raise CliError(f"no session {session!r}")
            session = live.id
        else:
            session = f"cli-{uuid.uuid4().hex[:8]}"
        sub = engine.subscribe(session)
        try:
            turn = await engine.submit(session, args.text, kind="cli", model=args.model,
                                       is_operator=True)
        except EngineError as err:
            raise CliError(str(err)) from None
        # A message of commands only creates no session, and `!session ID delete` may remove it.
        live = await engine.session(session)
        if not args.json and live is not None:
            print(f"[session {live.row.short_id} · {live.model_key(engine)}]", file=sys.stderr)
        # --json names no session that does not exist: an id made up for a message that created
        # none would be looked for in vain (`aiops audit --session`, the API: 404).
        shown_id = session if live is not None else None
        async for e in sub:
            if e.turn_id != turn.id and not isinstance(e, ev.ErrorEvent):
                continue
            match e:
                case ev.Notice(command=str(command), ok=False) if command:
                    status = 1  # a !command reported an error
                case ev.GateResolved(gate=gate):
                    task = asking.pop(gate.id, None)
                    if task is not None and not task.done():  # resolved before we had an answer: a timeout
                        task.cancel()
                        say.write(f"\n[gate {gate.id}: {gate.decision} by {gate.by}]\n")
            if args.json:
                out.write(json.dumps({"event": e.name, **e.payload(), "session_id": shown_id}, default=str) + "\n")
                if isinstance(e, ev.GateOpened):
                    out.write(json.dumps(_waiting_line(e), default=str) + "\n")
            else:
                show(e)
            if isinstance(e, ev.ErrorEvent):
                status = 1
            elif isinstance(e, ev.Done):
                if not args.json:  # (a JSON line ends with its own newline: no blank line after it)
                    out.write("\n")
                break
            if isinstance(e, ev.GateOpened):
                out.flush()
                asking[e.gate.id] = asyncio.create_task(answer(e.gate))
            out.flush()
        sub.close()
    finally:
        for task in asking.values():
            task.cancel()
        await engine.stop()
    return status
