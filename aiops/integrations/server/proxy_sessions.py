"""What the OpenAI- and Ollama-compatible proxies share: models, sessions, and streaming a turn.

Chat UIs resend the whole conversation with every request; the agent keeps one session per
conversation. This module maps one onto the other:

* **Identity.** `X-Aiops-Session` when sent, else Open WebUI's `X-OpenWebUI-Chat-Id`, else the
  OpenAI `user` field, else a fingerprint of the caller (token name or address) and the
  conversation's first user message. The identity names a *root*; the sessions of a root are the root
  itself and its forks `<root>+2`, `<root>+3`, ... A client token's names are namespaced by the
  token (`<token>:<name>`), so another client token naming the same conversation gets its own.
* **Ownership.** Sessions are created owned by the caller (see owners); a client token continues
  only its own, operators any.
* **Reconciliation.** The client's user and assistant texts are authoritative. A request continues
  the session of its root whose conversation equals the client's history before the new message;
  one whose conversation is a prefix of it gets the missing messages imported first. Anything else
  (an edited or regenerated message, a new chat that happens to share a fingerprint) forks a new
  session holding the client's history. aiops adds only the new trailing user message, and its own
  tool records stay with the matching prefix.
* **Streaming.** `turn_deltas` turns the engine's events for one turn into the text a chat user
  sees (answer text plus, when configured, a short italic status line while a gate waits);
  `Channel` writes frames, sends keep-alives on an idle stream and notices a client that hung up,
  which cancels the turn and its gates.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from aiops.config import Config, ModelConfig
from aiops.engine import events as ev
from aiops.engine.bus import Subscription
from aiops.engine.commands import command_name
from aiops.engine.engine import Engine, EngineError
from aiops.engine.turn import Turn, TurnResult
from aiops.engine.types import Message, Usage, new_id
from aiops.gates.broker import waiting_notice
from aiops.integrations.server.addresses import configured_hosts, shown_to
from aiops.integrations.server.app import CONFIG_KEY, ENGINE_KEY, STATE_KEY, HttpError, check_model
from aiops.integrations.server.owners import (
    Caller,
    caller,
    claim,
    forbidden,
    namespace,
    owner_meta,
    owner_of,
    safe_name,
)

log = logging.getLogger(__name__)

PUBLIC_MODEL = "aiops"  # "the session's model"; `aiops/<key>` names a registry model
# Open WebUI's background prompts (titles, tags, follow-ups, search queries, autocompletion) start
# so and quote the chat in <chat_history>; its RAG template, which it puts before the user's own
# question when a file, a knowledge base or a web search is attached, starts so too but quotes no
# chat history: that is the user's turn.
TASK_PREFIX = "### Task:"
TASK_HISTORY_TAG = "<chat_history>"
RAG_CONTEXT_END = "</context>"  # where the default RAG template ends, and the question begins
RAG_CONTEXT_START = "<context>"
RAG_QUERY_OPEN, RAG_QUERY_CLOSE = "<user_query>", "</user_query>"
# Open WebUI's tool-selection request (its tools on a model without native function calling): its
# default template as the system message, then "Query: …" or "History:\n…\nQuery: …" (older
# versions: "Query: History:…"), asking for a JSON list of tool calls.
TOOL_SELECTION_PREFIX = "Available Tools:"
SESSION_HEADER = "X-Aiops-Session"
OPENWEBUI_CHAT_HEADER = "X-OpenWebUI-Chat-Id"
DISCONNECT_POLL_SECONDS = 0.5


# ---- settings -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProxySettings:
    keepalive_seconds: float = 15.0
    status_lines: bool = True
    tool_progress: bool = False

    @classmethod
    def from_config(cls, cfg: Config) -> ProxySettings:
        s = cfg.app.server
        return cls(keepalive_seconds=s.keepalive_seconds, status_lines=s.proxy_status_lines,
                   tool_progress=s.proxy_tool_progress)


# ---- models ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PublishedModel:
    name: str  # "aiops" or "aiops/<key>"
    key: str  # the registry key that answers (for "aiops": the default model)
    config: ModelConfig
    session_model: bool  # True for "aiops": each session's own model


def published_models(engine: Engine) -> list[PublishedModel]:
    """`aiops` (each session's model) and `aiops/<key>` for every enabled registry model."""
    models = engine.config.models
    default = models.default_model
    out = [PublishedModel(PUBLIC_MODEL, default, models.models[default], True)]
    out += [PublishedModel(f"{PUBLIC_MODEL}/{key}", key, m, False)
            for key, m in sorted(models.enabled().items())]
    return out


def strip_tag(name: str) -> str:
    """Ollama names carry a tag; `:latest` is the only one we publish, so it is optional. Ollama
    matches the tag without regard to case (`:LATEST`), as the rest of the name."""
    tag = ":latest"
    return name[: -len(tag)] if name[-len(tag):].casefold() == tag else name


def find_model(engine: Engine, requested: str) -> PublishedModel | None:
    """The published model a request names (with or without `:latest`, in any case, as Ollama
    matches names), or None: the entry `published_models` lists under that name, looked up
    without listing them all (every chat request asks)."""
    name = strip_tag(requested.strip())
    models = engine.config.models
    prefix, slash, key = name.partition("/")
    if prefix.casefold() != PUBLIC_MODEL:
        return None
    if not slash:
        return PublishedModel(PUBLIC_MODEL, models.default_model, models.models[models.default_model], True)
    if key not in models.models:  # an exact match first: registry keys may differ only in case
        key = next((k for k in models.models if k.casefold() == key.casefold()), key)
    m = models.models.get(key)
    if m is None or not m.enabled:
        return None
    return PublishedModel(f"{PUBLIC_MODEL}/{key}", key, m, False)


def turn_model(model: PublishedModel) -> str | None:
    """What to pass to `engine.submit(model=...)`: None keeps the session's own model."""
    return None if model.session_model else model.key


def model_not_found(requested: str) -> HttpError:
    return HttpError(404, "model_not_found",
                     f"model {requested!r} not found; this server publishes {PUBLIC_MODEL!r} and "
                     f"'{PUBLIC_MODEL}/<key>' for each enabled model (GET /v1/models or /api/tags)",
                     param="model")


# ---- client messages -------------------------------------------------------------------------------


# The events `turn_output` turns into chat text; a streaming proxy request subscribes to these
# only, so the engine's other events (user, turn, session changes) do not wake it for nothing.
TURN_OUTPUT_EVENTS = frozenset({ev.TOK, ev.GATE, ev.GATE_RESOLVED, ev.TOOL_CALL, ev.ERROR, ev.DONE})


@dataclass(frozen=True, slots=True)
class ClientMessage:
    role: str  # system | user | assistant
    text: str


def tools_refused(field_name: str = "tools") -> HttpError:
    return HttpError(400, "tools_not_supported",
                     f"client-supplied {field_name!r} is not supported: the aiops agent runs its own tools "
                     f"server-side (behind operator gates) and answers with text; send the request "
                     f"without {field_name!r}", param=field_name)


def omitted(kind: str) -> str:
    """What stands in the history for a part aiops cannot pass on (an image the chat once had)."""
    kind = "image" if kind in ("image", "image_url") else kind
    return f"[{kind} omitted: aiops passes on text only]"


def check_conversation(messages: Sequence[ClientMessage]) -> None:
    """The last message must be the new user message (400 otherwise)."""
    if not messages:
        raise HttpError(400, "invalid_request", "messages is empty: send at least one user message",
                        param="messages")
    if messages[-1].role != "user":
        raise HttpError(400, "invalid_request",
                        f"the last message must be the user's new message, not {messages[-1].role!r}",
                        param="messages")
    if not messages[-1].text.strip():
        raise HttpError(400, "invalid_request", "the last user message is empty", param="messages")


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


@dataclass(frozen=True, slots=True)
class TaskAnswer:
    text: str
    usage: dict[str, int] | None  # the model's token counts; None when it reported none
    finish_reason: str  # "stop", or "length": cut at the model's output limit


async def answer_background_task(engine: Engine, model: PublishedModel, messages: Sequence[ClientMessage],
                                 who: Caller, *, failed_status: int) -> TaskAnswer:
    """A plain model call: no tools, no gates, no session, nothing recorded. A failure is an
    HttpError of the surface's own status for a failed model (`failed_status`)."""
    from aiops.engine.backends import ModelError

    system = "\n\n".join(m.text for m in messages if m.role == "system" and m.text) or None
    convo = [Message("user" if m.role == "user" else "assistant", m.text)
             for m in messages if m.role in ("user", "assistant")]
    try:
        completion = await engine.complete_plain(model.key, convo, system=system)
    except ModelError as e:
        raise HttpError(failed_status, "model_error", shown_to(who, str(e), configured_hosts(engine))) from None
    return TaskAnswer(completion.text, completion.usage.counts() if completion.usage is not None else None,
                      "length" if completion.finish_reason == "length" else "stop")


# ---- what chat users are told of a failure -------------------------------------------------------------


def turn_error(request: web.Request, error: dict[str, Any] | None, default_code: str) -> tuple[str, str]:
    """The code and message a chat client gets for a turn that ended in error."""
    err = error or {}
    message = shown_to(caller(request), str(err.get("message", "the turn failed")),
                       configured_hosts(request.app[ENGINE_KEY]))
    return str(err.get("code", default_code)), message


def answer_text(request: web.Request, result: TurnResult, session_id: str) -> str:
    """The text of a non-streaming answer. A turn stopped midway (by the operator, a `!stop`, a
    deleted session) or ended by the engine at a limit says so at its end, as a stream does,
    instead of passing its partial (often empty) text off as the whole answer. A shutdown that
    cut it is a 503 with no text: the client should not take a half answer for a reply. The
    partial answer stays recorded either way."""
    if result.status == "cancelled" and request.app[STATE_KEY].closing:
        raise HttpError(503, "shutting_down", "the server shut down before the answer was done; the "
                        "partial answer is kept in the session", headers={SESSION_HEADER: session_id,
                                                                          "x-should-retry": "false"})
    text = result.text
    if not proxy_state(request).settings.status_lines:
        return text
    why = STOPPED if result.status == "cancelled" else result.ended
    if why:
        line = status_line(_NO, why)
        text = f"{text.rstrip()}\n\n{line}" if text.strip() else line
    return text


# ---- status lines and text normalisation ---------------------------------------------------------------

# Lines aiops writes into a chat answer: `*⏳ waiting for operator approval: …*` and friends. They
# are recognised (and ignored) when the client sends the answer back as history.
_WAIT, _OK, _NO, _TOOL = "⏳", "✅", "⛔", "🔧"
STOPPED = "the answer was stopped"
_STATUS_RE = re.compile(r"^\*(?:⏳|✅|⛔|🔧) [^\n]*\*[ \t]*$", re.MULTILINE)


def status_line(marker: str, text: str) -> str:
    return f"*{marker} {' '.join(text.replace('*', '').split())}*"


def normalize(text: str) -> str:
    """Text as compared across requests: status lines dropped, whitespace collapsed."""
    if "*" in text:
        text = _STATUS_RE.sub("", text)
    return " ".join(text.split())


@dataclass(frozen=True, slots=True)
class _GateView:
    """A gate event's data as the gate texts take it."""

    tool: str
    operation: str
    tables: Sequence[str]


def gate_status(data: dict[str, Any]) -> str:
    """The chat user's line for a waiting gate, in the same words as every other waiting notice:
    `*⏳ waiting for operator approval: db_query write on users*`."""
    gate = _GateView(str(data.get("tool") or "a tool"), str(data.get("operation") or "call"),
                     [str(t) for t in data.get("tables") or []])
    return status_line(_WAIT, waiting_notice(gate))


def resolution_status(data: dict[str, Any]) -> str:
    decision = data.get("decision")
    if decision == "approved":
        return status_line(_OK, "approved by the operator")
    if decision == "denied":
        return status_line(_NO, "denied by the operator")
    if decision == "timeout":
        return status_line(_NO, "no operator answered in time")
    return status_line(_NO, "approval request cancelled")


# ---- conversation views ----------------------------------------------------------------------------


Entry = tuple[str, str]  # (role, normalized text)


RESET_COMMANDS = frozenset({"reset"})


def client_entries(messages: Iterable[ClientMessage]) -> list[tuple[Entry, ClientMessage]]:
    """The client's conversation as compared (user and non-empty assistant texts, normalized),
    each with the message as sent."""
    out: list[tuple[Entry, ClientMessage]] = []
    for m in messages:
        if m.role == "user":
            out.append((("user", as_typed(normalize(m.text))), m))
        elif m.role == "assistant" and (text := normalize(m.text)):
            out.append((("assistant", text), m))
    return out


def since_reset(engine: Engine, messages: Sequence[ClientMessage]) -> Sequence[ClientMessage]:
    """The part of a client's history its session still holds: a `!reset` archived everything
    before it, but a chat UI keeps sending all of it. From the last message that ran `!reset`,
    as the session recorded it: that message without its command lines, then what followed (a
    message of only commands, and its answer, left no turn: see session_view)."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m.role == "user" and "!" in m.text:
            parsed = engine.commands.parse(m.text, "proxy")
            if any(command_name(c) in RESET_COMMANDS for c in parsed.commands):
                rest = messages[i + 1:]
                if parsed.text:
                    return [ClientMessage("user", parsed.text), *rest]
                first_user = next((j for j, r in enumerate(rest) if r.role == "user"), len(rest))
                return rest[first_user:]
    return messages


def client_view(messages: Iterable[ClientMessage]) -> list[Entry]:
    return [entry for entry, _ in client_entries(messages)]


def without_status_lines(text: str) -> str:
    """An answer as the client stored it, minus the status lines aiops wrote into it."""
    if "*" not in text:
        return text
    return re.sub(r"\n{3,}", "\n\n", _STATUS_RE.sub("", text)).strip()


@dataclass
class _TurnText:
    turn_id: str | None
    user: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)  # command outputs
    answer: list[str] = field(default_factory=list)
    unseen: bool = False  # the turn was stopped or failed: its client may have got none of it
    cut: bool = False  # ...or only the start of it (a stream it hung up on, or that was stopped)


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


def _system_rag(messages: Sequence[ClientMessage]) -> str | None:
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
    context = _system_rag(messages[:-1])
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


# Statuses of a recorded answer a client may never have got (see session_view).
MAYBE_UNSEEN = ("cancelled", "error")


def _maybe_unseen(m: Message) -> bool:
    """A record of a turn that ended stopped or failed: a non-streaming client got no text of it.
    A stop can also come as the answer is recorded whole: then only its notice says so."""
    return (m.role == "error" or (m.role == "assistant" and m.status in MAYBE_UNSEEN)
            or (m.role == "notice" and m.meta.get("kind") == "cancelled"))


# The role, in a session's view, of an answer a client may hold only the start of: the turn was
# stopped (its client hung up mid-stream, or the operator stopped it) or failed. aiops may have
# recorded more than the client read (a fast model writes ahead of a reader), even the whole
# answer when the stop came as it ended. A client's copy matches it when ours begins with it.
HELD_IN_PART = "assistant…"


def session_view(history: Iterable[Message], *, without_stopped: bool = False) -> list[Entry]:
    """A session's conversation as the client saw it: per turn, the user text and the answer.

    `without_stopped`: as a client sees it that never got the stopped or failed answers (a
    non-streaming request the shutdown answered 503, one whose client gave up, one answered 502):
    without them, nor the output of commands in their messages (which came with the answer).

    Grouped by turn, not by commit order: a message sent while a turn runs is stored before that
    turn's answer, but the client shows each question followed by its answer (as `by_turn` gives
    the model)."""
    turns: list[_TurnText] = []
    by_id: dict[str, _TurnText] = {}
    for m in history:
        turn = by_id.get(m.turn_id) if m.turn_id else None
        if m.role == "user":
            if turn is None:
                turn = _TurnText(m.turn_id)
                turns.append(turn)
                if m.turn_id:
                    by_id[m.turn_id] = turn
            turn.user.append(m.content)
            continue
        if turn is None and m.turn_id and m.role == "notice" and m.meta.get("kind") == "command":
            # A turn whose user message a `!reset` in it archived: its outputs start the view.
            turn = _TurnText(m.turn_id)
            turns.append(turn)
            by_id[m.turn_id] = turn
        if turn is None:  # no turn of its own (older histories): it belongs to the latest one
            if not turns:
                continue
            turn = turns[-1]
        if turn.turn_id == m.turn_id and _maybe_unseen(m):
            turn.cut = True
            if without_stopped:
                turn.unseen = True
                continue
        if m.role == "assistant" and m.content:
            turn.answer.append(m.content)
        elif m.role == "notice" and m.meta.get("kind") == "command" and turn.turn_id == m.turn_id:
            turn.outputs.append(m.content)
    out: list[Entry] = []
    for t in turns:
        if not t.user and not t.answer:
            # The output of a `!reset` that had nothing else in its message: the session is
            # empty to the client that sent it, as to one that starts a new chat in it.
            continue
        out.append(("user", as_typed(normalize("\n".join(t.user)))))
        answer = "" if t.unseen else normalize("\n\n".join(t.outputs + t.answer))
        if answer:
            out.append((HELD_IN_PART if t.cut else "assistant", answer))
    return out


def _same(client: Entry, ours: Entry) -> bool:
    if ours[0] == HELD_IN_PART:
        return client[0] == "assistant" and ours[1].startswith(client[1])
    if client[0] != ours[0]:
        return False
    if client[1] == ours[1]:
        return True
    # "@model question" is recorded as "question"; "!cmd" lines are recorded apart from the text.
    return client[0] == "user" and client[1][:1] in ("@", "!") and client[1].endswith(ours[1])


def is_prefix(ours: Sequence[Entry], client: Sequence[Entry]) -> bool:
    return len(ours) <= len(client) and all(_same(c, o) for c, o in zip(client, ours, strict=False))


# A session's view as kept between requests: per entry its role, its text's hash and length.
# Enough for `_same` (an exact match, or the client's text ending with ours), a few dozen bytes
# an entry whatever the texts' length; a match is confirmed on the real view before it is used.
# An answer the client may hold in part keeps its text too (the client's may be any start of it).
Signature = tuple[str, int, int, str | None]


def signatures(view: Sequence[Entry]) -> list[Signature]:
    return [(role, hash(text), len(text), text if role == HELD_IN_PART else None) for role, text in view]


def _same_sig(client: Entry, ours: Signature, in_part: bool = True) -> bool:
    role, h, n, whole = ours
    if whole is not None:
        return client[0] == "assistant" and (whole.startswith(client[1]) if in_part else whole == client[1])
    if client[0] != role:
        return False
    text = client[1]
    if len(text) == n and hash(text) == h:
        return True
    return (role == "user" and text[:1] in ("@", "!") and len(text) >= n
            and hash(text[len(text) - n:]) == h)


def is_prefix_sig(ours: Sequence[Signature], client: Sequence[Entry], *, in_part: bool = True) -> bool:
    """`ours` begins the client's conversation; with `in_part`, a stopped answer of ours may be
    held by the client in part (see HELD_IN_PART)."""
    return len(ours) <= len(client) and all(_same_sig(c, o, in_part) for c, o in zip(client, ours, strict=False))


@dataclass(frozen=True, slots=True)
class _Seen:
    """What `_choose` needs of a session, as of the engine's history stamp it was read under."""
    stamp: int
    kind: str
    owner: str | None
    view: list[Signature]
    # The view without stopped answers, when there are any: a client may never have got them.
    unstopped: list[Signature] | None = None


