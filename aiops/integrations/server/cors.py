"""Cross-origin access for browser clients, off unless `[server] cors_origins` lists origins.

A chat client that runs in a browser (a browser extension such as Page Assist, Open WebUI's direct
connections, a web page on localhost) can call the server only if it answers the browser's
preflight and names the page's origin in its responses. Real Ollama does so for a list of local
origins by default; aiops does it for none until the operator lists them, because any page the
operator's browser opens could otherwise drive the agent of a loopback server without tokens.

Patterns are origins (`http://localhost:3000`) where `*` stands for any run of characters
(`http://localhost:*`, `chrome-extension://*`). The preflight is answered before authentication
(browsers send it without credentials); the request that follows is authenticated as any other.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from aiohttp import web

from aiops.integrations.server.context import Handler

ORIGINS_KEY = web.AppKey("aiops_cors_origins", re.Pattern)  # cors_origins, compiled

_METHODS = "GET, HEAD, POST, DELETE, OPTIONS"
# What browser clients send: the token, JSON bodies, the session and chat-id headers.
_HEADERS = "Authorization, Content-Type, X-Aiops-Session, X-OpenWebUI-Chat-Id"
_EXPOSE = "X-Aiops-Session"
_MAX_AGE = "600"


def _pattern(origin: str) -> str:
    """One origin pattern as a regex: literal but for `*`; a trailing `:*` also matches no port
    (`http://localhost:*` covers `http://localhost`, port 80). Browsers send origins lower-case."""
    origin = origin.lower()
    tail = ""
    if origin.endswith(":*"):
        origin, tail = origin[:-2], r"(?::[0-9]+)?"
    return ".*".join(re.escape(part) for part in origin.split("*")) + tail


def compile_origins(patterns: Sequence[str]) -> re.Pattern[str] | None:
    """One regex for every pattern, matched whole."""
    if not patterns:
        return None
    return re.compile("(?:" + "|".join(_pattern(p) for p in patterns) + r")\Z")


def allowed_origin(request: web.Request) -> str | None:
    """The request's Origin when `cors_origins` allows it (None: no Origin, or not allowed)."""
    pattern = request.app.get(ORIGINS_KEY)
    origin = request.headers.get("Origin")
    if pattern is None or not origin or not pattern.match(origin.lower()):
        return None
    return origin


@web.middleware
async def cors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answer an allowed origin's preflight here, before authentication; every other request goes
    on (its response gets the headers in `add_headers`)."""
    if (request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers
            and (origin := allowed_origin(request)) is not None):
        return web.Response(status=204, headers={
            "Access-Control-Allow-Origin": origin,
            "Access-Control-Allow-Methods": _METHODS,
            "Access-Control-Allow-Headers": request.headers.get("Access-Control-Request-Headers", _HEADERS),
            "Access-Control-Max-Age": _MAX_AGE,
            "Vary": "Origin",
        })
    return await handler(request)


async def add_headers(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: streams included, whose headers leave before the handler returns."""
    origin = allowed_origin(request)
    if origin is not None:
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Expose-Headers"] = _EXPOSE
        response.headers.add("Vary", "Origin")


def setup(app: web.Application, patterns: Sequence[str]) -> None:
    compiled = compile_origins(patterns)
    if compiled is None:
        return
    app[ORIGINS_KEY] = compiled
    app.on_response_prepare.append(add_headers)
