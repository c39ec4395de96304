"""Running the server: `start_server` for an engine already running (the console), `serve` for
`aiops serve` (headless: the engine and the server on one loop, never importing Textual; the loop
itself is run by `aiops.integrations.runtime`, as the console's is).

Shutdown order on SIGINT/SIGTERM: stop listening and refuse new requests, stop the engine (running
turns are cancelled cleanly and recorded, so every stream and waiting submit sees its `done`), then
end the open streams and give the remaining requests `shutdown_timeout` seconds.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from aiops.config import Config
from aiops.engine import gc_policy
from aiops.engine.engine import Engine
from aiops.integrations.runtime import exit_if_left, run_to_exit
from aiops.integrations.server.app import create_app
from aiops.integrations.server.auth import BindRefused, Token, check_bind, load_tokens, partly_unset
from aiops.integrations.server.context import AUTH_KEY, STATE_KEY

log = logging.getLogger(__name__)

CORS_WITHOUT_TOKENS = ("cors_origins without tokens: every web page of %s can use this server as an operator "
                       "(read every session, approve gates); configure a token to require one")


# aiohttp's descriptions of a fault ("Invalid header value char", "Bad status line"); anything
# else (a quoted line, the raw request target of InvalidURLError) may hold the request's bytes.
_FAULT = re.compile(r"[A-Za-z][A-Za-z ,-]{2,60}")


class MalformedRequestFilter(logging.Filter):
    """aiohttp logs a request it cannot parse (a NUL in a header, a space in a header name) as an
    ERROR with a traceback and the offending line. The client already got its 400; the line may
    hold its token, and anyone who can connect could fill the log with them. Such a record becomes
    one line (INFO, or lower when aiohttp chose lower) naming the address and the kind of fault,
    never the bytes."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, RequestPayloadError) and isinstance(exc.__cause__, HttpProcessingError):
            # A body that does not decode (bad gzip): the handler answered 400 already; this is
            # aiohttp failing again as it drains the rest of the body. Nothing to add.
            return False
        if isinstance(exc, HttpProcessingError) and 400 <= (exc.code or 0) < 500:
            first = next((line.strip() for line in exc.message.splitlines() if line.strip()), "")
            first = first.rstrip(":").strip()
            fault = first if _FAULT.fullmatch(first) else type(exc).__name__
            remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            level = min(record.levelno, logging.INFO)
            record.levelno, record.levelname = level, logging.getLevelName(level)
            record.msg, record.args = "malformed HTTP request from %s (%d): %s", (remote, exc.code, fault)
            record.exc_info = record.exc_text = None
        return True


class AcceptFailureFilter(logging.Filter):
    """Out of file descriptors (clients holding more connections than `ulimit -n` allows), asyncio
    logs "socket.accept() out of system resource" with a traceback for every failed accept, up to
    the backlog each time it retries: thousands of lines a second, enough to fill a disk. One line
    per `interval` says what happens and how many were left out."""

    _PREFIX = "socket.accept() out of system resource"

    def __init__(self, interval: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.interval = interval
        self._clock = clock
        self._next = 0.0
        self._left_out = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not (isinstance(record.msg, str) and record.msg.startswith(self._PREFIX)):
            return True
        now = self._clock()
        if now < self._next:
            self._left_out += 1
            return False
        exc = record.exc_info[1] if record.exc_info else None
        record.msg = ("cannot accept connections: %s (%d more such failures in the last %.0f s); "
                      "clients hold too many connections, or raise the open-file limit (ulimit -n %d)")
        record.args = (exc.strerror if isinstance(exc, OSError) else exc, self._left_out, self.interval,
                       _open_file_limit())
        record.exc_info = record.exc_text = None
        self._next, self._left_out = now + self.interval, 0
        return True


def _open_file_limit() -> int:
    try:
        import resource
    except ImportError:  # not on Windows
        return -1
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def raise_open_file_limit() -> None:
    """Every connection is a file descriptor, and a soft limit of 1024 (a common default) is
    reached by a few hundred idle clients: take what the hard limit allows, as servers do."""
    try:
        import resource
    except ImportError:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError) as e:
            log.debug("open-file limit stays %d: %s", soft, e)