# ---- identity ---------------------------------------------------------------------------------------


# The API's client-id pattern: a fork's id (`<root>+2`) can be sent back as it was received.
_SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}$")


# A conversation's root id leaves room for a fork's "+N" (up to 7 digits) within the 128
# characters a session id may have: every id the server sends back can be sent again.
_ROOT_MAX = 120


def _fitted(root: str) -> str:
    """`root`, or when it is too long, its start and a hash of the whole: still one per name."""
    if len(root) <= _ROOT_MAX:
        return root
    return root[:_ROOT_MAX - 9] + "-" + hashlib.sha256(root.encode()).hexdigest()[:8]


@dataclass(frozen=True, slots=True)
class ConversationId:
    root: str  # session id of the conversation's first session; forks are root+N
    source: str  # header | openwebui | user | fingerprint

    @property
    def explicit(self) -> bool:
        return self.source == "header"


def conversation_id(request: web.Request, messages: Sequence[ClientMessage],
                    user: str | None = None) -> ConversationId:
    """The conversation's root session id. Names a client chose (header, chat id, `user`) are
    namespaced by a client token's name, so one client token cannot continue another's
    conversation by naming it; a name already carrying the caller's namespace (a session id the
    server sent back) is taken as it is."""
    ns = namespace(caller(request))
    header = request.headers.get(SESSION_HEADER, "").strip()
    if header:
        if not _SESSION_ID.match(header) or header.isdigit():
            raise HttpError(400, "invalid_session",
                            f"{SESSION_HEADER} must be 1-128 characters of A-Z a-z 0-9 . _ : @ + -, starting "
                            f"with a letter or digit, and not all digits")
        root = header if header.startswith(ns) else ns + header
        if len(_first_root(root)) > _ROOT_MAX or len(root) > 128:
            # Longer, and the id the server sends back (namespaced, or a fork's) could not be
            # sent again.
            raise HttpError(400, "invalid_session",
                            f"{SESSION_HEADER} is too long: at most {_ROOT_MAX - len(ns)} characters"
                            + (f" with this token (its sessions are named {ns}<name>)" if ns else "")
                            + ", so that a fork's id (<name>+N) stays within 128")
        return ConversationId(root, "header")
    chat = request.headers.get(OPENWEBUI_CHAT_HEADER, "").strip()
    if chat:
        return ConversationId(_fitted(ns + "owui-" + safe_name(chat)), "openwebui")
    if user and user.strip():
        return ConversationId(_fitted(ns + "user-" + safe_name(user)), "user")
    h = hashlib.sha256(str(request.get("principal") or f"addr:{request.remote}").encode())
    first_user = next((m.text for m in messages if m.role == "user"), "")
    # Not the system message: chat UIs fill it from templates ({{CURRENT_DATETIME}}) that change
    # every turn, and each turn would start a new conversation. Two chats that begin alike fork
    # apart anyway. (Its slot stays, empty, so that chats without one keep their ids.)
    # As the chat shows it later: the first request's question may come inside Open WebUI's RAG
    # template (a file or web search attached), every later one without it.
    for part in ("", as_typed(normalize(first_user))):
        h.update(b"\x00" + part.encode())
    # Namespaced as the names above: the id goes back in X-Aiops-Session, and a client token that
    # sends it again must find this session, not a new `<token>:proxy-…` one.
    return ConversationId(ns + "proxy-" + h.hexdigest()[:16], "fingerprint")


