"""One agent turn: stream the model, run tool calls, feed results back, until a plain answer.

The turn is bounded by `max_tool_iterations` and a repeat detector, every step publishes its events
(aiops/engine/events.py), and each assistant and tool message is committed as soon as it is complete. A stop
cancels the turn's task: the partial answer is recorded as cancelled, its pending gates are
cancelled, and every call still without a result gets a cancelled one, so history says what was cut
short. A failure does the same, marked as an error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from aiops.engine import events as ev
from aiops.engine.backends import ModelError
from aiops.engine.calls import run_checked
from aiops.engine.client_tools import CLIENT_CALLS, ClientTool, open_client_calls, returned, unanswered
from aiops.engine.context import by_turn, conversation, trim
from aiops.engine.textcalls import StreamGuard, looks_like_tool_call, parse_text_tool_calls
from aiops.engine.tools import ToolContext, ToolHost, ToolOutput, canonical_call
from aiops.engine.types import (
    Completion,
    Message,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    Usage,
    new_id,
    valid_completion,
    valid_data,
    valid_text,
)

if TYPE_CHECKING:
    from aiops.config import Config, ModelConfig
    from aiops.engine.backends import Backend
    from aiops.engine.bus import EventBus
    from aiops.engine.gatekeeper import GateOutcome
    from aiops.engine.sessions import LiveSession
    from aiops.engine.tools import Classification, Tool, ToolRegistry
    from aiops.engine.types import ToolSpec
    from aiops.gates.limits import LimitsConfig

log = logging.getLogger(__name__)

MAX_RESULT_CHARS = 20_000
PREVIEW_CHARS = 2_000
REPEAT_LIMIT = 3
# How long a stopped turn waits for its cancelled tool calls to clean up (a rollback, a result
# being written) before it ends without them.
CANCEL_GRACE_SECONDS = 5.0
# The result a call cut short gets, for the user now and for the model next turn: (stopped while
# the tool ran, stopped while it waited for approval, stopped before it ran).
CANCELLED_CALL = (
    "cancelled: the turn was stopped before {name} finished; its effect, if any, is unknown",
    "cancelled: the turn was stopped while {name} waited for approval; it was not executed",
    "cancelled: the turn was stopped before {name} ran; it was not executed",
)
FAILED_CALL = (
    "error: the turn failed before {name} finished; its effect, if any, is unknown",
    "error: the turn failed while {name} waited for approval; it was not executed",
    "error: the turn failed before {name} ran; it was not executed",
)


def clipped(text: str) -> str:
    """A tool's result as a session records it, whoever ran the tool: storable (see valid_text),
    and cut at MAX_RESULT_CHARS, so that one huge result does not crowd the model's context."""
    text = valid_text(text)
    if len(text) > MAX_RESULT_CHARS:
        text = text[:MAX_RESULT_CHARS] + f"\n[truncated: {len(text) - MAX_RESULT_CHARS} more characters]"
    return text


@dataclass(slots=True)
class TurnResult:
    turn_id: str
    status: str  # complete | cancelled | error
    text: str
    error: dict[str, Any] | None = None
    usage: Usage | None = None
    # "length" when the answer was cut at the model's output limit; None for a natural end.
    finish_reason: str | None = None
    # Why the engine ended the turn before the model was done (a tool-iteration limit, a repeated
    # call): the notice it recorded. The text is then not a whole answer.
    ended: str | None = None
    # Calls of client tools (named as the client knows them) the turn hands back to its client:
    # it goes on when their results come (Engine.resume). `finish_reason` is then "tool_calls".
    client_calls: list[ToolCall] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"turn_id": self.turn_id, "status": self.status, "text": self.text}
        if self.client_calls:
            d["client_calls"] = [c.to_dict() for c in self.client_calls]
        if self.error:
            d["error"] = self.error
        if self.finish_reason:
            d["finish_reason"] = self.finish_reason
        if self.ended:
            d["ended"] = self.ended
        if self.usage is not None and (counts := self.usage.counts()) is not None:
            d["usage"] = counts  # only real counts: none at all when nothing was counted
        return d

    def done_event(self, session_id: str, model: str, *, command: bool = False) -> ev.Done:
        """The `done` that ends this turn, on `model` (the one it ran on, or its session's);
        `command` when the message ran commands only. Every producer of `done` builds it here."""
        counts = self.usage.counts() if self.usage is not None else None
        return ev.Done(
            session_id=session_id, turn_id=self.turn_id, text=self.text,
            status=self.status,  # type: ignore[arg-type]
            model=model, command=command,
            error=ev.ErrorInfo.from_dict(self.error) if self.error else None,
            finish_reason=self.finish_reason, ended=self.ended,
            usage=ev.TokenCounts(**counts) if counts is not None else None,
            client_calls=tuple(ev.ClientCall(c.id, c.name, c.arguments) for c in self.client_calls))


