"""`aiops console` and `aiops serve`, which run the engine and its HTTP server, and `aiops attach`,
which follows a session of a running one."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys

from aiops.cli.common import CliError, load, setup_file_logging


def cmd_serve(args: argparse.Namespace) -> int:
    cfg = load(args)
    setup_file_logging(cfg, args.verbose)
    try:
        from aiops.integrations.server.run import serve
    except ImportError:
        raise CliError("the HTTP server is not available in this build") from None
    return serve(cfg, host=args.host, port=args.port)


def cmd_console(args: argparse.Namespace) -> int:
    # The collector is off while the console's modules load (half a million objects that live as
    # long as the process: walked again and again, they took ~0.08 s of CPU before the first
    # frame); run_console freezes them and turns it back on (aiops/tui/running.py).
    gc.disable()
    try:
        cfg = load(args)
        setup_file_logging(cfg, args.verbose)
        try:
            from aiops.tui.app import run_console
        except ImportError as e:
            raise CliError(f"the console is not available: {e}") from None
        return run_console(cfg, host=args.host, port=args.port, server=not args.no_server)
    finally:
        gc.enable()


def _local_url(host: str, port: int) -> str:
    """The configured server as a client on this machine reaches it: a wildcard bind on loopback,
    an IPv6 address in brackets."""
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def cmd_attach(args: argparse.Namespace) -> int:
    cfg = load(args)
    url = args.url or _local_url(cfg.app.server.host, cfg.app.server.port)

    async def run() -> int:
        from aiops.client import AgentClient, AgentError

        try:
            async with AgentClient(url) as client:
                try:
                    await client.session(args.session, limit=1)
                except AgentError as missing:
                    if missing.status != 404:
                        raise
                    if not args.wait:
                        # A mistyped id waited forever without a word (issue 21): an error, unless
                        # the caller means to start watching before the session's first message.
                        raise CliError(f"no session {args.session!r} on {url} (`aiops watch --wait "
                                       f"{args.session}` waits for its first message)") from None
                    print(f"aiops: no session {args.session!r} on {url} yet; waiting for its first "
                          f"message (ctrl+c to stop)", file=sys.stderr, flush=True)
                async for item in client.stream(args.session):
                    print(json.dumps({"event": item["event"], **item["data"]}, default=str), flush=True)
        except AgentError as e:
            if e.code == "connection_error":
                raise CliError(f"cannot reach the aiops server at {url}: {e.message}") from None
            if e.code == "stream_cut":
                raise CliError(e.message) from None
            hint = " (set AIOPS_TOKEN to a token of the server)" if e.status == 401 else ""
            raise CliError(f"{url}: {e}{hint}") from None
        return 0

    return asyncio.run(run())
