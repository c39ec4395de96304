"""The `aiops` command.

Argument parsing comes first and heavy imports happen inside each sub-command, so `aiops --help`
and `aiops config paths` stay instant and `aiops serve` never imports Textual.

The sub-commands live in the modules of this package, by concern: args (the parser), common (what
they share), config (config paths/check/init, mcp import), reports (models, plugins, audit), chat,
server (console, serve, watch), attach (the attached console), remote_chat (`aiops chat`
through a running aiops).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import NoReturn

from aiops.cli.args import parse_args
from aiops.cli.attach import cmd_attach_any, cmd_watch
from aiops.cli.chat import _rule_hint, cmd_chat
from aiops.cli.common import CliError, parse_since
from aiops.cli.config import cmd_config_check, cmd_config_init, cmd_config_paths, cmd_mcp_import
from aiops.cli.reports import cmd_audit, cmd_models, cmd_plugins
from aiops.cli.server import cmd_console, cmd_serve

__all__ = ["CliError", "_rule_hint", "main", "parse_args", "parse_since", "run"]

_last_command: str | None = None  # the sub-command main() ran last (for run())


def run() -> NoReturn:
    """The `aiops` command (its console script, and `python -m aiops.cli`): main(), then its exit
    status; after `aiops chat`, without the interpreter's teardown (see _exit_now)."""
    code = main()
    if _last_command == "chat":
        _exit_now(code)
    sys.exit(code)


def _exit_now(code: int) -> NoReturn:
    """Exit at once, skipping the interpreter's teardown of every module imported: after `aiops
    chat`'s answer that took 0.25-0.6 s on an idle machine, more than a second on a loaded one
    (docs/PERFORMANCE.md, issue 27). What a normal exit does that anyone would notice is done
    first: the atexit hooks run (logging's flush and close among them, and any an embedder
    registered) and stdout and stderr are flushed. The store is closed by then (the engine stops
    before main() returns). A non-daemon thread still running gets the normal exit, which waits
    for it; so does a run under a profiler, a tracer or coverage (`python -m cProfile -m aiops.cli
    chat …` writes its figures after this would have ended the process)."""
    import atexit
    import os
    import threading

    if sys.getprofile() is not None or sys.gettrace() is not None or any(
            t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        code = code or 120  # what Python exits with when it cannot flush them
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    global _last_command
    args = parse_args(argv)
    _last_command = args.command
    # (aiops.paths, not aiops.config: the exceptions without pydantic, for `aiops chat`'s remote path)
    from aiops.paths import ConfigError, DataDirUnusable

    handlers = {
        None: cmd_console, "console": cmd_console, "serve": cmd_serve, "chat": cmd_chat,
        "models": cmd_models, "audit": cmd_audit, "plugins": cmd_plugins, "attach": cmd_attach_any,
        "watch": cmd_watch,
    }
    try:
        if args.command == "config":
            fn = {"paths": cmd_config_paths, "check": cmd_config_check,
                  "init": cmd_config_init}[args.config_command]
        elif args.command == "mcp":
            fn = cmd_mcp_import
        else:
            fn = handlers[args.command]
        return fn(args)
    except (ConfigError, CliError, DataDirUnusable) as e:
        print(f"aiops: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`aiops chat ... | head`): no traceback, and none at exit either.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
