"""The live-session cache: the sessions in memory, their admission and eviction, and the watchers
told when a session's stored history changes.

The store is the truth; a `LiveSession` is a copy the cache may drop while the session is idle.
Code that holds one across an await and then changes it pins it first (`SessionCache.pinned`), so
a message is never queued on a copy the cache has already dropped.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from aiops.engine import events as ev
from aiops.engine.errors import EngineError
from aiops.engine.store import SessionRow, Store, title_after
from aiops.engine.types import Message, is_short_id

if TYPE_CHECKING:
    from aiops.config import Config
    from aiops.engine.turn import Turn

# `cli`: `aiops chat` (one turn from a shell), apart from the console so that the console opens on
# its own sessions, not on the last one a script ran.
SESSION_KINDS = ("console", "cli", "api", "proxy", "slack", "swarm", "mcp")


class _Configured(Protocol):
    @property
    def config(self) -> Config: ...


class _HistorySource(Protocol):
    async def history(self, session_id: str) -> list[Message]: ...


class _HasStore(Protocol):
    @property
    def store(self) -> _HistorySource: ...


class _Stated(_Configured, Protocol):
    def session_state(self, session_id: str) -> str: ...


@dataclass
class LiveSession:
    """A session in memory: its row, its (lazily loaded) history, its turn queue."""

    row: SessionRow
    state: str = "idle"  # idle | running | waiting
    queue: deque[Turn] = field(default_factory=deque)
    current: Turn | None = None
    worker: asyncio.Task[None] | None = None
    pins: int = 0
    # Set while Engine.delete_session runs: done when the session is gone from memory and store.
    deleting: asyncio.Future[None] | None = None
    _history: list[Message] | None = None
    _history_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def id(self) -> str:
        return self.row.id

    @property
    def idle(self) -> bool:
        """Nothing running, queued or in hand: dropping it from memory loses nothing."""
        return (self.current is None and not self.queue and self.pins == 0 and self.state == "idle"
                and (self.worker is None or self.worker.done()) and not self._history_lock.locked()
                and self.deleting is None)

    def model_key(self, engine: _Configured) -> str:
        key = self.row.model
        if key and key in engine.config.models.models:
            return key
        return engine.config.models.default_model

    async def history(self, engine: _HasStore) -> list[Message]:
        if self._history is None:
            async with self._history_lock:
                if self._history is None:
                    self._history = await engine.store.history(self.id)
        return self._history

    def forget_history(self) -> None:
        """The stored history changed under the copy (a reset): read it afresh next time."""
        self._history = None

    def remember(self, msg: Message) -> None:
        """A message just committed: into the loaded history, and the row's title, time and count
        (read by `!session` and the session's events, as the store would count it)."""
        if self._history is not None:
            self._history.append(msg)
        self.row.title = title_after(self.row.title, msg)
        self.row.updated_at = msg.created_at
        self.row.message_count += 1

    def to_dict(self, engine: _Stated) -> dict[str, Any]:
        d = self.row.to_dict()
        d.update(model=self.model_key(engine), state=engine.session_state(self.id), queued=len(self.queue))
        return d


class SessionCache:
    """The live sessions, least recently used first, at most `size` of them idle."""

    def __init__(self, size: int, store: Store) -> None:
        self._sessions: OrderedDict[str, LiveSession] = OrderedDict()
        self.size = size
        self._store = store
        # Told the id of each session whose history changed (see Engine.watch_history).
        self.history_watchers: list[Callable[[str], None]] = []

    def __len__(self) -> int:
        return len(self._sessions)

    def __iter__(self) -> Iterator[LiveSession]:
        return iter(list(self._sessions.values()))

    def get(self, session_id: str) -> LiveSession | None:
        return self._sessions.get(session_id)

    def use(self, session_id: str) -> LiveSession | None:
        """The session if in memory, marked as the most recently used."""
        live = self._sessions.get(session_id)
        if live is not None:
            self._sessions.move_to_end(session_id)
        return live

    def find(self, ref: str) -> LiveSession | None:
        """The session `ref` (full or shorthand id) if it is in memory; no store lookup."""
        live = self._sessions.get(ref)
        if live is None and is_short_id(ref):
            n = int(ref)
            live = next((s for s in self._sessions.values() if s.row.short_id == n), None)
        return live

    async def load(self, ref: str, *, kind: str, create: bool, model: str | None,
                   meta: dict[str, Any] | None) -> tuple[LiveSession | None, bool]:
        """The session `ref` read from the store into memory; made there when asked and missing
        (with `model`, already checked, and `meta`). Returns it (None: no such session) and
        whether it was made now. EngineError for a session that may not be made."""
        if create and not is_short_id(ref) and kind in SESSION_KINDS:
            # One store round trip instead of a lookup and a create; a new session's history is
            # known to be empty, so it is not loaded either.
            row, created = await self._store.get_or_create_session(ref, kind, model, meta)
            if not created:
                return self.admit(LiveSession(row)), False
            return self.admit(LiveSession(row, _history=[])), True
        found = await self._store.get_session(ref)
        if found is None:
            if not create:
                return None, False
            if kind not in SESSION_KINDS:
                raise EngineError(f"unknown session kind {kind!r}")
            if is_short_id(ref):
                raise EngineError(f"no session {ref}: all-digit ids are shorthand ids of existing sessions")
            row = await self._store.create_session(ref, kind, model, meta)
            return self.admit(LiveSession(row)), True
        return self.admit(LiveSession(found)), False

    def holds(self, live: LiveSession) -> bool:
        """`live` is the session's copy in memory (not one dropped or deleted meanwhile)."""
        return self._sessions.get(live.id) is live

    def admit(self, live: LiveSession) -> LiveSession:
        """`live` as the session's one copy in memory (or the copy another caller admitted while
        the store was read), then drop idle sessions beyond the cache size."""
        known = self._sessions.setdefault(live.id, live)
        self._sessions.move_to_end(live.id)
        if len(self._sessions) > self.size:
            self._evict_idle(keep=live.id)
        return known

    def drop(self, live: LiveSession) -> None:
        """`live` is gone (deleted): out of memory, if it is still the copy there."""
        if self.holds(live):
            del self._sessions[live.id]

    def _evict_idle(self, keep: str) -> None:
        """Drop the least recently used idle sessions until the cache is back to its size. A
        long-running server sees a new session per API script run or chat conversation: kept
        forever, they grow memory without bound and make every full garbage collection slower
        (docs/PERFORMANCE.md). Busy sessions stay, however many there are, and so does `keep`,
        the one being handed to a caller (it pins the session only once it has it)."""
        excess = len(self._sessions) - self.size
        victims: list[str] = []
        for sid, live in self._sessions.items():
            if len(victims) >= excess:
                break
            if live.idle and sid != keep:
                victims.append(sid)
        for sid in victims:
            del self._sessions[sid]

    @contextmanager
    def pinned(self, live: LiveSession | None) -> Iterator[None]:
        """Keep `live` in memory while a caller that awaits in between still has to change it."""
        if live is None:
            yield
            return
        live.pins += 1
        try:
            yield
        finally:
            live.pins -= 1

    def history_changed(self, session_id: str) -> None:
        for fn in self.history_watchers:
            fn(session_id)


class HeldDeletions:
    """A session deleted by a command of the message being taken in is announced after that
    message's `done`: a stream that ends at the deletion must still get the `done`."""

    def __init__(self) -> None:
        self._commanding: dict[str, int] = {}  # sessions whose message's commands are running
        self._held: dict[str, ev.SessionChanged] = {}

    def commands_begin(self, session_id: str) -> None:
        self._commanding[session_id] = self._commanding.get(session_id, 0) + 1

    def commands_over(self, session_id: str) -> ev.SessionChanged | None:
        """The deletion to announce now that the last of its commands' messages is answered."""
        n = self._commanding.pop(session_id, 1) - 1
        if n > 0:
            self._commanding[session_id] = n
            return None
        return self._held.pop(session_id, None)

    def hold(self, deleted: ev.SessionChanged) -> bool:
        """Keep `deleted` for later when commands of its session are running; False otherwise."""
        sid = deleted.session_id or ""
        if not self._commanding.get(sid):
            return False
        self._held[sid] = deleted
        return True
