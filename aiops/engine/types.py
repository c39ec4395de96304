"""The engine's neutral message and tool-call model.

Every provider backend converts its own wire shapes to and from these; nothing outside a backend
ever sees an OpenAI or Gemini object.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

Role = Literal["system", "user", "assistant", "tool", "notice", "gate", "error"]

# Roles that are conversation (sent to the model); the rest are history-only records.
MODEL_ROLES: frozenset[str] = frozenset({"system", "user", "assistant", "tool"})


def is_short_id(ref: str) -> bool:
    """Whether `ref` is a session's shorthand number: ASCII digits only. `str.isdigit()` alone
    also takes "³" and other Unicode digits, which `int()` refuses or reads as another number."""
    return ref.isascii() and ref.isdigit()


# A UTF-16 surrogate on its own: JSON can carry one (`"\\ud800"`) and Python decodes it into a
# str that neither SQLite nor a UTF-8 stream can take. (A proper pair decodes to one character.)
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_text(text: str) -> str:
    """`text` with each lone surrogate replaced by U+FFFD, as a UTF-8 decoder would."""
    return text if text.isascii() else _LONE_SURROGATE.sub("\ufffd", text)


def valid_data(value: Any) -> Any:
    """`valid_text` through a decoded JSON value (keys included)."""
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, dict):
        return {valid_text(k) if isinstance(k, str) else k: valid_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [valid_data(v) for v in value]
    return value


def new_id(prefix: str = "") -> str:
    # 48 random bits, as the first 12 hex digits of a uuid4 were, without building the UUID
    # (several are made per proxied request).
    return prefix + os.urandom(6).hex()


class SessionKey(NamedTuple):
    """A session's place in the sessions listing, which is most recently updated first, then by
    id, descending: a page `before` it is the sessions after it in that order (keyset paging).
    On the wire (`GET /api/v1/sessions?before=`): `<updated_at>,<client_id>`."""

    updated_at: float
    client_id: str

    @classmethod
    def of(cls, session: Mapping[str, Any]) -> SessionKey:
        """The key of a listed session (a `list_sessions` row: `updated_at`, `client_id`)."""
        return cls(float(session["updated_at"]), str(session["client_id"]))

    def to_wire(self) -> str:
        return f"{self.updated_at!r},{self.client_id}"  # repr: the float read back is this one

    @classmethod
    def from_wire(cls, text: str) -> SessionKey:
        """Parse `<updated_at>,<client_id>` (the id may hold commas; the number cannot). Raises
        ValueError saying what is wrong."""
        at, comma, client_id = text.partition(",")
        if not comma or not client_id:
            raise ValueError("expected `<updated_at>,<client_id>` (a listed session's values)")
        try:
            updated_at = float(at)
        except ValueError:
            raise ValueError(f"updated_at {at!r} is not a number") from None
        if not math.isfinite(updated_at):
            raise ValueError(f"updated_at {at!r} is not a finite number")
        return cls(updated_at, client_id)


@dataclass(slots=True)
class ToolCall:
    """A request by the model to run one tool."""

    id: str
    name: str
    arguments: dict[str, Any]
    # Set when the arguments could not be decoded; the call is answered with this error.
    parse_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "name": self.name, "arguments": self.arguments}
        if self.parse_error:
            d["parse_error"] = self.parse_error
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ToolCall:
        return cls(id=d["id"], name=d["name"], arguments=d.get("arguments") or {},
                   parse_error=d.get("parse_error"))


@dataclass(slots=True)
class Message:
    """One entry of a session's history.

    `role` is "user" | "assistant" | "tool" | "system" for conversation, and "notice" | "gate" |
    "error" for records that are history but never sent to the model.
    """

    role: Role
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None  # role == "tool": which call this answers
    name: str | None = None  # role == "tool": the tool's name
    thinking: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    id: int | None = None  # row id once stored
    turn_id: str | None = None
    status: str = "complete"  # complete | cancelled | error

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "role": self.role,
            "content": self.content,
            "tool_calls": [tc.to_dict() for tc in self.tool_calls],
            "tool_call_id": self.tool_call_id,
            "name": self.name,
            "thinking": self.thinking,
            "meta": self.meta,
            "created_at": self.created_at,
            "turn_id": self.turn_id,
            "status": self.status,
        }


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def counts(self) -> dict[str, int] | None:
        """`{prompt_tokens, completion_tokens}`, or None when nothing was counted (a model that
        reports no usage, a turn stopped before the model answered): zeros would claim a count.
        Every surface that reports usage takes it from here."""
        if not self.total_tokens:
            return None
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens}


# ---- what a backend yields while streaming one model call -------------------------------------


@dataclass(slots=True)
class TextDelta:
    text: str


@dataclass(slots=True)
class ThinkingDelta:
    text: str


@dataclass(slots=True)
class ToolSpec:
    """A tool as offered to a model: name, description, JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(slots=True)
class Completion:
    """The end of one model call: the whole assistant reply."""

    text: str = ""
    thinking: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage | None = None
    finish_reason: str = "stop"


def valid_completion(c: Completion) -> Completion:
    """A model's reply as it may be stored and streamed: no lone surrogates in any of its text."""
    calls = [dataclasses.replace(t, id=valid_text(t.id), name=valid_text(t.name), arguments=valid_data(t.arguments))
             for t in c.tool_calls]
    return dataclasses.replace(c, text=valid_text(c.text), thinking=valid_text(c.thinking), tool_calls=calls)


StreamItem = TextDelta | ThinkingDelta | Completion
