"""The running turn of each session and its events so far: what a session shows when it is picked
mid-turn.

The chat pane draws a session's history from the store, which holds a turn only once it ended; the
turn still running is replayed from these buffers instead (the prompt, then every delta so far,
merged as the chat would merge them). Plain state, owned by the App and fed from its event handlers:
nothing here touches a widget.
"""

from __future__ import annotations

from aiops.engine import events as ev
from aiops.tui.outbox import merged_delta

KEEP = 500  # prompts and typed turns remembered at most (oldest forgotten first)


class LiveTurns:
    """The live turn per session, its replay buffer, and the turns this console's input submitted."""

    def __init__(self) -> None:
        # session id -> its running turn id; session id -> that turn's events so far.
        self.turn: dict[str, str] = {}
        self.events: dict[str, list[ev.Event]] = {}
        # A turn's prompt arrives before the turn starts: kept so the replay begins with it.
        self._user_events: dict[str, ev.UserPosted] = {}
        # Turns this console's input submitted, until they end: turn id -> (session id, text typed).
        self._typed_here: dict[str, tuple[str, str]] = {}
        # Turns posted and not begun (queued behind the running one), and the notes said of them
        # meanwhile ("queued behind the running turn", not stored): a session shown while they
        # wait shows them as the live chat did, until the turn starts or ends unstarted.
        self._unstarted: dict[str, str] = {}  # turn id -> session id
        self._queued: dict[str, list[ev.Notice]] = {}  # turn id -> its notes

    def typed(self, turn_id: str, session_id: str, text: str) -> None:
        """The input submitted `text` as `turn_id`: a cancel may put it back in the input."""
        self._typed_here[turn_id] = (session_id, text)
        while len(self._typed_here) > KEEP:
            self._typed_here.pop(next(iter(self._typed_here)))

    def typed_text(self, session_id: str) -> str | None:
        """What this console typed for the session's running turn (or, Esc right after Enter before
        the turn began, the one typed here last); None for a turn a chat UI or a script sent."""
        turn = self.turn.get(session_id)
        if turn is None:
            turn = next((t for t, (s, _) in reversed(self._typed_here.items()) if s == session_id), None)
        typed = self._typed_here.get(turn or "")
        return typed[1] if typed is not None else None

    def queued_notes(self, session_id: str) -> list[ev.Notice]:
        """The notes of the session's turns still queued, oldest first."""
        return [n for tid, notes in self._queued.items() if self._unstarted.get(tid) == session_id for n in notes]

    def track(self, event: ev.Event) -> None:
        sid, tid = event.session_id or "", event.turn_id
        if isinstance(event, ev.UserPosted) and tid:
            self._user_events[tid] = event
            while len(self._user_events) > KEEP:
                self._user_events.pop(next(iter(self._user_events)))
            if not event.command:
                self._unstarted[tid] = sid
                while len(self._unstarted) > KEEP:
                    oldest = next(iter(self._unstarted))
                    del self._unstarted[oldest]
                    self._queued.pop(oldest, None)
        elif isinstance(event, ev.Notice) and event.command is None and tid in self._unstarted:
            self._queued.setdefault(tid, []).append(event)
        if isinstance(event, ev.TurnStarted | ev.Done) and tid:
            self._unstarted.pop(tid, None)
            self._queued.pop(tid, None)
        if isinstance(event, ev.TurnStarted) and tid:
            self.turn[sid] = tid
            first = self._user_events.get(tid)
            self.events[sid] = [first, event] if first is not None else [event]
        elif tid and self.turn.get(sid) == tid:
            buf = self.events.setdefault(sid, [])
            merged = merged_delta(buf[-1], event) if buf else None
            if merged is not None:
                buf[-1] = merged
            else:
                buf.append(event)
            if isinstance(event, ev.Done):
                self.turn.pop(sid, None)
                self.events.pop(sid, None)
                self._user_events.pop(tid, None)
        if isinstance(event, ev.Done) and tid:
            self._typed_here.pop(tid, None)

    def partial_text(self, session_id: str | None) -> str:
        """The text the session's running turn streamed so far."""
        return "".join(e.text for e in self.events.get(session_id or "", []) if isinstance(e, ev.Tok))
