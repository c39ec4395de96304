"""What every surface reads of the app and of its requests: the app's keys, its `ServerState`,
the engine and config, the caller's role, and how a streaming answer begins.

The auth middleware sets `request["role"]` ("operator" | "client") and `request["principal"]` (the
token's name, or "loopback:<addr>" when no token is configured) on every request it lets through.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.streams import StreamReader

from aiops.config import Config
from aiops.engine.bus import Subscription
from aiops.engine.engine import Engine
from aiops.integrations.server.auth import CLIENT, OPERATOR, Authenticator
from aiops.integrations.server.errors import HttpError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Closing(Exception):
    """Set on a body still being read when the shutdown begins."""


@dataclass
class ServerState:
    """What the app knows about itself: public routes, open streams, whether it is closing."""

    public: set[tuple[str, str]] = field(default_factory=set)
    streams: set[Subscription] = field(default_factory=set)
    closing: bool = False
    # Bodies still arriving: ended with Closing when the shutdown begins (see bodies.read_body).
    bodies: set[StreamReader] = field(default_factory=set)

    def begin_closing(self) -> None:
        """Refuse new requests (503), and those still waiting for their body: aiohttp stops
        reading from its connections as it shuts them down, so that body would never come and
        its request would end, at shutdown_timeout, with no answer at all."""
        self.closing = True
        for body in self.bodies:
            body.set_exception(Closing())

    @contextmanager
    def track(self, sub: Subscription) -> Iterator[Subscription]:
        """Register a stream's subscription so shutdown can end it; closes it on exit."""
        self.streams.add(sub)
        try:
            yield sub
        finally:
            self.streams.discard(sub)
            sub.close()

    def close_streams(self) -> None:
        """Shutdown: refuse new requests and end every open stream (each drains what it holds)."""
        self.begin_closing()
        for sub in list(self.streams):
            sub.close()


ENGINE_KEY = web.AppKey("aiops_engine", Engine)
CONFIG_KEY = web.AppKey("aiops_config", Config)
AUTH_KEY = web.AppKey("aiops_auth", Authenticator)
STATE_KEY = web.AppKey("aiops_state", ServerState)
AUTHENTICATED_KEY = web.RequestKey("aiops_authenticated", bool)  # a valid token (or loopback, open mode)
STREAMING_KEY = web.RequestKey("aiops_streaming", bool)  # headers sent: errors can no longer be answered


def get_engine(request: web.Request) -> Engine:
    return request.app[ENGINE_KEY]


def get_config(request: web.Request) -> Config:
    return request.app[CONFIG_KEY]


def server_state(request: web.Request) -> ServerState:
    return request.app[STATE_KEY]


def check_model(engine: Engine, key: str, param: str) -> None:
    """400 `unknown_model` / `model_disabled` (the engine's words) unless `key` may run a turn."""
    if why := engine.check_model(key):
        code = "unknown_model" if key not in engine.config.models.models else "model_disabled"
        raise HttpError(400, code, why, param=param)


def is_operator(request: web.Request) -> bool:
    return request.get("role") == OPERATOR


def require_operator(request: web.Request) -> None:
    """403 unless the caller has the operator role."""
    if not is_operator(request):
        raise HttpError(403, "forbidden",
                        f"this needs an operator token; {request.get('principal', 'the caller')} has the "
                        f"{request.get('role', CLIENT)} role")


def mark_public(app: web.Application, method: str, path: str) -> None:
    """Let `method path` through without a token (health checks, Ollama's `GET /` probe)."""
    app[STATE_KEY].public.add((method.upper(), path))


async def prepare_stream(request: web.Request, response: web.StreamResponse) -> None:
    """Send a streaming response's headers. After this, errors cannot become a new response."""
    request[STREAMING_KEY] = True
    await response.prepare(request)
