"""The engine's events as types: one frozen dataclass per kind, joined in the `Event` union.

Producers (the turn runner, the intake, the gatekeeper) build these; views (the console, the API
stream, the proxy, `aiops chat`, Slack, MCP) `match` on them or handle one type each. The wire
form — the SSE event name and its JSON body — comes from one place: `Event.name` and
`Event.payload()`, and `from_wire` reads it back (an attached console, a swarm peer).

The names are also the SSE event names of the API stream (docs/API.md):
`tok thinking tool_call tool_result gate gate_resolved notice error done` are the contract's;
`user`, `turn`, `session` and `rate` are extra events for views that draw more than one
conversation; `models` (what the server knows of its models' reachability) is published by the
server, not the engine.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

# One rate-limited tool type's use in one session: the limiter's own rows travel in `RateChanged`.
from aiops.gates.rate_usage import RateUsage as RateInfo

# The wire names (kept as constants: tests and older plugins name events by them).
TOK = "tok"
THINKING = "thinking"
TOOL_CALL = "tool_call"
TOOL_RESULT = "tool_result"
GATE = "gate"
GATE_RESOLVED = "gate_resolved"
NOTICE = "notice"
ERROR = "error"
DONE = "done"
USER = "user"
TURN = "turn"
SESSION = "session"
RATE = "rate"
MODELS = "models"
CONTRACT_EVENTS: frozenset[str] = frozenset(
    {TOK, THINKING, TOOL_CALL, TOOL_RESULT, GATE, GATE_RESOLVED, NOTICE, ERROR, DONE}
)

_seq = itertools.count(1)


def _next_seq() -> int:
    return next(_seq)


@dataclass(frozen=True, slots=True, kw_only=True)
class _EventBase:
    """What every event carries besides its own fields: where it belongs and when it happened."""

    name: ClassVar[str]
    session_id: str | None
    turn_id: str | None = None
    ts: float = field(default_factory=time.time)
    # Publication order across the process (resumable streams use it).
    seq: int = field(default_factory=_next_seq)

    def body(self) -> dict[str, Any]:
        """The event's own fields in their wire shape (no session or turn id)."""
        raise NotImplementedError

    @property
    def data(self) -> dict[str, Any]:
        """The wire body (kept for tests and serializers; views read the typed fields)."""
        return self.body()

    def payload(self) -> dict[str, Any]:
        """The JSON body clients receive (SSE data, API, MCP, `aiops chat --json`)."""
        body = self.body()
        body.setdefault("session_id", self.session_id)
        if self.turn_id is not None:
            body.setdefault("turn_id", self.turn_id)
        return body


# ---- the conversation -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Tok(_EventBase):
    """A delta of the assistant's answer."""

    name: ClassVar[Literal["tok"]] = "tok"
    text: str

    def body(self) -> dict[str, Any]:
        return {"text": self.text}


@dataclass(frozen=True, slots=True, kw_only=True)
class Thinking(_EventBase):
    """A delta of the model's reasoning."""

    name: ClassVar[Literal["thinking"]] = "thinking"
    text: str

    def body(self) -> dict[str, Any]:
        return {"text": self.text}


@dataclass(frozen=True, slots=True)
class ClientCall:
    """A call of a client tool, named as the client knows it."""

    id: str
    name: str
    arguments: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": dict(self.arguments)}


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCalled(_EventBase):
    """The model's call of one tool is about to be checked and run."""

    name: ClassVar[Literal["tool_call"]] = "tool_call"
    call_id: str
    tool: str
    arguments: Mapping[str, Any]
    # A client tool's call (see engine.client_tools): it runs in the chat client, not gated here.
    client: bool = False

    def body(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.call_id, "name": self.tool, "arguments": self.arguments}
        if self.client:
            d["client"] = True
        return d


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolReturned(_EventBase):
    """A tool call's result (a preview of it: the whole text is in the history)."""

    name: ClassVar[Literal["tool_result"]] = "tool_result"
    call_id: str
    tool: str
    content: str
    truncated: bool = False
    is_error: bool = False
    duration_ms: float = 0.0
    gate: str | None = None  # the gate's decision, when the call passed one
    result_data: Any = None  # structured output of the tool, when it has any
    # "cancelled" or "error" for a call its stopped or failed turn left without a result.
    status: Literal["complete", "cancelled", "error"] = "complete"

    def body(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.call_id, "name": self.tool, "content": self.content,
                             "truncated": self.truncated, "is_error": self.is_error,
                             "duration_ms": self.duration_ms}
        if self.gate:
            d["gate"] = self.gate
        if self.result_data is not None:
            d["data"] = self.result_data
        if self.status != "complete":
            d["status"] = self.status
        return d


