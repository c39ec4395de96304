"""The aiohttp application: one app for every HTTP surface, its middlewares and shared helpers.

Three surfaces share the app and each keeps its own error shape: ours (`{"error": {"code",
"message"}}`) on `/api/v1`, OpenAI's error object on `/v1`, Ollama's `{"error": "..."}` on `/api/*`
(and `/`). Errors the middlewares produce (401, 403, 404, 405, 408, 413, malformed JSON, 500) take
the shape of the path they answer. Handlers raise `HttpError` and get the same treatment.

The auth middleware sets `request["role"]` ("operator" | "client") and `request["principal"]` (the
token's name, or "loopback:<addr>" when no token is configured) on every request it lets through.

For the proxy modules: `get_engine(request)`, `get_config(request)`, `require_operator(request)`,
`read_json(request)`, `parse_body(request, Model)`, `mark_public(app, method, path)`,
`prepare_stream(request, response)` and `server_state(request).track(subscription)`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
import warnings
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from aiohttp import web
from aiohttp.streams import StreamReader
from aiohttp.typedefs import Middleware
from aiohttp.web_exceptions import NotAppKeyWarning
from aiohttp.web_protocol import RequestPayloadError
from pydantic import BaseModel, ValidationError

from aiops.config import Config
from aiops.engine.bus import Subscription
from aiops.engine.engine import Engine, EngineStopping
from aiops.integrations.server.auth import (
    CLIENT,
    OPERATOR,
    Authenticator,
    AuthThrottled,
    FailedAuthThrottle,
    Identity,
    Token,
    addressed_to_loopback,
    bearer,
    is_loopback_peer,
    load_tokens,
)

log = logging.getLogger(__name__)

# request["role"] and request["principal"] are plain string keys on purpose: they are the contract
# every surface reads. aiohttp would rather see RequestKey objects; its hint is silenced for this module.
warnings.filterwarnings("ignore", category=NotAppKeyWarning, module=__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Surface = Literal["api", "openai", "ollama"]
M = TypeVar("M", bound=BaseModel)


class _Closing(Exception):
    """Set on a body still being read when the shutdown begins."""


@dataclass
class ServerState:
    """What the app knows about itself: public routes, open streams, whether it is closing."""

    public: set[tuple[str, str]] = field(default_factory=set)
    streams: set[Subscription] = field(default_factory=set)
    closing: bool = False
    # Bodies still arriving: ended with _Closing when the shutdown begins (see read_body).
    bodies: set[StreamReader] = field(default_factory=set)

    def begin_closing(self) -> None:
        """Refuse new requests (503), and those still waiting for their body: aiohttp stops
        reading from its connections as it shuts them down, so that body would never come and
        its request would end, at shutdown_timeout, with no answer at all."""
        self.closing = True
        for body in self.bodies:
            body.set_exception(_Closing())

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
ORIGINS_KEY = web.AppKey("aiops_cors_origins", re.Pattern)  # cors_origins, compiled (see cors.py)


def allowed_origin(request: web.Request) -> str | None:
    """The request's Origin when `cors_origins` allows it (None: no Origin, or not allowed)."""
    pattern = request.app.get(ORIGINS_KEY)
    origin = request.headers.get("Origin")
    if pattern is None or not origin or not pattern.match(origin.lower()):
        return None
    return origin


# ---- errors -----------------------------------------------------------------------------------------