def _root_of(session_id: str) -> str:
    base, sep, n = session_id.rpartition("+")
    return base if sep and n.isdigit() else session_id


def _first_root(session_id: str) -> str:
    """The name a fork of a fork (`name+2+3`) started from."""
    while (root := _root_of(session_id)) != session_id:
        session_id = root
    return session_id


# ---- starting a turn ---------------------------------------------------------------------------------


@dataclass
class StartedTurn:
    session_id: str
    turn: Turn
    sub: Subscription | None
    forked: bool = False
    imported: int = 0


_SEEN_MAX = 4096  # compact views kept (a few KB each, plus the text of any stopped answer)


async def _finish(job: Coroutine[Any, Any, None]) -> None:
    """Run `job` to its end even if the caller is cancelled meanwhile, once or more."""
    task = asyncio.ensure_future(job)
    while not task.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(task)


async def _cancel_accepted(engine: Engine, session_id: str, submit: asyncio.Future[Turn]) -> None:
    try:
        turn = await submit
    except Exception:  # noqa: BLE001 - refused after all: nothing to cancel
        return
    await cancel_turn(engine, session_id, turn, "the client disconnected")


def _check_turn_model(engine: Engine, text: str) -> None:
    """A leading `@model` the engine would refuse is the request's fault (400), and is refused
    before a session is made for it: the engine's answer came as a 502/500 and left an empty one."""
    try:
        parsed = engine.parse(text, "proxy")
    except EngineError as e:
        raise HttpError(400, "invalid_request", str(e), param="messages") from None
    if parsed.model is None:
        return
    if not parsed.text and not parsed.commands:
        raise HttpError(400, "invalid_request", f"@{parsed.model} needs a prompt after it",
                        param="messages")
    check_model(engine, parsed.model, "messages")


