"""The operations a view may ask of the engine: one narrow set, for every view.

The console, the API, the proxy, `aiops chat`, Slack, MCP, swarm and the attached console call the
engine through this protocol and nothing else (not its store, broker or session cache). `Engine`
implements it in-process; the attached console implements it over the HTTP API. Events come from
`subscribe`: typed values of `aiops.engine.events`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from aiops.engine.bus import Subscription
    from aiops.engine.events import GateInfo, RateInfo
    from aiops.engine.types import Message, SessionKey


class TurnHandle(Protocol):
    """A submitted message: its turn id, its session, and a way to wait for how it ended."""

    @property
    def id(self) -> str: ...

    @property
    def session_id(self) -> str: ...

    async def wait(self, timeout: float | None = None) -> Any: ...  # -> TurnResult


class EngineFacade(Protocol):
    async def submit(self, client_id: str | None, text: str, *, kind: str = "api",
                     model: str | None = None, is_operator: bool = False, depth: int = 0,
                     tools: bool = True, meta: dict[str, Any] | None = None,
                     owner_only: bool = False, hops: tuple[str, ...] = (), title: str | None = None) -> TurnHandle:
        """Take a message (its `!commands` run now, its text is queued as a turn); durable when
        this returns."""
        ...

    def stop_turn(self, ref: str, *, clear_queue: bool = False, by: str = "stop") -> bool: ...

    async def list_sessions(self, kind: str | None = None, limit: int = 1000, offset: int = 0, *,
                            owner: str | None = None, before: SessionKey | None = None) -> list[dict[str, Any]]:
        """Most recently active first, then by id; a page after another: `before` = the key of
        its last session (`SessionKey.of`), which deletions and activity meanwhile do not shift."""
        ...

    async def history(self, ref: str, *, limit: int | None = None,
                      before_id: int | None = None) -> list[Message]: ...

    async def delete_session(self, ref: str) -> bool: ...

    def resolve_gate(self, gate_id: str, decision: Literal["approved", "denied"],
                     scope: Literal["once", "session"] = "once", *, by: str) -> GateInfo:
        """Answer a pending gate (the one path every view takes; audited). Raises GateError for
        an unknown gate and GateAlreadyResolved when someone answered first."""
        ...

    def pending_gates(self, session_id: str | None = None) -> list[GateInfo]: ...

    def rate_usage(self, session_id: str | None = None) -> list[RateInfo]: ...

    def models(self) -> Mapping[str, Any]: ...

    def subscribe(self, session_id: str | None = None, names: Iterable[str] | None = None,
                  maxsize: int | None = None) -> Subscription: ...
