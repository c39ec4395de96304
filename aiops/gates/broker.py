"""The gate broker: every pending approval from every client, and exactly one answer per gate.

The broker holds no I/O of its own. The engine injects `publish(event, data)` (the event bus) and
`record(kind, gate, resolution)` (the audit log); the broker guarantees the order a reader of
either sees: "opened" is recorded before the `gate` event goes out, and every gate that was
announced gets exactly one `gate_resolved` event and one "resolved" record.

The broker trusts its caller: whoever calls `resolve` has already been checked for the operator
role (the API, console and MCP surfaces know their users; the broker does not).

Session grants ("approve for this session") live in memory only. Losing them on restart is the safe
direction: the operator is simply asked again. A call that passes by a grant is still recorded
("granted", naming the grant), so the audit log shows every call a gate let through.

A grant covers the same tool, operation, tables and kinds of statement: approving `INSERT INTO t`
for the session lets later INSERTs into t through, never a `DELETE FROM t` or a `DROP TABLE t`.
The gate object's `session_grant` says in words what a "session" answer would let through (None:
it would approve this call only).

Only calls fully described by their tool, operation and tables may create or use a grant. A SQL
statement that names no table, or acts beyond its tables (a file, a variable, a routine, the
server), is not `grantable`: approving `SET @x = 1` for the session must not let `RENAME TABLE`
through, nor approving `UPDATE t` let `SELECT ... FROM t INTO OUTFILE` through. A "session" answer
on such a gate is recorded as scope "once".
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

log = logging.getLogger(__name__)

Operation = Literal["read", "write"]
ResolutionDecision = Literal["approved", "denied", "timeout", "cancelled"]
Scope = Literal["once", "session"]

Publish = Callable[[str, dict[str, Any]], None]
Record = Callable[[str, "Gate", "Resolution | None"], Awaitable[None]]

_DECISION_ALIASES: dict[str, ResolutionDecision] = {
    "approve": "approved",
    "approved": "approved",
    "deny": "denied",
    "denied": "denied",
}
# Resolved gates stay readable through `get` (and answer GateAlreadyResolved) for this many gates.
_RESOLVED_MEMORY = 1024
_SUMMARY_ARGS_CHARS = 120


class GateError(Exception):
    pass


class GateNotFound(GateError, KeyError):
    def __str__(self) -> str:
        return f"no pending gate {self.args[0]!r}" if self.args else "no such gate"


class GateAlreadyResolved(GateError):
    def __init__(self, gate_id: str, resolution: Resolution) -> None:
        super().__init__(gate_id, resolution)
        self.gate_id = gate_id
        self.resolution = resolution

    def __str__(self) -> str:
        r = self.resolution
        return f"gate {self.gate_id} was already resolved: {r.decision} by {r.by}"


@dataclass(slots=True)
class Resolution:
    decision: ResolutionDecision
    scope: Scope
    by: str
    at: float

    @property
    def approved(self) -> bool:
        return self.decision == "approved"

    def to_dict(self) -> dict[str, Any]:
        return {"decision": self.decision, "scope": self.scope, "by": self.by, "at": self.at}


@dataclass(slots=True)
class Gate:
    id: str
    session_id: str
    client_id: str
    client_kind: str
    tool: str
    tool_type: str
    args: dict[str, Any]
    operation: Operation
    tables: list[str]
    summary: str
    created_at: float
    expires_at: float | None
    # Internal bookkeeping, not part of the wire shape.
    turn_id: str | None = None
    resolution: Resolution | None = None
    # Whether a "session" approval may cover later calls (see the module docstring).
    grantable: bool = True
    # Set when the call passed by a session grant instead of asking (never announced).
    grant: Grant | None = None
    # The statement kinds of a db call ("insert", "delete"); part of what a grant covers.
    kinds: tuple[str, ...] = ()
    # What gates.toml rules call the tool, when not its own name: an MCP tool the model calls
    # `time__get_current_time` is `mcp:time:get_current_time` there.
    rule_target: str | None = None
    # The model's call it holds (its `tool_call` event's id); None for a gate of no call of the
    # turn's (an MCP server's question).
    call_id: str | None = None

    @property
    def target(self) -> str:
        """The tool as gates.toml names it (`rule_target` in the wire shape)."""
        return self.rule_target or self.tool

    @property
    def session_grant(self) -> str | None:
        """What approving for the session lets through from then on, or None (this call only)."""
        if not self.grantable:
            return None
        return grant_scope(self.target, self.operation, self.tables, self.kinds) + " pass without asking"

    def to_dict(self) -> dict[str, Any]:
        """The gate object as docs/API.md ("Gates") documents it, `session_grant` included."""
        return {
            "id": self.id,
            "session_id": self.session_id,
            "client_id": self.client_id,
            "client_kind": self.client_kind,
            "tool": self.tool,
            "rule_target": self.target,
            "tool_type": self.tool_type,
            "args": self.args,
            "operation": self.operation,
            "tables": list(self.tables),
            "summary": self.summary,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "session_grant": self.session_grant,
            "call_id": self.call_id,
        }

    def resolved_dict(self) -> dict[str, Any]:
        """The gate object plus its resolution keys (the `gate_resolved` event payload)."""
        if self.resolution is None:
            raise ValueError(f"gate {self.id} is not resolved")
        return {**self.to_dict(), **self.resolution.to_dict()}


@dataclass(slots=True)
class Grant:
    """A scope-"session" approval: the same tool, operation and tables pass without asking."""

    id: str
    session_id: str
    tool: str  # as gates.toml names it (the gate's `target`): what the operator was shown
    operation: Operation
    tables: frozenset[str]
    gate_id: str
    by: str
    created_at: float
    kinds: frozenset[str] = frozenset()

    def covers(self, gate: Gate) -> bool:
        """Whether this grant lets `gate`'s call through: same session, tool, operation, exactly
        the same tables and exactly the same statement kinds."""
        # By the rule's name, not the model's: that is what the operator approved, and two MCP
        # tools can be called alike over time (one server's tools withdrawn, another's in).
        return (gate.grantable and self.session_id == gate.session_id and self.tool == gate.target
                and self.operation == gate.operation and self.tables == _table_key(gate.tables)
                and self.kinds == frozenset(gate.kinds))

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "session_id": self.session_id, "tool": self.tool,
                "operation": self.operation, "tables": sorted(self.tables), "kinds": sorted(self.kinds),
                "gate_id": self.gate_id, "by": self.by, "created_at": self.created_at}


@dataclass(slots=True)
class _Entry:
    gate: Gate
    future: asyncio.Future[Resolution]
    # Announced (`gate` published): only then may operators see and answer it.
    visible: bool = False


def _new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:12]}"


def _table_key(tables: Iterable[str]) -> frozenset[str]:
    return frozenset(t.lower() for t in tables)


class GateBroker:
    def __init__(
        self,
        publish: Publish,
        record: Record | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._publish = publish
        self._record = record
        self._clock = clock
        self._pending: dict[str, _Entry] = {}
        self._resolved: OrderedDict[str, Gate] = OrderedDict()
        self._grants: dict[str, Grant] = {}
        # Audit writes started from a cancelled request; kept referenced until they finish.
        self._background: set[asyncio.Task[None]] = set()

    # ---- asking -----------------------------------------------------------------------------------

    async def request(
        self,
        session_id: str,
        client_id: str,
        client_kind: str,
        tool: str,
        tool_type: str,
        args: Mapping[str, Any],
        operation: Operation,
        tables: Sequence[str],
        summary: str,
        turn_id: str | None,
        wait_seconds: float | None,
        grantable: bool = True,
        kinds: Sequence[str] = (),
        rule_target: str | None = None,
        call_id: str | None = None,
    ) -> Resolution:
        """Ask an operator; return the one resolution (approved, denied, timeout or cancelled).

        A call matching a session grant is approved without asking (and recorded as "granted");
        a call that is not `grantable` neither uses nor creates a grant.
        If the calling task is cancelled while waiting, the gate is resolved "cancelled" and the
        CancelledError propagates. `rule_target`: what gates.toml calls the tool when that is not
        `tool` (an MCP tool's `mcp:SERVER:TOOL`); operators see it in the gate object. `call_id`:
        the model's call the gate holds (the id its `tool_call` event carries).
        """
        # Only db calls have tables; ignoring them elsewhere keeps grants and gates consistent.
        gate_tables = list(tables) if tool_type == "db" else []
        now = self._clock()
        timeout = wait_seconds if wait_seconds and wait_seconds > 0 else None
        gate = Gate(
            id=_new_id("g"), session_id=session_id, client_id=client_id, client_kind=client_kind,
            tool=tool, tool_type=tool_type, args=dict(args), operation=operation,
            tables=gate_tables, summary=summary, created_at=now,
            expires_at=now + timeout if timeout is not None else None, turn_id=turn_id,
            grantable=grantable, kinds=tuple(sorted(set(kinds))),
            rule_target=rule_target if rule_target and rule_target != tool else None,
            call_id=call_id,
        )
        grant = self._matching_grant(gate) if grantable else None
        if grant is not None:
            # Never announced: nobody is asked. Recorded all the same, naming the grant.
            gate.expires_at = None
            gate.grant = grant
            gate.resolution = Resolution("approved", "session", "session-grant", now)
            if self._record is not None:
                await self._record("granted", gate, gate.resolution)
            return gate.resolution

        entry = _Entry(gate, asyncio.get_running_loop().create_future())
        # Registered before the audit write so a stop arriving meanwhile still cancels it.
        self._pending[gate.id] = entry
        opened_recorded = False
        try:
            if self._record is not None:
                await self._record("opened", gate, None)
            opened_recorded = True
            if not entry.future.done() and (late := self._matching_grant(gate)) is not None:
                # Granted while its opening was being recorded: an operator approved a twin of
                # this call for the session meanwhile. Never announced, nobody is asked.
                gate.grant = late
                self._settle(entry, Resolution("approved", "session", "session-grant", self._clock()))
            if not entry.future.done():
                entry.visible = True
                self._emit("gate", gate.to_dict())
            if not entry.future.done():
                # asyncio.wait never cancels the future, so a timeout and an operator's answer
                # race only through _settle, which lets exactly one win.
                await asyncio.wait({entry.future}, timeout=timeout)
            if not entry.future.done():
                self._settle(entry, Resolution("timeout", "once", "timeout", self._clock()))
            resolution = entry.future.result()
        except BaseException as exc:
            # Whatever interrupts the wait (cancellation, a failing audit write), the gate ends
            # resolved, never left pending in an inbox.
            if not entry.future.done():
                by = "interrupted" if isinstance(exc, asyncio.CancelledError) else "error"
                self._settle(entry, Resolution("cancelled", "once", by, self._clock()))
            if opened_recorded:
                self._record_later(gate, entry.future.result())
            raise
        if self._record is not None:
            await self._record("resolved", gate, resolution)
        return resolution

    # ---- answering --------------------------------------------------------------------------------

    def resolve(self, gate_id: str, decision: str, scope: str = "once", *, by: str) -> Resolution:
        """Answer a pending gate. The first answer wins; later ones raise GateAlreadyResolved.

        A denial is always scope "once" (there are no session-wide denials); an approval with
        scope "session" also lets the same tool, operation and tables through for the session,
        unless the gate is not grantable, in which case the approval is scope "once". Gates of
        the session already waiting that the new grant covers are approved by it at once (two
        parallel calls asked twice; the operator who approved the first for the session must not
        have to answer the second).
        """
        normalized = _DECISION_ALIASES.get(decision)
        if normalized is None:
            raise ValueError(f"decision must be approve(d) or deny/denied, not {decision!r}")
        if scope not in ("once", "session"):
            raise ValueError(f"scope must be 'once' or 'session', not {scope!r}")
        entry = self._pending.get(gate_id)
        if entry is None or not entry.visible:
            done = self._resolved.get(gate_id)
            if done is not None and done.resolution is not None:
                raise GateAlreadyResolved(gate_id, done.resolution)
            raise GateNotFound(gate_id)
        final_scope: Scope = ("session" if scope == "session" and normalized == "approved"
                              and entry.gate.grantable else "once")
        resolution = Resolution(normalized, final_scope, by, self._clock())
        self._settle(entry, resolution)
        if final_scope == "session":
            grant = self._add_grant(entry.gate, by)
            covered = [e for e in self._pending.values() if e.visible and grant.covers(e.gate)]
            for other in covered:
                other.gate.grant = grant
                self._settle(other, Resolution("approved", "session", "session-grant", resolution.at))
        return resolution

    def cancel_turn(self, turn_id: str, by: str = "stop") -> int:
        """Cancel every pending gate of a turn; returns how many."""
        return self._cancel_where(lambda g: g.turn_id == turn_id, by)

    def cancel_session(self, session_id: str, by: str = "stop") -> int:
        """Cancel every pending gate of a session; returns how many. Grants are kept."""
        return self._cancel_where(lambda g: g.session_id == session_id, by)

    def _cancel_where(self, pred: Callable[[Gate], bool], by: str) -> int:
        entries = [e for e in self._pending.values() if pred(e.gate)]
        at = self._clock()
        return sum(self._settle(e, Resolution("cancelled", "once", by, at)) for e in entries)

    def _settle(self, entry: _Entry, resolution: Resolution) -> bool:
        """The single place a gate is resolved; synchronous, so there is nothing to race."""
        if entry.future.done():
            return False
        gate = entry.gate
        gate.resolution = resolution
        entry.future.set_result(resolution)
        self._pending.pop(gate.id, None)
        self._resolved[gate.id] = gate
        while len(self._resolved) > _RESOLVED_MEMORY:
            self._resolved.popitem(last=False)
        if entry.visible:
            self._emit("gate_resolved", gate.resolved_dict())
        return True

    # ---- reading ----------------------------------------------------------------------------------

    def pending(self, session_id: str | None = None) -> list[Gate]:
        """Announced, unanswered gates, oldest first."""
        gates = [e.gate for e in self._pending.values()
                 if e.visible and (session_id is None or e.gate.session_id == session_id)]
        return sorted(gates, key=lambda g: g.created_at)

    def get(self, gate_id: str) -> Gate | None:
        """A pending gate, or a recently resolved one (with `.resolution` set)."""
        entry = self._pending.get(gate_id)
        if entry is not None:
            return entry.gate if entry.visible else None
        return self._resolved.get(gate_id)

    # ---- grants -----------------------------------------------------------------------------------

    def _matching_grant(self, gate: Gate) -> Grant | None:
        if not gate.grantable:
            return None
        return next((grant for grant in self._grants.values() if grant.covers(gate)), None)

    def _add_grant(self, gate: Gate, by: str) -> Grant:
        if not gate.grantable:
            raise ValueError(f"gate {gate.id} is not grantable")
        existing = self._matching_grant(gate)
        if existing is not None:
            return existing
        key = _table_key(gate.tables)
        grant = Grant(id=_new_id("gr"), session_id=gate.session_id, tool=gate.target,
                      operation=gate.operation, tables=key, gate_id=gate.id, by=by,
                      created_at=self._clock(), kinds=frozenset(gate.kinds))
        self._grants[grant.id] = grant
        return grant

    def grants(self, session_id: str | None = None) -> list[Grant]:
        return [g for g in self._grants.values() if session_id is None or g.session_id == session_id]

    def get_grant(self, grant_id: str) -> Grant | None:
        return self._grants.get(grant_id)

    def revoke_grant(self, grant_id: str) -> bool:
        """Forget one grant. The broker records nothing here: revocation is audited by its caller
        (the Gatekeeper), which knows who revoked it."""
        return self._grants.pop(grant_id, None) is not None

    def revoke_session_grants(self, session_id: str) -> list[Grant]:
        """Forget every grant of a session; returns them (for the caller's audit record)."""
        gone = [g for g in self._grants.values() if g.session_id == session_id]
        for grant in gone:
            del self._grants[grant.id]
        return gone

    # ---- plumbing ---------------------------------------------------------------------------------

    def _emit(self, event: str, data: dict[str, Any]) -> None:
        # A broken subscriber must not leave a gate half-resolved.
        try:
            self._publish(event, data)
        except Exception:
            log.exception("publishing %s failed", event)

    def _record_later(self, gate: Gate, resolution: Resolution) -> None:
        if self._record is None:
            return
        try:
            task = asyncio.get_running_loop().create_task(self._record_safely(gate, resolution))
        except RuntimeError:
            log.error("no running loop to record resolution of gate %s", gate.id)
            return
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _record_safely(self, gate: Gate, resolution: Resolution) -> None:
        assert self._record is not None
        try:
            await self._record("resolved", gate, resolution)
        except Exception:
            log.exception("recording resolution of gate %s failed", gate.id)

    async def drain(self) -> None:
        """Wait for audit writes started by cancelled requests (call before closing the store)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)


# ---- texts ----------------------------------------------------------------------------------------


class GateLike(Protocol):
    """What the texts need; a Gate, or anything describing a call that never became one."""

    @property
    def tool(self) -> str: ...
    @property
    def operation(self) -> str: ...
    @property
    def tables(self) -> Sequence[str]: ...


def _args_text(args: Mapping[str, Any]) -> str:
    if not args:
        return ""
    for key in ("query", "sql", "statement", "q", "command"):
        value = args.get(key)
        if isinstance(value, str) and value.strip():
            return value
    if len(args) == 1:
        (value,) = args.values()
        if isinstance(value, str):
            return value
    try:
        return json.dumps(dict(args), ensure_ascii=False, default=str, separators=(", ", ": "))
    except (TypeError, ValueError):
        return repr(dict(args))


def grant_scope(tool: str, operation: str, tables: Sequence[str], kinds: Sequence[str] = ()) -> str:
    """The calls a session grant covers, in words: "later db_query calls of this session that run
    only INSERT on exactly shop.orders", "later ddgs_search read calls of this session"."""
    on = f" on exactly {', '.join(tables)}" if tables else ""
    if kinds:
        what = " + ".join(k.upper() for k in sorted(kinds))
        return f"later {tool} calls of this session that run only {what}{on or ' on no table'}"
    return f"later {tool} {operation} calls of this session{on}"


def _head(tool: str, operation: str, tables: Sequence[str]) -> str:
    head = f"{tool} {operation}"
    if tables:
        head += f" on {', '.join(tables)}"
    return head


def summarize(tool: str, operation: str, tables: Sequence[str], args: Mapping[str, Any]) -> str:
    """One line for inboxes and notices: "db_query write on users: DELETE FROM users WHERE id=3"."""
    text = " ".join(_args_text(args).split())
    if len(text) > _SUMMARY_ARGS_CHARS:
        text = text[: _SUMMARY_ARGS_CHARS - 1].rstrip() + "…"
    head = _head(tool, operation, tables)
    return f"{head}: {text}" if text else head


def summary_detail(summary: str, tool: str, operation: str, tables: Sequence[str],
                   target: str | None = None) -> str:
    """What a gate's summary says beyond its tool, operation and tables, for views that show those
    apart (the console's inbox). A tool's own summary may say more before its ": " than the
    generic head does ("update_system_prompt overwrite section 'x': …"): only the tool's name goes
    (or its rule `target`, which an MCP tool's summary starts with: "mcp:time:get_current_time {…}")."""
    head = _head(tool, operation, tables)
    if summary == head:
        return ""  # a call without arguments: the head says it all
    if summary.startswith(head + ": "):
        return summary[len(head) + 2:]
    if target and target != tool and summary.startswith(target + " "):
        return summary[len(target) + 1:]
    return summary.removeprefix(tool + " ")


class NamedGate(GateLike, Protocol):
    @property
    def target(self) -> str: ...


def waiting_notice(gate: NamedGate) -> str:
    """Said to whoever waits (the chat, the API stream, a chat client): the tool as the operator's
    inbox and gates.toml name it."""
    return f"waiting for operator approval: {_head(gate.target, gate.operation, gate.tables)}"


def denial_message(gate: GateLike, resolution: Resolution) -> str:
    """The tool result the model reads when a gate did not approve the call."""
    what = f"the {_head(gate.tool, gate.operation, gate.tables)} call"
    if resolution.decision == "approved":
        raise ValueError("denial_message called for an approved gate")
    if resolution.decision == "denied":
        reason = f"The operator did not allow {what}; it was not run."
    elif resolution.decision == "timeout":
        reason = f"No operator answered the approval request for {what} in time; it was not run."
    else:
        reason = f"The approval request for {what} was cancelled; it was not run."
    return reason + " Do not retry it. Explain to the user that this action was not approved."
