"""Client tools: tools a chat client offers with its request, run by the client, not by aiops.

A client (Open WebUI with native function calling, an IDE agent, a script using the SDK's tool
helpers) sends its tools with a message. The turn offers them to the model beside the agent's own;
a model call to one ends the turn's model loop and goes back to the client (the agent's own calls
in the same reply run first, gated as always). The client runs it and sends the result; that
result continues the same turn (`Engine.resume`). aiops never gates a client tool: it runs on the
client's side, with what the client allows.

What the history keeps, so that everything here is derived from the store and survives a restart:
the assistant message's `meta["client_calls"]` maps each client call's id to the name the client
knows (the model may have seen it renamed, see `offer`); each result is a `tool` message with
`meta["client"] = True`, and one the client never sent (it sent a new message instead) is recorded
as `meta["unanswered"] = True`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from aiops.engine import events as ev
from aiops.engine.types import Message, ToolCall, ToolSpec

PREVIEW_CHARS = 2_000  # of a result, in its event (as turn.PREVIEW_CHARS)

CLIENT_CALLS = "client_calls"  # assistant meta: {call id: the client's name of the tool}
# The result recorded for a client call whose client sent a new message instead of its result.
UNANSWERED = ("unanswered: the chat client sent a new message instead of this tool's result; "
              "the tool may not have run")
PREFIX = "client_"  # what a client tool whose name an agent tool has is renamed with


@dataclass(frozen=True, slots=True)
class ClientTool:
    """One tool of a client, as offered to the model (`spec.name` may differ from `name`)."""

    name: str  # as the client named it
    spec: ToolSpec  # as the model sees it

    @property
    def model_name(self) -> str:
        return self.spec.name


def offer(specs: Iterable[ToolSpec], taken: Iterable[str]) -> tuple[ClientTool, ...]:
    """The client's tools as offered to the model: one whose name an agent tool (or an earlier
    client tool) already has is renamed `client_<name>` (then `client_<name>_2`, …) and mapped back
    when the model calls it."""
    used = set(taken)
    out: list[ClientTool] = []
    for spec in specs:
        name = spec.name
        if name in used:
            name = f"{PREFIX}{spec.name}"
            n = 2
            while name in used:
                name = f"{PREFIX}{spec.name}_{n}"
                n += 1
        used.add(name)
        out.append(ClientTool(spec.name, ToolSpec(name, spec.description, spec.parameters)))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class OpenClientCalls:
    """The client calls of a session's last turn still waiting for their results."""

    turn_id: str
    calls: tuple[ToolCall, ...]  # as the model made them (its names)
    client_names: dict[str, str]  # call id -> the client's name

    def client_call(self, call: ToolCall) -> ToolCall:
        return ToolCall(call.id, self.client_names.get(call.id, call.name), call.arguments)


def open_client_calls(history: Sequence[Message], before: str | None = None) -> OpenClientCalls | None:
    """The client calls of the last turn (the last before turn `before`, when given) that have no
    result yet, or None. A turn that waits for a client ends with the assistant message holding
    them (then the results of the agent's own calls, or some of the client's)."""
    end = len(history)
    if before is not None:
        end = next((i for i, m in enumerate(history) if m.turn_id == before), end)
    answered = {m.tool_call_id for m in history if m.role == "tool" and m.tool_call_id}
    for m in reversed(history[:end]):
        if m.role in ("tool", "notice", "gate"):
            continue  # results, and status records between a call and its results
        if m.role == "assistant" and m.tool_calls:
            names = m.meta.get(CLIENT_CALLS)
            if not isinstance(names, dict) or not names or m.turn_id is None:
                return None
            open_ = tuple(c for c in m.tool_calls if c.id in names and c.id not in answered)
            if not open_:
                return None
            return OpenClientCalls(m.turn_id, open_, {str(k): str(v) for k, v in names.items()})
        return None
    return None


def unanswered(open_calls: OpenClientCalls) -> list[Message]:
    """The results recorded for calls whose client sent a new message instead."""
    return [Message("tool", UNANSWERED, tool_call_id=c.id, name=c.name, turn_id=open_calls.turn_id,
                    meta={"client": True, "unanswered": True, "is_error": True}) for c in open_calls.calls]


def returned(session_id: str, msg: Message) -> ev.ToolReturned:
    """The `tool_result` event of a client call's recorded result (sent, or unanswered)."""
    text = msg.content
    return ev.ToolReturned(session_id=session_id, turn_id=msg.turn_id, call_id=msg.tool_call_id or "",
                           tool=msg.name or "", content=text[:PREVIEW_CHARS],
                           truncated=len(text) > PREVIEW_CHARS, is_error=bool(msg.meta.get("is_error")),
                           duration_ms=0.0)
