"""Conversation matching: a chat client's history against a session's, as the client saw it.

Both sides become views — lists of (role, normalized text) — compared as prefixes: a request
continues the session whose view the client's history starts with. Between requests the proxy
keeps the views filed by their prefixes (proxy.index), so that a request finds its session
without comparing the others; the one found is confirmed on its real view before it is used.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from aiops.engine.commands import command_name
from aiops.engine.engine import Engine
from aiops.engine.types import Message
from aiops.integrations.server.proxy.messages import ClientMessage
from aiops.integrations.server.proxy.openwebui import as_typed
from aiops.integrations.server.proxy.status import collapsed, normalize

Entry = tuple[str, str]  # (role, normalized text)


RESET_COMMANDS = frozenset({"reset"})


def client_entries(messages: Iterable[ClientMessage]) -> list[tuple[Entry, ClientMessage]]:
    """The client's conversation as compared (user and non-empty assistant texts, normalized),
    each with the message as sent."""
    out: list[tuple[Entry, ClientMessage]] = []
    for m in messages:
        if m.role == "user":
            out.append((("user", as_typed(collapsed(m.text))), m))
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



@dataclass
class _TurnText:
    turn_id: str | None
    user: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)  # command outputs
    answer: list[str] = field(default_factory=list)
    unseen: bool = False  # the turn was stopped or failed: its client may have got none of it
    cut: bool = False  # ...or only the start of it (a stream it hung up on, or that was stopped)



# Statuses of a recorded answer a client may never have got (see session_view).
MAYBE_UNSEEN = ("cancelled", "error")


def maybe_unseen(m: Message) -> bool:
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
        if turn.turn_id == m.turn_id and maybe_unseen(m):
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
        out.append(("user", as_typed(collapsed("\n".join(t.user)))))
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
