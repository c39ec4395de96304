"""The check every tool call passes between argument validation and execution.

Order: rate limit (a refused call does not use a slot and opens no gate), then the policy decision
(allow / ask / deny), then for "ask" the broker, which waits for exactly one resolution. Nothing
bypasses this: `@model` turns and delegated calls run under the caller's session and come here too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Protocol

from aiops.engine import events as ev
from aiops.engine.tools import Classification, Tool, ToolContext
from aiops.engine.types import Message
from aiops.gates.broker import (
    Gate,
    GateBroker,
    Grant,
    Resolution,
    denial_message,
    summarize,
)
from aiops.gates.limits import LimitsConfig, RateLimiter
from aiops.gates.redact import mask_sql_secrets
from aiops.gates.rules import GatesConfig

if TYPE_CHECKING:
    from aiops.engine.bus import EventBus
    from aiops.engine.store import Store


class GateHost(Protocol):
    """What the gatekeeper needs of the engine: where events go, where gates are recorded."""

    @property
    def bus(self) -> EventBus: ...

    @property
    def store(self) -> Store: ...

    async def record(self, session_id: str, msg: Message, *, publish: bool = False) -> Message: ...

    def notice(self, session_id: str | None, text: str, turn_id: str | None = None, *,
               persist: bool = True) -> None: ...

    def live_state_changed(self, session_id: str | None) -> None:
        """A session's state may have changed (a gate makes it "waiting"): announce it."""
        ...


@dataclass(slots=True)
class GateOutcome:
    allowed: bool
    message: str = ""  # for the model when not allowed
    decision: str = "allow"  # allow | approved | denied | timeout | cancelled | rate_limited | policy


# Who closed what a deleted session left: its grants (audited) and its open gates.
SESSION_DELETED = "session deleted"


