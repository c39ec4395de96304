"""The event bus: the one boundary between the engine and everything that shows it.

Events are the typed values of `aiops.engine.events`; the bus only routes them.

The console, the API stream, the proxy, Slack and MCP all consume the same events. Publishing never
blocks and never waits on a reader: each subscriber has a bounded queue, and a subscriber that
falls behind is dropped with an `error` event instead of slowing the engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from aiops.engine.events import Event, Thinking, Tok, error_event, from_wire, is_slow_consumer


class _Overflow:
    pass


_OVERFLOW = _Overflow()
_CLOSED = object()


class Subscription:
    """A bounded queue of events for one reader. Iterate it with `async for`.

    Deltas may be merged while queued: a reader that is a little behind gets the same text in
    fewer, larger pieces instead of being dropped after a fast burst.

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
        if isinstance(event, Tok | Thinking) and items:
            last = items[-1]
            if (type(last) is type(event) and last.turn_id == event.turn_id
                    and last.session_id == event.session_id):
                # Same kind, turn and session: one delta with both texts, in the first one's place.
                items[-1] = dataclasses.replace(last, text=last.text + event.text)
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
        while self._items and self._items[0] is not _OVERFLOW and self._items[0] is not _CLOSED:
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
            return error_event(
                self.session_id, "slow_consumer",
                f"event stream dropped: the reader fell more than {self.maxsize} events behind")
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
            if is_slow_consumer(ev):
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

    def publish(self, event: Event | str, session_id: str | None = None,
                data: dict[str, Any] | None = None, turn_id: str | None = None) -> Event:
        """Send `event` to every subscriber that wants it, and to every listener.

        (Transitional: `publish(name, session_id, data, turn_id)` builds the typed event from its
        wire form; producers are being moved to typed events, after which only `publish(event)`
        stays.)"""
        if isinstance(event, str):
            ev = from_wire(event, {**(data or {}), "session_id": session_id, "turn_id": turn_id})
        else:
            ev = event
        session_id, name = ev.session_id, ev.name
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