@dataclass(frozen=True, slots=True)
class GateInfo:
    """The gate object (docs/API.md, "Gates"), with its resolution once it has one."""

    id: str
    session_id: str
    client_id: str
    client_kind: str
    tool: str
    tool_type: str
    args: Mapping[str, Any]
    operation: str  # read | write
    tables: tuple[str, ...]
    summary: str
    created_at: float
    expires_at: float | None
    # What approving it "for the session" would let through, in words (None: this call only).
    session_grant: str | None = None
    # What gates.toml rules call the tool (`mcp:SERVER:TOOL` for the MCP tool the model calls
    # `SERVER__TOOL`); None from a server older than the field.
    rule_target: str | None = None
    # The model's call the gate holds (the id of its tool_call event); None for a gate of no call
    # (an MCP server's question) or from a server older than the field.
    call_id: str | None = None
    # Set on a resolved gate:
    decision: str | None = None  # approved | denied | timeout | cancelled
    scope: str | None = None  # once | session
    by: str | None = None
    at: float | None = None
    # Anything else the gate object carries on the wire (kept so a round trip loses nothing).
    extra: Mapping[str, Any] = field(default_factory=dict)

    _FIELDS: ClassVar[tuple[str, ...]] = (
        "id", "session_id", "client_id", "client_kind", "tool", "tool_type", "args", "operation",
        "tables", "summary", "created_at", "expires_at", "session_grant", "rule_target", "call_id")
    _RESOLUTION: ClassVar[tuple[str, ...]] = ("decision", "scope", "by", "at")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GateInfo:
        known = set(cls._FIELDS) | set(cls._RESOLUTION)
        return cls(
            id=str(d.get("id", "")), session_id=str(d.get("session_id", "")),
            client_id=str(d.get("client_id", "")), client_kind=str(d.get("client_kind", "")),
            tool=str(d.get("tool", "")), tool_type=str(d.get("tool_type", "")),
            args=dict(d.get("args") or {}), operation=str(d.get("operation", "")),
            tables=tuple(d.get("tables") or ()), summary=str(d.get("summary", "")),
            created_at=float(d.get("created_at") or 0.0), expires_at=d.get("expires_at"),
            session_grant=d.get("session_grant"), rule_target=d.get("rule_target"), call_id=d.get("call_id"),
            decision=d.get("decision"), scope=d.get("scope"), by=d.get("by"), at=d.get("at"),
            extra={k: v for k, v in d.items() if k not in known},
        )

    @property
    def resolved(self) -> bool:
        return self.decision is not None

    @property
    def target(self) -> str:
        """The tool as gates.toml names it, which is what an operator is shown: `rule_target`, or
        the tool's name when the gate came without one."""
        return self.rule_target or self.tool

    def to_dict(self) -> dict[str, Any]:
        """The gate object (plus its resolution keys once resolved), exactly as on the wire."""
        d: dict[str, Any] = {
            "id": self.id, "session_id": self.session_id, "client_id": self.client_id,
            "client_kind": self.client_kind, "tool": self.tool,
            **({"rule_target": self.rule_target} if self.rule_target is not None else {}),
            "tool_type": self.tool_type,
            "args": self.args, "operation": self.operation, "tables": list(self.tables),
            "summary": self.summary, "created_at": self.created_at, "expires_at": self.expires_at,
            "session_grant": self.session_grant,
            **({"call_id": self.call_id} if self.call_id is not None else {}),
        }
        d.update(self.extra)
        if self.decision is not None:
            d.update(decision=self.decision, scope=self.scope, by=self.by, at=self.at)
        return d


@dataclass(frozen=True, slots=True, kw_only=True)
class GateOpened(_EventBase):
    """A tool call waits for an operator's answer (from now until `GateResolved` for its id)."""

    name: ClassVar[Literal["gate"]] = "gate"
    gate: GateInfo

    def body(self) -> dict[str, Any]:
        return self.gate.to_dict()


@dataclass(frozen=True, slots=True, kw_only=True)
class GateResolved(_EventBase):
    """A gate was answered (approved, denied), timed out or was cancelled; `gate.decision` says."""

    name: ClassVar[Literal["gate_resolved"]] = "gate_resolved"
    gate: GateInfo

    def body(self) -> dict[str, Any]:
        return self.gate.to_dict()