class Gatekeeper:
    def __init__(self, engine: GateHost, rules: GatesConfig, limits: LimitsConfig) -> None:
        self.engine = engine
        self.rules = rules
        self.limits = limits
        self.limiter = RateLimiter(limits, on_change=self._rate_changed)
        self.broker = GateBroker(publish=self._publish, record=self._record)

    def _rate_changed(self, session_id: str) -> None:
        usage = tuple(self.limiter.usage(session_id))
        self.engine.bus.publish(ev.RateChanged(session_id=session_id, usage=usage))

    def _publish(self, name: str, data: dict[str, Any]) -> None:
        """The broker's event hook: a gate opened ("gate") or resolved ("gate_resolved")."""
        session_id = data.get("session_id")
        gate = self.broker.get(data["id"])
        turn_id = gate.turn_id if gate is not None else None
        info = ev.GateInfo.from_dict(data)
        opened = name == ev.GATE
        self.engine.bus.publish(ev.GateOpened(session_id=session_id, turn_id=turn_id, gate=info) if opened
                                else ev.GateResolved(session_id=session_id, turn_id=turn_id, gate=info))
        # "Waiting for approval" is no event of its own: each view derives it from GateOpened and
        # GateResolved (the API stream writes its notice line from the gate, for its clients).
        self.engine.live_state_changed(session_id)

    async def _record(self, what: str, gate: Gate, resolution: Resolution | None) -> None:
        """The broker's audit hook: "opened", "resolved", or "granted" (passed by a session grant)."""
        gd = gate.to_dict()
        gd["turn_id"] = gate.turn_id
        res = resolution.to_dict() if resolution is not None else {}
        data: dict[str, Any] = {"gate": gd, "resolution": res}
        if gate.grant is not None:
            data["grant"] = gate.grant.to_dict()
        await self.engine.store.add_audit(
            f"gate_{what}", session_id=gd.get("session_id"), gate_id=gd.get("id"), tool=gd.get("tool"),
            operation=gd.get("operation"), decision=res.get("decision"), scope=res.get("scope"),
            actor=res.get("by"), data=data,
        )
        if what == "resolved":
            text = f"{res.get('decision')}: {gd.get('summary')}"
        elif what == "granted":
            text = f"approved (session grant): {gd.get('summary')}"
        else:
            return
        meta = {**gd, **res}
        if gate.grant is not None:
            meta["grant_id"] = gate.grant.id
        await self.engine.record(gd["session_id"], Message(
            "gate", text, turn_id=gd.get("turn_id"), meta=meta), publish=False)

    async def revoke_grant(self, grant_id: str, *, by: str, session_id: str | None = None) -> Grant | None:
        """Revoke one session grant and audit who did; None when there is no such grant."""
        grant = self.broker.get_grant(grant_id)
        if grant is None or not self.broker.revoke_grant(grant_id):
            return None
        await self.engine.store.add_audit(
            "grant_revoked", session_id=grant.session_id, gate_id=grant.gate_id, tool=grant.tool,
            operation=grant.operation, actor=by,
            data={"grant": grant.to_dict(), "revoked_from_session": session_id})
        return grant

    async def forget_session(self, session_id: str) -> None:
        """A deleted session's approvals and rate-limit state go with it: a later session of the
        same id (another caller's, perhaps) starts with none. Each revoked grant is audited."""
        self.limiter.forget(session_id)
        for grant in self.broker.revoke_session_grants(session_id):
            await self.engine.store.add_audit(
                "grant_revoked", session_id=session_id, gate_id=grant.gate_id, tool=grant.tool,
                operation=grant.operation, actor=SESSION_DELETED,
                data={"grant": grant.to_dict(), "revoked_from_session": session_id})

    @staticmethod
    def _grantable(tool: Tool, cls: Classification) -> bool:
        # A db call whose tables do not describe it (none named, or it acts beyond them) could be
        # anything; a session approval of one must never cover another.
        if tool.tool_type == "db" and (cls.unknown_tables or not cls.tables):
            return False
        return cls.grantable

    async def check(self, tool: Tool, args: dict[str, Any], cls: Classification,
                    ctx: ToolContext) -> GateOutcome:
        refusal = self.limiter.check(ctx.session_id, tool.tool_type)
        if refusal:
            return GateOutcome(False, refusal, "rate_limited")
        # An MCP tool's model-facing name (`SERVER__TOOL`, maybe cut) is not what rules name: they
        # say `mcp:SERVER:TOOL`, which the tool carries as its gate target.
        target = str(tool.meta.get("gate_target") or tool.name)
        decision = self.rules.decide(target, tool.tool_type, cls.operation, cls.tables,
                                     unknown_tables=cls.unknown_tables, reads_tables=cls.reads_tables)
        if decision == "allow":
            return GateOutcome(True)
        # What operators read and the audit log keeps: credentials in the SQL masked. The call
        # itself runs with its own arguments, never with these.
        args = _masked(args)
        summary = mask_sql_secrets(cls.summary or summarize(tool.name, cls.operation, list(cls.tables), args))
        if ctx.via:
            summary += f" (via {ctx.via})"
        if decision == "deny":
            msg = (f"The gate policy denies {tool.name} {cls.operation}"
                   f"{' on ' + ', '.join(cls.tables) if cls.tables else ''}. Do not retry this call; "
                   f"tell the user it is not allowed by the operator's policy.")
            await self.engine.store.add_audit(
                "policy_denied", session_id=ctx.session_id, tool=tool.name, operation=cls.operation,
                decision="denied", actor="policy",
                data={"args": args, "tables": list(cls.tables), "rule_target": target})
            await self.engine.record(ctx.session_id, Message(
                "gate", f"denied by policy: {summary}", turn_id=ctx.turn_id,
                meta={"tool": tool.name, "rule_target": target, "operation": cls.operation, "tables": list(cls.tables),
                      "decision": "denied", "by": "policy", "summary": summary, "at": time.time()},
            ), publish=False)
            return GateOutcome(False, msg, "policy")
        resolution = await self.broker.request(
            session_id=ctx.session_id, client_id=ctx.session_id, client_kind=ctx.client_kind,
            tool=tool.name, tool_type=tool.tool_type, args=args, operation=cls.operation,
            tables=list(cls.tables), summary=summary, turn_id=ctx.turn_id,
            wait_seconds=self.rules.wait_seconds(ctx.client_kind), grantable=self._grantable(tool, cls),
            kinds=cls.kinds, rule_target=target, call_id=ctx.call_id,
        )
        if resolution.decision == "approved":
            return GateOutcome(True, decision="approved")
        what = SimpleNamespace(tool=tool.name, operation=cls.operation,
                               tables=list(cls.tables) if tool.tool_type == "db" else [])
        return GateOutcome(False, denial_message(what, resolution), resolution.decision)  # type: ignore[arg-type]


def _masked(value: Any) -> Any:
    """`value` with credentials masked in every string it holds (SQL in any argument)."""
    if isinstance(value, str):
        return mask_sql_secrets(value)
    if isinstance(value, dict):
        return {k: _masked(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_masked(v) for v in value]
    return value
