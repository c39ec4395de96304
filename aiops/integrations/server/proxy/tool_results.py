"""A request carrying the results of client tool calls (see client_tools): which calls of the
waiting turn its results answer."""

from __future__ import annotations

from collections.abc import Sequence

from aiops.engine.client_tools import OpenClientCalls
from aiops.integrations.server.errors import HttpError
from aiops.integrations.server.proxy.messages import ClientMessage, ClientToolCall


def is_continuation(messages: Sequence[ClientMessage]) -> bool:
    """The request ends with tool results: it carries what the client's tools returned."""
    return bool(messages) and messages[-1].role == "tool"


def exchange(messages: Sequence[ClientMessage]) -> tuple[tuple[ClientToolCall, ...], list[ClientMessage]]:
    """The calls of the last assistant message and the tool results that follow it."""
    i = len(messages)
    while i and messages[i - 1].role == "tool":
        i -= 1
    results = list(messages[i:])
    asked = messages[i - 1].tool_calls if i and messages[i - 1].role == "assistant" else ()
    if not asked:
        raise HttpError(400, "invalid_request",
                        f"messages.{i}: a tool result must follow the assistant message with its tool call",
                        param=f"messages.{i}")
    return asked, results


def pair(waiting: OpenClientCalls, asked: Sequence[ClientToolCall],
         results: Sequence[ClientMessage]) -> tuple[list[tuple[str, str]], bool] | None:
    """Each result paired with the waiting call it answers, as (call id, text), and whether every
    pair was made by id; None when the results do not fit the calls. By the call's id (ours, as
    OpenAI clients send it back); else by its place in the client's assistant message (Ollama's
    calls carry no id, so Open WebUI makes one up); else the next waiting call of that name. A
    result whose id names neither a waiting call nor a call of the assistant message answers
    nothing: taken for the next waiting call, a client's slip would record one tool's result as
    another's (OpenAI refuses such a request too)."""
    calls = list(waiting.calls)
    names = {c.id: waiting.client_names.get(c.id, c.name) for c in calls}
    by_id = {c.id: c for c in calls}
    pairs: list[tuple[str, str]] = []
    exact = True
    for r in results:
        call = by_id.get(r.tool_call_id or "")
        if call is None:
            exact = False
            place = next((k for k, a in enumerate(asked) if a.id is not None and a.id == r.tool_call_id), None)
            if place is not None and place < len(calls) and calls[place].id in by_id \
                    and names[calls[place].id] == asked[place].name:
                call = calls[place]
            elif place is None and r.tool_call_id:
                return None
            else:
                name = r.tool_name or (asked[place].name if place is not None else None)
                call = next((c for c in calls if c.id in by_id and (name is None or names[c.id] == name)), None)
        if call is None:
            return None
        del by_id[call.id]
        pairs.append((call.id, r.text))
    return pairs, exact
