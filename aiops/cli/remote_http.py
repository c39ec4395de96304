"""The little HTTP `aiops chat` needs to talk to a running aiops: one JSON call at a time and one
server-sent event stream, on asyncio streams and the standard library alone.

Why not aiops.client (aiohttp): importing aiohttp takes 0.3 s on its own (it builds its TLS
contexts, loading the system's CA certificates, at import), and `aiops chat` through a running aiops
has 0.3 s in all to show its first token (issue 27). What it needs is small: HTTP/1.1 requests with
`Connection: close` (so a JSON body ends with the connection, its length or its last chunk), and one
chunked response read as it arrives. Scripts keep using aiops.client; this one is not for them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

from aiops.api_errors import AgentError, error_from, segment
from aiops.sse import EventTooLarge, SseParser

MAX_HEADER_LINES = 100
MAX_BODY = 64 * 1024 * 1024  # a JSON answer, or one event's line: beyond this the server is not aiops


# (the library client's error, under the name this module has always used)
ApiError = AgentError


class _Response:
    def __init__(self, status: int, headers: dict[str, str], reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.status = status
        self.headers = headers
        self._reader = reader
        self._writer = writer
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        self._left: int | None = int(length) if length and length.isdigit() else None

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";")[0].strip().lower()

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (chunked, a Content-Length, or up to the end of the connection)."""
        r = self._reader
        if self._chunked:
            while True:
                size_line = await r.readline()
                if not size_line.endswith(b"\n"):
                    raise asyncio.IncompleteReadError(size_line, None)
                size = int(size_line.split(b";", 1)[0].strip() or b"x", 16)
                if size == 0:
                    return  # (trailers, if any, are left unread: the connection closes)
                yield await r.readexactly(size)
                await r.readexactly(2)  # the CRLF after each chunk
        elif self._left is not None:
            while self._left > 0:
                data = await r.read(min(self._left, 65536))
                if not data:
                    raise asyncio.IncompleteReadError(b"", self._left)
                self._left -= len(data)
                yield data
        else:
            while data := await r.read(65536):
                yield data

    async def read(self) -> bytes:
        body = b""
        async for chunk in self.chunks():
            body += chunk
            if len(body) > MAX_BODY:
                raise ApiError(self.status, "invalid_response", f"an answer longer than {MAX_BODY} bytes")
        return body

    def close(self) -> None:
        self._writer.close()


