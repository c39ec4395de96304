"""Which session a chat request continues, and starting its turn there.

Chat UIs resend the whole conversation with every request; the agent keeps one session per
conversation. `ProxySessions.start` maps one onto the other:

* **Ownership.** Sessions are created owned by the caller (see owners); a client token continues
  only its own, operators any.
* **Reconciliation.** The client's user and assistant texts are authoritative. A request continues
  the session of its root (see identity) whose conversation equals the client's history before the
  new message; one whose conversation is a prefix of it gets the missing messages imported first.
  Anything else (an edited or regenerated message, a new chat that happens to share a fingerprint)
  forks a new session holding the client's history. aiops adds only the new trailing user message,
  and its own tool records stay with the matching prefix (see matching).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from aiops.engine import events as ev
from aiops.engine.bus import Subscription
from aiops.engine.client_tools import open_client_calls
from aiops.engine.engine import Engine, EngineError
from aiops.engine.turn import Turn
from aiops.engine.types import Message, ToolSpec, new_id
from aiops.integrations.server.context import check_model
from aiops.integrations.server.errors import HttpError
from aiops.integrations.server.owners import Caller, claim, forbidden, owner_meta, owner_of
from aiops.integrations.server.proxy.identity import ConversationId, first_root, root_of
from aiops.integrations.server.proxy.matching import (
    Entry,
    Seen,
    client_entries,
    client_view,
    is_prefix,
    is_prefix_sig,
    maybe_unseen,
    session_view,
    signatures,
    since_reset,
)
from aiops.integrations.server.proxy.messages import ClientMessage, ClientToolCall, check_conversation, folded
from aiops.integrations.server.proxy.models import PublishedModel, turn_model
from aiops.integrations.server.proxy.openwebui import with_system_context
from aiops.integrations.server.proxy.status import without_status_lines
from aiops.integrations.server.proxy.tool_results import exchange, pair


@dataclass
class StartedTurn:
    session_id: str
    turn: Turn
    sub: Subscription | None
    forked: bool = False
    imported: int = 0


_SEEN_MAX = 4096  # compact views kept (a few KB each, plus the text of any stopped answer)


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


class ProxySessions:
    """Maps conversations to sessions; one lock per conversation root serialises resolution."""

    def __init__(self, engine: Engine, *, max_imported: int = 1000) -> None:
        self.engine = engine
        self.max_imported = max_imported  # earlier messages a session takes in from clients, in all
        self._forks: dict[str, list[str]] = {}  # root -> known session ids of that root
        # Compact views of recently compared sessions, least recently used first: without them
        # every request read the history of every chat sharing its name (a `user` field names
        # all of one person's chats), and grew slower with each chat.
        self._seen: OrderedDict[str, Seen] = OrderedDict()
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

    def close(self) -> None:
        """Stop following the engine's events (the app's cleanup)."""
        self._unlisten()

    def _on_event(self, event: ev.Event) -> None:
        match event:
            case ev.SessionChanged(change="deleted", session_id=str(sid)) if sid:
                self._forget(sid)
            case ev.Done(client_calls=calls, session_id=str(sid)) if calls:
                self._awaiting[sid] = frozenset(c.id for c in calls)
                self._awaiting.move_to_end(sid)
                while len(self._awaiting) > _SEEN_MAX:
                    self._awaiting.popitem(last=False)
            case ev.TurnStarted(session_id=str(sid)) | ev.UserPosted(session_id=str(sid)):
                self._awaiting.pop(sid, None)

    def _forget(self, sid: str) -> None:
        self._seen.pop(sid, None)
        self._awaiting.pop(sid, None)
        for root in {sid, root_of(sid), first_root(sid)}:
            known = self._forks.get(root)
            if known is not None and sid in known:
                known.remove(sid)
                if not known:
                    del self._forks[root]

    async def _load_index(self) -> None:
        if self._loaded:
            return
        async with self._load_lock:
            if self._loaded:
                return
            for sid in await self.engine.store.session_ids("proxy"):
                self._forks.setdefault(root_of(sid), []).append(sid)
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
                if self._forks.get(conv.root) == []:
                    del self._forks[conv.root]  # refused, or every session of it gone

    async def _start_locked(self, conv: ConversationId, messages: Sequence[ClientMessage],
                            model: PublishedModel, who: Caller, events: Iterable[str] | None,
                            client_tools: Sequence[ToolSpec]) -> StartedTurn:
        engine = self.engine
        entries = client_entries(since_reset(engine, messages[:-1]))
        client = [entry for entry, _ in entries]
        if conv.root not in self._forks.get(conv.root, ()):
            # A conversation new to the proxy takes in all of it (and _choose creates its session).
            self._check_import(conv.root, len(entries), 0)
        session_id, skip, forked = await self._choose(conv, client, model, who)
        missing = [m for _, m in entries[skip:]]
        if missing:
            seen = self._seen.get(session_id)  # a session read while choosing (a new one: none)
            self._check_import(session_id, len(missing), seen.imported if seen is not None else 0)
        # Created here (owned by the caller) when it is new; refused if it is not the caller's.
        await claim(engine, session_id, who, kind="proxy", model=turn_model(model))
        imported = 0
        if missing:
            imported = await self._import(session_id, missing)
        # The session exists from here on (claimed, perhaps imported into): indexed whatever follows.
        known = self._forks.setdefault(conv.root, [])
        if session_id not in known:
            known.append(session_id)
        # Subscribed before submitting, so not even a command's instant `done` is missed.
        sub = engine.bus.subscribe(session_id, names=events)
        # The owner again: should a delete slip in before the submit runs, the session it starts
        # afresh is still the caller's, not an unowned one only operators may use.
        submit = asyncio.ensure_future(engine.submit(session_id, messages[-1].text, kind="proxy",
                                                     model=turn_model(model), is_operator=False,
                                                     meta=owner_meta(who), owner_only=not who.operator,
                                                     client_tools=client_tools))
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
        known = list(self._forks.get(conv.root, ()))
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

    async def _choose(self, conv: ConversationId, client: list[Entry],
                      model: PublishedModel, who: Caller) -> tuple[str, int, bool]:
        """(session id, how many of the client's messages it already holds (the rest are imported
        first), whether this forked)."""
        engine = self.engine
        known = self._forks.setdefault(conv.root, [])
        if conv.root not in known:
            # Not a proxy session we know of: create it, owned by the caller (one store round
            # trip), or learn whose it is.
            try:
                live = await claim(engine, conv.root, who, kind="proxy", model=turn_model(model))
            except HttpError:
                if conv.explicit:
                    raise  # a session named outright: say it is another's rather than fork
                live = None  # a name shared by chance (a fingerprint): the caller forks from it
            if live is not None and live.row.kind == "proxy":
                known.insert(0, conv.root)
            elif live is not None and conv.explicit:
                kind = live.row.kind
                raise HttpError(409, "session_conflict",
                                f"session {conv.root!r} is {'an' if kind in ('api', 'mcp') else 'a'} {kind} session; "
                                f"the proxy continues only proxy sessions")
        elif conv.explicit:
            live = await engine.session(conv.root)
            if live is not None and not who.may_use(owner_of(live)):
                raise forbidden(conv.root)
        for trusted in (True, False):
            chosen = await self._match(known, conv, client, who, trusted)
            if chosen is None:
                break
            sid, held = chosen
            if (held == 0 and conv.explicit and sid == conv.root) or await self._confirmed(sid, held, client):
                return sid, held, False
            # A stale or colliding compact view (never seen in practice): compare the real ones.
            self._seen.clear()
        new_id_ = await self._free_id(conv.root, known)
        return new_id_, 0, new_id_ != conv.root

    async def _match(self, known: list[str], conv: ConversationId, client: list[Entry], who: Caller,
                     trusted: bool) -> tuple[str, int] | None:
        """The session to continue and how many of the client's messages it holds, or None: the
        one holding all of them, else the one holding the longest prefix of them. One that holds
        them only by taking the client's copy of a stopped answer for part of its own comes after
        one that holds them outright, and the newest such branch first: a regenerated answer
        stopped early often begins as the first one did."""
        best: tuple[str, int] | None = None  # a session whose conversation is a prefix of the client's
        in_part: tuple[str, int] | None = None  # holds them all, an answer of it in part
        root_used = False
        for sid in list(known):
            seen = await self._seen_of(sid, trusted)
            if seen is None or seen.kind != "proxy":
                if sid in known:  # deleted meanwhile (the listener may have been first)
                    known.remove(sid)
                continue
            if not who.may_use(seen.owner):
                continue  # another caller's branch of a shared name: never continued, never shown
            ours = seen.view
            if sid == conv.root:
                root_used = bool(ours)
            if not client and ours and not conv.explicit:
                continue  # a first message never continues an existing conversation
            for view in (ours, seen.unstopped):  # (unstopped: without a stopped answer the client never got)
                if view is not None and len(view) == len(client):
                    if is_prefix_sig(view, client, in_part=False):
                        return sid, len(client)
                    if is_prefix_sig(view, client):
                        in_part = (sid, len(client))  # the newest one wins: `known` is oldest first
            if (best is None or len(ours) > best[1]) and is_prefix_sig(ours, client):
                best = (sid, len(ours))
        if in_part is not None:
            return in_part
        if not client and conv.explicit and root_used:
            # X-Aiops-Session with only the new message: aiops holds the history.
            return conv.root, 0
        return best

    async def _seen_of(self, sid: str, trusted: bool) -> Seen | None:
        engine = self.engine
        stamp = engine.history_stamp(sid)  # before reading: a write meanwhile makes it stale
        seen = self._seen.get(sid)
        if trusted and seen is not None and seen.stamp == stamp:
            self._seen.move_to_end(sid)
            return seen
        live = await engine.session(sid)
        if live is None:
            self._seen.pop(sid, None)
            return None
        history = await live.history(engine)
        stopped = any(maybe_unseen(m) for m in history)
        seen = Seen(stamp, live.row.kind, owner_of(live), signatures(session_view(history)),
                    signatures(session_view(history, without_stopped=True)) if stopped else None,
                    sum(1 for m in history if m.meta.get("imported")))
        self._seen[sid] = seen
        self._seen.move_to_end(sid)
        while len(self._seen) > _SEEN_MAX:
            self._seen.popitem(last=False)
        return seen

    async def _confirmed(self, sid: str, held: int, client: list[Entry]) -> bool:
        """The chosen session's real conversation is what its compact view said."""
        live = await self.engine.session(sid)
        if live is None:
            return False
        history = await live.history(self.engine)
        return any(len(ours) == held and is_prefix(ours, client)
                   for ours in (session_view(history), session_view(history, without_stopped=True)))

    async def _free_id(self, root: str, known: Sequence[str]) -> str:
        if await self.engine.session(root) is None:
            return root
        # After the highest fork known: counting up from 2 asked the store once per earlier fork.
        forks = (sid.rpartition("+")[2] for sid in known if sid != root)
        n = max((int(f) for f in forks if f.isascii() and f.isdigit()), default=1) + 1
        if len(f"{root}+{n}") > 128:
            # A fork of a fork sent back as X-Aiops-Session: named after the first root instead,
            # so that its id can be sent again too.
            root, n = first_root(root), 2
        while await self.engine.session(f"{root}+{n}") is not None:
            n += 1
        return f"{root}+{n}"

    async def _import(self, session_id: str, missing: list[ClientMessage]) -> int:
        """Record the client's earlier messages, one turn id per user message and its answer."""
        turn_id: str | None = None
        for m in missing:
            if m.role == "user" or turn_id is None:
                turn_id = new_id("imp_")
            text = m.text if m.role == "user" else without_status_lines(m.text)
            await self.engine.record(session_id, Message(m.role, text, turn_id=turn_id,  # type: ignore[arg-type]
                                                         meta={"imported": True, "source": "proxy"}))
        return len(missing)



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

