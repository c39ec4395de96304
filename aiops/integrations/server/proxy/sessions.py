"""Which session a chat request continues, and starting its turn there.

Chat UIs resend the whole conversation with every request; the agent keeps one session per
conversation. `ProxySessions.start` maps one onto the other:

* **Ownership.** Sessions are created owned by the caller (see owners); a client token continues
  only its own, operators any.
* **Reconciliation.** The client's user and assistant texts are authoritative. A request continues
  the session of its root (see identity) whose conversation equals the client's history before the
  new message; one whose conversation is a prefix of it gets the missing messages imported first.
  Anything else (an edited or regenerated message, a new chat that happens to share a fingerprint)
  forks a new session holding the client's history, its client tool exchanges included (see
  imported). aiops adds only the new trailing user message, and its own tool records stay with the
  matching prefix (see matching).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import OrderedDict
from collections.abc import Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from aiops.engine import events as ev
from aiops.engine.bus import Subscription
from aiops.engine.client_tools import offer, open_client_calls
from aiops.engine.commands import parse_input
from aiops.engine.engine import Engine, EngineError
from aiops.engine.turn import Turn
from aiops.engine.types import Message, ToolSpec
from aiops.integrations.server.context import check_model
from aiops.integrations.server.errors import HttpError
from aiops.integrations.server.owners import Caller, claim, forbidden, owner_meta, owner_of
from aiops.integrations.server.proxy.identity import ConversationId, first_root, root_of
from aiops.integrations.server.proxy.imported import model_names, records, taken_in
from aiops.integrations.server.proxy.index import Indexed, RootIndex
from aiops.integrations.server.proxy.matching import (
    Entry,
    client_entries,
    client_view,
    is_prefix,
    maybe_unseen,
    session_view,
    since_reset,
)
from aiops.integrations.server.proxy.messages import ClientMessage, ClientToolCall, check_conversation, folded
from aiops.integrations.server.proxy.models import PublishedModel, turn_model
from aiops.integrations.server.proxy.openwebui import as_typed, question_of, with_system_context
from aiops.integrations.server.proxy.status import collapsed
from aiops.integrations.server.proxy.tool_results import exchange, pair


@dataclass
class StartedTurn:
    session_id: str
    turn: Turn
    sub: Subscription | None
    forked: bool = False
    imported: int = 0


async def _finish(job: Coroutine[Any, Any, None]) -> None:
    """Run `job` to its end even if the caller is cancelled meanwhile, once or more."""
    task = asyncio.ensure_future(job)
    while not task.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(task)


async def _cancel_accepted(engine: Engine, session_id: str, submit: asyncio.Future[Turn]) -> None:
    try:
        turn = await submit
    except Exception:  # noqa: BLE001 - refused after all: nothing to cancel
        return
    await cancel_turn(engine, session_id, turn, "the client disconnected")


def _check_turn_model(engine: Engine, text: str) -> None:
    """A leading `@model` the engine would refuse is the request's fault (400), and is refused
    before a session is made for it: the engine's answer came as a 502/500 and left an empty one."""
    try:
        parsed = engine.parse(text, "proxy")
    except EngineError as e:
        raise HttpError(400, "invalid_request", str(e), param="messages") from None
    if parsed.model is None:
        return
    if not parsed.text and not parsed.commands:
        raise HttpError(400, "invalid_request", f"@{parsed.model} needs a prompt after it",
                        param="messages")
    check_model(engine, parsed.model, "messages")


_BATCH = 500  # sessions read from the store in one go when a root is read after a start
# Sessions remembered as waiting for their client's tool results (the oldest forgotten first).
_AWAITING_MAX = 4096


@dataclass
class MatchStats:
    """The matching work done so far (tests and benchmarks read it): a request's share must not
    grow with the number of conversations of its root."""
    histories_read: int = 0  # session histories read to index or confirm a session
    steps: int = 0  # client entries walked through an index


