"""One `agent_call`: a message to a peer's agent over its `/api/v1`, its answer back.

The peer's session stream is opened first (nothing of the turn can be missed), then the message
is submitted with the hop header; the stream's events of that turn are read back as typed events
(`events.from_wire`) until its `done`. Along the way the peer's progress — its tool calls, a gate
waiting for its operator, their answers — goes to the caller's views as notices. A call that runs
out of time stops the peer's turn (`POST /sessions/{id}/stop`), and so does a caller's turn being
stopped meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiops.client import AgentClient, AgentError
from aiops.config import PeerConfig
from aiops.engine import events as ev
from aiops.engine.tools import ToolOutput
from aiops.integrations.swarm.hops import HOPS_HEADER, Hops
from aiops.integrations.web_text import FULL_TEXT_MAX_CHARS, error, output, snippet, untrusted

log = logging.getLogger(__name__)

# Seconds for one request to the peer (connect, submit, stop): the answer itself has the call's timeout.
REQUEST_SECONDS = 30.0
STOP_SECONDS = 10.0

# Stops sent after the caller's turn was cancelled: they outlive the call's task.
_stopping: set[asyncio.Task[None]] = set()


async def finish_stops() -> None:
    """Let the stops still on their way reach their peers (at shutdown: the turns were cancelled
    first, and each sent one), for at most STOP_SECONDS."""
    pending = {t for t in _stopping if t.get_loop() is asyncio.get_running_loop()}
    if pending:
        await asyncio.wait(pending, timeout=STOP_SECONDS)


@dataclass(slots=True)
class PeerCall:
    """One call to one peer; `progress` shows a line of the peer's progress to the caller."""

    name: str
    peer: PeerConfig
    token: str | None
    hops: Hops
    session_id: str  # the peer's session (remote_session_id)
    timeout: float
    max_chars: int
    progress: Callable[[str], None]
    steps: list[str] = field(default_factory=list)

    def client(self) -> AgentClient:
        # "" and not None: no token must not fall back to this process's $AIOPS_TOKEN.
        return AgentClient(self.peer.url, token=self.token or "", timeout=min(REQUEST_SECONDS, self.timeout),
                           headers={HOPS_HEADER: self.hops.header()})

    def _step(self, text: str) -> None:
        self.steps.append(text)
        self.progress(text)

    def _data(self, **extra: Any) -> dict[str, Any]:
        return {"peer": self.name, "url": self.peer.url, "remote_session": self.session_id,
                "depth": self.hops.depth, "progress": self.steps, **extra}

    def _error(self, text: str, **extra: Any) -> ToolOutput:
        out = error(text, [self.token or ""])
        out.data = self._data(**extra)
        return out

    async def run(self, message: str) -> ToolOutput:
        async with self.client() as agent:
            try:
                stream = await agent.stream(self.session_id).open()
            except AgentError as e:
                return self._error(self._unreachable(e))
            try:
                return await self._converse(agent, stream, message)
            finally:
                await stream.aclose()

    def _unreachable(self, e: AgentError) -> str:
        if e.status == 0:
            return f"peer {self.name} ({self.peer.url}) cannot be reached: {e.message}"
        if e.status in (401, 403):
            return (f"peer {self.name} refused this aiops ({e.status} {e.code}: {e.message}); its token "
                    f"({self.peer.token_env or 'none configured'}) is missing, wrong, or not allowed there")
        return f"peer {self.name} answered {e.status} {e.code}: {e.message}"

    async def _converse(self, agent: AgentClient, stream: Any, message: str) -> ToolOutput:
        turn_id: str | None = None
        try:
            async with asyncio.timeout(self.timeout):
                try:
                    accepted = await agent.submit(message, client_id=self.session_id)
                except AgentError as e:
                    if e.code == "agent_call_refused":
                        return self._error(f"peer {self.name} refused the call: {e.message}", refused=True)
                    return self._error(self._unreachable(e))
                turn_id = str(accepted.get("turn_id") or "")
                if accepted.get("status") != "accepted":  # answered at once (nothing ran a model)
                    return self._answer(str(accepted.get("text", "")), str(accepted.get("status")), turn_id)
                return await self._follow(stream, turn_id)
        except TimeoutError:
            stopped = await self._stop(agent)
            return self._error(f"no answer from peer {self.name} within {self.timeout:g} s (timeout_seconds "
                               f"in [swarm] of aiops.toml); {stopped}", timed_out=True, turn_id=turn_id)
        except asyncio.CancelledError:
            # The caller's turn was stopped: the peer's must not run on for no one (a stop that
            # comes before the submit lands stops the turn about to start). This client closes as
            # the cancellation unwinds, so the stop goes out on one of its own.
            task = asyncio.ensure_future(self._stop_after_cancel())
            _stopping.add(task)
            task.add_done_callback(_stopping.discard)
            raise

    async def _stop(self, agent: AgentClient) -> str:
        try:
            async with asyncio.timeout(STOP_SECONDS):
                r = await agent.stop(self.session_id)
        except (AgentError, TimeoutError) as e:
            log.warning("agent_call: could not stop the turn on peer %s: %s", self.name, e)
            return f"stopping its turn there failed ({e}): it may still run"
        return "its turn there was stopped" if r.get("stopped") else "its turn there had already ended"

    async def _stop_after_cancel(self) -> None:
        async with self.client() as agent:
            await self._stop(agent)

    async def _follow(self, stream: Any, turn_id: str) -> ToolOutput:
        answering = False
        try:
            async for item in stream:
                name, data = item["event"], item["data"]
                try:
                    event = ev.from_wire(name, data)
                except (ValueError, TypeError):
                    continue  # an event of a newer peer: not ours to read
                if isinstance(event, ev.ErrorEvent) and event.turn_id is None:
                    # The stream's own end: the session deleted there, this reader dropped, ...
                    return self._error(f"peer {self.name} ended the stream before answering: "
                                       f"{event.code}: {event.message}", turn_id=turn_id)
                if event.turn_id != turn_id:
                    continue  # another turn of that session (one left from a stopped call)
                match event:
                    case ev.Tok():
                        if not answering:
                            answering = True
                            self.progress(f"{self.name} is answering…")
                    case ev.ToolCalled(tool=tool):
                        self._step(f"{self.name}: calling {tool}")
                    case ev.GateOpened(gate=gate):
                        self._step(f"waiting for operator approval of {gate.target} on {self.name}")
                    case ev.GateResolved(gate=gate):
                        who = f" by {gate.by}" if gate.by else ""
                        self._step(f"{self.name}: {gate.target} {gate.decision or 'answered'}{who}")
                    case ev.ToolReturned(tool=tool, is_error=failed, content=content):
                        self._step(f"{self.name}: {tool} failed: {snippet(content, 160)}" if failed
                                   else f"{self.name}: {tool} returned")
                    case ev.Notice(text=text) if "gate_id" not in data:  # (the gate's own line is above)
                        self._step(f"{self.name}: {snippet(text, 300)}")
                    case ev.ErrorEvent(error=err):
                        self._step(f"{self.name}: error: {snippet(err.message, 300)}")
                    case ev.Done() as done:
                        return self._done(done)
        except AgentError as e:
            return self._error(f"the connection to peer {self.name} was lost before its answer: {e.message}",
                               turn_id=turn_id)
        return self._error(f"peer {self.name} closed the stream before its answer (is it shutting down?)",
                           turn_id=turn_id)

    def _done(self, done: ev.Done) -> ToolOutput:
        if done.status == "error":
            why = done.error.message if done.error else "no reason given"
            return self._error(f"peer {self.name}'s turn failed: {why}", turn_id=done.turn_id, status="error")
        if done.status == "cancelled":
            return self._error(f"peer {self.name}'s turn was cancelled there (stopped by its operator, or "
                               f"it shut down)", turn_id=done.turn_id, status="cancelled")
        text = done.text
        if done.ended:
            text += f"\n[{self.name} ended its turn before answering fully: {done.ended}]"
        elif done.finish_reason == "length":
            text += f"\n[{self.name}'s answer was cut at its model's output limit]"
        return self._answer(text, "complete", done.turn_id or "")

    def _answer(self, text: str, status: str, turn_id: str) -> ToolOutput:
        framed = f"peer {self.name} answered:\n" + untrusted(f"aiops peer {self.name}", text)
        out = output(framed, self.max_chars)
        out.data = {**(out.data or {}), **self._data(turn_id=turn_id, status=status,
                                                     answer=text[:FULL_TEXT_MAX_CHARS])}
        return out
