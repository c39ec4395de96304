"""What a chat user sees of one turn: the engine's typed events for it turned into answer text
(plus, when configured, short italic status lines while a gate waits or a tool runs), and how the
turn ended (`TurnEnd`), whichever dialect writes it."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from aiops.engine import events as ev
from aiops.engine.turn import TurnResult
from aiops.integrations.server.proxy.sessions import StartedTurn
from aiops.integrations.server.proxy.state import ProxySettings
from aiops.integrations.server.proxy.status import (
    REFUSED,
    STOPPED,
    TOOL,
    gate_status,
    resolution_status,
    status_line,
)

# The events `turn_output` turns into chat text; a streaming proxy request subscribes to these
# only, so the engine's other events (user, turn, session changes) do not wake it for nothing.
# `thinking` only when the answer shows reasoning (`output_events`).
TURN_OUTPUT_EVENTS = frozenset({ev.TOK, ev.GATE, ev.GATE_RESOLVED, ev.TOOL_CALL, ev.ERROR, ev.DONE})


def output_events(*, stream: bool, times_text: bool, reasoning: bool) -> frozenset[str]:
    """What one proxied answer subscribes to: a stream all that `turn_output` shows; a whole answer
    its `done`, its `tok` when the dialect times its text, and `thinking` when it shows reasoning."""
    if stream:
        events = TURN_OUTPUT_EVENTS
    else:
        events = frozenset({ev.TOK, ev.DONE}) if times_text else frozenset({ev.DONE})
    return (events | {ev.THINKING}) if reasoning else events


@dataclass(frozen=True, slots=True)
class TurnEnd:
    """How a proxied turn ended, as its answer reports it."""

    status: str  # complete | cancelled | error
    text: str
    usage: dict[str, int] | None  # the model's counts; None when it counted nothing
    error: ev.ErrorInfo | None
    finish_reason: str = "stop"  # or "length": cut at the model's output limit
    ended: str | None = None  # why the engine ended the turn early (a limit), if it did
    # Calls of the client's tools the answer hands to the client (finish_reason "tool_calls").
    client_calls: tuple[ev.ClientCall, ...] = ()
    # The model's reasoning over the turn, for a whole (non-streamed) answer that shows it; a
    # stream sends it as it comes instead.
    reasoning: str = ""

    @classmethod
    def of(cls, done: ev.Done, error: ev.ErrorInfo | None = None) -> TurnEnd:
        """From the turn's `done` (`error`: the turn's `error` event, if `done` names none)."""
        status, err = _as_answered(done.status, done.error or error)
        return cls(status, done.text, _counts(done.usage), err, done.finish_reason or "stop", done.ended,
                   done.client_calls)

    @classmethod
    def of_result(cls, result: TurnResult) -> TurnEnd:
        err = result.error
        status, info = _as_answered(result.status, err if isinstance(err, ev.ErrorInfo) or err is None
                                    else ev.ErrorInfo.from_dict(err))
        return cls(status, result.text, result.usage.counts() if result.usage else None, info,
                   result.finish_reason or "stop", result.ended,
                   tuple(ev.ClientCall(c.id, c.name, c.arguments) for c in result.client_calls))


def _as_answered(status: str, error: ev.ErrorInfo | None) -> tuple[str, ev.ErrorInfo | None]:
    """A chat UI gets a failed `!command`'s output as its answer, as it always did: the text says
    what failed, and an error reply would drop the output of the message's other commands."""
    if status == "error" and error is not None and error.code == "command_failed":
        return "complete", None
    return status, error


def _counts(usage: ev.TokenCounts | None) -> dict[str, int] | None:
    """Token counts as the dialects report them; None when nothing was counted (zeros would claim
    a count: see Usage.counts)."""
    if usage is None or not (usage.prompt_tokens or usage.completion_tokens):
        return None
    return usage.to_dict()


