"""The middlewares every request passes: errors answered in the path's shape, then authentication.

`error_middleware` turns what a handler raises (`HttpError`, aiohttp's HTTP exceptions — 404, 405,
413 —, a stop under way, anything unexpected) into the surface's error shape, unless the answer's
headers are already out. `auth_middleware` refuses a web page's request from an origin not listed,
checks the bearer token (or, without tokens, that the call is loopback-only), sets the caller's
role and principal, refuses new requests once the shutdown begins and bodies over max_body_bytes.
"""

from __future__ import annotations

import asyncio
import logging
import warnings

from aiohttp import web
from aiohttp.web_exceptions import NotAppKeyWarning

from aiops.engine.engine import EngineStopping
from aiops.integrations.server.auth import (
    CLIENT,
    OPERATOR,
    AuthThrottled,
    Identity,
    addressed_to_loopback,
    bearer,
    is_loopback_peer,
)
from aiops.integrations.server.context import (
    AUTH_KEY,
    AUTHENTICATED_KEY,
    CONFIG_KEY,
    STATE_KEY,
    STREAMING_KEY,
    Handler,
)
from aiops.integrations.server.cors import allowed_origin
from aiops.integrations.server.errors import HttpError, error_response, shutting_down

log = logging.getLogger(__name__)

# request["role"] and request["principal"] are plain string keys on purpose: they are the contract
# every surface reads. aiohttp would rather see RequestKey objects; its hint is silenced for this module.
warnings.filterwarnings("ignore", category=NotAppKeyWarning, module=__name__)


def from_http_exception(request: web.Request, e: web.HTTPException) -> HttpError:
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
        return error_response(request, from_http_exception(request, e))
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
        raise shutting_down(request, "send it again to the next one")
    limit = request.app[CONFIG_KEY].app.server.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise HttpError(413, "payload_too_large",
                        f"request body too large: {request.content_length} bytes, the limit is {limit} "
                        f"(max_body_bytes in aiops.toml)")
    return await handler(request)