@dataclass(frozen=True, slots=True, kw_only=True)
class Notice(_EventBase):
    """Status text; or, with `command`, the output of that `!command` (`ok` false on a failure)."""

    name: ClassVar[Literal["notice"]] = "notice"
    text: str
    command: str | None = None
    ok: bool | None = None

    def body(self) -> dict[str, Any]:
        d: dict[str, Any] = {"text": self.text}
        if self.command is not None:
            d["command"] = self.command
        if self.ok is not None:
            d["ok"] = self.ok
        return d


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """What went wrong: a code clients may branch on and a message people read; a `model_error`
    also says its `cause` (`key`, `connection` or `server`: engine/backends/base.py), so a view
    can advise without reading the message."""

    code: str
    message: str
    cause: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {"code": self.code, "message": self.message}
        if self.cause is not None:
            d["cause"] = self.cause
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ErrorInfo:
        cause = d.get("cause")
        return cls(str(d.get("code", "error")), str(d.get("message", "")),
                   str(cause) if cause is not None else None)


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorEvent(_EventBase):
    """A failure: of the model, a tool's backend, the turn itself, or the reader's stream
    (`slow_consumer`: the reader fell too far behind and its stream ends here)."""

    name: ClassVar[Literal["error"]] = "error"
    error: ErrorInfo

    @property
    def code(self) -> str:
        return self.error.code

    @property
    def message(self) -> str:
        return self.error.message

    def body(self) -> dict[str, Any]:
        return self.error.to_dict()


@dataclass(frozen=True, slots=True)
class TokenCounts:
    prompt_tokens: int
    completion_tokens: int

    def to_dict(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens}


@dataclass(frozen=True, slots=True, kw_only=True)
class Done(_EventBase):
    """The end of a turn, always: how it ended and its whole text."""

    name: ClassVar[Literal["done"]] = "done"
    text: str
    status: Literal["complete", "cancelled", "error"]
    model: str
    # The message ran commands only (no model turn).
    command: bool = False
    error: ErrorInfo | None = None
    # "length" when the answer was cut at the model's output limit.
    finish_reason: str | None = None
    # Why the engine ended the turn before the model was done: the text is not a whole answer.
    ended: str | None = None
    usage: TokenCounts | None = None
    # Client tool calls the turn hands back to its client (finish_reason "tool_calls"): the turn
    # goes on when their results come.
    client_calls: tuple[ClientCall, ...] = ()

    def body(self) -> dict[str, Any]:
        d: dict[str, Any] = {"text": self.text, "status": self.status, "model": self.model}
        if self.client_calls:
            d["client_calls"] = [c.to_dict() for c in self.client_calls]
        if self.command:
            d["command"] = True
        if self.error is not None:
            d["error"] = self.error.to_dict()
        if self.finish_reason:
            d["finish_reason"] = self.finish_reason
        if self.ended:
            d["ended"] = self.ended
        if self.usage is not None:
            d["usage"] = self.usage.to_dict()
        return d


# ---- what views of many sessions draw besides a conversation -------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class UserPosted(_EventBase):
    """A user message was committed (with `command`: a message of `!commands`)."""

    name: ClassVar[Literal["user"]] = "user"
    text: str
    command: bool = False
    model: str | None = None  # a one-turn `@model`

    def body(self) -> dict[str, Any]:
        if self.command:
            return {"text": self.text, "command": True}
        return {"text": self.text, "model": self.model}


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnStarted(_EventBase):
    """A queued turn began to run."""

    name: ClassVar[Literal["turn"]] = "turn"
    model: str

    def body(self) -> dict[str, Any]:
        return {"status": "started", "model": self.model}


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionChanged(_EventBase):
    """A session was created, changed (title, model, state) or deleted. `session` is its record
    as the API lists it; a deleted one's holds only `client_id` and `short_id`."""

    name: ClassVar[Literal["session"]] = "session"
    change: Literal["created", "updated", "deleted"]
    session: Mapping[str, Any]

    def body(self) -> dict[str, Any]:
        return {"change": self.change, **self.session}


@dataclass(frozen=True, slots=True, kw_only=True)
class RateChanged(_EventBase):
    """A session's rate-limit use changed."""

    name: ClassVar[Literal["rate"]] = "rate"
    usage: tuple[RateInfo, ...]

    def body(self) -> dict[str, Any]:
        return {"usage": [u.to_dict() for u in self.usage]}


@dataclass(frozen=True, slots=True)
class ModelState:
    """Whether one configured model answers, as last seen: by a probe (a cheap list-models request)
    or a turn (a model error marks it unreachable, a whole answer reachable again)."""

    key: str
    ok: bool
    reason: str = ""  # why it is unreachable
    checked_at: float = 0.0
    cause: str = ""  # with `reason`: "key" or "connection" (engine/backends/base.py FailureCause)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"key": self.key, "ok": self.ok, "reason": self.reason, "checked_at": self.checked_at}
        if self.cause:
            d["cause"] = self.cause
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelState:
        return cls(str(d.get("key", "")), bool(d.get("ok")), str(d.get("reason") or ""),
                   float(d.get("checked_at") or 0), str(d.get("cause") or ""))


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelsChanged(_EventBase):
    """The reachability of the enabled models changed (every model's, not only the changed one's).
    Published by the server that probes them (aiops/integrations/server/model_health.py)."""

    name: ClassVar[Literal["models"]] = "models"
    models: tuple[ModelState, ...]

    def body(self) -> dict[str, Any]:
        return {"models": [m.to_dict() for m in self.models]}