class ProxySessions:
    """Maps conversations to sessions; one lock per conversation root serialises resolution.

    The sessions of each root are filed in a `RootIndex` by their conversations, so that a request
    finds its session in work proportional to its own history, not to the number of chats sharing
    its root. The index is memory only, built from the store one root at a time: the first request
    of a root after a start reads each of its sessions once; after that, a session is read again
    only when its history changed (the engine says which, see `Engine.watch_history`)."""

    def __init__(self, engine: Engine, *, max_imported: int = 1000) -> None:
        self.engine = engine
        self.max_imported = max_imported  # earlier messages a session takes in from clients, in all
        self.stats = MatchStats()
        self._roots: dict[str, RootIndex] = {}
        self._roots_of: dict[str, set[str]] = {}  # session id -> the roots filing it
        self._loaded = False
        self._load_lock = asyncio.Lock()
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        # Sessions whose last turn handed client tool calls back (session -> the calls' ids),
        # newest last: where a request carrying results looks first, rather than reading every
        # session of its root (all of one `user`'s chats, every "hi" chat of one caller).
        self._awaiting: OrderedDict[str, frozenset[str]] = OrderedDict()
        # A deleted session leaves the index at once: a long-running server would otherwise keep
        # every conversation it ever saw.
        self._unlisten = engine.bus.add_listener(self._on_event)
        self._unwatch = engine.watch_history(self._history_changed)

    def close(self) -> None:
        """Stop following the engine's events (the app's cleanup)."""
        self._unlisten()
        self._unwatch()

    def _on_event(self, event: ev.Event) -> None:
        match event:
            case ev.SessionChanged(change="deleted", session_id=str(sid)) if sid:
                self._forget(sid)
            case ev.Done(client_calls=calls, session_id=str(sid)) if calls:
                self._awaiting[sid] = frozenset(c.id for c in calls)
                self._awaiting.move_to_end(sid)
                while len(self._awaiting) > _AWAITING_MAX:
                    self._awaiting.popitem(last=False)
            case ev.TurnStarted(session_id=str(sid)) | ev.UserPosted(session_id=str(sid)):
                self._awaiting.pop(sid, None)

    def _history_changed(self, sid: str) -> None:
        for root in self._roots_of.get(sid, ()):
            self._roots[root].dirty.add(sid)

    def _file(self, root: str, sid: str, *, first: bool = False) -> RootIndex:
        index = self._roots.get(root)
        if index is None:
            index = self._roots[root] = RootIndex(root)
        index.add(sid, first=first)
        self._roots_of.setdefault(sid, set()).add(root)
        return index

    def _forget(self, sid: str, root: str | None = None) -> None:
        """`sid` out of the index (of `root` only, when given)."""
        roots = self._roots_of.get(sid, set())
        for r in [root] if root is not None else list(roots):
            index = self._roots.get(r)
            if index is not None:
                index.remove(sid)
                if not index.members:
                    del self._roots[r]
            roots.discard(r)
        if not roots:
            self._roots_of.pop(sid, None)
            self._awaiting.pop(sid, None)

    def roots_indexed(self) -> dict[str, list[str]]:
        """Each root the index holds, with its sessions (oldest first)."""
        return {root: index.ordered() for root, index in self._roots.items()}

    async def _load_index(self) -> None:
        if self._loaded:
            return
        async with self._load_lock:
            if self._loaded:
                return
            # Names only: each session is read when its root is first asked for.
            for sid in await self.engine.store.session_ids("proxy"):
                self._file(root_of(sid), sid)
            self._loaded = True

    async def _lock(self, root: str) -> asyncio.Lock:
        lock, n = self._locks.get(root, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[root] = (lock, n + 1)
        return lock

    def _unlock(self, root: str) -> None:
        lock, n = self._locks[root]
        if n <= 1:
            del self._locks[root]
        else:
            self._locks[root] = (lock, n - 1)

    async def start(self, conv: ConversationId, messages: Sequence[ClientMessage],
                    model: PublishedModel, who: Caller, *, events: Iterable[str] | None = None,
                    client_tools: Sequence[ToolSpec] = ()) -> StartedTurn:
        """Pick (or fork) the session, import what it lacks, subscribe (to `events`, default all),
        submit the new message (offering the model `client_tools`). Sessions `who` may not use
        are never continued; new ones are owned by `who`."""
        messages = folded(messages)  # a tool exchange is part of its answer (see client_tools)
        check_conversation(messages)
        messages = with_system_context(messages, self.engine)
        _check_turn_model(self.engine, messages[-1].text)
        # One admission from the first look at the sessions to the submit: a shutdown that
        # begins meanwhile waits for it, rather than closing the store under a half-imported
        # history or a message accepted with no turn to end it.
        with self.engine.admission():
            await self._load_index()
            lock = await self._lock(conv.root)
            try:
                async with lock:
                    return await self._start_locked(conv, messages, model, who, events, client_tools)
            finally:
                self._unlock(conv.root)
                index = self._roots.get(conv.root)
                if index is not None and not index.members:
                    del self._roots[conv.root]  # refused, or every session of it gone

    async def _start_locked(self, conv: ConversationId, messages: Sequence[ClientMessage],
                            model: PublishedModel, who: Caller, events: Iterable[str] | None,
                            client_tools: Sequence[ToolSpec]) -> StartedTurn:
        engine = self.engine
        earlier = since_reset(engine, messages[:-1])
        entries = client_entries(earlier)
        index = self._roots.get(conv.root)
        if index is None or conv.root not in index.members:
            # A conversation new to the proxy takes in all of it (and _choose creates its session).
            self._check_import(conv.root, len(self._records(taken_in(earlier), client_tools)), 0)
        session_id, skip, forked = await self._choose(conv, entries, model, who)
        missing = self._records(_lacking(earlier, entries, skip), client_tools)
        if missing:
            index = self._roots.get(conv.root)
            rec = index.members.get(session_id) if index is not None else None  # (a new one: none)
            self._check_import(session_id, len(missing), rec.imported if rec is not None else 0)
        # Created here (owned by the caller) when it is new; refused if it is not the caller's.
        await claim(engine, session_id, who, kind="proxy", model=turn_model(model))
        imported = 0
        if missing:
            imported = await self._import(session_id, missing)
        # The session exists from here on (claimed, perhaps imported into): indexed whatever
        # follows (read when the root is next looked up: its turn is about to change it anyway).
        self._file(conv.root, session_id)
        # Subscribed before submitting, so not even a command's instant `done` is missed.
        sub = engine.bus.subscribe(session_id, names=events)
        # The owner again: should a delete slip in before the submit runs, the session it starts
        # afresh is still the caller's, not an unowned one only operators may use.
        submit = asyncio.ensure_future(engine.submit(session_id, messages[-1].text, kind="proxy",
                                                     model=turn_model(model), is_operator=False,
                                                     meta=owner_meta(who), owner_only=not who.operator,
                                                     client_tools=client_tools,
                                                     title=question_of(messages[-1].text)))
        return await self._started(session_id, submit, sub, forked, imported)

    async def _started(self, session_id: str, submit: asyncio.Future[Turn], sub: Subscription,
                       forked: bool = False, imported: int = 0) -> StartedTurn:
        engine = self.engine
        try:
            # Shielded: a client hanging up (its handler cancelled) while the engine records the
            # message would leave a question that no turn answers, and the retry would fork.
            turn = await asyncio.shield(submit)
        except asyncio.CancelledError:
            sub.close()
            # The engine finishes accepting the message, then the turn is cancelled as any
            # hang-up cancels it; neither is cut short by a second cancel (a shutdown, say).
            await _finish(_cancel_accepted(engine, session_id, submit))
            raise
        except BaseException as e:
            sub.close()
            if isinstance(e, EngineError):
                raise HttpError(400, "invalid_request", str(e)) from None
            raise
        return StartedTurn(session_id, turn, sub, forked, imported)

    async def resume(self, conv: ConversationId, messages: Sequence[ClientMessage], who: Caller, *,
                     events: Iterable[str] | None = None, client_tools: Sequence[ToolSpec] = ()) -> StartedTurn:
        """A request carrying the results of client tool calls: the session of the conversation
        whose turn waits for them records them and goes on (see client_tools)."""
        asked, results = exchange(messages)
        view = client_view(since_reset(self.engine, folded(messages)))
        with self.engine.admission():
            await self._load_index()
            lock = await self._lock(conv.root)
            try:
                async with lock:
                    found = await self._waiting_for(conv, view, asked, results, who)
                    if found is None:
                        raise HttpError(400, "invalid_request",
                                        "the tool results answer no tool call this conversation's session "
                                        "waits for (answered already, or the chat was changed since): send "
                                        "a new user message instead", param="messages")
                    session_id, pairs = found
                    sub = self.engine.bus.subscribe(session_id, names=events)
                    job = asyncio.ensure_future(self.engine.resume(session_id, pairs, kind="proxy",
                                                                   client_tools=client_tools))
                    return await self._started(session_id, job, sub)
            finally:
                self._unlock(conv.root)

    async def _waiting_for(self, conv: ConversationId, view: list[Entry], asked: Sequence[ClientToolCall],
                           results: Sequence[ClientMessage], who: Caller) -> tuple[str, list[tuple[str, str]]] | None:
        """The session of the conversation whose last turn waits for these results, with each
        result's call id: one whose conversation is the client's, newest first, preferring one
        whose calls the results name by id (a regenerated answer forks a second such session)."""
        index = self._roots.get(conv.root)
        known = index.ordered() if index is not None else []
        if conv.explicit and conv.root not in known:
            known.append(conv.root)
        # The sessions known to wait first (the results' ids first among them); every session of
        # the root only when none of them fits (after a restart, which forgets who waits).
        ids = {r.tool_call_id for r in results}
        waiting = sorted((sid for sid in known if sid in self._awaiting),
                         key=lambda sid: (bool(ids & self._awaiting[sid]), known.index(sid)))
        found = await self._waiting_among(waiting, conv, view, asked, results, who)
        if found is None and waiting != known:
            found = await self._waiting_among(known, conv, view, asked, results, who)
        return found

    async def _waiting_among(self, candidates: list[str], conv: ConversationId, view: list[Entry],
                             asked: Sequence[ClientToolCall], results: Sequence[ClientMessage],
                             who: Caller) -> tuple[str, list[tuple[str, str]]] | None:
        fallback: tuple[str, list[tuple[str, str]]] | None = None
        for sid in reversed(candidates):
            live = await self.engine.session(sid)
            if live is None or live.row.kind != "proxy" or not who.may_use(owner_of(live)):
                continue
            history = await live.history(self.engine)
            ours = session_view(history)
            if not (conv.explicit and sid == conv.root and not view) and not (
                    len(ours) == len(view) and is_prefix(ours, view)):
                continue
            waiting = open_client_calls(history)
            paired = pair(waiting, asked, results) if waiting is not None else None
            if paired is None:
                continue
            pairs, exact = paired
            if exact:
                return sid, pairs
            fallback = fallback or (sid, pairs)
        return fallback

    def _check_import(self, session_id: str, missing: int, already: int) -> None:
        """400 when taking in `missing` earlier messages would give the session more than
        `max_imported` messages from clients' histories (before anything is created or written)."""
        if missing + already > self.max_imported:
            held = f" (it holds {already} already)" if already else ""
            raise HttpError(400, "history_too_long",
                            f"the chat's history is too long to take in: {missing} earlier messages for "
                            f"session {session_id!r}{held}, the limit is {self.max_imported} a session "
                            f"(proxy_max_imported in [server] of aiops.toml); start a new chat",
                            param="messages")

    async def _choose(self, conv: ConversationId, entries: list[tuple[Entry, ClientMessage]],
                      model: PublishedModel, who: Caller) -> tuple[str, int, bool]:
        """(session id, how many of the client's messages it already holds (the rest are imported
        first), whether this forked)."""
        engine = self.engine
        index = self._roots.get(conv.root)
        if index is None or conv.root not in index.members:
            # Not a proxy session we know of: create it, owned by the caller (one store round
            # trip), or learn whose it is.
            try:
                live = await claim(engine, conv.root, who, kind="proxy", model=turn_model(model))
            except HttpError:
                if conv.explicit:
                    raise  # a session named outright: say it is another's rather than fork
                live = None  # a name shared by chance (a fingerprint): the caller forks from it
            if live is not None and live.row.kind == "proxy":
                index = self._file(conv.root, conv.root, first=True)
            elif live is not None and conv.explicit:
                kind = live.row.kind
                raise HttpError(409, "session_conflict",
                                f"session {conv.root!r} is {'an' if kind in ('api', 'mcp') else 'a'} {kind} session; "
                                f"the proxy continues only proxy sessions")
        elif conv.explicit:
            live = await engine.session(conv.root)
            if live is not None and not who.may_use(owner_of(live)):
                raise forbidden(conv.root)
        if index is None:
            index = self._roots[conv.root] = RootIndex(conv.root)
        client = [entry for entry, _ in entries]
        variants = [self._variants(entry, m) for entry, m in entries]
        for _ in range(2):
            await self._refresh(index)
            chosen = self._match(index, conv, client, variants, who)
            if chosen is None:
                break
            sid, held = chosen
            if (held == 0 and conv.explicit and sid == conv.root) or await self._confirmed(sid, held, client):
                return sid, held, False
            # A stale or colliding entry (never seen in practice): read it again, look up again.
            index.dirty.add(sid)
        new_id_ = await self._free_id(conv.root, index)
        return new_id_, 0, new_id_ != conv.root

    def _variants(self, entry: Entry, m: ClientMessage) -> tuple[str, ...]:
        """What else a user text starting with `@model` or `!commands` may have been recorded as:
        the text the engine keeps of it (under the proxy's command rules, or anyone's), as the
        session's view shows it. Only texts that end the client's, as matching._same allows."""
        role, text = entry
        if role != "user" or text[:1] not in ("@", "!"):
            return ()
        out: list[str] = []
        for parsed in (self.engine.commands.parse(m.text, "proxy"), parse_input(m.text, self.engine.commands.raw_names())):
            alt = as_typed(collapsed(parsed.text))
            if alt != text and text.endswith(alt) and alt not in out:
                out.append(alt)
        return tuple(out)

    def _match(self, index: RootIndex, conv: ConversationId, client: list[Entry],
               variants: list[tuple[str, ...]], who: Caller) -> tuple[str, int] | None:
        """The session to continue and how many of the client's messages it holds, or None: the
        one holding all of them, else the one holding the longest prefix of them. One that holds
        them only by taking the client's copy of a stopped answer for part of its own comes after
        one that holds them outright, and the newest such branch first: a regenerated answer
        stopped early often begins as the first one did."""

        def usable(sid: str, rec: Indexed) -> bool:
            if not who.may_use(rec.owner):
                return False  # another caller's branch of a shared name: never continued, never shown
            # A first message never continues an existing conversation.
            return bool(client) or conv.explicit or not rec.view

        self.stats.steps += len(client)
        found = index.find(client, variants, usable)
        if found.exact is not None:
            return found.exact, len(client)
        if found.in_part is not None:
            return found.in_part, len(client)
        if not client and conv.explicit:
            root = index.members.get(conv.root)
            if root is not None and root.view and who.may_use(root.owner):
                # X-Aiops-Session with only the new message: aiops holds the history.
                return conv.root, 0
        return found.best

    async def _refresh(self, index: RootIndex) -> None:
        """Read the sessions of `index` whose history changed since they were filed (or that were
        never read): each change is read once, by the next request of its root. Many at once (every
        one of the root, after a start) are read from the store in batches; one, through the engine
        (whose copy of a busy session's history is in memory)."""
        engine = self.engine
        while index.dirty:
            if len(index.dirty) > 1:
                cold = list(itertools.islice(index.dirty, _BATCH))
                index.dirty.difference_update(cold)
                found = await engine.store.histories(cold)
                self.stats.histories_read += len(found)
                for row, history in found:
                    if row.kind == "proxy":
                        self._put(index, row.id, row.owner, history)
                for sid in set(cold) - {row.id for row, _ in found if row.kind == "proxy"}:
                    self._forget(sid, index.root)
                continue
            # (Out of `dirty` before reading: a write meanwhile, which the watcher reports, puts it
            # back, to be read again by the next request.)
            sid = index.dirty.pop()
            live = await engine.session(sid)
            if live is None or live.row.kind != "proxy":
                self._forget(sid, index.root)
                continue
            history = await live.history(engine)
            self.stats.histories_read += 1
            self._put(index, sid, owner_of(live), history)

    @staticmethod
    def _put(index: RootIndex, sid: str, owner: str | None, history: list[Message]) -> None:
        stopped = any(maybe_unseen(m) for m in history)
        index.put(sid, owner, sum(1 for m in history if m.meta.get("imported")),
                  session_view(history), session_view(history, without_stopped=True) if stopped else None)

    async def _confirmed(self, sid: str, held: int, client: list[Entry]) -> bool:
        """The chosen session's real conversation is what its index entry said."""
        live = await self.engine.session(sid)
        if live is None:
            return False
        history = await live.history(self.engine)
        self.stats.histories_read += 1
        return any(len(ours) == held and is_prefix(ours, client)
                   for ours in (session_view(history), session_view(history, without_stopped=True)))

    async def _free_id(self, root: str, index: RootIndex) -> str:
        if await self.engine.session(root) is None:
            return root
        # After the highest fork known: counting up from 2 asked the store once per earlier fork.
        n = index.top_fork + 1
        if len(f"{root}+{n}") > 128:
            # A fork of a fork sent back as X-Aiops-Session: named after the first root instead,
            # so that its id can be sent again too.
            root, n = first_root(root), 2
        while await self.engine.session(f"{root}+{n}") is not None:
            n += 1
        return f"{root}+{n}"

    def _records(self, messages: Sequence[ClientMessage], client_tools: Sequence[ToolSpec]) -> list[Message]:
        """What a session records of the client's earlier `messages` (see imported): their tool
        calls named as this turn offers the client's tools to the model."""
        if not messages:
            return []
        agent_tools = frozenset(self.engine.tools.names())
        return records(messages, model_names(offer(client_tools, agent_tools), agent_tools))

    async def _import(self, session_id: str, missing: list[Message]) -> int:
        """Record the client's earlier messages (see imported.records)."""
        for msg in missing:
            await self.engine.record(session_id, msg)
        return len(missing)



def _lacking(earlier: Sequence[ClientMessage], entries: list[tuple[Entry, ClientMessage]],
             skip: int) -> list[ClientMessage]:
    """The client's earlier messages a session holding the first `skip` of its `entries` (taken
    from `earlier`) lacks: every one from the first entry it lacks on, answers of tool calls alone
    included (matching leaves them out of the view; see imported.taken_in)."""
    if skip >= len(entries):
        return []
    first = entries[skip][1]
    start = next(i for i, m in enumerate(earlier) if m is first)  # the message itself, not its equal
    return taken_in(earlier[start:])


async def cancel_turn(engine: Engine, session_id: str, turn: Turn, why: str) -> None:
    """Cancel one turn, running or still queued; a running one records its partial answer."""
    if turn.done:
        return
    live = await engine.session(session_id)
    if live is None:
        return
    if live.current is turn:
        engine.stop_turn(session_id, by=why)
    elif engine.drop_queued_turn(live, turn):
        await engine.record(session_id, Message("notice", f"turn cancelled before it started: {why}",
                                                turn_id=turn.id, meta={"kind": "cancelled"}))

