"""What Open WebUI sends besides a chat, recognised by its templates: background prompts (titles,
tags, follow-ups, search queries, tool selection) answered by a plain model call, and its RAG
template (a file, a knowledge base or a web search attached), whose question is the user's turn.

Open WebUI's background prompts start with `### Task:` and quote the chat in <chat_history>; its
RAG template, which it puts before the user's own question, starts so too but quotes no chat
history. Its tool-selection request (its tools on a model without native function calling) has its
default template as the system message, then "Query: …" or "History:\n…\nQuery: …" (older
versions: "Query: History:…"), asking for a JSON list of tool calls.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from aiops.engine.commands import command_name
from aiops.engine.engine import Engine, EngineError
from aiops.integrations.server.proxy.messages import ClientMessage

TASK_PREFIX = "### Task:"
TASK_HISTORY_TAG = "<chat_history>"
RAG_CONTEXT_END = "</context>"  # where the default RAG template ends, and the question begins
RAG_CONTEXT_START = "<context>"
RAG_QUERY_OPEN, RAG_QUERY_CLOSE = "<user_query>", "</user_query>"
TOOL_SELECTION_PREFIX = "Available Tools:"


def is_background_task(messages: Sequence[ClientMessage]) -> bool:
    """Open WebUI's title/tag/follow-up prompts and its tool selection: answered by a plain model
    call, no session."""
    if not messages or messages[-1].role != "user":
        return False
    text = messages[-1].text
    if text.lstrip().startswith(TASK_PREFIX) and TASK_HISTORY_TAG in text:
        return True
    return _is_tool_selection(messages)


def _is_tool_selection(messages: Sequence[ClientMessage]) -> bool:
    if len(messages) != 2 or messages[0].role != "system":
        return False
    query = messages[1].text.lstrip()
    # Anywhere in the system message: Open WebUI puts a model's own system prompt before it.
    return (TOOL_SELECTION_PREFIX in messages[0].text
            and (query.startswith("Query: ") or (query.startswith("History:") and "\nQuery: " in query)))



def as_typed(text: str) -> str:
    """A user message as its chat UI shows it later: Open WebUI sends a question with a file or
    web search attached inside its RAG template, and the question alone in later histories.
    Applied to both sides of a comparison (the client's history and the session's), so a client
    that keeps sending the template, or a message the user typed in that shape, matches too."""
    if text.startswith(TASK_PREFIX) and RAG_CONTEXT_END in text:
        question = text.rpartition(RAG_CONTEXT_END)[2].strip()
        # Older Open WebUI templates repeat the question after the context, in <user_query>,
        # and the message goes on with the question as typed.
        if question.startswith(RAG_QUERY_OPEN) and RAG_QUERY_CLOSE in question:
            inside, _, after = question[len(RAG_QUERY_OPEN):].partition(RAG_QUERY_CLOSE)
            question = after.strip() or inside.strip()
        return question
    return text


_TASK_LINE = re.compile("^" + re.escape(TASK_PREFIX), re.MULTILINE)
# The list of attached files Open WebUI 0.12 puts between its RAG template's context and the question.
_ATTACHED_FILES = re.compile(r"\A\s*<attached_files>.*?</attached_files>\s*", re.DOTALL)


TITLE_CHARS = 200  # of the question kept for a title (which takes its first 8 words, 60 characters)


def question_of(text: str) -> str | None:
    """The user's question alone, when `text` wraps it (Open WebUI's RAG template, the attached
    files' list before it), to title a session by; None when it does not (the text titles it,
    `!commands` taken out as usual)."""
    question = _ATTACHED_FILES.sub("", as_typed(text)).strip()
    if not question or question == text.strip():
        return None
    return question[:TITLE_CHARS]


def system_rag(messages: Sequence[ClientMessage]) -> str | None:
    """Open WebUI's RAG template in a client system message (`### Task:` at a line's start, then
    `<context>` holding its `<source …>` documents, then `</context>`), as far as its context
    ends; None when there is none (a system prompt merely written in that style, say)."""
    for m in reversed(messages):
        if m.role != "system":
            continue
        text = m.text
        if (task := _TASK_LINE.search(text)) is None:
            continue
        start, end = task.start(), text.rfind(RAG_CONTEXT_END)
        opened = text.find(RAG_CONTEXT_START, start, end) if end > start else -1
        if opened >= 0 and text.find("<source", opened, end) >= 0:
            return text[start:end + len(RAG_CONTEXT_END)]
    return None


def with_system_context(messages: Sequence[ClientMessage], engine: Engine) -> Sequence[ClientMessage]:
    """The client's messages, the new one carrying the RAG context Open WebUI put in the system
    message (with RAG_SYSTEM_CONTEXT, and in older versions for any OpenAI connection) instead of
    the message itself: client system messages are not given to the agent, and the attached file
    or search results would otherwise be lost. Put in front of the question, as Open WebUI does
    when it puts it in the message, and compared the same way (see as_typed); after the
    message's `!commands` and its `@model`, which only count at its start."""
    new = messages[-1]
    if new.role != "user" or new.text.lstrip().startswith(TASK_PREFIX):
        return messages
    context = system_rag(messages[:-1])
    if context is None:
        return messages
    try:
        parsed = engine.parse(new.text, "proxy")
    except EngineError:
        return messages  # refused later, as it is
    raw = engine.commands.raw_names()
    if not parsed.text or any(command_name(c) in raw for c in parsed.commands):
        return messages  # commands only, or one that takes the rest of the message as its argument
    text = "\n".join(parsed.commands) + "\n" if parsed.commands else ""
    text += f"@{parsed.model} " if parsed.model else ""
    return [*messages[:-1], ClientMessage("user", f"{text}{context}\n{parsed.text}")]
