"""A chat client's messages as the proxy core takes them, whatever the dialect that sent them."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiops.integrations.server.errors import HttpError


@dataclass(frozen=True, slots=True)
class ClientToolCall:
    """A tool call as a client sends it back in an assistant message (see client_tools)."""

    id: str | None  # Ollama's calls have none (Open WebUI makes one up)
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ClientMessage:
    role: str  # system | user | assistant | tool
    text: str
    # The role as the client wrote it, when the proxy reads it as another (OpenAI's "developer"
    # is a system message here): errors name what the client sent.
    sent_as: str | None = None
    tool_calls: tuple[ClientToolCall, ...] = ()  # an assistant message's calls of client tools
    tool_call_id: str | None = None  # a tool result: the call it answers
    tool_name: str | None = None  # a tool result: the tool's name (Ollama's `tool_name`), if sent
    # An answer folded from several messages (see folded): those messages as sent, tool results
    # included. Matching compares the folded text; a session taking the answer in records these.
    parts: tuple[ClientMessage, ...] = ()


def tools_refused(field_name: str = "tools") -> HttpError:
    """A tool field this server does not take: every one with `client_tools = "refuse"`, the
    deprecated `functions` / `function_call` always (`tools` replaced them)."""
    if field_name in ("functions", "function_call"):
        why = "the deprecated functions API is not supported: send the functions as `tools`"
    else:
        why = ("this server does not take client tools (client_tools = \"refuse\" in [server] of "
               "aiops.toml): the aiops agent runs its own tools server-side, behind operator gates")
    return HttpError(400, "tools_not_supported", f"client-supplied {field_name!r}: {why}; send the request "
                     f"without {field_name!r}", param=field_name)


def omitted(kind: str) -> str:
    """What stands in the history for a part aiops cannot pass on (an image the chat once had)."""
    kind = "image" if kind in ("image", "image_url") else kind
    return f"[{kind} omitted: aiops passes on text only]"


def folded(messages: Sequence[ClientMessage]) -> list[ClientMessage]:
    """The conversation as matched: the assistant messages of one answer (its text before a tool
    call, its text after the result) joined as one, as a session's view shows one turn's answer and
    as a streamed answer shows it, with the tool results that answered its calls kept only in its
    `parts` (a tool result following no call is left out: no model would take it)."""
    out: list[ClientMessage] = []
    joined = False  # out[-1] is an assistant message whose last part called tools
    for m in messages:
        if m.role == "tool":
            if joined and out and out[-1].role == "assistant":
                prev = out[-1]
                out[-1] = dataclasses.replace(prev, parts=(*(prev.parts or (prev,)), m))
            continue
        if m.role == "assistant" and joined and out and out[-1].role == "assistant":
            prev = out[-1]
            text = "\n\n".join(t for t in (prev.text, m.text) if t)
            out[-1] = ClientMessage("assistant", text, tool_calls=prev.tool_calls + m.tool_calls,
                                    parts=(*(prev.parts or (prev,)), m))
        else:
            out.append(m)
        joined = m.role == "assistant" and bool(m.tool_calls)
    return out


def check_conversation(messages: Sequence[ClientMessage]) -> None:
    """The last message must be the new user message (400 otherwise)."""
    if not messages:
        raise HttpError(400, "invalid_request", "messages is empty: send at least one user message",
                        param="messages")
    if messages[-1].role != "user":
        raise HttpError(400, "invalid_request",
                        f"the last message must be the user's new message, not "
                        f"{messages[-1].sent_as or messages[-1].role!r}",
                        param="messages")
    if not messages[-1].text.strip():
        raise HttpError(400, "invalid_request", "the last user message is empty", param="messages")



def check_message_count(body: Any, limit: int) -> None:
    """413 for a request with more than `limit` messages (`proxy_max_messages`), told before the
    body is validated message by message."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if isinstance(messages, list) and len(messages) > limit:
        raise HttpError(413, "too_many_messages",
                        f"too many messages: {len(messages)} in this request, the limit is {limit} "
                        f"(proxy_max_messages in [server] of aiops.toml); start a new chat", param="messages")