class HttpError(Exception):
    """An HTTP error answered in the shape of the surface the request came to."""

    def __init__(self, status: int, code: str, message: str, *, param: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.headers = dict(headers or {})


def surface_for(path: str) -> Surface:
    """Which error shape a path answers in, by prefix (never by guessing from the body)."""
    if path == "/api/v1" or path.startswith("/api/v1/"):
        return "api"
    if path.startswith("/v1/api/"):
        return "ollama"  # the legacy alias of the Ollama routes
    if path == "/v1" or path.startswith("/v1/"):
        return "openai"
    if path == "/" or path == "/api" or path.startswith("/api/"):
        return "ollama"
    return "api"


_OPENAI_TYPES = {401: "invalid_request_error", 403: "permission_error", 429: "rate_limit_error"}


def error_body(surface: Surface, err: HttpError) -> dict[str, Any]:
    if surface == "openai":
        etype = _OPENAI_TYPES.get(err.status, "server_error" if err.status >= 500 else "invalid_request_error")
        code = "invalid_api_key" if err.status == 401 else err.code
        return {"error": {"message": err.message, "type": etype, "param": err.param, "code": code}}
    if surface == "ollama":
        return {"error": err.message}
    return {"error": {"code": err.code, "message": err.message}}


# The openai SDK retries a 409 or a 5xx twice by default. A proxied turn that failed has run, its
# tools included, and a retry would look like a regenerated message: it would run again, in a fork.
# `x-should-retry: false` is the SDK's own switch; 408, 429 and 503 `unavailable` (nothing ran)
# stay retryable. (A 503 `shutting_down`, a turn the shutdown cut, sets the header itself.)
_NO_RETRY = frozenset({409, 500, 502})


def error_response(request: web.Request, err: HttpError) -> web.Response:
    surface = surface_for(request.path)
    resp = web.json_response(error_body(surface, err), status=err.status)
    resp.headers.update(err.headers)
    if surface == "openai" and err.status in _NO_RETRY:
        resp.headers.setdefault("x-should-retry", "false")
    if err.status == 413 or err.headers.get("Connection") == "close":
        # The rest of the body is not read (an oversized one, or one the shutdown refused): the
        # connection ends with the answer (aiohttp then says `Connection: close` and means it).
        resp.force_close()
    return resp


def _from_http_exception(request: web.Request, e: web.HTTPException) -> HttpError:
    headers: dict[str, str] = {}
    if e.status == 404:
        return HttpError(404, "not_found", f"no route {request.method} {request.path}")
    if e.status == 405:
        allow = e.headers.get("Allow", "")
        if allow:
            headers["Allow"] = allow
        return HttpError(405, "method_not_allowed",
                         f"{request.method} is not allowed on {request.path}"
                         + (f" (allowed: {allow})" if allow else ""), headers=headers)
    if e.status == 413:
        limit = request.app[CONFIG_KEY].app.server.max_body_bytes
        return HttpError(413, "payload_too_large",
                         f"request body too large: the limit is {limit} bytes (max_body_bytes in aiops.toml)")
    code = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 408: "request_timeout",
            409: "conflict", 429: "rate_limited", 503: "unavailable"}.get(e.status, "http_error")
    return HttpError(e.status, code, e.text or e.reason)


# ---- request helpers -------------------------------------------------------------------------------


def get_engine(request: web.Request) -> Engine:
    return request.app[ENGINE_KEY]


def check_model(engine: Engine, key: str, param: str) -> None:
    """400 `unknown_model` / `model_disabled` (the engine's words) unless `key` may run a turn."""
    if why := engine.check_model(key):
        code = "unknown_model" if key not in engine.config.models.models else "model_disabled"
        raise HttpError(400, code, why, param=param)


def get_config(request: web.Request) -> Config:
    return request.app[CONFIG_KEY]


def server_state(request: web.Request) -> ServerState:
    return request.app[STATE_KEY]


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


async def read_body(request: web.Request) -> bytes:
    """The raw body, bounded by max_body_bytes (413) and request_timeout (408); 503 when the
    server begins to shut down before it has all arrived."""
    timeout = request.app[CONFIG_KEY].app.server.request_timeout
    try:
        async with asyncio.timeout(timeout):
            if request.content.is_eof():  # all here already (nearly always): nothing to wait for
                return await request.read()
            return await _read_unless_closing(request, request.app[STATE_KEY])
    except TimeoutError:
        raise HttpError(408, "request_timeout",
                        f"the request body did not arrive within {timeout:g} s") from None
    except RequestPayloadError as e:
        # A Content-Encoding (gzip, deflate, br) whose data does not decode: the client's fault.
        cause = e.__cause__ or e
        raise HttpError(400, "invalid_body", f"the request body could not be decoded "
                        f"(Content-Encoding: {request.headers.get('Content-Encoding', 'none')}): "
                        f"{getattr(cause, 'message', None) or cause}") from None


async def _read_unless_closing(request: web.Request, state: ServerState) -> bytes:
    if not state.closing:
        state.bodies.add(request.content)
        try:
            return await request.read()
        except _Closing:
            pass
        finally:
            state.bodies.discard(request.content)
    raise _shutting_down(request)


def _shutting_down(request: web.Request, why: str = "the request body had not all arrived, nothing of it "
                   "was taken in") -> HttpError:
    """503 for a request the shutdown refuses. What is left of its body is not read (aiohttp drops
    it once the shutdown closes the connection): ended here, so that aiohttp answers and closes the
    connection at once rather than waiting up to 10 s (its lingering time) for the rest."""
    if not request.content.is_eof():
        request.content.feed_eof()
    return HttpError(503, "unavailable", f"the server is shutting down; {why}", headers={"Connection": "close"})