@dataclass(slots=True)
class Turn:
    id: str
    session_id: str
    text: str
    client_kind: str
    model: str | None = None  # a one-turn `@model` override
    is_operator: bool = False
    depth: int = 0
    # The aiops instances this turn's message came through, first caller first (swarm calls).
    hops: tuple[str, ...] = ()
    prefix: str = ""  # output of commands that came in the same message
    tools_enabled: bool = True
    # The chat client's own tools, offered to the model beside the agent's (see client_tools).
    client_tools: tuple[ClientTool, ...] = ()
    cancelled_gates: int = 0  # gates of this turn cancelled by a stop
    stop_requested: bool = False  # a stop has cancelled it: later stops report nothing to stop
    # The runner has begun. A task cancelled before its first step never runs a line of it (no
    # record, no `done`), so a stop that comes earlier is left for the runner to find.
    started: bool = False
    future: asyncio.Future[TurnResult] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    task: asyncio.Task[None] | None = None  # the task running it (see turn_queue), once begun

    async def wait(self, timeout: float | None = None) -> TurnResult:
        # (asyncio.timeout: Python 3.11's wait_for can swallow a cancellation of the waiter)
        async with asyncio.timeout(timeout):
            return await asyncio.shield(self.future)

    @property
    def done(self) -> bool:
        return self.future.done()


async def _wait_cancelled(tasks: list[asyncio.Future[Any]]) -> None:
    """Wait for cancelled calls to clean up, at most CANCEL_GRACE_SECONDS: a tool that ignores its
    cancellation must not hold the turn (and the operator's stop) open. A second stop cuts the wait
    short and passes the cancellation on to them again."""
    for t in tasks:
        # Retrieved whenever it ends, so a late failure is not reported as never retrieved.
        t.add_done_callback(lambda t: t.cancelled() or t.exception())
    try:
        _, pending = await asyncio.wait(tasks, timeout=CANCEL_GRACE_SECONDS)
    except asyncio.CancelledError:
        for t in tasks:
            t.cancel()
        raise
    if pending:
        log.warning("%d tool call(s) still running %g s after they were cancelled; the turn ends "
                    "without them", len(pending), CANCEL_GRACE_SECONDS)


class TurnHost(ToolHost, Protocol):
    """What a turn needs of the engine: its models, tools, gates, records and events."""

    @property
    def config(self) -> Config: ...

    @property
    def bus(self) -> EventBus: ...

    @property
    def tools(self) -> ToolRegistry: ...

    @property
    def limits(self) -> LimitsConfig: ...

    def model_config(self, key: str) -> ModelConfig: ...

    def backend(self, key: str) -> Backend: ...

    def system_prompt(self, model_key: str, text_tools: list[ToolSpec] | None = None, *,
                      session_id: str | None = None, turn_id: str | None = None) -> str | None: ...

    async def record(self, session_id: str, msg: Message, *, publish: bool = False) -> Message: ...

    def session_changed(self, live: LiveSession) -> None:
        """The session's state (running, idle) changed: announce it."""
        ...

    async def check_call(self, tool: Tool, args: dict[str, Any], cls: Classification,
                         ctx: ToolContext) -> GateOutcome:
        """The gatekeeper's check of one call (rate limit, policy, operator)."""
        ...

    def cancel_turn_gates(self, turn_id: str, *, by: str = "stop") -> int:
        """Cancel the turn's pending gates; how many there were."""
        ...

    def tool_unavailable(self, name: str) -> str | None:
        """Why the unregistered tool `name` is a plugin's that cannot be called yet, or None."""
        ...