async def turn_output(started: StartedTurn, settings: ProxySettings, *,
                      reasoning: bool = False) -> AsyncIterator[tuple[str, str, TurnEnd | None]]:
    """The chat-visible output of one turn as `(reasoning, text, None)` pieces, then
    `(reasoning, text, TurnEnd)` at its end. `reasoning` (the model's `thinking`, which comes
    before the text of the same piece) is empty unless asked for.

    Events already queued are taken together, so a burst of tokens becomes one piece (one write,
    one frame) instead of one per token. Reasoning that follows text in a burst (a later model
    call of the turn) starts a new piece, so the client gets both in the order they came. Ends
    without a `TurnEnd` when the subscription is closed under it (client gone, shutdown).
    """
    turn_id = started.turn.id
    sub = started.sub
    assert sub is not None
    sent: list[str] = []  # model text streamed so far
    tail = ""  # the last characters written, to keep status lines on their own paragraph
    error: ev.ErrorInfo | None = None

    def status(line: str) -> str:
        nonlocal tail
        sep = "" if not tail else ("" if tail.endswith("\n\n") else ("\n" if tail.endswith("\n") else "\n\n"))
        out = f"{sep}{line}\n\n"
        tail = out[-2:]
        return out

    # The reasoning of the piece being made: one list for the whole answer, emptied at each piece,
    # so that a plain answer's pieces cost nothing more than its text.
    thought: list[str] = []

    def said() -> str:
        if not thought:
            return ""
        text = "".join(thought)
        thought.clear()
        return text

    def take(e: ev.Event, out: list[str]) -> TurnEnd | None:
        nonlocal tail, error
        if e.turn_id != turn_id:
            if ev.is_slow_consumer(e):
                assert isinstance(e, ev.ErrorEvent)
                return TurnEnd("error", "".join(sent), None, e.error)
            return None
        match e:
            case ev.Tok(text=text) if text:
                sent.append(text)
                tail = (tail + text)[-2:]
                out.append(text)
            case ev.Thinking(text=text) if text and reasoning:
                # Not part of the answer's text: no status-line spacing, nothing to compare later.
                thought.append(text)
            case ev.GateOpened(gate=gate) if settings.status_lines:
                out.append(status(gate_status(gate)))
            case ev.GateResolved(gate=gate) if settings.status_lines:
                out.append(status(resolution_status(gate)))
            case ev.ToolCalled(tool=tool, client=False) if settings.tool_progress:
                out.append(status(status_line(TOOL, f"running {tool or 'a tool'}")))
            case ev.ErrorEvent():
                error = e.error
            case ev.Done():
                final = e.text
                streamed = "".join(sent)
                if final != streamed and final.startswith(streamed):
                    rest = final[len(streamed):]  # e.g. command output that never came as tokens
                    sent.append(rest)
                    tail = (tail + rest)[-2:]
                    out.append(rest)
                if e.status == "cancelled" and settings.status_lines:
                    out.append(status(status_line(REFUSED, STOPPED)))
                elif e.ended and settings.status_lines:
                    out.append(status(status_line(REFUSED, e.ended)))
                return TurnEnd.of(e, error)
        return None

    if started.turn.prefix:
        # The output of commands in the same message begins the answer (its `done` text too), and
        # came before the turn did, as no event of it: said first, as a whole reply says it.
        lead = started.turn.prefix + "\n\n"
        sent.append(lead)
        tail = lead[-2:]
        yield "", lead, None
    while True:
        e = await sub.get()
        if e is None:
            return
        out: list[str] = []
        done = take(e, out)
        while done is None and sub.qsize():
            e = await sub.get()  # queued: returns without waiting
            if e is None:
                break
            if out and isinstance(e, ev.Thinking):
                # The next model call's reasoning, after this one's text: a piece of its own.
                yield said(), "".join(out), None
                out = []
            done = take(e, out)
        if out or thought or done is not None:
            yield said(), "".join(out), done
        if done is not None or e is None:
            return


async def wait_done(started: StartedTurn, on_first_text: Callable[[], None] | None = None) -> TurnEnd:
    """The turn's result, taken from its `done` event: that comes as soon as the answer is
    recorded, a few loop turns before the turn's own future (which waits for the task to end).
    `on_first_text` is called as the answer's first text (or shown reasoning) arrives, if `tok`
    is subscribed to. With `thinking` subscribed, the result carries the turn's reasoning."""
    if started.sub is not None:
        turn_id = started.turn.id
        thought: list[str] = []
        async for e in started.sub:
            if e.turn_id != turn_id:
                continue
            match e:
                case ev.Thinking(text=text):
                    thought.append(text)
                    if on_first_text is not None:  # generating has begun, reasoning first
                        on_first_text()
                        on_first_text = None
                case ev.Tok() if on_first_text is not None:
                    on_first_text()
                    on_first_text = None
                case ev.Done():
                    end = TurnEnd.of(e)
                    return dataclasses.replace(end, reasoning="".join(thought)) if thought else end
    return TurnEnd.of_result(await started.turn.wait())
