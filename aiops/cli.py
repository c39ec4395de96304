"""The `aiops` command.

Argument parsing comes first and heavy imports happen inside each sub-command, so `aiops --help`
and `aiops config paths` stay instant and `aiops serve` never imports Textual.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiops import __version__

if TYPE_CHECKING:
    from aiops.engine.lock import DataDirLock


class CliError(Exception):
    """Printed as one line on stderr; exit status 2."""


def _parser() -> argparse.ArgumentParser:
    # The common options are accepted before or after any sub-command (`aiops --config-dir X config
    # check` and `aiops config check --config-dir X` alike); SUPPRESS keeps a value given before a
    # sub-command from being reset by the sub-parser's default. main() fills the real defaults.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config-dir", default=argparse.SUPPRESS,
                        help="config directory (default: $AIOPS_CONFIG_DIR or the XDG dir)")
    common.add_argument("--data-dir", default=argparse.SUPPRESS,
                        help="data directory (default: $AIOPS_DATA_DIR or the XDG dir)")
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="debug logging (to the log file)")

    def sub_parser(**kw: Any) -> argparse.ArgumentParser:
        return argparse.ArgumentParser(parents=[common], **kw)

    p = argparse.ArgumentParser(prog="aiops", description="Operator console for a multi-client AI agent.",
                                parents=[common])
    p.add_argument("--version", action="version", version=f"aiops {__version__}")
    # The console is the default sub-command, so its options work without naming it:
    # `aiops --port 18999` is `aiops console --port 18999`.
    _server_args(p)
    _console_args(p)
    sub = p.add_subparsers(dest="command", parser_class=sub_parser)

    c = sub.add_parser("console", help="the full-screen console (the default)")
    _server_args(c)
    _console_args(c)

    s = sub.add_parser("serve", help="headless: the engine and the HTTP server, no console")
    _server_args(s)

    ch = sub.add_parser("chat", help="run one turn and stream it to stdout",
                        description="Run one turn and stream it to stdout. Exit status: 0 done, 1 the "
                                    "turn or a !command reported an error, 2 a usage or config error.")
    ch.add_argument("text", help="the message (text starting with ! or @ is a command); - reads it from stdin")
    ch.add_argument("--session", help="session id (full or shorthand); default: a new one")
    ch.add_argument("--model", help="model key for this turn")
    ch.add_argument("--json", action="store_true", help="print events as JSON lines")

    m = sub.add_parser("models", help="list the model registry")
    m.add_argument("--json", action="store_true")

    cfg = sub.add_parser("config", help="configuration: paths, check, init")
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True, parser_class=sub_parser)
    cfg_sub.add_parser("paths", help="print every path in use")
    cfg_sub.add_parser("check", help="validate every config file")
    ini = cfg_sub.add_parser("init", help="copy the shipped defaults (config files and system prompt) "
                                          "into the config dir for editing")
    ini.add_argument("--force", action="store_true", help="overwrite existing files")

    a = sub.add_parser("audit", help="print the gate audit log")
    a.add_argument("--session", help="only this session (full or shorthand id)")
    a.add_argument("--since", help="only entries since T (ISO time, or an age like 10m, 2h, 1d)")
    a.add_argument("--json", action="store_true", help="JSON lines")

    pl = sub.add_parser("plugins", help="list plugins and their state")
    pl.add_argument("--json", action="store_true")

    at = sub.add_parser("attach", help="watch a running aiops's session stream (read-only)")
    at.add_argument("session", help="session id")
    at.add_argument("--url", default=None, help="server URL (default: from aiops.toml)")
    return p


def _server_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default=argparse.SUPPRESS, help="bind address (default from aiops.toml; loopback)")
    p.add_argument("--port", type=_port, default=argparse.SUPPRESS, help="port (default from aiops.toml)")


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0-65535; 0 picks a free one)")
    return port


def _console_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-server", action="store_true", default=argparse.SUPPRESS,
                   help="do not start the HTTP server")


_DEFAULTS: dict[str, Any] = {"config_dir": None, "data_dir": None, "verbose": False, "host": None,
                             "port": None, "no_server": False}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = _parser()
    args = parser.parse_args(argv)
    given = {name for name in _DEFAULTS if hasattr(args, name)}
    if args.command not in (None, "console", "serve") and given & {"host", "port", "no_server"}:
        parser.error(f"--host, --port and --no-server are options of the console and serve, not of "
                     f"{args.command!r}")
    if args.command == "serve" and "no_server" in given:
        parser.error("--no-server is an option of the console (serve is the server)")
    for name, default in _DEFAULTS.items():
        if name not in given:
            setattr(args, name, default)
    return args


# ---- helpers ----------------------------------------------------------------------------------------


def _load(args: argparse.Namespace) -> Any:
    from aiops.config import load_config, resolve_paths

    paths = resolve_paths(args.config_dir, args.data_dir)
    return load_config(paths)


def _setup_file_logging(cfg: Any, verbose: bool) -> None:
    """Logs go to a file in the data dir, never to the terminal a console draws on."""
    from aiops.logs import log_file_handler

    cfg.paths.data_dir.mkdir(parents=True, exist_ok=True)
    handler = log_file_handler(cfg.paths.log_path)
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    for noisy in ("httpx", "httpcore", "openai", "google_genai", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def parse_since(text: str) -> float:
    from datetime import datetime

    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    digits = text[:-1].replace(".", "", 1)
    if text and text[-1] in units and digits.isascii() and digits.isdigit():  # not "³m": float() refuses it
        return time.time() - float(text[:-1]) * units[text[-1]]
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise CliError(f"--since {text!r}: expected an ISO time (2026-01-31T12:00) or an age (10m, 2h, 1d)") from None
    return dt.timestamp()


# ---- sub-commands -------------------------------------------------------------------------------------


def _lock_state(path: Path) -> str:
    from aiops.engine.lock import fcntl, holder

    if fcntl is None:
        return "no locking on this platform"
    if not path.exists():
        return "absent: no aiops runs on this data dir"
    info = holder(path)
    if info is None:
        return "free: no aiops runs on this data dir"
    url = f", {info['url']}" if info.get("url") else ""
    return f"held by pid {info.get('pid', '?')}{url}"


def cmd_config_paths(args: argparse.Namespace) -> int:
    from aiops.config import CONFIG_FILES, read_toml, resolve_paths

    paths = resolve_paths(args.config_dir, args.data_dir)

    def absent(p: Path, note: str = "absent") -> str:
        return "" if p.exists() else f"  ({note})"

    print(f"config dir       {paths.config_dir}{absent(paths.config_dir)}")
    print(f"shipped defaults {paths.shipped_config_dir}")
    for name in CONFIG_FILES:
        p = paths.config_file(name)
        origin = "user" if p.parent == paths.config_dir else "default"
        print(f"  {name:<14} {p}  ({origin})")
    print(f"data dir         {paths.data_dir}{absent(paths.data_dir)}")
    print(f"  database       {paths.db_path}{absent(paths.db_path)}")
    print(f"  log file       {paths.log_path}{absent(paths.log_path)}")
    print(f"  lock file      {paths.lock_path}  ({_lock_state(paths.lock_path)})")
    # Every tree a model names, where it is read and edited, and where a missing one comes from.
    try:
        models = read_toml(paths.config_file("models.toml")).get("models", {})
        folders = sorted({str(m.get("system_prompt_folder", "default")) for m in models.values()
                          if isinstance(m, dict)} or {"default"})
    except Exception:  # noqa: BLE001 - `config check` reports a broken models.toml
        folders = ["default"]
    print(f"system prompts   {paths.prompt_dir}")
    for name in folders:
        folder = paths.prompt_folder(name)
        if folder is None:
            continue
        src = paths.shipped_prompt_folder(name)
        note = "" if folder.exists() else (f"  (absent: copied from {src} on first use)" if src
                                           else "  (absent)")
        print(f"  {name:<14} {folder}{note}")
    print(f"shipped prompts  {paths.shipped_prompt_dir}")
    envs = [str(p) + ("" if p.exists() else " (absent)") for p in paths.env_files()]
    print(f".env files       {', '.join(envs)}")
    return 0


def cmd_config_check(args: argparse.Namespace) -> int:
    cfg = _load(args)
    from aiops.prompts.tree import load_tree

    problems = 0
    for name, path in cfg.sources.items():
        print(f"ok  {name:<14} {path}")
    for key, m in cfg.models.models.items():
        if m.enabled and m.key_status() == "missing":
            print(f"warn model {key}: {m.api_key_env} is not set (calls to it will fail)")
    seen: set[Path] = set()
    for key, m in cfg.models.models.items():
        folder = cfg.paths.prompt_folder(m.system_prompt_folder)
        if folder is not None and not folder.exists():
            # Not copied yet: the engine copies the shipped tree on first use; check that one.
            folder = cfg.paths.shipped_prompt_folder(m.system_prompt_folder) or folder
        if folder is None or folder in seen:
            continue
        seen.add(folder)
        if not folder.exists():
            print(f"ERR model {key}: system_prompt_folder {folder} does not exist")
            problems += 1
            continue
        tree = load_tree(folder)
        for e in tree.errors:
            print(f"ERR system prompt {folder}: {e.message}")
            problems += 1
    from aiops.engine.plugins import PluginUnavailable, discover, validate_settings

    for name, cls in discover().items():
        if isinstance(cls, Exception):
            print(f"ERR plugin {name}: cannot load: {cls}")
            problems += 1
            continue
        try:
            validate_settings(cls, cfg.plugin_settings(cls.name), str(cfg.sources["plugins.toml"]))
        except PluginUnavailable as e:
            print(f"ERR {e}")
            problems += 1
    print("configuration is valid" if not problems else f"{problems} problem(s)")
    return 1 if problems else 0


def cmd_config_init(args: argparse.Namespace) -> int:
    import shutil

    from aiops.config import CONFIG_FILES, copy_tree, replace_tree, resolve_paths

    paths = resolve_paths(args.config_dir, args.data_dir)
    try:
        paths.config_dir.mkdir(parents=True, exist_ok=True)
        for name in CONFIG_FILES:
            dest = paths.config_dir / name
            if dest.exists() and not args.force:
                print(f"kept    {dest}")
                continue
            shutil.copyfile(paths.shipped_config_dir / name, dest)
            print(f"wrote   {dest}")
        # The system prompt trees too: the engine reads and edits the user's copy.
        for src in sorted(p for p in paths.shipped_prompt_dir.iterdir() if p.is_dir()):
            dest = paths.prompt_dir / src.name
            if dest.exists() and not args.force:
                print(f"kept    {dest}/")
                continue
            if dest.exists():
                replace_tree(src, dest)  # the user's tree goes only once the new copy is complete
            else:
                copy_tree(src, dest)
            print(f"wrote   {dest}/")
    except OSError as e:
        raise CliError(f"cannot write {e.filename or paths.config_dir}: {e.strerror or e}") from None
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    cfg = _load(args)
    models = cfg.models
    if args.json:
        print(json.dumps([{"key": k, **m.model_dump(), "default": k == models.default_model,
                           "key_status": m.key_status()} for k, m in models.models.items()], indent=2))
        return 0
    print(f"{'':2} {'key':<14} {'type':<7} {'model_id':<30} {'enabled':<8} {'api key':<11} url")
    for k, m in models.models.items():
        mark = "* " if k == models.default_model else "  "
        print(f"{mark}{k:<14} {m.type:<7} {m.model_id:<30} {'yes' if m.enabled else 'no':<8} "
              f"{m.key_status():<11} {m.display_url()}")
    print("\n* default model. Keys come from the environment or .env (api_key_env in models.toml).")
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    cfg = _load(args)
    _setup_file_logging(cfg, args.verbose)  # it starts an engine: its warnings go where the others' do

    async def run() -> list[Any]:
        from aiops.engine.engine import Engine

        engine = Engine(cfg)
        await engine.start()
        try:
            await engine.plugins_ready()  # e.g. mysql's connection check, which runs in the background
            return list(engine.plugin_status)
        finally:
            await engine.stop()

    statuses = asyncio.run(run())
    if args.json:
        print(json.dumps([s.to_dict() for s in statuses], indent=2))
        return 0
    width = max((len(s.name) for s in statuses), default=0)
    for s in statuses:
        print(f"{s.name:<{width}}  {s.state:<9} {s.reason}")
    if not statuses:
        print("no plugins found")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    cfg = _load(args)
    since = parse_since(args.since) if args.since else None

    async def run() -> list[Any]:
        from aiops.engine.store import Store

        if not cfg.paths.db_path.exists():
            return []
        store = Store(cfg.paths.db_path)
        await store.open()
        try:
            sid = None
            if args.session:
                row = await store.get_session(args.session)
                if row is None:
                    raise CliError(f"no session {args.session!r}")
                sid = row.id
            return await store.audit(sid, since)
        finally:
            await store.close()

    rows = asyncio.run(run())
    if args.json:
        for r in rows:
            print(json.dumps(r.to_dict(), default=str))
        return 0
    if not rows:
        print("no audit entries")
    for r in rows:
        t = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.ts))
        what = " ".join(x for x in (r.tool, r.operation) if x)
        decision = f"{r.decision}" + (f" ({r.scope})" if r.scope else "") if r.decision else ""
        by = f"by {r.actor}" if r.actor else ""
        detail = ""
        data = r.data if isinstance(r.data, dict) else {}
        gate, grant, call_args = data.get("gate"), data.get("grant"), data.get("args")
        if gate:
            detail = gate.get("summary", "")
            if grant:  # passed by a session grant
                detail += f" (grant {grant.get('id')})"
        elif grant:  # grant_revoked
            detail = f"grant {grant.get('id')} on {', '.join(grant.get('tables') or []) or '-'}"
        elif r.event == "prompt_edit":
            detail = f"section {data.get('section')} {data.get('operation')}"
        elif isinstance(data.get("sql"), str):  # operator_db
            detail = data["sql"]
        elif isinstance(call_args, dict):  # policy_denied: what the call would have done
            sql = call_args.get("sql")
            detail = sql if isinstance(sql, str) else json.dumps(call_args, ensure_ascii=False, default=str)
        detail = " ".join(str(detail).split())
        print(f"{t}  {r.session_id or '-':<18} {r.event:<14} {what:<24} {decision:<18} {by:<16} {detail}")
    return 0


def _rule_hint(gate: dict[str, Any]) -> str:
    """The gates.toml rule that decided `gate`, phrased as the setting that would allow it."""
    op = gate["operation"]
    if gate.get("tool_type") == "db":
        tables = gate.get("tables") or []
        if not tables:  # the statement names no table: the unknown rule decides
            return f'[db.unknown] {op} = "allow"'
        rules = " and ".join(f'[db.tables."{t}"] {op} = "allow"' for t in tables)
        return f"{rules} (and [db.unknown] {op}, if the statement does more than touch its tables)"
    return f'[tools."{gate["tool"]}"] {op} = "allow"'


def cmd_chat(args: argparse.Namespace) -> int:
    if args.text == "-":
        # `git log -1 | aiops chat -`: the message is what the pipe holds, read before anything
        # starts (so a usage error never leaves an engine half up).
        args.text = sys.stdin.read()
        if not args.text.strip():
            raise CliError("aiops chat -: nothing to send (stdin was empty)")
    cfg = _load(args)
    _setup_file_logging(cfg, args.verbose)
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


class _TerminalAsker:
    """Asks the operator about gates on the terminal `aiops chat` runs in.

    One daemon thread reads stdin lines into a queue: a prompt whose gate resolves elsewhere (it
    timed out) can be abandoned without leaving a reader blocked, and the process can still exit.
    """

    def __init__(self) -> None:
        self._lines: asyncio.Queue[str] | None = None
        self._lock = asyncio.Lock()  # one prompt at a time (parallel calls may open several gates)

    def _start(self) -> asyncio.Queue[str]:
        if self._lines is None:
            import threading

            loop = asyncio.get_running_loop()
            lines: asyncio.Queue[str] = asyncio.Queue()

            def read() -> None:
                while True:
                    line = sys.stdin.readline()
                    try:
                        loop.call_soon_threadsafe(lines.put_nowait, line)
                    except RuntimeError:  # the loop has closed: aiops chat is exiting
                        return
                    if not line:  # EOF
                        return

            threading.Thread(target=read, name="aiops-chat-stdin", daemon=True).start()
            self._lines = lines
        return self._lines

    async def ask(self, gate: dict[str, Any]) -> tuple[str, str]:
        """(decision, scope) from the operator; EOF or anything but y/s is a denial."""
        async with self._lock:
            lines = self._start()
            while not lines.empty():  # typed ahead, before this question was shown
                lines.get_nowait()
            print(f"approve {gate['tool']}? [y]es once, [s]ession, [N]o: ", end="", file=sys.stderr,
                  flush=True)
            answer = (await lines.get()).strip().lower()
        if answer in ("y", "yes"):
            return "approved", "once"
        if answer in ("s", "session"):
            return "approved", "session"
        return "denied", "once"


# C0 and C1 controls but tab and newline, and DEL: what the model, a tool or a database sends
# must not drive the operator's terminal (hide text, move the cursor, redraw a gate's question).
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0))}


def _shown(text: str) -> str:
    """`text` as `aiops chat` prints it: control characters written out as `\\xNN`."""
    return text.translate(_CONTROLS)


async def _chat(cfg: Any, args: argparse.Namespace, lock: DataDirLock | None = None) -> int:
    import uuid
    from types import SimpleNamespace

    from aiops.engine import events as ev
    from aiops.engine.engine import Engine, EngineError
    from aiops.gates.broker import GateError, waiting_notice

    engine = Engine(cfg)
    await engine.start()
    await engine.close_left_open(lock)
    out = sys.stdout
    status = 0
    # The data-dir lock keeps the console and `aiops serve` out while this runs, so a gate can only
    # be answered here: on the terminal, or (without one) refused at once rather than waited on.
    asker = _TerminalAsker() if sys.stdin.isatty() else None
    asking: dict[str, asyncio.Task[None]] = {}
    waiting_texts: set[str] = set()  # the console's "waiting for approval" notices: we ask instead
    say = sys.stderr if args.json else out  # keeps --json output to JSON lines

    async def answer(gate: dict[str, Any]) -> None:
        if asker is None:
            decision, scope, by = "denied", "once", "aiops chat (no terminal)"
        else:
            decision, scope = await asker.ask(gate)
            by = "aiops chat (terminal)"
        try:
            engine.gatekeeper.broker.resolve(gate["id"], decision, scope, by=by)
        except GateError as e:
            say.write(f"[gate {gate['id']}: {e}]\n")
            return
        if asker is None:
            gates_toml = cfg.paths.config_dir / "gates.toml"
            say.write(f"[denied: aiops chat has no terminal to ask for approval on. To allow "
                      f"{gate['tool']} {gate['operation']}, set {_rule_hint(gate)} in {gates_toml} "
                      f"(`aiops config init` copies the defaults there), or send the message through "
                      f"a running aiops (the console, or `aiops serve` and its API) and approve it "
                      f"there]\n")
        else:
            say.write(f"[{decision}{' for this session' if scope == 'session' else ''}]\n")
        say.flush()

    try:
        for p in engine.plugin_status:
            if p.state in ("skipped", "failed"):
                print(f"[plugin {p.name} {p.state}: {p.reason}]", file=sys.stderr)
        session = args.session
        if session:
            live = await engine.session(session)
            if live is None:
                raise CliError(f"no session {session!r}")
            session = live.id
        else:
            session = f"console-{uuid.uuid4().hex[:8]}"
        sub = engine.bus.subscribe(session)
        try:
            turn = await engine.submit(session, args.text, kind="console", model=args.model,
                                       is_operator=True)
        except EngineError as e:
            raise CliError(str(e)) from None
        # A message of commands only creates no session, and `!session ID delete` may remove it.
        live = await engine.session(session)
        if not args.json and live is not None:
            print(f"[session {live.row.short_id} · {live.model_key(engine)}]", file=sys.stderr)
        async for e in sub:
            if e.turn_id != turn.id and e.name != ev.ERROR:
                continue
            if e.name == ev.NOTICE and e.data.get("command") and e.data.get("ok") is False:
                status = 1  # a !command reported an error
            if e.name == ev.GATE_RESOLVED:
                task = asking.pop(e.data["id"], None)
                if task is not None and not task.done():  # resolved before we had an answer: a timeout
                    task.cancel()
                    say.write(f"\n[gate {e.data['id']}: {e.data['decision']} by {e.data['by']}]\n")
            if args.json:
                out.write(json.dumps({"event": e.name, **e.payload()}, default=str) + "\n")
            elif e.name == ev.TOK:
                out.write(_shown(e.data["text"]))
            elif e.name == ev.TOOL_CALL:
                out.write(f"\n→ {_shown(e.data['name'])}({json.dumps(e.data['arguments'])[:200]})\n")
            elif e.name == ev.TOOL_RESULT:
                first = (e.data["content"].strip().splitlines() or [""])[0][:200]
                mark = "✗" if e.data["is_error"] else "←"
                out.write(f"{mark} {_shown(e.data['name'])}: {_shown(first)} ({e.data['duration_ms']:.0f} ms)\n")
            elif e.name == ev.NOTICE and e.data.get("command"):
                out.write(f"{_shown(e.data['text'])}\n")  # a command's output, as is
            elif e.name == ev.NOTICE:
                if e.data["text"] not in waiting_texts:
                    out.write(f"\n[{_shown(e.data['text'])}]\n")
            elif e.name == ev.GATE:
                out.write(f"\n[gate {e.data['id']}: {_shown(e.data['summary'])}]\n")
            elif e.name == ev.ERROR:
                out.write(f"\nerror: {_shown(e.data['message'])}\n")
            if e.name == ev.ERROR:
                status = 1
            elif e.name == ev.DONE:
                out.write("\n")
            if e.name == ev.DONE:
                break
            if e.name == ev.GATE:
                out.flush()
                waiting_texts.add(waiting_notice(SimpleNamespace(**e.data)))
                asking[e.data["id"]] = asyncio.create_task(answer(e.data))
            out.flush()
        sub.close()
    finally:
        for task in asking.values():
            task.cancel()
        await engine.stop()
    return status


def cmd_serve(args: argparse.Namespace) -> int:
    cfg = _load(args)
    _setup_file_logging(cfg, args.verbose)
    try:
        from aiops.integrations.server.run import serve
    except ImportError:
        raise CliError("the HTTP server is not available in this build") from None
    return serve(cfg, host=args.host, port=args.port)


def cmd_console(args: argparse.Namespace) -> int:
    cfg = _load(args)
    _setup_file_logging(cfg, args.verbose)
    try:
        from aiops.tui.app import run_console
    except ImportError as e:
        raise CliError(f"the console is not available: {e}") from None
    return run_console(cfg, host=args.host, port=args.port, server=not args.no_server)


def _local_url(host: str, port: int) -> str:
    """The configured server as a client on this machine reaches it: a wildcard bind on loopback,
    an IPv6 address in brackets."""
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def cmd_attach(args: argparse.Namespace) -> int:
    cfg = _load(args)
    url = args.url or _local_url(cfg.app.server.host, cfg.app.server.port)

    async def run() -> int:
        from aiops.client import AgentClient, AgentError

        try:
            async with AgentClient(url) as client:
                try:
                    await client.session(args.session, limit=1)
                except AgentError as e:
                    if e.status != 404:
                        raise
                    # Following an id before its first message is by design (start watching, then
                    # submit), but a mistyped id must not look like a hang: say what it waits for.
                    print(f"aiops: no session {args.session!r} on {url} yet; waiting for its first "
                          f"message (ctrl+c to stop)", file=sys.stderr, flush=True)
                async for e in client.stream(args.session):
                    print(json.dumps({"event": e["event"], **e["data"]}, default=str), flush=True)
        except AgentError as e:
            if e.code == "connection_error":
                raise CliError(f"cannot reach the aiops server at {url}: {e.message}") from None
            if e.code == "stream_cut":
                raise CliError(e.message) from None
            hint = " (set AIOPS_TOKEN to a token of the server)" if e.status == 401 else ""
            raise CliError(f"{url}: {e}{hint}") from None
        return 0

    return asyncio.run(run())


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from aiops.config import ConfigError

    handlers = {
        None: cmd_console, "console": cmd_console, "serve": cmd_serve, "chat": cmd_chat,
        "models": cmd_models, "audit": cmd_audit, "plugins": cmd_plugins, "attach": cmd_attach,
    }
    try:
        if args.command == "config":
            fn = {"paths": cmd_config_paths, "check": cmd_config_check,
                  "init": cmd_config_init}[args.config_command]
        else:
            fn = handlers[args.command]
        return fn(args)
    except (ConfigError, CliError) as e:
        print(f"aiops: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`aiops chat ... | head`): no traceback, and none at exit either.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