class ProxySessions:
    """Maps conversations to sessions; one lock per conversation root serialises resolution."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._forks: dict[str, list[str]] = {}  # root -> known session ids of that root
        # Compact views of recently compared sessions, least recently used first: without them
        # every request read the history of every chat sharing its name (a `user` field names
        # all of one person's chats), and grew slower with each chat.
        self._seen: OrderedDict[str, _Seen] = OrderedDict()
        self._loaded = False
        self._load_lock = asyncio.Lock()
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        # A deleted session leaves the index at once: a long-running server would otherwise keep
        # every conversation it ever saw.
        engine.bus.add_listener(self._on_event)

    def _on_event(self, event: ev.Event) -> None:
        if event.name == ev.SESSION and event.session_id and event.data.get("change") == "deleted":
            self._forget(event.session_id)

    def _forget(self, sid: str) -> None:
        self._seen.pop(sid, None)
        for root in {sid, _root_of(sid), _first_root(sid)}:
            known = self._forks.get(root)
            if known is not None and sid in known:
                known.remove(sid)
                if not known:
                    del self._forks[root]

    async def _load_index(self) -> None:
        if self._loaded:
            return
        async with self._load_lock:
            if self._loaded:
                return
            for sid in await self.engine.store.session_ids("proxy"):
                self._forks.setdefault(_root_of(sid), []).append(sid)
            self._loaded = True

    async def _lock(self, root: str) -> asyncio.Lock:
        lock, n = self._locks.get(root, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[root] = (lock, n + 1)
        return lock

    def _unlock(self, root: str) -> None:
        lock, n = self._locks[root]
        if n <= 1:
            del self._locks[root]
        else:
            self._locks[root] = (lock, n - 1)

    async def start(self, conv: ConversationId, messages: Sequence[ClientMessage],
                    model: PublishedModel, who: Caller, *, events: Iterable[str] | None = None) -> StartedTurn:
        """Pick (or fork) the session, import what it lacks, subscribe (to `events`, default all),
        submit the new message. Sessions `who` may not use are never continued; new ones are
        owned by `who`."""
        check_conversation(messages)
        messages = with_system_context(messages, self.engine)
        _check_turn_model(self.engine, messages[-1].text)
        # One admission from the first look at the sessions to the submit: a shutdown that
        # begins meanwhile waits for it, rather than closing the store under a half-imported
        # history or a message accepted with no turn to end it.
        with self.engine.admission():
            await self._load_index()
            lock = await self._lock(conv.root)
            try:
                async with lock:
                    return await self._start_locked(conv, messages, model, who, events)
            finally:
                self._unlock(conv.root)
                if self._forks.get(conv.root) == []:
                    del self._forks[conv.root]  # refused, or every session of it gone

    async def _start_locked(self, conv: ConversationId, messages: Sequence[ClientMessage],
                            model: PublishedModel, who: Caller, events: Iterable[str] | None) -> StartedTurn:
        engine = self.engine
        entries = client_entries(since_reset(engine, messages[:-1]))
        client = [entry for entry, _ in entries]
        session_id, skip, forked = await self._choose(conv, client, model, who)
        # Created here (owned by the caller) when it is new; refused if it is not the caller's.
        await claim(engine, session_id, who, kind="proxy", model=turn_model(model))
        missing = [m for _, m in entries[skip:]]
        imported = 0
        if missing:
            imported = await self._import(session_id, missing)
        # The session exists from here on (claimed, perhaps imported into): indexed whatever follows.
        known = self._forks.setdefault(conv.root, [])
        if session_id not in known:
            known.append(session_id)
        # Subscribed before submitting, so not even a command's instant `done` is missed.
        sub = engine.bus.subscribe(session_id, names=events)
        # The owner again: should a delete slip in before the submit runs, the session it starts
        # afresh is still the caller's, not an unowned one only operators may use.
        submit = asyncio.ensure_future(engine.submit(session_id, messages[-1].text, kind="proxy",
                                                     model=turn_model(model), is_operator=False,
                                                     meta=owner_meta(who), owner_only=not who.operator))
        try:
            # Shielded: a client hanging up (its handler cancelled) while the engine records the
            # message would leave a question that no turn answers, and the retry would fork.
            turn = await asyncio.shield(submit)
        except asyncio.CancelledError:
            sub.close()
            # The engine finishes accepting the message, then the turn is cancelled as any
            # hang-up cancels it; neither is cut short by a second cancel (a shutdown, say).
            await _finish(_cancel_accepted(engine, session_id, submit))
            raise
        except BaseException as e:
            sub.close()
            if isinstance(e, EngineError):
                raise HttpError(400, "invalid_request", str(e)) from None
            raise
        return StartedTurn(session_id, turn, sub, forked, imported)

    async def _choose(self, conv: ConversationId, client: list[Entry],
                      model: PublishedModel, who: Caller) -> tuple[str, int, bool]:
        """(session id, how many of the client's messages it already holds (the rest are imported
        first), whether this forked)."""
        engine = self.engine
        known = self._forks.setdefault(conv.root, [])
        if conv.root not in known:
            # Not a proxy session we know of: create it, owned by the caller (one store round
            # trip), or learn whose it is.
            try:
                live = await claim(engine, conv.root, who, kind="proxy", model=turn_model(model))
            except HttpError:
                if conv.explicit:
                    raise  # a session named outright: say it is another's rather than fork
                live = None  # a name shared by chance (a fingerprint): the caller forks from it
            if live is not None and live.row.kind == "proxy":
                known.insert(0, conv.root)
            elif live is not None and conv.explicit:
                kind = live.row.kind
                raise HttpError(409, "session_conflict",
                                f"session {conv.root!r} is {'an' if kind in ('api', 'mcp') else 'a'} {kind} session; "
                                f"the proxy continues only proxy sessions")
        elif conv.explicit:
            live = await engine.session(conv.root)
            if live is not None and not who.may_use(owner_of(live)):
                raise forbidden(conv.root)
        for trusted in (True, False):
            chosen = await self._match(known, conv, client, who, trusted)
            if chosen is None:
                break
            sid, held = chosen
            if (held == 0 and conv.explicit and sid == conv.root) or await self._confirmed(sid, held, client):
                return sid, held, False
            # A stale or colliding compact view (never seen in practice): compare the real ones.
            self._seen.clear()
        new_id_ = await self._free_id(conv.root, known)
        return new_id_, 0, new_id_ != conv.root

    async def _match(self, known: list[str], conv: ConversationId, client: list[Entry], who: Caller,
                     trusted: bool) -> tuple[str, int] | None:
        """The session to continue and how many of the client's messages it holds, or None: the
        one holding all of them, else the one holding the longest prefix of them. One that holds
        them only by taking the client's copy of a stopped answer for part of its own comes after
        one that holds them outright, and the newest such branch first: a regenerated answer
        stopped early often begins as the first one did."""
        best: tuple[str, int] | None = None  # a session whose conversation is a prefix of the client's
        in_part: tuple[str, int] | None = None  # holds them all, an answer of it in part
        root_used = False
        for sid in list(known):
            seen = await self._seen_of(sid, trusted)
            if seen is None or seen.kind != "proxy":
                if sid in known:  # deleted meanwhile (the listener may have been first)
                    known.remove(sid)
                continue
            if not who.may_use(seen.owner):
                continue  # another caller's branch of a shared name: never continued, never shown
            ours = seen.view
            if sid == conv.root:
                root_used = bool(ours)
            if not client and ours and not conv.explicit:
                continue  # a first message never continues an existing conversation
            for view in (ours, seen.unstopped):  # (unstopped: without a stopped answer the client never got)
                if view is not None and len(view) == len(client):
                    if is_prefix_sig(view, client, in_part=False):
                        return sid, len(client)
                    if is_prefix_sig(view, client):
                        in_part = (sid, len(client))  # the newest one wins: `known` is oldest first
            if (best is None or len(ours) > best[1]) and is_prefix_sig(ours, client):
                best = (sid, len(ours))
        if in_part is not None:
            return in_part
        if not client and conv.explicit and root_used:
            # X-Aiops-Session with only the new message: aiops holds the history.
            return conv.root, 0
        return best

    async def _seen_of(self, sid: str, trusted: bool) -> _Seen | None:
        engine = self.engine
        stamp = engine.history_stamp(sid)  # before reading: a write meanwhile makes it stale
        seen = self._seen.get(sid)
        if trusted and seen is not None and seen.stamp == stamp:
            self._seen.move_to_end(sid)
            return seen
        live = await engine.session(sid)
        if live is None:
            self._seen.pop(sid, None)
            return None
        history = await live.history(engine)
        stopped = any(_maybe_unseen(m) for m in history)
        seen = _Seen(stamp, live.row.kind, owner_of(live), signatures(session_view(history)),
                     signatures(session_view(history, without_stopped=True)) if stopped else None)
        self._seen[sid] = seen
        self._seen.move_to_end(sid)
        while len(self._seen) > _SEEN_MAX:
            self._seen.popitem(last=False)
        return seen

    async def _confirmed(self, sid: str, held: int, client: list[Entry]) -> bool:
        """The chosen session's real conversation is what its compact view said."""
        live = await self.engine.session(sid)
        if live is None:
            return False
        history = await live.history(self.engine)
        return any(len(ours) == held and is_prefix(ours, client)
                   for ours in (session_view(history), session_view(history, without_stopped=True)))

    async def _free_id(self, root: str, known: Sequence[str]) -> str:
        if await self.engine.session(root) is None:
            return root
        # After the highest fork known: counting up from 2 asked the store once per earlier fork.
        forks = (sid.rpartition("+")[2] for sid in known if sid != root)
        n = max((int(f) for f in forks if f.isascii() and f.isdigit()), default=1) + 1
        if len(f"{root}+{n}") > 128:
            # A fork of a fork sent back as X-Aiops-Session: named after the first root instead,
            # so that its id can be sent again too.
            root, n = _first_root(root), 2
        while await self.engine.session(f"{root}+{n}") is not None:
            n += 1
        return f"{root}+{n}"

    async def _import(self, session_id: str, missing: list[ClientMessage]) -> int:
        """Record the client's earlier messages, one turn id per user message and its answer."""
        turn_id: str | None = None
        for m in missing:
            if m.role == "user" or turn_id is None:
                turn_id = new_id("imp_")
            text = m.text if m.role == "user" else without_status_lines(m.text)
            await self.engine.record(session_id, Message(m.role, text, turn_id=turn_id,  # type: ignore[arg-type]
                                                         meta={"imported": True, "source": "proxy"}))
        return len(missing)