Event = (Tok | Thinking | ToolCalled | ToolReturned | GateOpened | GateResolved | Notice | ErrorEvent
         | Done | UserPosted | TurnStarted | SessionChanged | RateChanged | ModelsChanged)
"""Every event the engine publishes."""

EVENT_TYPES: dict[str, type[_EventBase]] = {
    t.name: t for t in (Tok, Thinking, ToolCalled, ToolReturned, GateOpened, GateResolved, Notice,
                        ErrorEvent, Done, UserPosted, TurnStarted, SessionChanged, RateChanged, ModelsChanged)
}


def error_event(session_id: str | None, code: str, message: str, turn_id: str | None = None) -> ErrorEvent:
    return ErrorEvent(session_id=session_id, turn_id=turn_id, error=ErrorInfo(code, message))


def is_slow_consumer(event: Event) -> bool:
    """The event that ends a subscription whose reader fell too far behind."""
    return isinstance(event, ErrorEvent) and event.code == "slow_consumer"


def from_wire(name: str, payload: Mapping[str, Any], *, ts: float | None = None) -> Event:
    """The typed event of a wire event (an SSE event's name and JSON body), as `payload()` wrote
    it. Raises ValueError for a name that is no event of ours."""
    p = dict(payload)
    ids: dict[str, Any] = {"session_id": p.pop("session_id", None), "turn_id": p.pop("turn_id", None)}
    if ts is not None:
        ids["ts"] = ts
    match name:
        case "tok":
            return Tok(text=str(p.get("text", "")), **ids)
        case "thinking":
            return Thinking(text=str(p.get("text", "")), **ids)
        case "tool_call":
            return ToolCalled(call_id=str(p.get("id", "")), tool=str(p.get("name", "")),
                              arguments=dict(p.get("arguments") or {}), client=bool(p.get("client")), **ids)
        case "tool_result":
            return ToolReturned(call_id=str(p.get("id", "")), tool=str(p.get("name", "")),
                                content=str(p.get("content", "")), truncated=bool(p.get("truncated")),
                                is_error=bool(p.get("is_error")), duration_ms=float(p.get("duration_ms") or 0),
                                gate=p.get("gate"), result_data=p.get("data"),
                                status=p.get("status") or "complete", **ids)
        case "gate":
            return GateOpened(gate=GateInfo.from_dict({**p, "session_id": ids["session_id"]}), **ids)
        case "gate_resolved":
            return GateResolved(gate=GateInfo.from_dict({**p, "session_id": ids["session_id"]}), **ids)
        case "notice":
            return Notice(text=str(p.get("text", "")), command=p.get("command"), ok=p.get("ok"), **ids)
        case "error":
            return ErrorEvent(error=ErrorInfo.from_dict(p), **ids)
        case "done":
            err, usage = p.get("error"), p.get("usage")
            return Done(text=str(p.get("text", "")), status=p.get("status") or "complete",
                        model=str(p.get("model", "")), command=bool(p.get("command")),
                        error=ErrorInfo.from_dict(err) if isinstance(err, Mapping) else None,
                        finish_reason=p.get("finish_reason"), ended=p.get("ended"),
                        usage=TokenCounts(int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)))
                        if isinstance(usage, Mapping) else None,
                        client_calls=tuple(ClientCall(str(c.get("id", "")), str(c.get("name", "")),
                                                      dict(c.get("arguments") or {}))
                                           for c in p.get("client_calls") or () if isinstance(c, Mapping)),
                        **ids)
        case "user":
            return UserPosted(text=str(p.get("text", "")), command=bool(p.get("command")),
                              model=p.get("model"), **ids)
        case "turn":
            return TurnStarted(model=str(p.get("model", "")), **ids)
        case "session":
            change = p.pop("change", "updated")
            return SessionChanged(change=change, session=p, **ids)
        case "rate":
            return RateChanged(usage=tuple(RateInfo(**u) for u in p.get("usage") or ()), **ids)
        case "models":
            return ModelsChanged(models=tuple(ModelState.from_dict(m) for m in p.get("models") or ()
                                              if isinstance(m, Mapping)), **ids)
    raise ValueError(f"unknown event {name!r}")
