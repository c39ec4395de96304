"""One user message's turn, shown in its thread: a placeholder posted at once and updated as the
turn goes (a tool running, a gate waiting for *what*), a message per gate that says what waits
and then who decided, and finally the answer in place of the placeholder (in parts when long)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from aiops.engine.engine import EngineError
from aiops.engine.events import (
    DONE,
    ERROR,
    GATE,
    GATE_RESOLVED,
    NOTICE,
    TOOL_CALL,
    Done,
    ErrorEvent,
    ErrorInfo,
    GateOpened,
    GateResolved,
    Notice,
    ToolCalled,
    is_slow_consumer,
)
from aiops.integrations.slack.gate_blocks import (
    outcome_blocks,
    outcome_text,
    summary,
    waiting_blocks,
    waiting_text,
)
from aiops.integrations.slack.intake import UserMessage
from aiops.integrations.slack.markup import escape, markdown_to_mrkdwn
from aiops.integrations.slack.poster import Poster
from aiops.integrations.slack.splitting import split_message

if TYPE_CHECKING:
    from aiops.engine.bus import Subscription
    from aiops.engine.facade import EngineFacade

log = logging.getLogger(__name__)

WORKING = ":hourglass_flowing_sand: working…"
# The events a thread shows (token deltas are not streamed into Slack: each would be an update).
_FOLLOWED = (TOOL_CALL, GATE, GATE_RESOLVED, NOTICE, ERROR, DONE)


def answer_text(text: str, status: str, error: str | None = None, *, finish_reason: str | None = None,
                ended: str | None = None) -> str:
    """The Markdown a finished turn leaves in its thread."""
    notes: list[str] = []
    if status == "cancelled":
        notes.append("*(stopped)*")
    elif status == "error":
        notes.append(f"**error:** {error or 'the turn failed'}")
    if finish_reason == "length":
        notes.append("*(cut at the model's output limit)*")
    if ended:
        notes.append(f"*({ended})*")
    return "\n\n".join([t for t in (text.strip(), *notes) if t]) or "*(no answer)*"


class ThreadTurn:
    """Submit one message to its thread's session and show its turn in the thread."""

    def __init__(self, engine: EngineFacade, poster: Poster, msg: UserMessage, *, buttons: bool) -> None:
        self.engine = engine
        self.poster = poster
        self.msg = msg
        self.buttons = buttons
        self.placeholder: str | None = None
        self.gate_messages: dict[str, str] = {}  # gate id -> ts of its message in the thread

    async def run(self, text: str) -> None:
        msg = self.msg
        self.placeholder = await self.poster.post(msg.channel, msg.thread_ts, WORKING)
        # Subscribed before the message goes in: none of its turn's events can be missed.
        with self.engine.subscribe(msg.session_id, names=_FOLLOWED) as sub:
            try:
                handle = await self.engine.submit(msg.session_id, text, kind="slack",
                                                  meta={"slack_user": msg.user})
            except EngineError as e:
                await self._finish(f"**error:** {e}")
                return
            try:
                done = await self._follow(sub, handle.id)
            except Exception:  # noqa: BLE001 - a bug here must not leave "working…" for good
                log.exception("slack: following turn %s failed", handle.id)
                await self._finish("**error:** showing this answer failed (see aiops.log); it is in the "
                                   "session's history")
                return
        if done is None:
            # The stream ended before the turn's `done` (this reader fell too far behind): the
            # turn's result says how it ended.
            result = await handle.wait()
            done = answer_text(str(getattr(result, "text", "")), str(getattr(result, "status", "error")))
        await self._finish(done)

    async def _status(self, text: str) -> None:
        if self.placeholder is not None:
            await self.poster.update(self.msg.channel, self.placeholder, text)

    async def _follow(self, sub: Subscription, turn_id: str) -> str | None:
        """Show the turn's progress; its answer (Markdown) once it is done, None if the stream
        ended first."""
        error: ErrorInfo | None = None
        async for event in sub:
            if is_slow_consumer(event):
                break
            if event.turn_id != turn_id:
                continue  # another message's turn in the same thread follows itself
            match event:
                case ToolCalled(tool=tool):
                    await self._status(f"{WORKING} running `{escape(tool)}`")
                case GateOpened(gate=gate):
                    ts = await self.poster.post(self.msg.channel, self.msg.thread_ts, waiting_text(gate),
                                                waiting_blocks(gate, self.buttons))
                    if ts is not None:
                        self.gate_messages[gate.id] = ts
                    await self._status(f":raised_hand: waiting for operator approval of {summary(gate)}")
                case GateResolved(gate=gate):
                    ts = self.gate_messages.pop(gate.id, None)
                    if ts is not None:
                        await self.poster.update(self.msg.channel, ts, outcome_text(gate), outcome_blocks(gate))
                    await self._status(WORKING)
                case Notice(text=text, command=None) if getattr(event, "gate_id", None) is None:
                    # (Transitional: the engine's "waiting for approval" notice names its gate;
                    # the gate's own events show that here.)
                    await self._status(f"{WORKING} {escape(text)}")
                case ErrorEvent(error=info):
                    error = info
                case Done(text=text, status=status, finish_reason=reason, ended=ended):
                    err = event.error or error
                    return answer_text(text, status, err.message if err else None, finish_reason=reason,
                                       ended=ended)
        return None

    async def _finish(self, markdown: str) -> None:
        msg = self.msg
        parts = split_message(markdown_to_mrkdwn(markdown))
        first, rest = parts[0], parts[1:]
        if self.placeholder is None or not await self.poster.update(msg.channel, self.placeholder, first):
            await self.poster.post(msg.channel, msg.thread_ts, first)
        for part in rest:  # in order: each waits for the one before
            await self.poster.post(msg.channel, msg.thread_ts, part)