async def wait_done(started: StartedTurn, on_first_text: Callable[[], None] | None = None) -> TurnResult:
    """The turn's result, taken from its `done` event: that comes as soon as the answer is
    recorded, a few loop turns before the turn's own future (which waits for the task to end).
    `on_first_text` is called as the answer's first text arrives, if `tok` is subscribed to."""
    if started.sub is not None:
        async for e in started.sub:
            if on_first_text is not None and e.name == ev.TOK and e.turn_id == started.turn.id:
                on_first_text()
                on_first_text = None
            if e.name == ev.DONE and e.turn_id == started.turn.id:
                d = e.data
                usage = d.get("usage") or {}
                return TurnResult(started.turn.id, d.get("status", "complete"), d.get("text") or "",
                                  d.get("error"), Usage(usage.get("prompt_tokens", 0),
                                                        usage.get("completion_tokens", 0)),
                                  d.get("finish_reason"), d.get("ended"))
    return await started.turn.wait()


async def cancel_turn(engine: Engine, session_id: str, turn: Turn, why: str) -> None:
    """Cancel one turn, running or still queued; a running one records its partial answer."""
    if turn.done:
        return
    live = await engine.session(session_id)
    if live is None:
        return
    if live.current is turn:
        engine.stop_turn(session_id, by=why)
    elif engine.drop_queued_turn(live, turn):
        await engine.record(session_id, Message("notice", f"turn cancelled before it started: {why}",
                                                turn_id=turn.id, meta={"kind": "cancelled"}))