class Api:
    """Calls on `/api/v1` of the aiops at `base_url`, presenting `token` (a bearer token) if any."""

    def __init__(self, base_url: str, token: str | None, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{base_url!r} is not an http(s) URL")
        self._tls = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._tls else 80)
        self._host_header = parts.netloc.rpartition("@")[2]
        self._prefix = parts.path.rstrip("/")
        self._token = token
        self.timeout = timeout

    def _unreachable(self, e: BaseException) -> ApiError:
        return ApiError(0, "connection_error", f"{self.base_url}: {type(e).__name__}: {e}")

    async def _request(self, method: str, path: str, body: dict[str, Any] | None = None,
                       accept: str = "application/json") -> _Response:
        ssl_context = None
        if self._tls:
            import ssl

            ssl_context = ssl.create_default_context()
        try:
            reader, writer = await asyncio.open_connection(self._host, self._port, ssl=ssl_context,
                                                           limit=MAX_BODY)
        except (OSError, ValueError) as e:
            raise self._unreachable(e) from None
        payload = b"" if body is None else json.dumps(body).encode()
        head = [f"{method} {self._prefix}{path} HTTP/1.1", f"Host: {self._host_header}", f"Accept: {accept}",
                "User-Agent: aiops-chat", "Connection: close"]
        if self._token:
            head.append(f"Authorization: Bearer {self._token}")
        if body is not None or method in ("POST", "PUT", "PATCH"):
            head += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
        try:
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + payload)
            await writer.drain()
            status_line = await reader.readline()
            version, _, rest = status_line.decode("latin-1").partition(" ")
            if not version.startswith("HTTP/") or not rest[:3].isdigit():
                writer.close()
                raise ApiError(0, "invalid_response", f"{self.base_url} does not speak HTTP "
                                                      f"(it answered {status_line[:60]!r})")
            headers: dict[str, str] = {}
            for _ in range(MAX_HEADER_LINES):
                line = await reader.readline()
                if line in (b"\r\n", b"\n"):
                    break
                if not line:
                    raise asyncio.IncompleteReadError(line, None)
                key, _, value = line.decode("latin-1").partition(":")
                headers[key.strip().lower()] = value.strip()
            else:
                writer.close()
                raise ApiError(0, "invalid_response", f"{self.base_url} answered more than "
                                                      f"{MAX_HEADER_LINES} header lines")
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
            writer.close()
            raise self._unreachable(e) from None
        return _Response(int(rest[:3]), headers, reader, writer)

    async def call(self, method: str, path: str, body: dict[str, Any] | None = None, *,
                   expect: tuple[str, ...] = ()) -> dict[str, Any]:
        """The JSON object the server answered; an ApiError for an error status or anything else.
        `expect` names keys an aiops answer always has."""
        try:
            async with asyncio.timeout(self.timeout):
                resp = await self._request(method, path, body)
                try:
                    raw = await resp.read()
                except (OSError, asyncio.IncompleteReadError, ValueError) as e:
                    raise self._unreachable(e) from None
                finally:
                    resp.close()
        except TimeoutError:
            raise ApiError(0, "timeout", f"{self.base_url}: no answer to {method} {path} within "
                                         f"{self.timeout:g} s") from None
        if resp.status >= 400:
            raise error_from(resp.status, raw)
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = None
        shown = raw.decode("utf-8", "replace").strip()[:200]
        if not isinstance(data, dict):
            raise ApiError(resp.status, "invalid_response", f"{self.base_url}{path} answered "
                           f"{resp.content_type or 'no content type'}, not a JSON object (is {self.base_url} "
                           f"an aiops server?): {shown}")
        if missing := [k for k in expect if k not in data]:
            raise ApiError(resp.status, "invalid_response", f"{self.base_url}{path} answered without "
                           f"{', '.join(missing)} (is {self.base_url} an aiops server of this version?): {shown}")
        return data

    async def stream(self, client_id: str) -> EventStream:
        """The session's event stream, subscribed on the server when this returns."""
        path = "/api/v1/stream/" + segment(client_id)
        try:
            async with asyncio.timeout(self.timeout):
                resp = await self._request("GET", path, accept="text/event-stream")
                if resp.status != 200:
                    try:
                        body = await resp.read()
                    except (OSError, asyncio.IncompleteReadError, ValueError):
                        body = b""
                    resp.close()
                    raise error_from(resp.status, body)
        except TimeoutError:
            raise ApiError(0, "timeout", f"{self.base_url}: no answer to GET {path} within "
                                         f"{self.timeout:g} s") from None
        if resp.content_type != "text/event-stream":
            resp.close()
            raise ApiError(resp.status, "not_an_event_stream",
                           f"{self.base_url}{path} answered {resp.content_type or 'no content type'}, not an "
                           f"event stream (is {self.base_url} an aiops server?)")
        return EventStream(resp, client_id)


class EventStream:
    """`{"event": name, "data": {...}}` items of one session's server-sent events, as they come.
    A connection lost midway raises ApiError `stream_cut`: events may have been missed."""

    def __init__(self, resp: _Response, client_id: str) -> None:
        self._resp = resp
        self._chunks = resp.chunks()
        self.client_id = client_id

    def close(self) -> None:
        self._resp.close()

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        parser = SseParser(max_event=MAX_BODY)
        while True:
            try:
                chunk = await anext(self._chunks, None)
                if chunk is None:
                    return  # the server ended the stream; an event it left unfinished is dropped
                events = parser.feed(chunk)
            except EventTooLarge as e:
                raise ApiError(0, "invalid_response", str(e)) from None
            except (OSError, asyncio.IncompleteReadError, ValueError) as e:
                raise ApiError(0, "stream_cut", f"the event stream of {self.client_id} was cut "
                                                f"({type(e).__name__}: {e}); events may have been missed") from None
            for event in events:
                yield {"event": event.event, "data": json.loads(event.data)}