# A `\uD800`-`\uDFFF` escape: json.loads turns a pair of them into one character, but leaves a
# lone one as a surrogate, which no UTF-8 encoder (SQLite's, hashlib's, a socket's) accepts.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _lone_surrogate(value: Any) -> bool:
    # A stack, not recursion: JSON nested as deep as the parser allows must not overflow here.
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


class _NotJson(Exception):
    pass


def _not_json(word: str) -> Any:
    # Python's parser takes NaN, Infinity and -Infinity; JSON has no such numbers.
    raise _NotJson(word)


_DECODER = json.JSONDecoder(parse_constant=_not_json)


# A body this large is decoded on a worker thread: a chat UI resending a chat's screenshots sends
# tens of MB, ~50 ms of parsing that would otherwise hold every other stream up.
PARSE_IN_THREAD_BYTES = 1 << 20


async def read_json(request: web.Request) -> Any:
    """The body parsed as JSON; 400 `invalid_json` with the position when it is not."""
    raw = await read_body(request)
    if len(raw) >= PARSE_IN_THREAD_BYTES:
        return await asyncio.to_thread(_parse_json, raw)
    return _parse_json(raw)


def _parse_json(raw: bytes) -> Any:
    if not raw.strip():
        raise HttpError(400, "invalid_json", "the request body is empty; expected a JSON object")
    encoding = json.detect_encoding(raw)  # UTF-8, or UTF-16/32 by their BOM or NUL bytes, as json.loads
    try:
        # Strict, unlike json.loads' "surrogatepass": encoded surrogates (CESU-8, WTF-8) are not
        # Unicode, and no encoder after this one (SQLite's, hashlib's) would accept them.
        text = raw.decode(encoding)
        # One decoder made once: json.loads with an option builds one per call.
        data = _DECODER.decode(text)
    except _NotJson as e:
        raise HttpError(400, "invalid_json", f"malformed JSON body: {e} is not JSON (a number must be "
                                             f"finite)") from None
    except json.JSONDecodeError as e:
        # Some messages end in "at" themselves ("Unterminated string starting at").
        raise HttpError(400, "invalid_json", f"malformed JSON body: {e.msg.removesuffix(' at')} at line "
                                             f"{e.lineno} column {e.colno}") from None
    except UnicodeDecodeError:
        name = encoding.upper().removesuffix("-SIG")  # "UTF-8", "UTF-16-LE", …
        raise HttpError(400, "invalid_json", f"malformed JSON body: not valid {name}") from None
    except ValueError:
        # The only other ValueError of json.loads: an integer past Python's conversion limit.
        raise HttpError(400, "invalid_json", f"malformed JSON body: a number has more than "
                                             f"{sys.get_int_max_str_digits()} digits") from None
    except RecursionError:
        raise HttpError(400, "invalid_json", "malformed JSON body: arrays or objects nested too deeply") from None
    if _SURROGATE_ESCAPE.search(text) and _lone_surrogate(data):
        raise HttpError(400, "invalid_json", "malformed JSON body: a string holds an unpaired UTF-16 "
                                             "surrogate escape (\\uD800-\\uDFFF), which is not valid Unicode")
    return data


def validation_message(err: ValidationError) -> tuple[str, str | None]:
    """One line naming every bad field, and the first field's name."""
    parts: list[str] = []
    first: str | None = None
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "body"
        first = first or loc
        msg = "unknown field" if e["type"] == "extra_forbidden" else e["msg"]
        if e["type"] == "missing":
            msg = "required field is missing"
        parts.append(f"{loc}: {msg}")
    return "invalid request: " + "; ".join(parts), first