# ---- app state ---------------------------------------------------------------------------------------


class ProxyState:
    """Per-app proxy state, created by `setup` and bound to the engine on first use."""

    def __init__(self) -> None:
        self._sessions: ProxySessions | None = None
        self._settings: ProxySettings | None = None

    def bind(self, app: web.Application) -> None:
        if self._sessions is None:
            self._sessions = ProxySessions(app[ENGINE_KEY])
            self._settings = ProxySettings.from_config(app[CONFIG_KEY])

    @property
    def sessions(self) -> ProxySessions:
        assert self._sessions is not None
        return self._sessions

    @property
    def settings(self) -> ProxySettings:
        assert self._settings is not None
        return self._settings


PROXY_KEY = web.AppKey("aiops_proxy", ProxyState)


def install(app: web.Application) -> None:
    """Idempotent: both proxy modules call it from their `setup`."""
    if PROXY_KEY not in app:
        app[PROXY_KEY] = ProxyState()


def proxy_state(request: web.Request) -> ProxyState:
    state = request.app[PROXY_KEY]
    state.bind(request.app)
    return state


# ---- streaming one turn ----------------------------------------------------------------------------------


@dataclass
class Done:
    status: str  # complete | cancelled | error
    text: str
    usage: dict[str, int] | None
    error: dict[str, Any] | None
    finish_reason: str = "stop"  # or "length": cut at the model's output limit


