"""Taking in a message: read it, find (or make) its session, run its `!commands`, check its
one-turn model, commit its text and queue its turn.

Each step either lets the message go on or ends it with one of three values: `Queued` (a turn
waits for the model), `Finished` (answered without a model turn: its commands' output, or why its
text did not run) or `Refused` (nothing of it ran; the caller raises EngineError with the reason).
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from aiops.engine import events as ev
from aiops.engine.client_tools import ClientTool
from aiops.engine.commands import CommandContext, CommandHost, ParsedInput, not_the_senders
from aiops.engine.errors import EngineError
from aiops.engine.sessions import SESSION_KINDS, HeldDeletions, LiveSession, SessionCache
from aiops.engine.store import OWNER_KEY
from aiops.engine.turn import Turn, TurnResult
from aiops.engine.types import Message, is_short_id, new_id

if TYPE_CHECKING:
    from aiops.engine.bus import EventBus
    from aiops.engine.turn_queue import TurnQueue

MAX_COMMANDS = 20  # per message


@dataclass(frozen=True, slots=True)
class Queued:
    """The message's text is committed and its turn queued on the session."""

    turn: Turn


@dataclass(frozen=True, slots=True)
class Finished:
    """The message was answered without a model turn; `turn` has already ended."""

    turn: Turn


@dataclass(frozen=True, slots=True)
class Refused:
    """Nothing of the message ran: `reason` is for the user."""

    reason: str


Outcome = Queued | Finished | Refused


class IntakeHost(CommandHost, Protocol):
    """What the intake needs of the engine besides its own collaborators: the commands' view of
    it (a command runs with it), and the way a message is committed."""

    async def record(self, session_id: str, msg: Message, *, publish: bool = False) -> Message: ...

    def notice(self, session_id: str | None, text: str, turn_id: str | None = None, *,
               persist: bool = True) -> None: ...


def too_many_commands(parsed: ParsedInput) -> str | None:
    if len(parsed.commands) > MAX_COMMANDS:
        # Each runs on the loop, answers and may be written down: thousands of `!help` lines in
        # one message stalled every client for seconds and answered with 100+ MB.
        return (f"a message may hold at most {MAX_COMMANDS} !commands; "
                f"this one holds {len(parsed.commands)}")
    return None


@dataclass(slots=True)
class _Message:
    """One message being taken in, and what the steps learned of it so far."""

    client_id: str
    parsed: ParsedInput
    kind: str
    model: str | None
    is_operator: bool
    depth: int
    tools: bool
    hops: tuple[str, ...]
    meta: dict[str, Any] | None
    owner: str | None  # with `owner_only`: the owner its session must have
    client_tools: tuple[ClientTool, ...] = ()  # the chat client's tools, as offered to the model
    title: str | None = None  # what the session is titled by, when not the text (see Engine.submit)
    turn_id: str = field(default_factory=lambda: new_id("turn_"))
    live: LiveSession | None = None
    session_id: str = ""  # the session's full id once found; else the client's id
    outputs: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # the output of each command that reported an error

    def answer(self) -> str:
        return "\n\n".join(self.outputs)