def _install_log_filters() -> None:
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, MalformedRequestFilter) for f in server_log.filters):
        server_log.addFilter(MalformedRequestFilter())
    loop_log = logging.getLogger("asyncio")
    if not any(isinstance(f, AcceptFailureFilter) for f in loop_log.filters):
        loop_log.addFilter(AcceptFailureFilter())


class ServerStartError(Exception):
    """The server could not listen (address in use, permission); the message is for the operator."""


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@dataclass
class ServerHandle:
    """A running server. `urls[0]` is the main listener (with the real port when 0 was asked)."""

    runner: web.AppRunner
    app: web.Application
    host: str
    sites: list[web.TCPSite] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    _stopped: bool = False
    mcp: Any = None  # the /mcp endpoint (aiops.integrations.mcp.endpoint), on its own port

    @property
    def url(self) -> str:
        return self.urls[0]

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    @property
    def token_count(self) -> int:
        return len(self.app[AUTH_KEY].tokens)

    def connected_clients(self) -> int:
        """Event streams open right now (API streams, proxy streams that track theirs, and attached
        consoles' operator streams)."""
        from aiops.integrations.server.operator_api import FEED_KEY

        return len(self.app[STATE_KEY].streams) + self.app[FEED_KEY].readers

    async def close_listeners(self) -> None:
        """Stop accepting connections; requests on open connections get 503 from now on."""
        self.app[STATE_KEY].begin_closing()
        for site in list(self.runner.sites):
            await site.stop()

    async def stop(self) -> None:
        """End open streams, let open requests finish (up to shutdown_timeout), close everything."""
        if self._stopped:
            return
        self._stopped = True
        if self.mcp is not None:
            await self.mcp.stop()
        self.app[STATE_KEY].close_streams()
        await self.runner.cleanup()


async def start_server(engine: Engine, cfg: Config | None = None, host: str | None = None,
                       port: int | None = None, *, env: Mapping[str, str] | None = None,
                       tokens: list[Token] | None = None) -> ServerHandle:
    """Serve every surface for `engine` (already started) on `host:port` and each extra port.

    Raises BindRefused for a non-loopback bind without tokens and ServerStartError when a port
    cannot be bound.
    """
    cfg = cfg or engine.config
    server = cfg.app.server
    env = env if env is not None else engine.env
    host = server.host if host is None else host
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]  # an IPv6 address as written in a URL
    port = server.port if port is None else port
    if tokens is None:
        tokens = load_tokens(cfg.app.auth, env)
    check_bind(host, tokens, cfg.app.auth, env)
    if server.cors_origins and not tokens:
        log.warning(CORS_WITHOUT_TOKENS, ", ".join(server.cors_origins))
    app = create_app(engine, cfg, tokens=tokens)
    _install_log_filters()
    raise_open_file_limit()
    # handler_cancellation: a client that hangs up cancels its handler (streams end, subscriptions
    # close). Access logging is off: requests are logged by our own code when it matters.
    # keepalive_timeout: aiohttp's timer for a connection waiting for its next request, from the
    # connection or the last response; it is the only limit on headers that never finish (no
    # handler runs before they do), so it gets request_timeout instead of aiohttp's hour.
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True,
                           shutdown_timeout=server.shutdown_timeout,
                           keepalive_timeout=server.request_timeout)
    await runner.setup()
    handle = ServerHandle(runner, app, host)
    ports = [port]
    for p in server.extra_ports:
        if p in ports:
            # Listening twice on one port fails as if another program held it: say what it is.
            log.warning("extra_ports in aiops.toml lists port %d, which aiops already listens on; "
                        "listening on it once", p)
        else:
            ports.append(p)
    for p in ports:
        site = web.TCPSite(runner, host or None, p)
        try:
            await site.start()
        except OSError as e:
            await runner.cleanup()
            where = _url(host or "0.0.0.0", p)
            if e.errno == errno.EADDRINUSE:
                raise ServerStartError(f"cannot listen on {where}: port {p} is in use by another program; stop "
                                       f"it, or choose another port (--port, or port/extra_ports in aiops.toml; "
                                       f"--port 0 picks a free one)") from None
            if e.errno == errno.EACCES:
                raise ServerStartError(f"cannot listen on {where}: permission denied (ports below 1024 need "
                                       f"privileges; choose another with --port)") from None
            raise ServerStartError(f"cannot listen on {where}: {e.strerror or e}") from None
        handle.sites.append(site)
    for addr in runner.addresses:
        url = _url(str(addr[0]), int(addr[1]))
        if url not in handle.urls:
            handle.urls.append(url)
    from aiops.integrations.mcp.endpoint import start_for_server

    handle.mcp = await start_for_server(engine, cfg, host, handle.port, tokens)
    log.info("serving on %s (%d token(s))", ", ".join(handle.urls), len(tokens))
    return handle


