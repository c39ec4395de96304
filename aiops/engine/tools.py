"""The tool registry: what the model may call, with validated arguments.

A tool is a name, a description, a pydantic argument model, a tool type (what gates and rate limits
key on), a per-call classifier (read or write, and for SQL the tables) and an async executor.
Schemas for every provider come from the pydantic model, so they cannot drift from validation.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, ValidationError

from aiops.engine.types import ToolSpec

if TYPE_CHECKING:
    from aiops.engine.store import Store

Operation = Literal["read", "write"]


@dataclass(slots=True, frozen=True)
class Classification:
    """What a call is about to do; the gate decides on this."""

    operation: Operation
    tables: tuple[str, ...] = ()
    unknown_tables: bool = False
    summary: str = ""
    # False when the call is not fully described by (tool, operation, tables): an operator's
    # "approve for the session" then covers this call only, never later ones.
    grantable: bool = True
    # A write that also reads the tables it names (`INSERT INTO t SELECT * FROM secret`): each
    # table's read rule applies as well as its write rule.
    reads_tables: bool = False
    # What the call does beyond read/write, e.g. the SQL statement kinds ("insert", "delete"): a
    # session approval covers later calls of the same kinds only (INSERT is no licence to DELETE).
    kinds: tuple[str, ...] = ()


@dataclass(slots=True)
class ToolOutput:
    text: str  # what the model sees
    data: Any = None  # structured form for the console (rows, etc.)
    is_error: bool = False


class ToolHost(Protocol):
    """What a tool reaches of the engine through its context: the audit log and notices."""

    @property
    def store(self) -> Store: ...

    def notice(self, session_id: str | None, text: str, turn_id: str | None = None, *,
               persist: bool = True) -> None: ...


@dataclass(slots=True)
class ToolContext:
    """Who is calling: tools act on behalf of one session's turn."""

    engine: ToolHost
    session_id: str
    client_kind: str
    turn_id: str | None
    model_key: str
    depth: int = 0  # agent-call / delegation depth
    is_operator: bool = False
    # Who wrote the call when it is not the session's own model (a delegate: "delegate model
    # grok"): gates and denials say so, so the operator judges the call knowing its author.
    via: str = ""
    # The aiops instances the turn's message came through (a swarm call's hop list), oldest first:
    # an agent_call from here carries them on, so that a loop back to one of them is refused.
    hops: tuple[str, ...] = ()
    # The model's call this runs for (its id in the turn's tool_call events): a gate names it, so
    # a view marks the right call of two alike. A delegate's inner call keeps its caller's.
    call_id: str | None = None

    def notice(self, text: str, *, persist: bool = True) -> None:
        """Status text for the session's views; without `persist`, not written to its history
        (progress that the tool's result sums up)."""
        self.engine.notice(self.session_id, text, self.turn_id, persist=persist)


Executor = Callable[[Any, ToolContext], Awaitable["ToolOutput | str"]]
Classifier = Callable[[Any], Classification]
# Why a call may not run at all in this context (None: it may), checked before its rate limit and
# gate: an operator is not asked about a call that would be refused anyway (agent_call's depth).
Precheck = Callable[[Any, ToolContext], "str | None"]


@dataclass(slots=True)
class Tool:
    name: str
    description: str
    args_model: type[BaseModel]
    tool_type: str
    execute: Executor
    operation: Operation = "read"  # when there is no classifier
    classify: Classifier | None = None
    precheck: Precheck | None = None
    plugin: str = "core"
    meta: dict[str, Any] = field(default_factory=dict)
    # pydantic builds a JSON schema in about a millisecond; every turn asks for every tool's.
    _spec: ToolSpec | None = field(default=None, init=False, repr=False, compare=False)

    def classification(self, args: BaseModel) -> Classification:
        if self.classify is not None:
            return self.classify(args)
        return Classification(self.operation)

    def spec(self) -> ToolSpec:
        if self._spec is None or self._spec.name != self.name or self._spec.description != self.description:
            schema = self.args_model.model_json_schema()
            schema.pop("title", None)
            self._spec = ToolSpec(self.name, self.description, schema)
        return self._spec

    def validate(self, arguments: dict[str, Any]) -> BaseModel:
        return self.args_model.model_validate(arguments)


def format_validation_error(tool: str, err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "arguments"
        parts.append(f"{loc}: {e['msg']}")
    return f"invalid arguments for {tool}: " + "; ".join(parts)


class ToolRegistry:
    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is already registered (by {self._tools[tool.name].plugin})")
        self._tools[tool.name] = tool

    def unregister(self, name: str) -> None:
        self._tools.pop(name, None)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def all(self) -> list[Tool]:
        return [self._tools[n] for n in sorted(self._tools)]

    def specs(self) -> list[ToolSpec]:
        return [t.spec() for t in self.all()]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)


def canonical_call(name: str, arguments: dict[str, Any]) -> str:
    """A stable key for the repeat detector: same tool, same arguments."""
    return name + ":" + json.dumps(arguments, sort_keys=True, default=str)
