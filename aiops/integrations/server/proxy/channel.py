"""The HTTP side of one proxied answer: frames written in as few writes as possible, keep-alives on
an idle stream, and a client that hung up noticed (which cancels its turn and its gates)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

log = logging.getLogger(__name__)

DISCONNECT_POLL_SECONDS = 0.5


class BufferedStreamResponse(web.StreamResponse):
    """A streaming response whose headers leave with the first frames instead of in a write of
    their own (as aiohttp's non-streaming Response does). `Channel` flushes them within a poll
    interval even when no frame comes."""

    _send_headers_immediately = False


class Channel:
    """Writes frames to a prepared streaming response, as few writes as it can; sends keep-alives on
    an idle stream and notices a client that hung up (then calls `on_disconnect` once).

    The response's headers and `head` (e.g. the OpenAI role chunk) go out with the first frames, or
    on their own once the stream has been quiet for a poll interval, so a quick answer takes two
    writes: its text, then its end. The watch is a timer callback, not a task: most answers end
    before it first fires."""

    def __init__(self, request: web.Request, response: web.StreamResponse | None,
                 on_disconnect: Callable[[], Awaitable[None]], *,
                 keepalive: bytes | Callable[[], bytes] | None = None,
                 keepalive_seconds: float = 15.0, head: bytes = b"") -> None:
        """`keepalive`: the frame sent on an idle stream, or a function making a fresh one each
        time (a frame that carries a timestamp)."""
        self.request = request
        self.response = response
        self.keepalive = keepalive
        self.keepalive_seconds = keepalive_seconds
        self._head = head
        self._on_disconnect = on_disconnect
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()
        self._poll = min(DISCONNECT_POLL_SECONDS, keepalive_seconds / 2)
        self._timer: asyncio.TimerHandle | None = None
        self._pending: asyncio.Task[None] | None = None  # a keep-alive write or a disconnect
        self._finished = False
        self._flushed = False  # anything (headers included) written yet
        self.gone = False

    def start(self) -> Channel:
        self._timer = self._loop.call_later(self._poll, self._tick)
        return self

    async def write(self, data: bytes) -> None:
        assert self.response is not None
        if self._head:
            data, self._head = self._head + data, b""
        self._last = self._loop.time()
        self._flushed = True
        await self.response.write(data)  # b"" still sends buffered headers

    async def finish(self, data: bytes = b"") -> None:
        """The last frames and the end of the body, in one write."""
        assert self.response is not None
        self._finished = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._head:
            data, self._head = self._head + data, b""
        self._last = self._loop.time()
        await self.response.write_eof(data)

    def _connected(self) -> bool:
        transport = self.request.transport
        return transport is not None and not transport.is_closing()

    async def disconnected(self) -> None:
        if not self.gone:
            self.gone = True
            await self._on_disconnect()

    def _tick(self) -> None:
        self._timer = None
        if self._finished or self.gone:
            return
        if self._pending is None or self._pending.done():
            if not self._connected():
                self._pending = self._loop.create_task(self.disconnected())
                return
            if self.response is not None and (self._head or not self._flushed or (
                    self.keepalive is not None and self._loop.time() - self._last >= self.keepalive_seconds)):
                self._pending = self._loop.create_task(self._keepalive())
        self._timer = self._loop.call_later(self._poll, self._tick)

    async def _keepalive(self) -> None:
        # Made by the timer, it may run after the stream ended in the same loop turn: nothing may
        # follow the end of the body (a chunk after it would corrupt the kept-alive connection).
        if self._finished or self.gone:
            return
        try:
            # write() sends the headers and the head first; a keep-alive only when those are out.
            if self._head or not self._flushed:
                frame = b""
            else:
                frame = (self.keepalive() if callable(self.keepalive) else self.keepalive) or b""
            await self.write(frame)
        except ConnectionError:
            await self.disconnected()
        except Exception:  # noqa: BLE001 - a keep-alive must never take the handler down
            log.exception("proxy keep-alive failed")

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._pending is not None and not self._pending.done():
            await asyncio.wait({self._pending})
