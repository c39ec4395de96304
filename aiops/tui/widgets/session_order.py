"""The sessions list's order, kept sorted as sessions change.

Kinds in `KIND_ORDER` (unknown kinds after, by name); within a kind the session last active first,
ties in the order the sessions arrived. Sorting every session again at each redraw cost a few ms
with 10,000 stored, ten times a second while sessions stream: here a changed session alone is taken
out of its group and put back where its new last activity places it.
"""

from __future__ import annotations

from bisect import insort
from typing import Any

# The engine's session kinds, in the order the pane groups them (unknown kinds follow).
KIND_ORDER = ("console", "cli", "api", "proxy", "slack", "swarm", "mcp")


class SessionOrder:
    """Session ids per kind, in the order the list shows them."""

    def __init__(self) -> None:
        self._groups: dict[str, list[str]] = {}
        self._kind: dict[str, str] = {}  # the group each session is in
        self._key: dict[str, tuple[float, int]] = {}  # its place in the group, as of its last (re)placing
        self._arrived: dict[str, int] = {}  # ties keep the order the sessions came in
        self._next = 0

    def reset(self, sessions: dict[str, dict[str, Any]]) -> None:
        """Every session placed again, in `sessions`' order for ties."""
        self._groups, self._kind, self._key, self._arrived, self._next = {}, {}, {}, {}, 0
        for sid, s in sessions.items():
            self._arrived[sid] = self._next
            self._next += 1
            self._kind[sid] = kind = s.get("kind") or "api"
            self._key[sid] = self._key_of(sid, s)
            self._groups.setdefault(kind, []).append(sid)
        for group in self._groups.values():
            group.sort(key=self._key.__getitem__)

    def update(self, sessions: dict[str, dict[str, Any]], changed: set[str]) -> set[str]:
        """Place the `changed` sessions again (gone from `sessions`: taken out); the kinds whose
        groups changed."""
        kinds: set[str] = set()
        # Out first, all of them: each is put back by bisection, which needs the rest in order.
        for sid in changed:
            kind = self._kind.pop(sid, None)
            if kind is not None:
                self._groups[kind].remove(sid)
                del self._key[sid]
                kinds.add(kind)
                if not self._groups[kind]:
                    del self._groups[kind]
        for sid in changed:
            s = sessions.get(sid)
            if s is None:
                self._arrived.pop(sid, None)
                continue
            if sid not in self._arrived:
                self._arrived[sid] = self._next
                self._next += 1
            self._kind[sid] = kind = s.get("kind") or "api"
            self._key[sid] = self._key_of(sid, s)
            insort(self._groups.setdefault(kind, []), sid, key=self._key.__getitem__)
            kinds.add(kind)
        return kinds

    def _key_of(self, sid: str, s: dict[str, Any]) -> tuple[float, int]:
        return (-(s.get("updated_at") or 0), self._arrived[sid])

    def kinds(self) -> list[str]:
        known = [k for k in KIND_ORDER if k in self._groups]
        return known + sorted(set(self._groups) - set(KIND_ORDER))

    def kind_of(self, sid: str) -> str | None:
        """The group the session is in (None: not placed)."""
        return self._kind.get(sid)

    def group(self, kind: str) -> list[str]:
        """The kind's sessions in order (the list itself: not to be changed)."""
        return self._groups.get(kind, [])
