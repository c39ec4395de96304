"""One agent turn: stream the model, run tool calls, feed results back, until a plain answer.

The turn is bounded by `max_tool_iterations` and a repeat detector, every step publishes the events
of DESIGN.md, and each assistant and tool message is committed as soon as it is complete. A stop
cancels the turn's task: the partial answer is recorded as cancelled and its pending gates denied.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from aiops.engine import events as ev
from aiops.engine.backends import ModelError
from aiops.engine.context import by_turn, conversation, trim
from aiops.engine.textcalls import looks_like_tool_call, parse_text_tool_calls
from aiops.engine.tools import ToolContext, ToolOutput, canonical_call, format_validation_error
from aiops.engine.types import Completion, Message, TextDelta, ThinkingDelta, ToolCall, Usage, new_id

if TYPE_CHECKING:
    from aiops.engine.engine import Engine, LiveSession

log = logging.getLogger(__name__)

MAX_RESULT_CHARS = 20_000
PREVIEW_CHARS = 2_000
REPEAT_LIMIT = 3
# Text that may open a text-form tool call: held back from the stream until the reply is complete.
_CALL_MARKERS = ("<tool_call", "<tool_code", "<function=", "```", "{{")
_MAX_MARKER = max(len(m) for m in _CALL_MARKERS)


@dataclass(slots=True)
class TurnResult:
    turn_id: str
    status: str  # complete | cancelled | error
    text: str
    error: dict[str, Any] | None = None
    usage: Usage | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"turn_id": self.turn_id, "status": self.status, "text": self.text}
        if self.error:
            d["error"] = self.error
        if self.usage:
            d["usage"] = {"prompt_tokens": self.usage.prompt_tokens,
                          "completion_tokens": self.usage.completion_tokens}
        return d


@dataclass(slots=True)
class Turn:
    id: str
    session_id: str
    text: str
    client_kind: str
    model: str | None = None  # a one-turn `@model` override
    is_operator: bool = False
    depth: int = 0
    prefix: str = ""  # output of commands that came in the same message
    tools_enabled: bool = True
    cancelled_gates: int = 0  # gates of this turn cancelled by a stop
    future: asyncio.Future[TurnResult] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    task: asyncio.Task[TurnResult] | None = None

    async def wait(self, timeout: float | None = None) -> TurnResult:
        return await asyncio.wait_for(asyncio.shield(self.future), timeout)

    @property
    def done(self) -> bool:
        return self.future.done()


def _marker_prefix_len(text: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a call marker."""
    best = 0
    for m in _CALL_MARKERS:
        for k in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:k]):
                best = k
                break
    return best


class _StreamFilter:
    """Streams text deltas, but holds back what may be a text-form tool call."""

    def __init__(self, publish_tok: Any, hold_all: bool) -> None:
        self._publish = publish_tok
        self.buffer = ""
        self.emitted = 0
        self.holding = hold_all
        self.started = False  # seen non-blank text (a reply opening with JSON may be a call)

    def feed(self, text: str) -> None:
        # Only the new text plus a marker-length overlap is scanned, so a long answer costs linear time.
        scan_from = max(0, len(self.buffer) - _MAX_MARKER)
        self.buffer += text
        if self.holding:
            return
        if not self.started:
            stripped = self.buffer.lstrip()
            if stripped:
                self.started = True
                if stripped.startswith(("{", "[")):
                    self.holding = True
                    return
        window = self.buffer[scan_from:]
        if any(m in window for m in _CALL_MARKERS):
            self.holding = True
            return
        # hold back only a tail that could be the start of a marker split across deltas
        safe = len(self.buffer) - _marker_prefix_len(self.buffer)
        if safe > self.emitted:
            self._publish(self.buffer[self.emitted:safe])
            self.emitted = safe

    def finish(self, visible: str) -> None:
        """Emit what remains of the visible text once the reply is parsed."""
        if visible.startswith(self.buffer[: self.emitted]):
            rest = visible[self.emitted:]
        else:
            rest = visible if self.emitted == 0 else ""
        if rest:
            self._publish(rest)


