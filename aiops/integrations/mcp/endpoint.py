"""The /mcp endpoint: the SDK's streamable-HTTP app on its own port, behind the API's token check.

Why its own port and not a route of the aiohttp app: the SDK serves an ASGI (Starlette) app whose
session manager lives in the app's lifespan and whose responses are long SSE streams tied to
anyio cancel scopes. Bridging that into aiohttp means a hand-written ASGI adapter (request body,
streaming, disconnects, lifespan) in the middle of every MCP request; uvicorn runs it as the SDK
intends. So the endpoint listens on `[server] mcp_port` (default: the main port + 1; 0 when the
main port is 0), on the same host, bound right after the main listeners and stopped with them;
the SDK's app is built on the first authenticated request (LazyApp).

Authentication is the JSON API's, with the same functions (aiops.integrations.server.auth): a
configured token's role, or — with no tokens — loopback callers addressed by a loopback name act
as operators. Requests from web pages (an Origin header) are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import socket
import weakref
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import uvicorn  # (0.1 s to import; the SDK itself loads on the first MCP request)

from aiops.integrations.mcp.identity import SCOPE_KEY, Identity
from aiops.integrations.server.auth import (
    OPERATOR,
    Authenticator,
    Token,
    addressed_to_loopback,
    bearer,
    is_loopback_peer,
)

if TYPE_CHECKING:
    from aiops.config import Config
    from aiops.engine.engine import Engine
    from aiops.integrations.mcp.server import AiopsMcp

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
PATH = "/mcp"


async def _answer(send: Send, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class AuthMiddleware:
    """Who is calling, decided exactly as the JSON API's auth middleware decides it."""

    def __init__(self, app: ASGIApp, authn: Authenticator) -> None:
        self.app = app
        self.authn = authn

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        peer = (scope.get("client") or (None, None))[0]
        if "origin" in headers:
            await _answer(send, 403, "forbidden", "requests from web pages are refused on /mcp")
            return
        if self.authn.open:
            if not is_loopback_peer(peer):
                await _answer(send, 403, "forbidden", "no auth token is configured, so only loopback callers "
                                                      "are served")
                return
            if not addressed_to_loopback(headers.get("host")):
                await _answer(send, 403, "forbidden", "no auth token is configured, so only requests addressed "
                                                      "to a loopback name are served")
                return
            ident = Identity(f"loopback:{peer}", True)
        else:
            presented = bearer(headers.get("authorization"))
            token = self.authn.match(presented) if presented is not None else None
            if token is None:
                what = "missing bearer token" if presented is None else "invalid bearer token"
                await _answer(send, 401, "unauthorized", what, {"WWW-Authenticate": 'Bearer realm="aiops"'})
                return
            ident = Identity(token.name, token.role == OPERATOR)
        scope[SCOPE_KEY] = ident
        await self.app(scope, receive, send)


def _load_sdk() -> Any:
    """The MCP server module: about 1.5 s of CPU to import (the SDK's pydantic models), so it is
    imported off the event loop, and only when the first MCP request arrives."""
    from aiops.integrations.mcp import server

    return server


class LazyApp:
    """The SDK's app, built on the first (authenticated) request rather than at start-up: a server
    nobody talks MCP to pays nothing for it. Its lifespan (the SDK's session manager) is held open
    by one task from then until `close`, as anyio wants it entered and left by the same task."""

    def __init__(self, engine: Engine, host: str) -> None:
        self.engine = engine
        self.host = host
        self.aiops_mcp: AiopsMcp | None = None
        self._app: ASGIApp | None = None
        self._lock = asyncio.Lock()
        self._holder: asyncio.Task[None] | None = None
        self._release = asyncio.Event()

    async def _build(self) -> ASGIApp:
        async with self._lock:
            if self._app is not None:
                return self._app
            server_module = await asyncio.to_thread(_load_sdk)
            aiops_mcp = server_module.AiopsMcp(self.engine)
            app = aiops_mcp.mcp.streamable_http_app(streamable_http_path=PATH, host=self.host)
            ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()

            async def hold() -> None:
                try:
                    async with app.router.lifespan_context(app):
                        ready.set_result(None)
                        await self._release.wait()
                except BaseException as e:
                    if not ready.done():
                        ready.set_exception(e)
                    raise

            self._holder = asyncio.get_running_loop().create_task(hold(), name="mcp-lifespan")
            await ready
            aiops_mcp.start()
            self.aiops_mcp, self._app = aiops_mcp, app
            return app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # lifespan is off in uvicorn: the SDK's runs in `hold`
        app = self._app or await self._build()
        await app(scope, receive, send)

    async def close(self) -> None:
        self._release.set()
        if self._holder is not None:
            await asyncio.gather(self._holder, return_exceptions=True)
        if self.aiops_mcp is not None:
            await self.aiops_mcp.stop()