def json_type(value: Any) -> str:
    """A parsed JSON value's type as JSON names it (a client never wrote `NoneType`)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return {str: "a string", list: "an array", dict: "an object"}.get(type(value), type(value).__name__)


def validate(model: type[M], data: Any, what: str = "request body") -> M:
    if not isinstance(data, dict):
        raise HttpError(400, "invalid_request", f"the {what} must be a JSON object, not {json_type(data)}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        message, param = validation_message(e)
        raise HttpError(400, "invalid_request", message, param=param) from None


async def parse_body(request: web.Request, model: type[M]) -> M:
    """The JSON body validated by `model`; 400 naming the field otherwise."""
    return validate(model, await read_json(request))


# ---- middlewares -----------------------------------------------------------------------------------


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except HttpError as e:
        if request.get(STREAMING_KEY):
            raise
        return error_response(request, e)
    except web.HTTPException as e:
        if e.status < 400 or request.get(STREAMING_KEY):
            raise
        return error_response(request, _from_http_exception(request, e))
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except EngineStopping:  # a request that came as the engine began to stop
        if request.get(STREAMING_KEY):
            raise
        return error_response(request, HttpError(503, "unavailable", "the server is shutting down"))
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        if request.get(STREAMING_KEY):
            raise
        return error_response(request, HttpError(500, "internal_error",
                                                 "internal server error (details are in the server log)"))


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    authn = request.app[AUTH_KEY]
    public = (request.method, request.path) in state.public
    peer = request.remote
    if (origin := request.headers.get("Origin")) is not None and allowed_origin(request) is None:
        # A web page's request (browsers name the page's origin). Without this, any site the
        # operator visits could POST to a loopback server without tokens (a "simple" request
        # needs no preflight) and run turns as the operator. Ollama answers such origins 403 too.
        raise HttpError(403, "forbidden", f"requests from web pages of {origin[:80]!r} are refused: list the "
                                          f"origin in cors_origins ([server] in aiops.toml) to allow them")
    if authn.open:
        if not is_loopback_peer(peer):
            raise HttpError(403, "forbidden", "no auth token is configured, so only loopback callers are "
                                              "served")
        if not addressed_to_loopback(request.host):
            raise HttpError(403, "forbidden", f"no auth token is configured, so only requests addressed to a "
                                              f"loopback name (localhost, 127.0.0.1, [::1], this machine's name) are served, not "
                                              f"{request.host[:80]!r}; configure tokens to serve other names")
        ident = Identity(OPERATOR, f"loopback:{peer}", True)
    else:
        presented = bearer(request.headers.get("Authorization"))
        try:
            token = authn.match(presented, peer) if presented is not None else None
        except AuthThrottled as e:
            raise HttpError(429, "rate_limited", str(e), headers={"Retry-After": str(e.retry_after)}) from None
        if token is not None:
            ident = Identity(token.role, token.name, True)
        elif public:
            ident = Identity(CLIENT, f"anonymous:{peer}", False)
        elif presented is None:
            raise HttpError(401, "unauthorized", "missing bearer token: send 'Authorization: Bearer <token>'",
                            headers={"WWW-Authenticate": 'Bearer realm="aiops"'})
        else:
            raise HttpError(401, "unauthorized", "invalid bearer token",
                            headers={"WWW-Authenticate": 'Bearer realm="aiops", error="invalid_token"'})
    request["role"] = ident.role
    request["principal"] = ident.principal
    request[AUTHENTICATED_KEY] = ident.authenticated
    if state.closing:
        raise _shutting_down(request, "send it again to the next one")
    limit = request.app[CONFIG_KEY].app.server.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise HttpError(413, "payload_too_large",
                        f"request body too large: {request.content_length} bytes, the limit is {limit} "
                        f"(max_body_bytes in aiops.toml)")
    return await handler(request)


# ---- the app ---------------------------------------------------------------------------------------


def create_app(engine: Engine, cfg: Config | None = None, *, env: Mapping[str, str] | None = None,
               tokens: list[Token] | None = None) -> web.Application:
    """The application with every surface mounted.

    Tokens are `tokens` when given, else loaded from `env` (default: the engine's environment).
    """
    from aiops.integrations.server import api, cors, ollama_proxy, openai_proxy

    cfg = cfg or engine.config
    middlewares: list[Middleware] = [error_middleware, auth_middleware]
    if cfg.app.server.cors_origins:
        # First: a browser's preflight carries no token, so it is answered before authentication.
        middlewares.insert(0, cors.cors_middleware)
    app = web.Application(client_max_size=cfg.app.server.max_body_bytes, middlewares=middlewares)
    cors.setup(app, cfg.app.server.cors_origins)
    app[ENGINE_KEY] = engine
    app[CONFIG_KEY] = cfg
    if tokens is None:
        tokens = load_tokens(cfg.app.auth, env if env is not None else engine.env)
    app[AUTH_KEY] = Authenticator(tokens, FailedAuthThrottle(cfg.app.auth.failed_auth_limit,
                                                             cfg.app.auth.failed_auth_window_seconds))
    app[STATE_KEY] = ServerState(public={("GET", "/"), ("HEAD", "/")})
    api.setup(app)
    openai_proxy.setup(app)
    ollama_proxy.setup(app)
    return app
