"""A chat client's earlier messages as a session records them when it takes them in: a new chat
that already has a history (the user switched the chat to aiops), the messages a session lacks,
or a fork's whole history (an edited or regenerated message).

The records are those the session would hold had it run the chat itself, so that the model's
context is the same either way: one turn id per user message and its answer, and an answer that
called the client's tools recorded as a live round trip is (engine/client_tools.py): the
assistant message with its calls (`meta["client_calls"]` naming them as the client does), each
call's result as a `tool` message (`meta["client"]`), then the text that followed. Matching reads
only the texts (see matching.session_view), so the tool records change no session's view.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from aiops.engine.client_tools import CLIENT_CALLS, PREFIX, UNANSWERED, ClientTool
from aiops.engine.turn import clipped
from aiops.engine.types import Message, ToolCall, new_id
from aiops.integrations.server.proxy.messages import ClientMessage, ClientToolCall
from aiops.integrations.server.proxy.openwebui import question_of
from aiops.integrations.server.proxy.status import normalize, without_status_lines

Rename = Callable[[str], str]  # a client tool's name -> the name the model knows it by


def model_names(offered: Sequence[ClientTool], agent_tools: Collection[str]) -> Rename:
    """The names a live turn would have given the client's tools (engine.client_tools.offer): the
    request's own tools as this turn offers them; another tool the chat once called is renamed
    only when an agent tool has its name, so that the model never reads the client's result as
    the one its own tool gave."""
    names = {t.name: t.model_name for t in offered}

    def rename(name: str) -> str:
        if name in names:
            return names[name]
        return f"{PREFIX}{name}" if name in agent_tools else name

    return rename


def taken_in(earlier: Sequence[ClientMessage]) -> list[ClientMessage]:
    """Of the client's earlier messages (folded, see messages.folded), those a session records:
    user messages, and answers with a text or tool calls. An answer of calls alone is left out of
    the view matching compares, but its calls and results are the chat's history all the same."""
    return [m for m in earlier
            if m.role == "user" or (m.role == "assistant" and (m.tool_calls or normalize(m.text)))]


def records(messages: Sequence[ClientMessage], rename: Rename) -> list[Message]:
    """The records of `messages` (from taken_in), in order, each marked `meta.imported`."""
    out: list[Message] = []
    turn_id: str | None = None
    for m in messages:
        if m.role == "user" or turn_id is None:
            turn_id = new_id("imp_")
        if m.role == "user":
            title = question_of(m.text)
            out.append(Message("user", m.text, turn_id=turn_id,
                               meta=_meta(**({"title": title} if title is not None else {}))))
        else:
            out += _answer(m.parts or (m,), turn_id, rename)
    return out


def _meta(**more: Any) -> dict[str, Any]:
    return {"imported": True, "source": "proxy", **more}


def _answer(parts: Sequence[ClientMessage], turn_id: str, rename: Rename) -> list[Message]:
    """One answer's records: each assistant message with its calls, each call's result after it.
    A call the client sent no result for is recorded as unanswered (as the engine records it when
    the client sends a new message instead), and a result that answers no call is left out: every
    provider refuses a call without its result, or a result without its call."""
    out: list[Message] = []
    waiting: list[tuple[ClientToolCall, ToolCall]] = []  # (as the client sent it, as recorded)

    def close_unanswered() -> None:
        for _, call in waiting:
            out.append(Message("tool", UNANSWERED, tool_call_id=call.id, name=call.name, turn_id=turn_id,
                               meta=_meta(client=True, unanswered=True, is_error=True)))
        waiting.clear()

    for p in parts:
        if p.role == "tool":
            k = _answered(waiting, p)
            if k is None:
                continue
            _, call = waiting.pop(k)
            out.append(Message("tool", clipped(p.text), tool_call_id=call.id, name=call.name, turn_id=turn_id,
                               meta=_meta(client=True, is_error=False)))
            continue
        close_unanswered()
        # Ollama's calls carry no id: the model's protocols pair a result with its call by one.
        calls = [(c, ToolCall(c.id or new_id("call_"), rename(c.name), c.arguments)) for c in p.tool_calls]
        meta = _meta(**{CLIENT_CALLS: {call.id: c.name for c, call in calls}}) if calls else _meta()
        out.append(Message("assistant", without_status_lines(p.text), tool_calls=[call for _, call in calls],
                           turn_id=turn_id, meta=meta))
        waiting.extend(calls)
    close_unanswered()
    return out


def _answered(waiting: Sequence[tuple[ClientToolCall, ToolCall]], result: ClientMessage) -> int | None:
    """Which waiting call `result` answers, as a live turn pairs them (tool_results.pair): the one
    it names by id, else the first of the tool it names (Ollama's `tool_name`), else the first. A
    result naming an id no waiting call has answers none (a live continuation refuses it)."""
    found = next((k for k, (c, _) in enumerate(waiting) if c.id is not None and c.id == result.tool_call_id), None)
    if found is None and result.tool_call_id:
        return None
    if found is None and result.tool_name is not None:
        found = next((k for k, (c, _) in enumerate(waiting) if c.name == result.tool_name), None)
    if found is None and result.tool_name is None and waiting:
        found = 0
    return found