class TurnTimeLimit(Exception):
    """The turn reached `max_turn_seconds`; the message says so, for the `error` event."""


class TurnRunner:
    def __init__(self, engine: TurnHost, live: LiveSession, turn: Turn) -> None:
        self.engine = engine
        self.live = live
        self.turn = turn
        self.segments: list[str] = []
        # The reply streaming now, as deltas (joined on demand: appending to one str is quadratic).
        self._text_parts: list[str] = []
        self._thinking_parts: list[str] = []
        self._guard = StreamGuard()
        self.usage = Usage()
        self.model_key = turn.model or live.model_key(engine)
        # Calls committed in an assistant message and still without a result: a stop or a failure
        # answers them, so no call is left looking as if it were still running.
        self._open_calls: dict[str, ToolCall] = {}
        self._started: dict[str, float] = {}  # call id -> when it began (monotonic)
        self._at_gate: set[str] = set()  # calls in the gate check, maybe waiting for an operator
        self._executing: set[str] = set()  # calls whose tool is running
        self._finish = "stop"  # the last model call's finish reason
        self._ended: str | None = None  # the limit notice that ended the turn, if one did
        self._client_calls: list[ToolCall] = []  # handed back to the client (see client_tools)

    @property
    def partial(self) -> str:
        return "".join(self._text_parts)

    @property
    def partial_thinking(self) -> str:
        return "".join(self._thinking_parts)

    # -- events --

    def _pub(self, event: ev.Event) -> None:
        self.engine.bus.publish(event)

    def _tok(self, text: str) -> None:
        if text:
            self._pub(ev.Tok(session_id=self.turn.session_id, turn_id=self.turn.id, text=text))

    def _notice_event(self, text: str) -> None:
        self._pub(ev.Notice(session_id=self.turn.session_id, turn_id=self.turn.id, text=text))

    async def _commit(self, msg: Message) -> Message:
        """Commit one message of this turn; durable when this returns.

        A stop that lands during the write lets it finish before the cancellation goes on: the
        message is then in the store and in the cached history alike, and the cancel path, which
        answers what is still open, never records it a second time.
        """
        write = asyncio.ensure_future(self.engine.record(self.turn.session_id, msg))
        try:
            return await asyncio.shield(write)
        except asyncio.CancelledError:
            if not write.done():
                await asyncio.wait({write})
            raise

    # -- the turn --

    async def run(self) -> TurnResult:
        t = self.turn
        t.started = True
        self.live.state = "running"
        self.engine.session_changed(self.live)
        self._pub(ev.TurnStarted(session_id=t.session_id, turn_id=t.id, model=self.model_key))
        try:
            if t.stop_requested:
                raise asyncio.CancelledError  # stopped before it began: ends as any stopped turn
            await self._loop_within_time_limit()
            # A reply cut at the model's output limit says so: chat clients show it as cut off.
            finish = "tool_calls" if self._client_calls else "length" if self._finish == "length" else None
            result = TurnResult(t.id, "complete", self._final_text(), usage=self.usage,
                                finish_reason=finish, ended=self._ended, client_calls=self._client_calls)
        except asyncio.CancelledError:
            cur = asyncio.current_task()
            if cur is not None:
                cur.uncancel()
            result = await self._settle(self._on_cancel())
        except TurnTimeLimit as e:
            result = await self._settle(self._on_error("turn_time_limit", str(e)))
        except ModelError as e:
            if e.discard_partial:  # a runaway answer is never kept as context
                self._text_parts, self._thinking_parts = [], []
            result = await self._settle(self._on_error("model_error", str(e), cause=e.cause))
        except Exception as e:  # noqa: BLE001 - a bug in one turn must not kill the session
            log.exception("turn %s failed", t.id)
            result = await self._settle(self._on_error("internal_error", f"{type(e).__name__}: {e}"))
        if t.prefix:
            result.text = t.prefix + ("\n\n" + result.text if result.text else "")
        self._pub(result.done_event(t.session_id, self.model_key))
        self.live.state = "idle"
        self.engine.session_changed(self.live)
        return result

    async def _loop_within_time_limit(self) -> None:
        """The turn's loop, ended by TurnTimeLimit after `max_turn_seconds` (limits.toml)."""
        seconds = self.engine.limits.max_turn_seconds
        if not seconds:
            await self._loop()
            return
        try:
            async with asyncio.timeout(seconds) as deadline:
                await self._loop()
        except TimeoutError:
            if deadline.expired():
                raise TurnTimeLimit(f"the turn ran for {seconds:g} s, its limit (max_turn_seconds in "
                                    f"limits.toml), and was ended") from None
            raise

    async def _settle(self, record: Coroutine[Any, Any, TurnResult]) -> TurnResult:
        """Record how the turn ended. A second stop (or a shutdown) meanwhile must not cut that
        record short: it would leave calls without results and the turn without its `done`."""
        job = asyncio.ensure_future(record)
        while True:
            try:
                return await asyncio.shield(job)
            except asyncio.CancelledError:
                cur = asyncio.current_task()
                if cur is not None:
                    cur.uncancel()
                if job.cancelled():
                    raise

    def _final_text(self) -> str:
        return "\n\n".join(s for s in self.segments if s)

    def _partial_text(self) -> str:
        """The streamed part of a reply cut short, without text-form call markup in it (a call
        that was still being written is never run, and its markup was never shown)."""
        text = self.partial
        if looks_like_tool_call(text):
            parsed = parse_text_tool_calls(text, ())
            if parsed.unknown or parsed.errors:
                return parsed.text
        return text

    async def _keep_partial(self, status: str) -> None:
        """Commit what streamed of a reply cut short, marked incomplete (`status`)."""
        text = self._partial_text()
        if text or self.partial_thinking:
            await self._commit(Message(
                "assistant", text, thinking=self.partial_thinking, turn_id=self.turn.id, status=status,
                meta={"model": self.model_key, "incomplete": True}))
            self.segments.append(text)
        self._text_parts, self._thinking_parts = [], []

    async def _on_cancel(self) -> TurnResult:
        t = self.turn
        cancelled_gates = t.cancelled_gates + self.engine.cancel_turn_gates(t.id)
        await self._keep_partial("cancelled")
        stopped = await self._answer_open_calls(CANCELLED_CALL, "cancelled")
        note = "turn cancelled"
        if stopped:
            note += ": stopped " + ", ".join(c.name for c in stopped)
        if cancelled_gates:
            note += f" ({cancelled_gates} pending gate{'s' if cancelled_gates != 1 else ''} cancelled)"
        await self._commit(Message("notice", note, turn_id=t.id, meta={"kind": "cancelled"}))
        self._notice_event(note)
        return TurnResult(t.id, "cancelled", self._final_text(), usage=self.usage)

    async def _on_error(self, code: str, message: str, *, cause: str | None = None) -> TurnResult:
        t = self.turn
        await self._keep_partial("error")
        await self._answer_open_calls(FAILED_CALL, "error")
        info = ev.ErrorInfo(code, message, cause)
        err = info.to_dict()
        await self._commit(Message("error", message, turn_id=t.id, meta=err))
        self._pub(ev.ErrorEvent(session_id=t.session_id, turn_id=t.id, error=info))
        return TurnResult(t.id, "error", self._final_text(), error=err, usage=self.usage)

    async def _answer_open_calls(self, texts: tuple[str, str, str], status: str) -> list[ToolCall]:
        """Give every call still without a result one that says it was cut short, and where."""
        open_calls = list(self._open_calls.values())
        for call in open_calls:
            if call.id in self._executing:
                text, gate = texts[0], None
            elif call.id in self._at_gate:
                text, gate = texts[1], "cancelled"  # the broker cancels its gate
            else:
                text, gate = texts[2], None
            await self._record_result(call, ToolOutput(text.format(name=call.name), is_error=True),
                                      self._elapsed_ms(call), gate, status=status)
        return open_calls

    def _elapsed_ms(self, call: ToolCall) -> float:
        began = self._started.get(call.id)
        return (time.monotonic() - began) * 1000 if began is not None else 0.0

    async def _loop(self) -> None:
        engine, t = self.engine, self.turn
        model = engine.model_config(self.model_key)
        backend = engine.backend(self.model_key)
        text_mode = model.tool_calling == "text"
        tools = engine.tools.all() if t.tools_enabled else []
        client = {ct.model_name: ct for ct in t.client_tools}
        specs = [x.spec() for x in tools] + [ct.spec for ct in t.client_tools]
        known = {x.name for x in tools} | set(client)
        system = engine.system_prompt(self.model_key, specs if text_mode else [],
                                      session_id=t.session_id, turn_id=t.id)
        max_iter = engine.limits.max_tool_iterations
        seen: Counter[str] = Counter()
        iterations = 0
        await self._close_unanswered()
        while True:
            history = await self.live.history(engine)
            context = trim(conversation(by_turn(history, t.id)), model.max_context)
            if text_mode:
                from aiops.engine.context import as_text_protocol

                context = as_text_protocol(context)
            if self.segments and self.segments[-1]:
                self._tok("\n\n")
            completion = await self._stream(backend, context, [] if text_mode else specs, system)
            self._finish = completion.finish_reason
            calls = list(completion.tool_calls)
            visible = completion.text
            if not calls and t.tools_enabled and (text_mode or looks_like_tool_call(visible)):
                parsed = parse_text_tool_calls(visible, known)
                if parsed.calls or parsed.unknown or parsed.errors:
                    visible = parsed.text
                    calls = list(parsed.calls)
                    calls += [ToolCall(new_id("txt_"), name, {}, parse_error=f"unknown tool {name!r}")
                              for name in parsed.unknown]
                    calls += [ToolCall(new_id("txt_"), "invalid_tool_call", {}, parse_error=err)
                              for err in parsed.errors]
            self._tok(self._guard.finish(visible))
            self.segments.append(visible)
            self._text_parts, self._thinking_parts = [], []
            # Open before the commit: from here on a stop must answer these calls (the client's
            # too, until they are handed back to it).
            self._open_calls = {c.id: c for c in calls}
            theirs = [c for c in calls if c.name in client and not c.parse_error]
            meta: dict[str, Any] = {"model": self.model_key}
            if theirs:
                meta[CLIENT_CALLS] = {c.id: client[c.name].name for c in theirs}
            await self._commit(Message(
                "assistant", visible, tool_calls=calls, thinking=completion.thinking, turn_id=t.id,
                meta=meta))
            if not calls:
                return
            keys = [canonical_call(c.name, c.arguments) for c in calls]
            for k in keys:
                seen[k] += 1
            repeated = [c for c, k in zip(calls, keys, strict=True) if seen[k] >= REPEAT_LIMIT]
            if repeated:
                await self._refuse_all(calls, "not executed: the same call was repeated a third time")
                await self._end_early(f"ended the turn: {repeated[0].name} was called a third time "
                                      f"with the same arguments")
                return
            if iterations >= max_iter:
                await self._refuse_all(calls, "not executed: the tool iteration limit was reached")
                await self._end_early(f"ended the turn after {max_iter} tool iterations "
                                      f"(max_tool_iterations in limits.toml)")
                return
            iterations += 1
            # The agent's own calls run first, gated as always; then the client's go back to it.
            mine = [c for c in calls if c.id not in meta.get(CLIENT_CALLS, {})]
            if mine:
                await self._run_calls(mine)
            if theirs:
                self._hand_back(theirs, client)
                return

    async def _close_unanswered(self) -> None:
        """The client of an earlier turn sent this turn's message instead of the results of the
        client calls it was given: they are recorded as unanswered, and this turn goes on from
        the new message."""
        waiting = open_client_calls(await self.live.history(self.engine), before=self.turn.id)
        if waiting is None or waiting.turn_id == self.turn.id:
            return
        for result in unanswered(waiting):
            await self._commit(result)
            self._pub(returned(self.turn.session_id, result))

    def _hand_back(self, calls: list[ToolCall], client: dict[str, ClientTool]) -> None:
        """End the turn's model loop with calls the client runs: shown to every view as client
        calls (aiops does not gate them), answered when the client sends their results."""
        t = self.turn
        for c in calls:
            self._open_calls.pop(c.id, None)
            self._pub(ev.ToolCalled(session_id=t.session_id, turn_id=t.id, call_id=c.id, tool=c.name,
                                    arguments=c.arguments, client=True))
        self._client_calls = [ToolCall(c.id, client[c.name].name, c.arguments) for c in calls]

    async def _run_calls(self, calls: list[ToolCall]) -> None:
        """Run the agent's calls of one reply concurrently."""
        running = [asyncio.ensure_future(self._run_call(c)) for c in calls]
        try:
            # Not gather: cancelled, gather waits for every child to finish, so one tool that
            # ignores its cancellation would hold the stop; the cleanup below is bounded.
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_EXCEPTION)
            errors = [t.exception() for t in done if not t.cancelled()]  # every one retrieved
            if any(t.cancelled() for t in done):
                # A call cancelled from inside (a library raising CancelledError in a tool)
                # ends the turn as a stop would, and is recorded as one.
                raise asyncio.CancelledError
            failed = next((e for e in errors if e is not None), None)
            if failed is not None:
                raise failed
        finally:
            # A call that failed (or a stop) must not leave its siblings running on after the
            # turn ends. Cancelled, they still clean up (a result being written, a tool rolling
            # back): the turn waits for that, boundedly, so nothing of theirs lands after the
            # turn's own record and its `done`.
            if unfinished := [task for task in running if not task.done()]:
                for task in unfinished:
                    task.cancel()
                await _wait_cancelled(unfinished)

    async def _stream(self, backend: Any, context: list[Message], specs: list[Any],
                      system: str | None) -> Completion:
        self._guard = StreamGuard()
        self._text_parts, self._thinking_parts = [], []
        completion: Completion | None = None
        # The model's text is made valid as it arrives (see valid_text): a stray surrogate in one
        # token must not cut every stream of the session and fail the turn at its record.
        async for item in backend.stream(context, specs, system=system):
            if isinstance(item, TextDelta):
                text = valid_text(item.text)
                self._text_parts.append(text)
                self._tok(self._guard.feed(text))
            elif isinstance(item, ThinkingDelta):
                text = valid_text(item.text)
                self._thinking_parts.append(text)
                self._pub(ev.Thinking(session_id=self.turn.session_id, turn_id=self.turn.id, text=text))
            elif isinstance(item, Completion):
                completion = valid_completion(item)
        if completion is None:
            raise ModelError(self.model_key, self.engine.model_config(self.model_key).display_url(),
                             "the stream ended without a completion")
        if completion.usage:
            self.usage.prompt_tokens += completion.usage.prompt_tokens
            self.usage.completion_tokens += completion.usage.completion_tokens
        return completion

    async def _notice(self, text: str, *, kind: str | None = None) -> None:
        """`kind` "ended": the turn ends with this notice (crash recovery reads it so)."""
        await self._commit(Message("notice", text, turn_id=self.turn.id, meta={"kind": kind} if kind else {}))
        self._notice_event(text)

    async def _end_early(self, why: str) -> None:
        """The engine ends the turn before the model has answered: recorded, announced, and kept
        for `done`, so that no client takes what came so far for a whole answer."""
        self._ended = why
        await self._notice(why, kind="ended")

    async def _refuse_all(self, calls: list[ToolCall], reason: str) -> None:
        for c in calls:
            await self._record_result(c, ToolOutput(reason, is_error=True), 0.0)

    async def _record_result(self, call: ToolCall, out: ToolOutput, duration_ms: float,
                             decision: str | None = None, status: str = "complete") -> None:
        # Answered from here on, even if a stop lands during the write (the write still finishes).
        if self._open_calls.pop(call.id, None) is None:
            # Already answered: a tool that ignored its cancellation past the grace period and
            # ended after its turn did. The record says it was cancelled; nothing more is written.
            log.warning("tool %s ended after its turn had recorded it as cut short; result dropped",
                        call.name)
            return
        text = clipped(out.text)  # (a tool's text comes from anywhere: an MCP server, a web page)
        meta: dict[str, Any] = {"is_error": out.is_error, "duration_ms": round(duration_ms, 1)}
        if decision:
            meta["gate"] = decision
        result_data = valid_data(out.data)  # (structured output can hold undecodable names too)
        if result_data is not None:
            meta["data"] = result_data
        returned = ev.ToolReturned(
            session_id=self.turn.session_id, turn_id=self.turn.id, call_id=call.id, tool=call.name,
            content=text[:PREVIEW_CHARS], truncated=len(text) > PREVIEW_CHARS, is_error=out.is_error,
            duration_ms=meta["duration_ms"], gate=decision or None, result_data=result_data,
            status=status)  # type: ignore[arg-type]
        try:
            await self._commit(Message("tool", text, tool_call_id=call.id, name=call.name,
                                       turn_id=self.turn.id, meta=meta, status=status))
        except asyncio.CancelledError:
            self._pub(returned)  # committed all the same (see _commit)
            raise
        except Exception:
            # Not recorded (the store refused it): still open, so the failure path answers it.
            self._open_calls[call.id] = call
            raise
        self._pub(returned)

    async def _run_call(self, call: ToolCall) -> None:
        engine, t = self.engine, self.turn
        self._pub(ev.ToolCalled(session_id=t.session_id, turn_id=t.id, call_id=call.id, tool=call.name,
                                arguments=call.arguments))
        start = self._started[call.id] = time.monotonic()
        decision: str | None = None
        tool = engine.tools.get(call.name)
        # A tool its plugin has not registered yet (an MCP server still connecting) is not unknown:
        # the model is told why it cannot run now, not that it does not exist.
        pending = engine.tool_unavailable(call.name) if tool is None else None
        if pending:
            out = ToolOutput(f"error: {pending}; {call.name} was not executed", is_error=True)
        elif call.parse_error and tool is None:
            out = ToolOutput(f"error: {call.parse_error}. Available tools: "
                             f"{', '.join(engine.tools.names()) or 'none'}", is_error=True)
        elif call.parse_error:
            out = ToolOutput(f"error: could not decode the arguments of {call.name}: {call.parse_error}",
                             is_error=True)
        elif tool is None:
            out = ToolOutput(f"error: unknown tool {call.name!r}; it was not executed. Available tools: "
                             f"{', '.join(engine.tools.names()) or 'none'}", is_error=True)
        else:
            ctx = ToolContext(engine, t.session_id, t.client_kind, t.id, self.model_key, depth=t.depth,
                              is_operator=t.is_operator, hops=t.hops, call_id=call.id)
            out, decision = await self._execute(tool, call, ctx)
        await self._record_result(call, out, (time.monotonic() - start) * 1000, decision)

    async def _execute(self, tool: Any, call: ToolCall, ctx: ToolContext) -> tuple[ToolOutput, str | None]:
        def at_gate(waiting: bool) -> None:
            # Left set if a stop lands at the gate: the call was stopped there.
            if waiting:
                self._at_gate.add(call.id)
            else:
                self._at_gate.discard(call.id)

        return await run_checked(self.engine.check_call, tool, call.arguments, ctx, at_gate=at_gate,
                                 executing=lambda: self._executing.add(call.id))
