"""The event bus: the one boundary between the engine and everything that shows it.

The console, the API stream, the proxy, Slack and MCP all consume the same events. Publishing never
blocks and never waits on a reader: each subscriber has a bounded queue, and a subscriber that
falls behind is dropped with an `error` event instead of slowing the engine.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

# The names of DESIGN.md; they are also the SSE event names of the API stream.
TOK = "tok"
THINKING = "thinking"
TOOL_CALL = "tool_call"
TOOL_RESULT = "tool_result"
GATE = "gate"
GATE_RESOLVED = "gate_resolved"
NOTICE = "notice"
ERROR = "error"
DONE = "done"
CONTRACT_EVENTS: frozenset[str] = frozenset(
    {TOK, THINKING, TOOL_CALL, TOOL_RESULT, GATE, GATE_RESOLVED, NOTICE, ERROR, DONE}
)

# Extra events for views that draw more than a conversation (the console): a user message was
# committed, a turn started, a session was created/changed/deleted, rate-limit usage changed.
USER = "user"
TURN = "turn"
SESSION = "session"
RATE = "rate"

_seq = itertools.count(1)


@dataclass(slots=True, frozen=True)
class Event:
    name: str
    session_id: str | None
    data: dict[str, Any]
    turn_id: str | None = None
    ts: float = field(default_factory=time.time)
    seq: int = field(default_factory=lambda: next(_seq))

    def payload(self) -> dict[str, Any]:
        """The JSON body clients receive (SSE data, API, MCP)."""
        body = dict(self.data)
        body.setdefault("session_id", self.session_id)
        if self.turn_id is not None:
            body.setdefault("turn_id", self.turn_id)
        return body


class _Overflow:
    pass


_OVERFLOW = _Overflow()
_CLOSED = object()


# Deltas that may be merged while queued: a reader that is a little behind gets the same text in
# fewer, larger pieces instead of being dropped after a fast burst.
_COALESCE = frozenset({TOK, THINKING})


class Subscription:
    """A bounded queue of events for one reader. Iterate it with `async for`.

    Consecutive queued `tok` (or `thinking`) events of the same turn are merged into one, so a fast
    model's burst of tiny deltas costs one queue slot. Other events fill slots; a reader more than
    `maxsize` events behind is dropped with an `error` event (code `slow_consumer`).
    """

    def __init__(self, bus: EventBus, session_id: str | None, names: Iterable[str] | None,
                 maxsize: int) -> None:
        self._bus = bus
        self.session_id = session_id
        self.names = frozenset(names) if names is not None else None
        self._items: deque[Any] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.maxsize = maxsize
        self.closed = False
        self.dropped = False

    def wants(self, event: Event) -> bool:
        if self.session_id is not None and event.session_id != self.session_id:
            return False
        return self.names is None or event.name in self.names

    def _push(self, item: Any) -> None:
        self._items.append(item)
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _offer(self, event: Event) -> None:
        if self.closed:
            return
        items = self._items
        if event.name in _COALESCE and items:
            last = items[-1]
            if (isinstance(last, Event) and last.name == event.name and last.turn_id == event.turn_id
                    and last.session_id == event.session_id):
                items[-1] = Event(last.name, last.session_id,
                                  {**last.data, "text": last.data.get("text", "") + event.data.get("text", "")},
                                  last.turn_id, last.ts, last.seq)
                return
        if len(items) >= self.maxsize:
            self.dropped = True
            self.closed = True
            self._push(_OVERFLOW)
            self._bus._remove(self)
            return
        self._push(event)

    def qsize(self) -> int:
        """Events queued now: a reader may take this many with `get()` without waiting, which lets
        a stream write a burst of token events as one frame."""
        return len(self._items)

    def pending(self) -> list[Event]:
        """Take every event queued now, without waiting (markers for close/overflow excluded)."""
        out: list[Event] = []
        while self._items and isinstance(self._items[0], Event):
            out.append(self._items.popleft())
        return out

    async def get(self) -> Event | None:
        """The next event; None once the subscription is closed."""
        while not self._items:
            if self.closed:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self._items.popleft()
        if item is _CLOSED:
            return None
        if item is _OVERFLOW:
            return Event(ERROR, self.session_id, {
                "code": "slow_consumer",
                "message": f"event stream dropped: the reader fell more than {self.maxsize} events behind",
            })
        return item

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._bus._remove(self)
            self._push(_CLOSED)

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._iter()

    async def _iter(self) -> AsyncIterator[Event]:
        while True:
            ev = await self.get()
            if ev is None:
                return
            yield ev
            if ev.name == ERROR and ev.data.get("code") == "slow_consumer":
                return

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EventBus:
    def __init__(self, default_maxsize: int = 1000) -> None:
        # Subscriptions by the session they follow (None: every session). A publish looks only at
        # its session's readers and the global ones, so its cost does not grow with the number
        # of streams open on other sessions.
        self._subs: dict[str | None, list[Subscription]] = {}
        self._count = 0
        self._listeners: list[Callable[[Event], None]] = []
        self.default_maxsize = default_maxsize

    def subscribe(self, session_id: str | None = None, names: Iterable[str] | None = None,
                  maxsize: int | None = None) -> Subscription:
        sub = Subscription(self, session_id, names, maxsize or self.default_maxsize)
        self._subs.setdefault(session_id, []).append(sub)
        self._count += 1
        return sub

    def add_listener(self, fn: Callable[[Event], None]) -> Callable[[], None]:
        """A synchronous callback for every event; it must be cheap and never raise."""
        self._listeners.append(fn)
        return lambda: self._listeners.remove(fn) if fn in self._listeners else None

    def _remove(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.session_id)
        if subs is not None and sub in subs:
            subs.remove(sub)
            self._count -= 1
            if not subs:
                del self._subs[sub.session_id]

    def publish(self, name: str, session_id: str | None, data: dict[str, Any] | None = None,
                turn_id: str | None = None) -> Event:
        ev = Event(name, session_id, data or {}, turn_id)
        for key in (session_id, None) if session_id is not None else (None,):
            subs = self._subs.get(key)
            if subs:
                for sub in list(subs):
                    if sub.names is None or name in sub.names:
                        sub._offer(ev)
        for fn in list(self._listeners):
            fn(ev)
        return ev

    @property
    def subscriber_count(self) -> int:
        return self._count
