"""Building the context sent to a model from a session's history."""

from __future__ import annotations

import dataclasses
import json

from aiops.engine.types import MODEL_ROLES, Message

# For histories written before a stop recorded its own result for each open call.
CANCELLED_RESULT = "[no result: the call was cancelled before it finished]"
# Appended to a reply cut short, so the model never takes it for a whole answer it gave.
INCOMPLETE_REPLY = {
    "cancelled": "[this reply was cut off: the user stopped it before it was complete]",
    "error": "[this reply was cut off: the model's stream failed before it was complete]",
}
# Stands in for the reply a message never got (its turn stopped or failed before any text, or was
# cancelled while queued): the model must not take it for a question still to answer, and chat
# templates that insist on alternating roles get their assistant turn.
NO_REPLY = {
    "cancelled": "[no reply: the user stopped this turn before the assistant answered]",
    "error": "[no reply: the model's stream failed before the assistant answered]",
}
NO_REPLY_GIVEN = "[no reply was given to this message: its turn ended before the assistant answered]"


def by_turn(history: list[Message], upto: str | None) -> list[Message]:
    """History regrouped turn by turn, ending with turn `upto`.

    A message sent while another turn runs is committed at once (it must be durable before it is
    acknowledged), so in commit order it sits before the running turn's answer. Each turn's context
    must see whole earlier turns and none of the later, queued ones.
    """
    groups: dict[str, list[Message]] = {}
    for i, m in enumerate(history):
        groups.setdefault(m.turn_id or f"#{i}", []).append(m)
    out: list[Message] = []
    for key, msgs in groups.items():
        out.extend(msgs)
        if key == upto:
            break
    return out


def conversation(history: list[Message]) -> list[Message]:
    """The model-visible part of a history, made protocol-valid.

    Commands and notices are history but never context. An assistant message whose tool calls were
    cut short (a stopped turn) gets a placeholder result for each unanswered call, because every
    provider rejects a tool call without its result. A reply cut short (stopped, or its stream
    failed) goes back with a note saying so, and a message that got no reply at all is followed by
    a note in the reply's place.
    """
    out: list[Message] = []
    pending: dict[str, Message] = {}

    def flush() -> None:
        for call_id, asst in pending.items():
            name = next((c.name for c in asst.tool_calls if c.id == call_id), None)
            out.append(Message("tool", CANCELLED_RESULT, tool_call_id=call_id, name=name))
        pending.clear()

    for m in history:
        if m.role not in MODEL_ROLES or m.meta.get("command"):
            continue
        if m.role == "tool":
            if m.tool_call_id in pending:
                pending.pop(m.tool_call_id)
                out.append(m)
            # a result whose call is unknown would be rejected by providers: drop it
            continue
        flush()
        if m.role == "assistant" and not m.content and not m.tool_calls:
            if m.status not in NO_REPLY:
                continue
            m = dataclasses.replace(m, content=NO_REPLY[m.status])
        elif m.role == "assistant" and m.status in INCOMPLETE_REPLY:
            m = dataclasses.replace(m, content=f"{m.content}\n\n{INCOMPLETE_REPLY[m.status]}".lstrip())
        if m.role == "user" and out and out[-1].role == "user":
            out.append(Message("assistant", NO_REPLY_GIVEN))
        out.append(m)
        if m.role == "assistant":
            for c in m.tool_calls:
                pending[c.id] = m
    flush()
    return out


def trim(messages: list[Message], max_messages: int) -> list[Message]:
    """Keep the latest messages within `max_messages`, never separating a tool call from its results.

    An assistant message with tool calls and the results that follow it are one block: kept whole
    or dropped whole. The newest block is always kept, even if it alone is larger than the limit.
    The context starts at a user message when one is available, as some providers require.
    """
    blocks: list[list[Message]] = []
    for m in messages:
        if m.role == "tool" and blocks and (blocks[-1][0].role == "assistant" and blocks[-1][0].tool_calls):
            blocks[-1].append(m)
        else:
            blocks.append([m])
    kept: list[list[Message]] = []
    total = 0
    for block in reversed(blocks):
        if kept and total + len(block) > max_messages:
            break
        kept.append(block)
        total += len(block)
    kept.reverse()
    while len(kept) > 1 and kept[0][0].role != "user":
        kept.pop(0)
    return [m for block in kept for m in block]


def as_text_protocol(messages: list[Message]) -> list[Message]:
    """History for a `tool_calling = "text"` model: calls and results written as text.

    Such models never saw native tool messages, so their own calls go back as the markup they were
    told to write, and results come back as user turns. Consecutive user turns are merged because
    many chat templates insist on alternating roles.
    """
    out: list[Message] = []
    for m in messages:
        if m.role == "assistant" and m.tool_calls:
            calls = "\n".join(
                "<tool_call>" + json.dumps({"name": c.name, "arguments": c.arguments}) + "</tool_call>"
                for c in m.tool_calls
            )
            out.append(Message("assistant", f"{m.content}\n{calls}".strip()))
            continue
        if m.role == "tool":
            m = Message("user", f'<tool_result name="{m.name}">\n{m.content}\n</tool_result>')
        if out and m.role == "user" and out[-1].role == "user":
            out[-1] = Message("user", out[-1].content + "\n\n" + m.content)
        else:
            out.append(m)
    return out