async def turn_output(started: StartedTurn, settings: ProxySettings) -> AsyncIterator[tuple[str, Done | None]]:
    """The chat-visible text of one turn as `(text, None)` pieces, then `(text, Done)` at its end.

    Events already queued are taken together, so a burst of tokens becomes one piece (one write,
    one frame) instead of one per token. Ends without a `Done` when the subscription is closed
    under it (client gone, shutdown).
    """
    turn_id = started.turn.id
    sub = started.sub
    assert sub is not None
    sent: list[str] = []  # model text streamed so far
    tail = ""  # the last characters written, to keep status lines on their own paragraph
    error: dict[str, Any] | None = None

    def status(line: str) -> str:
        nonlocal tail
        sep = "" if not tail else ("" if tail.endswith("\n\n") else ("\n" if tail.endswith("\n") else "\n\n"))
        out = f"{sep}{line}\n\n"
        tail = out[-2:]
        return out

    def take(e: Any, out: list[str]) -> Done | None:
        nonlocal tail, error
        if e.turn_id != turn_id:
            if e.name == ev.ERROR and e.data.get("code") == "slow_consumer":
                return Done("error", "".join(sent), None, dict(e.data))
            return None
        name = e.name
        if name == ev.TOK:
            text = e.data.get("text") or ""
            if text:
                sent.append(text)
                tail = (tail + text)[-2:]
                out.append(text)
        elif name == ev.GATE:
            if settings.status_lines:
                out.append(status(gate_status(e.data)))
        elif name == ev.GATE_RESOLVED:
            if settings.status_lines:
                out.append(status(resolution_status(e.data)))
        elif name == ev.TOOL_CALL:
            if settings.tool_progress:
                out.append(status(status_line(_TOOL, f"running {e.data.get('name', 'a tool')}")))
        elif name == ev.ERROR:
            error = dict(e.data)
        elif name == ev.DONE:
            final = e.data.get("text") or ""
            streamed = "".join(sent)
            if final != streamed and final.startswith(streamed):
                rest = final[len(streamed):]  # e.g. command output that never came as tokens
                sent.append(rest)
                tail = (tail + rest)[-2:]
                out.append(rest)
            status_ = e.data.get("status", "complete")
            if status_ == "cancelled" and settings.status_lines:
                out.append(status(status_line(_NO, STOPPED)))
            elif (ended := e.data.get("ended")) and settings.status_lines:
                out.append(status(status_line(_NO, ended)))
            return Done(status_, final, e.data.get("usage"), e.data.get("error") or error,
                        e.data.get("finish_reason") or "stop")
        return None

    if started.turn.prefix:
        # The output of commands in the same message begins the answer (its `done` text too), and
        # came before the turn did, as no event of it: said first, as a whole reply says it.
        lead = started.turn.prefix + "\n\n"
        sent.append(lead)
        tail = lead[-2:]
        yield lead, None
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
            done = take(e, out)
        if out or done is not None:
            yield "".join(out), done
        if done is not None or e is None:
            return