class TurnRunner:
    def __init__(self, engine: Engine, live: LiveSession, turn: Turn) -> None:
        self.engine = engine
        self.live = live
        self.turn = turn
        self.segments: list[str] = []
        self.partial = ""
        self.partial_thinking = ""
        self.usage = Usage()
        self.model_key = turn.model or live.model_key(engine)

    # -- events --

    def _pub(self, name: str, data: dict[str, Any]) -> None:
        self.engine.bus.publish(name, self.turn.session_id, data, self.turn.id)

    def _tok(self, text: str) -> None:
        if text:
            self._pub(ev.TOK, {"text": text})

    # -- the turn --

    async def run(self) -> TurnResult:
        t = self.turn
        self.live.state = "running"
        self.engine._session_changed(self.live)
        self._pub(ev.TURN, {"status": "started", "model": self.model_key})
        try:
            await self._loop()
            result = TurnResult(t.id, "complete", self._final_text(), usage=self.usage)
        except asyncio.CancelledError:
            cur = asyncio.current_task()
            if cur is not None:
                cur.uncancel()
            result = await self._on_cancel()
        except ModelError as e:
            result = await self._on_error("model_error", str(e))
        except Exception as e:  # noqa: BLE001 - a bug in one turn must not kill the session
            log.exception("turn %s failed", t.id)
            result = await self._on_error("internal_error", f"{type(e).__name__}: {e}")
        if t.prefix:
            result.text = t.prefix + ("\n\n" + result.text if result.text else "")
        done = {"text": result.text, "status": result.status, "model": self.model_key}
        if result.error:
            done["error"] = result.error
        if self.usage.total_tokens:
            done["usage"] = {"prompt_tokens": self.usage.prompt_tokens,
                             "completion_tokens": self.usage.completion_tokens}
        self._pub(ev.DONE, done)
        self.live.state = "idle"
        self.engine._session_changed(self.live)
        return result

    def _final_text(self) -> str:
        return "\n\n".join(s for s in self.segments if s)

    async def _on_cancel(self) -> TurnResult:
        t = self.turn
        cancelled_gates = t.cancelled_gates + self.engine.gatekeeper.broker.cancel_turn(t.id)
        if self.partial or self.partial_thinking:
            await self.engine.record(t.session_id, Message(
                "assistant", self.partial, thinking=self.partial_thinking, turn_id=t.id,
                status="cancelled", meta={"model": self.model_key}))
            self.segments.append(self.partial)
        note = "turn cancelled"
        if cancelled_gates:
            note += f" ({cancelled_gates} pending gate{'s' if cancelled_gates != 1 else ''} cancelled)"
        await self.engine.record(t.session_id, Message("notice", note, turn_id=t.id,
                                                       meta={"kind": "cancelled"}))
        self._pub(ev.NOTICE, {"text": note})
        return TurnResult(t.id, "cancelled", self._final_text(), usage=self.usage)

    async def _on_error(self, code: str, message: str) -> TurnResult:
        t = self.turn
        err = {"code": code, "message": message}
        await self.engine.record(t.session_id, Message("error", message, turn_id=t.id, meta=err))
        self._pub(ev.ERROR, err)
        return TurnResult(t.id, "error", self._final_text(), error=err, usage=self.usage)

    async def _loop(self) -> None:
        engine, t = self.engine, self.turn
        model = engine.model_config(self.model_key)
        backend = engine.backend(self.model_key)
        text_mode = model.tool_calling == "text"
        tools = engine.tools.all() if t.tools_enabled else []
        specs = [x.spec() for x in tools]
        known = {x.name for x in tools}
        system = engine.system_prompt(self.model_key, specs if text_mode else [],
                                      session_id=t.session_id, turn_id=t.id)
        max_iter = engine.limits.max_tool_iterations
        seen: Counter[str] = Counter()
        iterations = 0
        while True:
            history = await self.live.history(engine)
            context = trim(conversation(by_turn(history, t.id)), model.max_context)
            if text_mode:
                from aiops.engine.context import as_text_protocol

                context = as_text_protocol(context)
            if self.segments and self.segments[-1]:
                self._tok("\n\n")
            completion = await self._stream(backend, context, [] if text_mode else specs, system,
                                            hold_all=text_mode)
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
            self._filter.finish(visible)
            self.segments.append(visible)
            self.partial = ""
            self.partial_thinking = ""
            await engine.record(t.session_id, Message(
                "assistant", visible, tool_calls=calls, thinking=completion.thinking, turn_id=t.id,
                meta={"model": self.model_key}))
            if not calls:
                return
            keys = [canonical_call(c.name, c.arguments) for c in calls]
            for k in keys:
                seen[k] += 1
            repeated = [c for c, k in zip(calls, keys, strict=True) if seen[k] >= REPEAT_LIMIT]
            if repeated:
                await self._refuse_all(calls, "not executed: the same call was repeated a third time")
                await self._notice(f"ended the turn: {repeated[0].name} was called a third time with "
                                   f"the same arguments")
                return
            if iterations >= max_iter:
                await self._refuse_all(calls, "not executed: the tool iteration limit was reached")
                await self._notice(f"ended the turn after {max_iter} tool iterations "
                                   f"(max_tool_iterations in limits.toml)")
                return
            iterations += 1
            await asyncio.gather(*(self._run_call(c) for c in calls))

    async def _stream(self, backend: Any, context: list[Message], specs: list[Any], system: str | None,
                      hold_all: bool) -> Completion:
        self._filter = _StreamFilter(self._tok, hold_all)
        completion: Completion | None = None
        async for item in backend.stream(context, specs, system=system):
            if isinstance(item, TextDelta):
                self.partial += item.text
                self._filter.feed(item.text)
            elif isinstance(item, ThinkingDelta):
                self.partial_thinking += item.text
                self._pub(ev.THINKING, {"text": item.text})
            elif isinstance(item, Completion):
                completion = item
        if completion is None:
            raise ModelError(self.model_key, self.engine.model_config(self.model_key).display_url(),
                             "the stream ended without a completion")
        if completion.usage:
            self.usage.prompt_tokens += completion.usage.prompt_tokens
            self.usage.completion_tokens += completion.usage.completion_tokens
        return completion

    async def _notice(self, text: str) -> None:
        await self.engine.record(self.turn.session_id, Message("notice", text, turn_id=self.turn.id))
        self._pub(ev.NOTICE, {"text": text})

    async def _refuse_all(self, calls: list[ToolCall], reason: str) -> None:
        for c in calls:
            await self._record_result(c, ToolOutput(reason, is_error=True), 0.0)

    async def _record_result(self, call: ToolCall, out: ToolOutput, duration_ms: float,
                             decision: str | None = None) -> None:
        text = out.text
        if len(text) > MAX_RESULT_CHARS:
            text = text[:MAX_RESULT_CHARS] + f"\n[truncated: {len(out.text) - MAX_RESULT_CHARS} more characters]"
        meta: dict[str, Any] = {"is_error": out.is_error, "duration_ms": round(duration_ms, 1)}
        if decision:
            meta["gate"] = decision
        if out.data is not None:
            meta["data"] = out.data
        await self.engine.record(self.turn.session_id, Message(
            "tool", text, tool_call_id=call.id, name=call.name, turn_id=self.turn.id, meta=meta))
        data = {"id": call.id, "name": call.name, "content": text[:PREVIEW_CHARS],
                "truncated": len(text) > PREVIEW_CHARS, "is_error": out.is_error,
                "duration_ms": meta["duration_ms"]}
        if decision:
            data["gate"] = decision
        if out.data is not None:
            data["data"] = out.data
        self._pub(ev.TOOL_RESULT, data)

    async def _run_call(self, call: ToolCall) -> None:
        engine, t = self.engine, self.turn
        self._pub(ev.TOOL_CALL, {"id": call.id, "name": call.name, "arguments": call.arguments})
        start = time.monotonic()
        decision: str | None = None
        tool = engine.tools.get(call.name)
        if call.parse_error and tool is None:
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
                              is_operator=t.is_operator)
            out, decision = await self._execute(tool, call, ctx)
        await self._record_result(call, out, (time.monotonic() - start) * 1000, decision)

    async def _execute(self, tool: Any, call: ToolCall, ctx: ToolContext) -> tuple[ToolOutput, str | None]:
        try:
            args = tool.validate(call.arguments)
        except ValidationError as e:
            return ToolOutput("error: " + format_validation_error(tool.name, e), is_error=True), None
        try:
            cls = tool.classification(args)
        except Exception as e:  # noqa: BLE001 - a classifier failure must fail closed
            return ToolOutput(f"error: {tool.name} could not be checked: {e}", is_error=True), None
        outcome = await self.engine.gatekeeper.check(tool, call.arguments, cls, ctx)
        if not outcome.allowed:
            return ToolOutput(outcome.message, is_error=True), outcome.decision
        try:
            raw = await tool.execute(args, ctx)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - the model sees the failure and the turn goes on
            log.info("tool %s raised: %s", tool.name, e)
            return ToolOutput(f"error: {tool.name} failed: {e}", is_error=True), outcome.decision
        out = raw if isinstance(raw, ToolOutput) else ToolOutput(str(raw))
        return out, outcome.decision