class _Quiet(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # aiops handles SIGINT/SIGTERM itself (the console, `aiops serve`); uvicorn must not.
        yield


@dataclass
class McpEndpoint:
    url: str
    server: uvicorn.Server
    task: asyncio.Task[None]
    app: LazyApp

    async def stop(self) -> None:
        # Open streams are cut after timeout_graceful_shutdown; then the SDK's lifespan ends.
        self.server.should_exit = True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                await asyncio.gather(self.task, return_exceptions=True)
        if not self.task.done():
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        await self.app.close()


def mcp_port(cfg: Config, main_port: int) -> int:
    configured = cfg.app.server.mcp_port
    if configured is not None:
        return configured
    return 0 if cfg.app.server.port == 0 or main_port == 0 else main_port + 1


def _url(host: str, port: int) -> str:
    h = f"[{host}]" if ":" in host else host
    return f"http://{h}:{port}{PATH}"


async def start_mcp_endpoint(engine: Engine, cfg: Config, host: str, main_port: int,
                             tokens: list[Token]) -> McpEndpoint:
    """Bind and serve /mcp; OSError (with a message naming the port) when it cannot be bound."""
    port = mcp_port(cfg, main_port)
    bind_host = host or "0.0.0.0"
    try:
        sock = socket.create_server((bind_host, port), family=socket.AF_INET6 if ":" in bind_host else socket.AF_INET,
                                    reuse_port=False)
    except OSError as e:
        reason = "in use by another program" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
        raise OSError(e.errno, f"cannot listen for MCP on {bind_host}:{port}: {reason} (mcp_port in aiops.toml)") \
            from None
    sock.setblocking(False)
    app = LazyApp(engine, bind_host)
    config = uvicorn.Config(AuthMiddleware(app, Authenticator(tokens)), lifespan="off", log_config=None,
                            access_log=False, log_level="warning", timeout_graceful_shutdown=1)
    server = _Quiet(config)
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]), name="mcp-endpoint")
    while not server.started and not task.done():  # noqa: ASYNC110 - uvicorn offers only this flag
        await asyncio.sleep(0.01)
    if task.done():
        sock.close()
        why: BaseException | str | None = task.exception() if not task.cancelled() else "cancelled"
        raise OSError(errno.EIO, f"the MCP endpoint did not start: {why}")
    url = _url(host or "0.0.0.0", sock.getsockname()[1])
    log.info("MCP endpoint at %s", url)
    return McpEndpoint(url, server, task, app)


# Where each engine's endpoint is, for /api/v1/health (None: not serving, with the reason).
_WHERE: weakref.WeakKeyDictionary[Any, tuple[str | None, str]] = weakref.WeakKeyDictionary()


def endpoint_status(engine: Engine) -> dict[str, Any] | None:
    """`{"url": ..., "error": ...}` for /api/v1/health; None when /mcp is switched off."""
    where = _WHERE.get(engine)
    if where is None:
        return None
    url, error = where
    return {"url": url, **({"error": error} if error else {})}


async def start_for_server(engine: Engine, cfg: Config, host: str, main_port: int,
                           tokens: list[Token]) -> McpEndpoint | None:
    """The server's hook: start /mcp unless `mcp_enabled = false`. A port that cannot be bound is
    logged and shown in /api/v1/health; the rest of the server runs without /mcp."""
    if not cfg.app.server.mcp_enabled:
        return None
    try:
        endpoint = await start_mcp_endpoint(engine, cfg, host, main_port, tokens)
    except OSError as e:
        log.error("%s", e.strerror or e)
        _WHERE[engine] = (None, str(e.strerror or e))
        return None
    _WHERE[engine] = (endpoint.url, "")
    return endpoint


def mcp_health(engine: Engine, operator: bool) -> dict[str, Any] | None:
    """/api/v1/health's `mcp`: where /mcp is, and — for operators — the external servers' state
    (with a failing stdio server's stderr tail, which may name paths or hosts)."""
    out: dict[str, Any] = {}
    if (where := endpoint_status(engine)) is not None:
        out["endpoint"] = where
    host = engine.plugin("mcp")
    status = getattr(host, "status", None)
    if operator and callable(status):
        out["servers"] = status()
    return out or None