class BufferedStreamResponse(web.StreamResponse):
    """A streaming response whose headers leave with the first frames instead of in a write of
    their own (as aiohttp's non-streaming Response does). `Channel` flushes them within a poll
    interval even when no frame comes."""

    _send_headers_immediately = False


class Channel:
    """Writes frames to a prepared streaming response, as few writes as it can; sends keep-alives on
    an idle stream and notices a client that hung up (then calls `on_disconnect` once).

    The response's headers and `head` (e.g. the OpenAI role chunk) go out with the first frames, or
    on their own once the stream has been quiet for a poll interval, so a quick answer takes two
    writes: its text, then its end. The watch is a timer callback, not a task: most answers end
    before it first fires."""

    def __init__(self, request: web.Request, response: web.StreamResponse | None,
                 on_disconnect: Callable[[], Awaitable[None]], *,
                 keepalive: bytes | Callable[[], bytes] | None = None,
                 keepalive_seconds: float = 15.0, head: bytes = b"") -> None:
        """`keepalive`: the frame sent on an idle stream, or a function making a fresh one each
        time (a frame that carries a timestamp)."""
        self.request = request
        self.response = response
        self.keepalive = keepalive
        self.keepalive_seconds = keepalive_seconds
        self._head = head
        self._on_disconnect = on_disconnect
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()
        self._poll = min(DISCONNECT_POLL_SECONDS, keepalive_seconds / 2)
        self._timer: asyncio.TimerHandle | None = None
        self._pending: asyncio.Task[None] | None = None  # a keep-alive write or a disconnect
        self._finished = False
        self._flushed = False  # anything (headers included) written yet
        self.gone = False

    def start(self) -> Channel:
        self._timer = self._loop.call_later(self._poll, self._tick)
        return self

    async def write(self, data: bytes) -> None:
        assert self.response is not None
        if self._head:
            data, self._head = self._head + data, b""
        self._last = self._loop.time()
        self._flushed = True
        await self.response.write(data)  # b"" still sends buffered headers

    async def finish(self, data: bytes = b"") -> None:
        """The last frames and the end of the body, in one write."""
        assert self.response is not None
        self._finished = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._head:
            data, self._head = self._head + data, b""
        self._last = self._loop.time()
        await self.response.write_eof(data)

    def _connected(self) -> bool:
        transport = self.request.transport
        return transport is not None and not transport.is_closing()

    async def disconnected(self) -> None:
        if not self.gone:
            self.gone = True
            await self._on_disconnect()

    def _tick(self) -> None:
        self._timer = None
        if self._finished or self.gone:
            return
        if self._pending is None or self._pending.done():
            if not self._connected():
                self._pending = self._loop.create_task(self.disconnected())
                return
            if self.response is not None and (self._head or not self._flushed or (
                    self.keepalive is not None and self._loop.time() - self._last >= self.keepalive_seconds)):
                self._pending = self._loop.create_task(self._keepalive())
        self._timer = self._loop.call_later(self._poll, self._tick)

    async def _keepalive(self) -> None:
        # Made by the timer, it may run after the stream ended in the same loop turn: nothing may
        # follow the end of the body (a chunk after it would corrupt the kept-alive connection).
        if self._finished or self.gone:
            return
        try:
            # write() sends the headers and the head first; a keep-alive only when those are out.
            if self._head or not self._flushed:
                frame = b""
            else:
                frame = (self.keepalive() if callable(self.keepalive) else self.keepalive) or b""
            await self.write(frame)
        except ConnectionError:
            await self.disconnected()
        except Exception:  # noqa: BLE001 - a keep-alive must never take the handler down
            log.exception("proxy keep-alive failed")

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._pending is not None and not self._pending.done():
            await asyncio.wait({self._pending})