def _banner(handle: ServerHandle, unset: list[str]) -> str:
    parts = ["API /api/v1", "OpenAI /v1", "Ollama /api"]
    if handle.mcp is not None:
        parts.append(f"MCP {handle.mcp.url}")
    if len(handle.urls) > 1:
        parts.append("also " + ", ".join(handle.urls[1:]))
    if handle.token_count:
        parts.append(f"{handle.token_count} token(s)")
    else:
        parts.append("no tokens: loopback callers are operators")
    return f"aiops serving on {handle.url} ({'; '.join(parts)})"


async def _serve(cfg: Config, host: str | None, port: int | None, lock: Any = None) -> int:
    env = os.environ
    server = cfg.app.server
    host = server.host if host is None else host
    unset = partly_unset(cfg.app.auth, env)
    for var in unset:
        print(f"aiops: warning: auth token not configured: {var} is unset", file=sys.stderr)
    try:
        tokens = load_tokens(cfg.app.auth, env)
        if cfg.app.server.cors_origins and not tokens:
            print("aiops: warning: " + CORS_WITHOUT_TOKENS % ", ".join(cfg.app.server.cors_origins),
                  file=sys.stderr)
        check_bind(host, tokens, cfg.app.auth, env)
    except BindRefused as e:
        print(f"aiops: {e}", file=sys.stderr)
        return 2

    engine = Engine(cfg)
    await engine.start()
    await engine.close_left_open(lock)
    for p in engine.plugin_status:
        if p.state == "failed":
            print(f"aiops: plugin {p.name} {p.state}: {p.reason}", file=sys.stderr)
    if skipped := [p.name for p in engine.plugin_status if p.state == "skipped"]:
        # A data tool without its key (or swarm without peers) is skipped on every start: one line,
        # not one each, and no reason guessed for all of them.
        print(f"aiops: plugins skipped (`aiops plugins` says why): "
              f"{', '.join(skipped)}", file=sys.stderr)
    try:
        handle = await start_server(engine, cfg, host, port, env=env, tokens=tokens)
    except (ServerStartError, BindRefused) as e:
        print(f"aiops: {e}", file=sys.stderr)
        await engine.stop()
        return 1

    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    if lock is not None and handle.urls:
        lock.update(url=handle.urls[0])
    gc_policy.settle()  # start-up is over: see gc_policy
    if cfg.app.server.mcp_enabled and handle.mcp is None:
        # The rest serves; said here, not only in /api/v1/health, as a port clash is found at once.
        from aiops.integrations.mcp.endpoint import endpoint_status

        why = (endpoint_status(engine) or {}).get("error") or "it did not start"
        print(f"aiops: warning: /mcp is not served: {why}", file=sys.stderr)
    print(_banner(handle, unset), flush=True)
    try:
        await stopping.wait()
    finally:
        log.info("shutting down")
        await handle.close_listeners()
        await engine.stop()
        await handle.stop()
        # The handlers stay until the loop closes: a second signal during the stop only sets
        # `stopping` again (see serve for the rest of the exit).
    log.info("stopped")
    return 0


def serve(cfg: Config, host: str | None = None, port: int | None = None) -> int:
    """`aiops serve`: run until SIGINT/SIGTERM; the exit status (2: refused to bind, or another
    aiops already holds the data dir)."""
    from aiops.engine.lock import AlreadyRunning, DataDirLock

    lock = DataDirLock(cfg.paths.lock_path)
    try:
        lock.acquire()
    except AlreadyRunning as e:
        print(f"aiops: {e}", file=sys.stderr)
        return 2
    rc, left = 1, [0]
    try:
        rc = run_to_exit(lambda loop: loop.run_until_complete(_serve(cfg, host, port, lock)), left)
        return rc
    except BaseException:
        if left[0]:
            log.exception("aiops serve ended with an error")
        raise
    finally:
        lock.release()
        exit_if_left(left[0], rc)
