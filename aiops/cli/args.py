"""The `aiops` command line: its sub-commands and options, parsed before anything heavy is imported."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from aiops import __version__

CHAT_HELP = """\
Run one turn and stream it to stdout (a new session of kind cli, or --session's).

Exit status:
  0  the turn ended, or every !command did what it was asked; a command whose
     end state holds already succeeds too (!reset with no history, !stop with
     no turn running)
  1  the turn ended in an error, or a !command could not do what it was
     asked: unknown, not permitted, bad arguments, or naming what does not
     exist (a page past the last, a session id, a model)
  2  a usage or configuration error, or a message aiops refused to take
  130, 143, 129
     Ctrl-C, SIGTERM or SIGHUP (128 + the signal); the turn is stopped
     first, its pending gates cancelled

A message of only !commands to a new session creates no session.
--json prints one JSON object per event: see docs/API.md, "aiops chat --json".
"""


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

    class SubParser(argparse.ArgumentParser):
        """Every sub-command's parser: the common options come with it."""

        def __init__(self, **kw: Any) -> None:
            super().__init__(parents=[common], **kw)

    p = argparse.ArgumentParser(prog="aiops", description="Operator console for a multi-client AI agent.",
                                parents=[common])
    p.add_argument("--version", action="version", version=f"aiops {__version__}")
    # The console is the default sub-command, so its options work without naming it:
    # `aiops --port 18999` is `aiops console --port 18999`.
    _server_args(p)
    _console_args(p)
    sub = p.add_subparsers(dest="command", parser_class=SubParser)

    c = sub.add_parser("console", help="the full-screen console (the default)")
    _server_args(c)
    _console_args(c)

    s = sub.add_parser("serve", help="headless: the engine and the HTTP server, no console")
    _server_args(s)

    ch = sub.add_parser("chat", help="run one turn and stream it to stdout",
                        formatter_class=argparse.RawDescriptionHelpFormatter, description=CHAT_HELP)
    ch.add_argument("text", help="the message (text starting with ! or @ is a command); - reads it from stdin")
    ch.add_argument("--session", help="session id (full or shorthand); default: a new one")
    ch.add_argument("--model", help="model key for this turn")
    ch.add_argument("--json", action="store_true", help="print events as JSON lines")
    ch.add_argument("--url", default=None,
                    help="send it to the aiops at URL (default: the one running on this data dir, if any)")
    ch.add_argument("--token-env", default=None, metavar="NAME",
                    help="with a running aiops: the variable holding the token (default: AIOPS_TOKEN)")

    m = sub.add_parser("models", help="list the model registry")
    m.add_argument("--json", action="store_true")

    cfg = sub.add_parser("config", help="configuration: paths, check, init")
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True, parser_class=SubParser)
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

    mc = sub.add_parser("mcp", help="MCP servers: import a Claude Desktop configuration")
    mc_sub = mc.add_subparsers(dest="mcp_command", required=True, parser_class=SubParser)
    imp = mc_sub.add_parser("import", help="add the mcpServers of a Claude Desktop JSON file to mcp.toml")
    imp.add_argument("file", help="e.g. claude_desktop_config.json")
    imp.add_argument("--replace", action="store_true", help="overwrite servers of the same name")

    at = sub.add_parser("attach", help="the console, attached to a running aiops (URL, or this data dir's)",
                        description="The full console on a running aiops: every session, the gates inbox, "
                                    "the prompt tree and rate limits. Without URL: the aiops running on this "
                                    "data dir (its run file), else the server of aiops.toml. `aiops attach "
                                    "SESSION` (not a URL) still watches one session, as `aiops watch` does.")
    at.add_argument("session", nargs="?", default=None, metavar="URL",
                    help="e.g. http://127.0.0.1:8765 (an ssh -L tunnel's local end works too)")
    at.add_argument("--url", default=None, help="server URL (for `aiops attach SESSION`)")
    at.add_argument("--token-env", default=None, metavar="NAME",
                    help="environment variable holding the token to present (default: AIOPS_TOKEN)")
    at.add_argument("--wait", action="store_true",
                    help="`aiops attach SESSION` of a session that does not exist yet: wait for its first "
                         "message (default: exit 2)")

    w = sub.add_parser("watch", help="print one session's events of a running aiops as JSON lines (read-only)")
    w.add_argument("session", help="session id")
    w.add_argument("--url", default=None, help="server URL (default: the running aiops, else aiops.toml)")
    w.add_argument("--wait", action="store_true",
                   help="a session that does not exist yet: wait for its first message (default: exit 2)")
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
