"""The proxy's index of the conversations of one root: which session holds which history.

Every session of a root (the root and its forks, see identity) is filed under its view (see
matching.session_view) as a path of prefix keys: the key of the empty view, then one per entry,
each key a hash of the previous key and the entry. Sessions sharing a start share those nodes, so
ten thousand chats that open with "hi" are one node, not ten thousand comparisons.

A client's history is looked up by walking the same keys: O(its length) dictionary lookups,
whatever the number of sessions of the root. The walk follows what `matching._same` accepts:

* an entry equal to ours;
* a user text that starts with `@model` or `!command` lines, whose recorded text (what the engine
  kept of it) ends it: the walk tries the text as sent and as the engine parses it;
* an answer of ours the client may hold only the start of (`HELD_IN_PART`): such children of a
  node are kept sorted by text, so those starting with the client's copy are one bisect away.

The index holds keys and the text of answers held in part, no other text; a chosen session is
confirmed on its real history before it is used (sessions.py). It lives in memory only: it is
rebuilt from the store, one root at a time, when a root is first asked for (see ProxySessions).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from aiops.integrations.server.proxy.matching import HELD_IN_PART, Entry

Key = int
EMPTY: Key = 0  # the key of the empty view (a session holding nothing yet)


def step(key: Key, role: str, text: str) -> Key:
    """The key of a view of `key`'s entries followed by (role, text). (A string caches its hash:
    a step costs one hash of the text the first time, then a tuple hash.)"""
    return hash((key, role, text))


@dataclass(slots=True)
class _Node:
    refs: int = 0  # paths of indexed views through here (the node goes when none is left)
    ends: list[tuple[int, str]] | None = None  # (order, session id) whose view ends here
    unstopped: list[tuple[int, str]] | None = None  # ... whose view without stopped answers does
    held: list[tuple[str, Key]] | None = None  # children by an answer held in part: (its text, key)


# A view as filed: per entry the key it leads to and, for an answer held in part, its text.
Path = list[tuple[Key, str | None]]


@dataclass(slots=True)
class Indexed:
    """What the proxy keeps of one session between requests."""
    order: int  # its place among the root's sessions, oldest first (tie-breaks, as the old scan had)
    owner: str | None
    imported: int  # messages taken in from clients' histories (see ProxySessions.max_imported)
    view: Path | None = None
    unstopped: Path | None = None  # the view without stopped answers, when there are any


@dataclass(frozen=True, slots=True)
class Found:
    """A lookup's answer: the session holding all of the client's messages (`exact`), else one
    holding them with a stopped answer of ours for the client's part of it (`in_part`, the newest),
    else the one holding the longest prefix of them (`best`, with how many it holds)."""
    exact: str | None = None
    in_part: str | None = None
    best: tuple[str, int] | None = None


def path_of(view: Sequence[Entry]) -> Path:
    out: Path = []
    key = EMPTY
    for role, text in view:
        key = step(key, role, text)
        out.append((key, text if role == HELD_IN_PART else None))
    return out


@dataclass
class RootIndex:
    """The sessions of one root, filed by their views."""
    root: str
    nodes: dict[Key, _Node] = field(default_factory=dict)
    members: dict[str, Indexed] = field(default_factory=dict)  # (its `view` None: not read yet)
    dirty: set[str] = field(default_factory=set)  # members to read (again) before the next lookup
    _first: int = 0
    _next: int = 0
    top_fork: int = 1  # the highest `+N` among the members' ids

    # ---- membership ----

    def add(self, sid: str, *, first: bool = False) -> None:
        """A session of this root, to be read before the next lookup; `first`: ordered before
        every other (the root itself, found after its forks)."""
        if sid in self.members:
            return
        if first:
            self._first -= 1
            order = self._first
        else:
            order = self._next
            self._next += 1
        self.members[sid] = Indexed(order, None, 0)
        self.dirty.add(sid)
        n = _fork_number(sid) if sid != self.root else None
        if n is not None and n > self.top_fork:
            self.top_fork = n

    def ordered(self) -> list[str]:
        """The members, oldest first."""
        return sorted(self.members, key=lambda sid: self.members[sid].order)

    def remove(self, sid: str) -> None:
        rec = self.members.pop(sid, None)
        self.dirty.discard(sid)
        if rec is not None:
            self._unfile(rec, sid)
        if sid != self.root and _fork_number(sid) == self.top_fork:
            # Rare (the newest fork deleted): the next fork may take its number again.
            self.top_fork = max((n for m in self.members if m != self.root and (n := _fork_number(m)) is not None),
                                default=1)

    def put(self, sid: str, owner: str | None, imported: int,
            view: Sequence[Entry], unstopped: Sequence[Entry] | None) -> None:
        """File a member's views as just read."""
        rec = self.members.get(sid)
        if rec is None:
            return  # removed meanwhile
        self._unfile(rec, sid)
        rec.owner, rec.imported = owner, imported
        rec.view = path_of(view)
        rec.unstopped = path_of(unstopped) if unstopped is not None else None
        self._file(rec.view, rec.order, sid, unstopped=False)
        if rec.unstopped is not None:
            self._file(rec.unstopped, rec.order, sid, unstopped=True)

    def _file(self, path: Path, order: int, sid: str, *, unstopped: bool) -> None:
        parent = self._node(EMPTY)
        parent.refs += 1
        node = parent
        for key, held in path:
            node = self.nodes.get(key) or self._node(key)
            node.refs += 1
            if held is not None and node.refs == 1:
                if parent.held is None:
                    parent.held = []
                bisect.insort(parent.held, (held, key))
            parent = node
        entry = (order, sid)
        if unstopped:
            node.unstopped = node.unstopped or []
            bisect.insort(node.unstopped, entry)
        else:
            node.ends = node.ends or []
            bisect.insort(node.ends, entry)

    def _node(self, key: Key) -> _Node:
        node = self.nodes.get(key)
        if node is None:
            node = self.nodes[key] = _Node()
        return node

    def _unfile(self, rec: Indexed, sid: str) -> None:
        for path, unstopped in ((rec.view, False), (rec.unstopped, True)):
            if path is None:
                continue
            end = path[-1][0] if path else EMPTY
            node = self.nodes[end]
            held_list = node.unstopped if unstopped else node.ends
            if held_list is not None and (rec.order, sid) in held_list:
                held_list.remove((rec.order, sid))
            parent_key = EMPTY
            self._release(EMPTY)
            for key, held in path:
                gone = self._release(key)
                if gone and held is not None:
                    parent = self.nodes.get(parent_key)
                    if parent is not None and parent.held is not None:
                        parent.held.remove((held, key))
                parent_key = key
        rec.view = rec.unstopped = None

    def _release(self, key: Key) -> bool:
        node = self.nodes[key]
        node.refs -= 1
        if node.refs <= 0:
            del self.nodes[key]
            return True
        return False

    # ---- lookup ----

    def find(self, client: Sequence[Entry], variants: Sequence[Sequence[str]],
             usable: Callable[[str, Indexed], bool]) -> Found:
        """The sessions `client` (a client's history, as compared) continues; `variants[i]`: other
        texts the user entry `client[i]` may have been recorded as (see module doc). Only sessions
        `usable` accepts are considered. Reads only the nodes along the client's history."""
        if EMPTY not in self.nodes:
            return Found()
        states: dict[Key, bool] = {EMPTY: False}  # node -> reached only by taking a part for the whole
        best: tuple[str, int] | None = None
        for depth in range(len(client) + 1):
            if depth == len(client):
                return self._at_end(states, usable, best)
            here = self._first_end(states, usable)
            if here is not None:
                best = (here, depth)  # deeper than any before
            states = self._next_states(states, client[depth], variants[depth])
            if not states:
                return Found(best=best)
        return Found(best=best)  # (not reached)

    def _first_end(self, states: dict[Key, bool], usable: Callable[[str, Indexed], bool]) -> str | None:
        found: tuple[int, str] | None = None
        for key in states:
            for order, sid in self.nodes[key].ends or ():
                if found is not None and order >= found[0]:
                    break
                if self._usable(sid, usable):
                    found = (order, sid)
                    break
        return found[1] if found else None

    def _at_end(self, states: dict[Key, bool], usable: Callable[[str, Indexed], bool],
                best: tuple[str, int] | None) -> Found:
        exact: tuple[int, str] | None = None
        in_part: tuple[int, str] | None = None
        for key, partial in states.items():
            node = self.nodes[key]
            for lst in (node.ends, node.unstopped):
                if not lst:
                    continue
                if not partial:  # the oldest, as the old scan found it first
                    for order, sid in lst:
                        if exact is not None and order >= exact[0]:
                            break
                        if self._usable(sid, usable):
                            exact = (order, sid)
                            break
                else:  # the newest: a regenerated answer stopped early often begins as the first did
                    for order, sid in reversed(lst):
                        if in_part is not None and order <= in_part[0]:
                            break
                        if self._usable(sid, usable):
                            in_part = (order, sid)
                            break
        return Found(exact[1] if exact else None, in_part[1] if in_part else None, best)

    def _usable(self, sid: str, usable: Callable[[str, Indexed], bool]) -> bool:
        rec = self.members.get(sid)
        return rec is not None and usable(sid, rec)

    def _next_states(self, states: dict[Key, bool], entry: Entry, variants: Sequence[str]) -> dict[Key, bool]:
        role, text = entry
        out: dict[Key, bool] = {}

        def reach(key: Key, partial: bool) -> None:
            if key in self.nodes:
                out[key] = out.get(key, True) and partial

        for key, partial in states.items():
            reach(step(key, role, text), partial)
            for alt in variants:
                reach(step(key, role, alt), partial)
            held = self.nodes[key].held
            if role == "assistant" and held:
                i = bisect.bisect_left(held, (text,))
                while i < len(held) and held[i][0].startswith(text):
                    whole, child = held[i]
                    reach(child, partial or whole != text)
                    i += 1
        return out


def _fork_number(sid: str) -> int | None:
    base, sep, n = sid.rpartition("+")
    return int(n) if sep and n.isascii() and n.isdigit() else None
