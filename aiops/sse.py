"""Reading a server-sent-events stream (`text/event-stream`): the one parser behind the library
client (aiops/client.py), `aiops chat`'s client through a running aiops (aiops/cli/remote_http.py)
and the attached console (aiops/integrations/remote/engine.py). Standard library only: `aiops chat`
must not import aiohttp to talk to a running aiops."""

from __future__ import annotations

from typing import NamedTuple

# One event's bytes (a pending line plus its data lines): past this the stream is not aiops's.
MAX_EVENT = 64 * 1024 * 1024


class EventTooLarge(ValueError):
    """An event, or a line of one, grew past the parser's limit."""


class ServerEvent(NamedTuple):
    """One event as sent: its name (`message` when the server named none), its data lines joined
    by newlines, and its `id:` (None when it had none). (A tuple: one is made per token streamed.)"""

    event: str
    data: str
    id: str | None = None


class SseParser:
    """Feed it the body as it arrives (`feed`, bytes in any cut) or line by line (`line`); it hands
    back each event once its closing blank line came. Lines end in LF or CRLF; `:` lines (keep-alive
    comments) and fields other than `event`, `data` and `id` are passed over. An event the stream
    ends before its blank line is dropped, as browsers do: it may be incomplete. `feed` refuses an
    event (or a line) growing past `max_event` with EventTooLarge: a peer is not let fill memory."""

    def __init__(self, max_event: int = MAX_EVENT) -> None:
        self.max_event = max_event
        self._partial: list[bytes] = []  # pieces of a line whose end has not come yet
        self._partial_size = 0
        self._name: str | None = None
        self._data: list[str] = []
        self._size = 0  # characters of data lines held for the event being read
        self._id: str | None = None

    def feed(self, chunk: bytes) -> list[ServerEvent]:
        """The events that `chunk` completes. Cut on bytes, not characters: a UTF-8 character split
        between two reads is decoded once both halves came."""
        events: list[ServerEvent] = []
        if b"\n" in chunk:
            lines = chunk.split(b"\n")
            if self._partial:
                lines[0] = b"".join(self._partial) + lines[0]
                self._partial, self._partial_size = [], 0
            chunk = lines.pop()
            take = self.line
            for raw in lines:
                event = take(raw.removesuffix(b"\r").decode("utf-8", "replace"))
                if event is not None:
                    events.append(event)
        if chunk:
            # Held in pieces, joined once the line ends: a long line in many reads is not copied
            # over and over.
            self._partial.append(chunk)
            self._partial_size += len(chunk)
        if self._partial_size + self._size > self.max_event:
            raise EventTooLarge(f"an event longer than {self.max_event} bytes")
        return events

    def line(self, text: str) -> ServerEvent | None:
        """Take one line (without its line end); the event it ends, if it is a blank line."""
        if not text:
            # An event with no data line is no event (the spec's rule): a lone `event:` or `id:` is
            # reset.
            event = ServerEvent(self._name or "message", "\n".join(self._data), self._id) if self._data else None
            self._name, self._data, self._size, self._id = None, [], 0, None
            return event
        if text.startswith(":"):
            return None
        field, _, value = text.partition(":")
        value = value.removeprefix(" ")
        if field == "data":
            self._size += len(value) + 1  # (checked against the limit once per `feed`)
            self._data.append(value)
        elif field == "event":
            self._name = value
        elif field == "id":
            self._id = value
        return None