class Intake:
    def __init__(self, host: IntakeHost, bus: EventBus, cache: SessionCache, held: HeldDeletions,
                 turns: TurnQueue) -> None:
        self._host = host
        self._bus = bus
        self._cache = cache
        self._held = held
        self._turns = turns

    def parse(self, text: str, kind: str) -> ParsedInput:
        """A message from a client of `kind` as read (see CommandRegistry.parse); EngineError when
        it holds more than MAX_COMMANDS commands."""
        parsed = self._host.commands.parse(text, kind)
        if why := too_many_commands(parsed):
            raise EngineError(why)
        return parsed

    def precheck(self, text: str, model: str | None) -> Refused | None:
        """What refuses a message before anything of it is taken in (even while stopping)."""
        if not text or not text.strip():
            return Refused("empty message")
        if model is not None and (why := self._host.check_model(model)):
            # Before anything runs: a new session would store this model, an existing one run on it.
            return Refused(why)
        return None

    async def take(self, pins: ExitStack, client_id: str | None, text: str, *, kind: str,
                   model: str | None, is_operator: bool, depth: int, tools: bool,
                   meta: dict[str, Any] | None, owner_only: bool, hops: tuple[str, ...] = (),
                   client_tools: tuple[ClientTool, ...] = (), title: str | None = None) -> Outcome:
        """The steps, in order. The session is pinned (on `pins`) from the moment it is known
        until its turn is queued: the commands and the writes in between must not see it dropped
        from memory."""
        parsed = self._host.commands.parse(text, kind)
        if why := too_many_commands(parsed):
            return Refused(why)
        msg = _Message(client_id or f"{kind}-{new_id()[:8]}", parsed, kind, model, is_operator, depth,
                       tools, hops, meta, (meta or {}).get(OWNER_KEY) if owner_only else None, client_tools,
                       title)
        if (refused := await self._find_session(msg, pins)) is not None:
            return refused
        if parsed.commands and (finished := await self._run_commands(msg, pins)) is not None:
            return finished
        if (finished := self._check_turn_model(msg)) is not None:
            return finished
        return await self._queue_text(msg)

    # -- the steps --

    async def _find_session(self, msg: _Message, pins: ExitStack) -> Refused | None:
        cid, kind = msg.client_id, msg.kind
        try:
            if msg.parsed.text:
                # A refused `@model` is answered later; it must not leave a new, empty session behind.
                refused = msg.parsed.model is not None and self._host.check_model(msg.parsed.model) is not None
                live = await self._host.session(cid, kind=kind, create=not refused, model=msg.model,
                                                meta=msg.meta)
            elif kind == "console" and not is_short_id(cid):
                # A console's session exists from the moment the console opens it (in-process it
                # is made then), so that `!model KEY` sets the model of its first turn. An attached
                # console's opens on the server with its first message: commands or not, as here.
                live = await self._host.session(cid, kind=kind, create=True, model=msg.model, meta=msg.meta)
            else:
                # Only commands: they run without creating a session, so `!help` from a new client
                # leaves nothing behind (a command that needs a session says so, or creates it).
                live = await self._host.session(cid)
                if live is None and is_short_id(cid):
                    return Refused(f"no session {cid}: all-digit ids are shorthand ids of existing sessions")
                if live is None and kind not in SESSION_KINDS:
                    return Refused(f"unknown session kind {kind!r}")
        except EngineError as e:
            return Refused(str(e))
        if live is not None and msg.owner is not None and live.row.owner != msg.owner:
            # The caller found no session of this id and another caller's appeared since (the
            # API checks access to one that exists): nothing of this message is for it.
            return Refused(not_the_senders(cid))
        pins.enter_context(self._cache.pinned(live))
        msg.live = live
        msg.session_id = live.id if live is not None else cid
        return None

    def _gone(self, msg: _Message) -> bool:
        """The session went away (or began to) while this message was being taken: deleted by one
        of its commands or by someone else. Nothing more may be written to it: a write behind the
        deletion's would fail, and a turn queued on it would never run."""
        live = msg.live
        return live is not None and (not self._cache.holds(live) or live.deleting is not None)

    async def _run_commands(self, msg: _Message, pins: ExitStack) -> Finished | None:
        sid, turn_id, parsed = msg.session_id, msg.turn_id, msg.parsed
        # A command may delete this very session: its deletion is announced after the `done` of
        # this message, so that a stream ending at the deletion still gets that `done`.
        self._held.commands_begin(sid)
        pins.callback(self._commands_over, sid)
        echo = "\n".join(parsed.commands)
        echoed = msg.live is not None
        if echoed:
            await self._host.record(sid, Message("user", echo, turn_id=turn_id, meta={"command": True}))
        self._bus.publish(ev.UserPosted(session_id=sid, turn_id=turn_id, text=echo, command=True))
        ctx = CommandContext(self._host, sid, msg.kind, msg.is_operator, turn_id, owner=msg.owner)
        for i, line in enumerate(parsed.commands):
            ctx.failed = False
            out = await self._host.commands.run(ctx, line)
            ok = not ctx.failed
            if not ok:
                msg.failed.append(out)
            if msg.live is None and (appeared := self._cache.get(sid)) is not None and ctx.foreign(appeared):
                # Not ours to write into, nor to publish to (its streams are its owner's).
                msg.outputs.append(out)
                if i + 1 < len(parsed.commands):
                    msg.outputs.append(f"(the rest of the message was not run: {not_the_senders(sid)})")
                return Finished(self._finish(msg, publish=False))
            if self._gone(msg):
                # A command deleted this very session (or a delete came meanwhile): answer, but
                # write nothing more to it.
                if i + 1 < len(parsed.commands) or parsed.text:
                    out += "\n(the rest of the message was not run: its session is deleted)"
                msg.outputs.append(out)
                self._bus.publish(ev.Notice(session_id=sid, turn_id=turn_id, text=out, command=line, ok=ok))
                assert msg.live is not None
                return Finished(self._finish(msg, model=msg.live.model_key(self._host)))
            msg.outputs.append(out)
            if msg.live is None:
                msg.live = self._cache.get(sid)  # a plugin's command may have created it
                pins.enter_context(self._cache.pinned(msg.live))
            if msg.live is not None:
                if not echoed:
                    await self._host.record(sid, Message("user", echo, turn_id=turn_id, meta={"command": True}))
                    echoed = True
                if not self._gone(msg):
                    await self._host.record(sid, Message("notice", out, turn_id=turn_id,
                                                         meta={"kind": "command", "command": line}))
            self._bus.publish(ev.Notice(session_id=sid, turn_id=turn_id, text=out, command=line, ok=ok))
        return None

    def _turn_model(self, msg: _Message) -> str | None:
        """The model of this one turn, when it is not the session's: an `@model`, or a `model`
        given with a message to an existing session that stores another."""
        live = msg.live
        return msg.parsed.model or (msg.model if live is not None and msg.model != live.row.model else None)

    def _check_turn_model(self, msg: _Message) -> Finished | None:
        parsed = msg.parsed
        if parsed.model is not None and not parsed.text:
            msg.outputs.append(f"@{parsed.model} needs a prompt after it (or use !model {parsed.model} "
                               f"to switch this session)")
        turn_model = self._turn_model(msg)
        if turn_model and (why := self._host.check_model(turn_model)):
            msg.outputs.append(why)
            return Finished(self._finish(msg, status="error", model=msg.model))
        if not parsed.text or msg.live is None:
            return Finished(self._finish(msg, model=msg.model))
        return None

    async def _queue_text(self, msg: _Message) -> Queued | Finished:
        live, parsed, turn_id = msg.live, msg.parsed, msg.turn_id
        assert live is not None
        turn_model = self._turn_model(msg)
        if not self._gone(msg):
            meta: dict[str, Any] = {"model": turn_model} if turn_model else {}
            if msg.title and msg.title != parsed.text:
                meta["title"] = msg.title
            await self._host.record(live.id, Message("user", parsed.text, turn_id=turn_id, meta=meta))
        if self._gone(msg):  # (a write ahead of the deletion's is deleted with the session)
            msg.outputs.append("this message was not run: its session was deleted meanwhile")
            return Finished(self._finish(msg, status="cancelled", model=live.model_key(self._host),
                                         command=bool(parsed.commands)))
        self._bus.publish(ev.UserPosted(session_id=live.id, turn_id=turn_id, text=parsed.text, model=turn_model))
        turn = Turn(turn_id, live.id, parsed.text, msg.kind, model=turn_model, is_operator=msg.is_operator,
                    depth=msg.depth, hops=msg.hops, prefix=msg.answer(), tools_enabled=msg.tools,
                    client_tools=msg.client_tools)
        if self._turns.enqueue(live, turn):
            self._host.notice(live.id, f"queued behind the running turn ({len(live.queue)} waiting)",
                              turn_id, persist=False)
        return Queued(turn)

    # -- endings --

    def _finish(self, msg: _Message, status: str = "complete", model: str | None = None,
                command: bool = True, publish: bool = True) -> Turn:
        """The turn of a message that ran no model: its commands' output (or why it was refused).
        Its `done` has the fields of any turn's (`model`: the session's, or a new one's), plus
        `command: true` unless the message was text that a delete kept from running. Without
        `publish`, the session there is not the sender's: nothing of it goes into its streams,
        and nothing of it (its model) comes back."""
        session_id, turn_id, text = msg.session_id, msg.turn_id, msg.answer()
        live = self._cache.get(session_id) if publish else None
        model_key = live.model_key(self._host) if live is not None else (
            model or self._host.config.models.default_model)
        turn = Turn(turn_id, session_id, "", msg.kind)
        error = {"code": "bad_request", "message": text} if status == "error" else None
        if status == "complete" and msg.failed:
            # A command that failed fails the message, as a refused one does: a script reads the
            # status, not each notice's `ok`. Those notices said it already: no `error` event.
            status, error = "error", {"code": "command_failed", "message": "\n\n".join(msg.failed)}
        result = TurnResult(turn_id, status, text, error)
        turn.future.set_result(result)
        if not publish:
            return turn
        if error is not None and error["code"] == "bad_request":
            self._bus.publish(ev.error_event(session_id, "bad_request", text, turn_id))
        self._bus.publish(result.done_event(session_id, model_key, command=command))
        return turn

    def _commands_over(self, session_id: str) -> None:
        if (deleted := self._held.commands_over(session_id)) is not None:
            self._bus.publish(deleted)
