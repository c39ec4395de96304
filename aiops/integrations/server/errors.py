"""HTTP errors in the shape of the surface a request came to.

Three surfaces share the app and each keeps its own error shape: ours (`{"error": {"code",
"message"}}`) on `/api/v1`, OpenAI's error object on `/v1`, Ollama's `{"error": "..."}` on `/api/*`
(and `/`). Handlers raise `HttpError`; the error middleware answers it in the path's shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from aiohttp import web

Surface = Literal["api", "openai", "ollama"]


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
    if path == "/v1" or path.startswith(("/v1/", "/chat/completions", "/models")):
        return "openai"  # (the last two: the OpenAI routes without /v1, for bare base URLs)
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


def shutting_down(request: web.Request, why: str = "the request body had not all arrived, nothing of it "
                  "was taken in") -> HttpError:
    """503 for a request the shutdown refuses. What is left of its body is not read (aiohttp drops
    it once the shutdown closes the connection): ended here, so that aiohttp answers and closes the
    connection at once rather than waiting up to 10 s (its lingering time) for the rest."""
    if not request.content.is_eof():
        request.content.feed_eof()
    return HttpError(503, "unavailable", f"the server is shutting down; {why}", headers={"Connection": "close"})
