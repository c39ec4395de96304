"""What a client of aiops's HTTP API makes of an answer that is not a success: shared by the library
client (aiops/client.py, aiohttp) and `aiops chat`'s standard-library client (aiops/cli/remote_http.py),
so this module imports nothing beyond the standard library."""

from __future__ import annotations

import json
from urllib.parse import quote


class AgentError(Exception):
    """The server answered with an error (`status`, and our `code` and `message`), or it could not
    be reached, went away or did not answer in time (`status` 0, code `connection_error`, on a
    stream `stream_cut`, or `timeout`)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


def segment(value: str) -> str:
    """One path segment, whatever the id holds: `x/../y` or `a?b` must not name another route."""
    quoted = quote(str(value), safe="")
    return quoted.replace(".", "%2E") if quoted in (".", "..") else quoted


def error_from(status: int, body: str | bytes) -> AgentError:
    """Our error object (`{"error": {"code", "message"}}`), or whatever else answered, as an AgentError."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict):
        return AgentError(status, str(err.get("code") or err.get("type") or "error"), str(err.get("message", "")))
    if isinstance(err, str):
        return AgentError(status, "error", err)
    return AgentError(status, "http_error", text.strip()[:500] or f"HTTP {status}")
