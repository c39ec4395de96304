"""The gate broker: one answer per gate, whoever answers first, under concurrency."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from aiops.gates.broker import (
    Gate,
    GateAlreadyResolved,
    GateBroker,
    GateNotFound,
    Resolution,
    denial_message,
    summarize,
    summary_detail,
    waiting_notice,
)

GATE_KEYS = {"id", "session_id", "client_id", "client_kind", "tool", "rule_target", "tool_type", "args",
             "operation", "tables", "summary", "created_at", "expires_at", "session_grant", "call_id"}
RESOLUTION_KEYS = {"decision", "scope", "by", "at"}


class Bus:
    """The injected publish(): keeps every event and lets a test await a condition on them."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._changed = asyncio.Event()

    def __call__(self, name: str, data: dict[str, Any]) -> None:
        self.events.append((name, data))
        self._changed.set()

    def named(self, name: str) -> list[dict[str, Any]]:
        return [d for n, d in self.events if n == name]

    async def until(self, pred: Callable[[], bool]) -> None:
        while not pred():
            self._changed.clear()
            await self._changed.wait()


class Audit:
    """The injected record(): an in-memory audit log."""

    def __init__(self, bus: Bus | None = None) -> None:
        self.rows: list[tuple[str, str, Resolution | None]] = []
        self.gates: dict[str, Gate] = {}
        self.bus = bus
        self.announced_before_opened: list[str] = []

    async def __call__(self, kind: str, gate: Gate, resolution: Resolution | None) -> None:
        if kind == "opened" and self.bus is not None:
            if any(d["id"] == gate.id for d in self.bus.named("gate")):
                self.announced_before_opened.append(gate.id)
        self.rows.append((kind, gate.id, resolution))
        self.gates[gate.id] = gate

    def kinds(self, gate_id: str) -> list[str]:
        return [k for k, gid, _ in self.rows if gid == gate_id]


@pytest.fixture
def bus() -> Bus:
    return Bus()


@pytest.fixture
def audit(bus: Bus) -> Audit:
    return Audit(bus)


@pytest.fixture
def broker(bus: Bus, audit: Audit) -> GateBroker:
    return GateBroker(bus, audit)


def ask(
    broker: GateBroker,
    session: str = "s1",
    *,
    tool: str = "db_query",
    tool_type: str = "db",
    operation: str = "write",
    tables: Sequence[str] = ("users",),
    turn: str | None = "t1",
    wait: float | None = None,
    args: dict[str, Any] | None = None,
    grantable: bool = True,
    kinds: Sequence[str] = (),
    rule_target: str | None = None,
) -> asyncio.Task[Resolution]:
    args = args if args is not None else {"query": "DELETE FROM users WHERE id=3"}
    return asyncio.create_task(broker.request(
        session, session, "api", tool, tool_type, args, operation, list(tables),  # type: ignore[arg-type]
        summarize(tool, operation, tables, args), turn, wait, grantable=grantable, kinds=kinds,
        rule_target=rule_target,
    ))


async def opened(bus: Bus, n: int) -> list[dict[str, Any]]:
    await bus.until(lambda: len(bus.named("gate")) >= n)
    return bus.named("gate")


async def test_gate_opens_publishes_and_resolves_once(broker: GateBroker, bus: Bus, audit: Audit) -> None:
    task = ask(broker)
    (event,) = await opened(bus, 1)
    assert set(event) == GATE_KEYS
    assert event["rule_target"] == "db_query"  # a tool the rules name by its own name
    assert event["tables"] == ["users"]
    assert event["expires_at"] is None
    assert event["summary"] == "db_query write on users: DELETE FROM users WHERE id=3"
    assert [g.id for g in broker.pending()] == [event["id"]]
    assert broker.get(event["id"]) is not None

    res = broker.resolve(event["id"], "approve", by="alice")
    assert await task == res
    assert (res.decision, res.scope, res.by) == ("approved", "once", "alice")

    (resolved,) = bus.named("gate_resolved")
    assert set(resolved) == GATE_KEYS | RESOLUTION_KEYS
    assert resolved["decision"] == "approved" and resolved["id"] == event["id"]
    assert broker.pending() == []
    assert audit.kinds(event["id"]) == ["opened", "resolved"]
    assert audit.announced_before_opened == []
    gate = broker.get(event["id"])
    assert gate is not None and gate.resolution == res


async def test_hundred_gates_answered_concurrently_each_resolved_exactly_once(
    broker: GateBroker, bus: Bus, audit: Audit
) -> None:
    tasks = [ask(broker, f"s{i % 10}", turn=f"turn{i}", args={"query": f"DELETE FROM users WHERE id={i}"})
             for i in range(100)]
    events = await opened(bus, 100)
    assert {len(broker.pending(f"s{k}")) for k in range(10)} == {10}

    go = asyncio.Event()

    async def answer(gate_id: str, decision: str, by: str) -> Resolution | GateAlreadyResolved:
        await go.wait()
        try:
            return broker.resolve(gate_id, decision, by=by)
        except GateAlreadyResolved as e:
            return e

    answers: list[tuple[str, list[asyncio.Task[Resolution | GateAlreadyResolved]]]] = []
    for i, ev in enumerate(events):
        racers = [("approve", f"op{i % 3}")]
        if i % 4 == 0:  # a second operator answers the same gate at the same moment
            racers.append(("deny", f"op{(i + 1) % 3 + 3}"))
        answers.append((ev["id"], [asyncio.create_task(answer(ev["id"], d, b)) for d, b in racers]))
    go.set()
    results = await asyncio.gather(*tasks)
    by_gate = {ev["id"]: r for ev, r in zip(events, results, strict=True)}

    raced = 0
    for gate_id, answer_tasks in answers:
        outcomes = [await t for t in answer_tasks]
        winners = [o for o in outcomes if isinstance(o, Resolution)]
        losers = [o for o in outcomes if isinstance(o, GateAlreadyResolved)]
        assert len(winners) == 1 and len(losers) == len(outcomes) - 1
        assert by_gate[gate_id] == winners[0]
        for loser in losers:
            raced += 1
            assert loser.resolution == winners[0]

    assert raced == 25
    resolved_ids = [d["id"] for d in bus.named("gate_resolved")]
    assert len(resolved_ids) == 100 and set(resolved_ids) == set(by_gate)
    assert all(audit.kinds(gid) == ["opened", "resolved"] for gid in by_gate)
    assert broker.pending() == []


async def test_timeout_resolves_as_timeout(broker: GateBroker, bus: Bus, audit: Audit) -> None:
    res = await ask(broker, wait=0.05)
    assert (res.decision, res.scope, res.by) == ("timeout", "once", "timeout")
    (event,) = bus.named("gate")
    assert event["expires_at"] == pytest.approx(event["created_at"] + 0.05)
    (resolved,) = bus.named("gate_resolved")
    assert resolved["decision"] == "timeout"
    assert audit.kinds(event["id"]) == ["opened", "resolved"]
    with pytest.raises(GateAlreadyResolved):
        broker.resolve(event["id"], "approve", by="late-operator")


async def test_answer_before_timeout_wins(broker: GateBroker, bus: Bus) -> None:
    task = ask(broker, wait=30)
    (event,) = await opened(bus, 1)
    broker.resolve(event["id"], "deny", by="alice")
    res = await task
    assert res.decision == "denied"
    assert len(bus.named("gate_resolved")) == 1


async def test_cancel_turn_and_cancel_session(broker: GateBroker, bus: Bus) -> None:
    a = ask(broker, "s1", turn="t1")
    b = ask(broker, "s1", turn="t1", tables=("orders",))
    c = ask(broker, "s1", turn="t2")
    d = ask(broker, "s2", turn="t3")
    await opened(bus, 4)

    assert broker.cancel_turn("t1") == 2
    assert [(await a).decision, (await b).decision] == ["cancelled", "cancelled"]
    assert {g.session_id for g in broker.pending()} == {"s1", "s2"}
    assert broker.cancel_turn("t1") == 0

    assert broker.cancel_session("s1") == 1
    assert (await c).decision == "cancelled"
    assert not d.done()
    assert [g.session_id for g in broker.pending()] == ["s2"]

    broker.resolve(broker.pending()[0].id, "approved", by="bob")
    assert (await d).decision == "approved"
    assert [r["decision"] for r in bus.named("gate_resolved")] == ["cancelled"] * 3 + ["approved"]


async def test_cancelled_task_resolves_gate_as_cancelled(broker: GateBroker, bus: Bus, audit: Audit) -> None:
    task = ask(broker)
    (event,) = await opened(bus, 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert broker.pending() == []
    (resolved,) = bus.named("gate_resolved")
    assert resolved["decision"] == "cancelled" and resolved["id"] == event["id"]
    await broker.drain()
    assert audit.kinds(event["id"]) == ["opened", "resolved"]
    with pytest.raises(GateAlreadyResolved):
        broker.resolve(event["id"], "approve", by="alice")


async def test_stop_while_opening_is_never_announced(bus: Bus) -> None:
    release = asyncio.Event()
    entered = asyncio.Event()
    rows: list[str] = []

    async def slow_record(kind: str, gate: Gate, resolution: Resolution | None) -> None:
        if kind == "opened":
            entered.set()
            await release.wait()
        rows.append(kind)

    broker = GateBroker(bus, slow_record)
    task = ask(broker, turn="t1")
    await entered.wait()
    # Not visible to operators before it is durable...
    assert broker.pending() == []
    # ...but a stop still reaches it.
    assert broker.cancel_turn("t1") == 1
    release.set()
    assert (await task).decision == "cancelled"
    assert bus.events == []
    assert rows == ["opened", "resolved"]


async def test_failing_audit_write_leaves_no_pending_gate(bus: Bus) -> None:
    async def broken(kind: str, gate: Gate, resolution: Resolution | None) -> None:
        raise OSError("disk full")

    broker = GateBroker(bus, broken)
    with pytest.raises(OSError):
        await ask(broker)
    assert broker.pending() == []
    assert bus.events == []


async def test_session_grant_and_revocation(broker: GateBroker, bus: Bus) -> None:
    first = ask(broker, "s1", tables=("users", "orders"))
    (event,) = await opened(bus, 1)
    res = broker.resolve(event["id"], "approve", "session", by="alice")
    assert (await first) == res and res.scope == "session"
    (grant,) = broker.grants("s1")
    assert (grant.tool, grant.operation, grant.tables) == ("db_query", "write", frozenset({"users", "orders"}))
    assert broker.grants("s2") == []

    # Same session, tool, operation and set of tables (in any order): approved without a gate.
    again = await ask(broker, "s1", tables=("orders", "users"))
    assert (again.decision, again.scope, again.by) == ("approved", "session", "session-grant")
    assert len(bus.named("gate")) == 1

    # Anything else still asks.
    others = [ask(broker, "s1", tables=("users",)), ask(broker, "s1", operation="read",
                                                         tables=("users", "orders")),
              ask(broker, "s2", tables=("users", "orders"))]
    await opened(bus, 4)
    assert broker.cancel_session("s1") == 2 and broker.cancel_session("s2") == 1
    await asyncio.gather(*others)

    assert broker.revoke_grant(grant.id) is True
    assert broker.revoke_grant(grant.id) is False
    asked = ask(broker, "s1", tables=("users", "orders"))
    await opened(bus, 5)
    assert broker.cancel_session("s1") == 1
    assert (await asked).decision == "cancelled"


async def test_a_session_approval_also_answers_the_waiting_gates_it_covers(broker: GateBroker, bus: Bus,
                                                                            audit: Audit) -> None:
    """A model calling the same tool twice in one step opens two gates: approving the first for
    the session answers the second too; gates the grant does not cover keep waiting."""
    first, twin = ask(broker, "s1"), ask(broker, "s1", args={"query": "DELETE FROM users WHERE id=4"})
    other_table, other_session = ask(broker, "s1", tables=("orders",)), ask(broker, "s2")
    events = await opened(bus, 4)
    broker.resolve(events[0]["id"], "approve", "session", by="alice")
    res = await twin
    assert (res.decision, res.scope, res.by) == ("approved", "session", "session-grant")
    assert (await first).by == "alice"
    (grant,) = broker.grants("s1")
    assert audit.gates[events[1]["id"]].grant is grant
    assert [g["id"] for g in bus.named("gate_resolved")] == [events[0]["id"], events[1]["id"]]
    assert [g.id for g in broker.pending()] == [events[2]["id"], events[3]["id"]]
    assert broker.cancel_session("s1") == 1 and broker.cancel_session("s2") == 1
    await asyncio.gather(other_table, other_session)


async def test_a_gate_approved_for_the_session_while_its_twin_is_being_opened_is_not_asked(bus: Bus) -> None:
    """The second call's gate is being recorded (not yet announced) when the operator approves
    the first for the session: it must not then be announced and wait for an answer."""
    audit = Audit(bus)

    async def record(kind: str, gate: Gate, resolution: Resolution | None) -> None:
        if kind == "opened" and bus.named("gate") and gate.id != bus.named("gate")[0]["id"]:
            broker.resolve(bus.named("gate")[0]["id"], "approve", "session", by="alice")
        await audit(kind, gate, resolution)

    broker = GateBroker(bus, record)
    first = ask(broker, "s1")
    await opened(bus, 1)
    twin = await asyncio.wait_for(ask(broker, "s1", args={"query": "DELETE FROM users WHERE id=4"}), 5)
    assert (twin.decision, twin.by) == ("approved", "session-grant")
    assert (await first).by == "alice"
    assert len(bus.named("gate")) == 1 and broker.pending() == []


async def test_a_call_passed_by_a_grant_is_recorded_naming_the_grant(broker: GateBroker, bus: Bus,
                                                                    audit: Audit) -> None:
    first = ask(broker, "s1")
    (event,) = await opened(bus, 1)
    broker.resolve(event["id"], "approve", "session", by="alice")
    await first
    (grant,) = broker.grants("s1")

    again = await ask(broker, "s1", args={"query": "DELETE FROM users WHERE id=4"})
    assert again.decision == "approved"
    assert len(bus.named("gate")) == 1  # nobody was asked
    kind, gate_id, resolution = audit.rows[-1]
    assert kind == "granted" and resolution == again and gate_id != event["id"]
    assert broker.get(gate_id) is None  # never announced, so no gate anyone could answer
    assert [r for r in audit.rows if r[0] == "granted"] == [("granted", gate_id, again)]
    recorded = audit.gates[gate_id]
    assert recorded.grant is grant and recorded.args == {"query": "DELETE FROM users WHERE id=4"}


async def test_a_call_that_is_not_grantable_neither_creates_nor_uses_a_grant(broker: GateBroker,
                                                                             bus: Bus) -> None:
    # "SET @x = 1" names no table: approving it for the session approves it once.
    task = ask(broker, "s1", tables=(), grantable=False, args={"query": "SET @x = 1"})
    (event,) = await opened(bus, 1)
    res = broker.resolve(event["id"], "approve", "session", by="alice")
    assert (res.decision, res.scope) == ("approved", "once")
    assert (await task) == res
    assert bus.named("gate_resolved")[-1]["scope"] == "once"
    assert broker.grants() == []

    # A grant made by a grantable call does not cover a non-grantable one with the same key
    # (`UPDATE users` approved for the session; `SELECT ... FROM users INTO OUTFILE` still asks).
    task = ask(broker, "s1")
    (_, event) = await opened(bus, 2)
    broker.resolve(event["id"], "approve", "session", by="alice")
    await task
    assert len(broker.grants("s1")) == 1
    outfile = ask(broker, "s1", grantable=False, args={"query": "SELECT * FROM users INTO OUTFILE '/x'"})
    (*_, event) = await opened(bus, 3)
    assert broker.resolve(event["id"], "approve", "session", by="alice").scope == "once"
    await outfile
    assert len(broker.grants("s1")) == 1


async def test_denial_with_session_scope_grants_nothing(broker: GateBroker, bus: Bus) -> None:
    task = ask(broker)
    (event,) = await opened(bus, 1)
    res = broker.resolve(event["id"], "denied", "session", by="alice")
    assert (res.decision, res.scope) == ("denied", "once")
    assert (await task) == res
    assert broker.grants() == []


async def test_resolve_errors(broker: GateBroker, bus: Bus) -> None:
    with pytest.raises(GateNotFound):
        broker.resolve("g-nope", "approve", by="alice")
    task = ask(broker)
    (event,) = await opened(bus, 1)
    with pytest.raises(ValueError):
        broker.resolve(event["id"], "maybe", by="alice")
    with pytest.raises(ValueError):
        broker.resolve(event["id"], "approve", "forever", by="alice")
    broker.resolve(event["id"], "approve", by="alice")
    await task
    with pytest.raises(GateAlreadyResolved):
        broker.resolve(event["id"], "deny", by="bob")


async def test_non_db_gate_has_no_tables_and_a_broken_subscriber_breaks_nothing() -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    def publish(name: str, data: dict[str, Any]) -> None:
        seen.append((name, data))
        raise RuntimeError("subscriber broke")

    broker = GateBroker(publish)
    res = await ask(broker, tool="ddgs_search", tool_type="search", tables=(), args={"q": "x"}, wait=0.01)
    assert res.decision == "timeout"
    assert [name for name, _ in seen] == ["gate", "gate_resolved"]
    assert seen[0][1]["tables"] == []
    gate = broker.get(seen[0][1]["id"])
    assert gate is not None and gate.resolution == res


def make_gate(tool: str = "db_query", operation: str = "write", tables: list[str] | None = None) -> Gate:
    tables = ["users"] if tables is None else tables
    return Gate(id="g1", session_id="s1", client_id="s1", client_kind="api", tool=tool, tool_type="db",
                args={}, operation=operation, tables=tables,  # type: ignore[arg-type]
                summary="", created_at=0.0, expires_at=None)


def test_summarize_truncates_and_flattens() -> None:
    assert summarize("db_query", "write", ["users"], {"query": "DELETE FROM users\n  WHERE id=3"}) == \
        "db_query write on users: DELETE FROM users WHERE id=3"
    assert summarize("ddgs_search", "read", [], {"q": "asyncio"}) == "ddgs_search read: asyncio"
    assert summarize("t", "read", [], {}) == "t read"
    long = summarize("db_query", "read", ["a", "b"], {"query": "SELECT " + "x, " * 200})
    assert long.startswith("db_query read on a, b: SELECT x,") and long.endswith("…")
    assert len(long) < 200
    assert '"a": 1' in summarize("t", "write", [], {"a": 1, "b": "two"})


def test_waiting_notice_and_denial_messages() -> None:
    gate = make_gate()
    assert waiting_notice(gate) == "waiting for operator approval: db_query write on users"
    texts = {d: denial_message(gate, Resolution(d, "once", "x", 0.0))  # type: ignore[arg-type]
             for d in ("denied", "timeout", "cancelled")}
    assert "operator did not allow" in texts["denied"]
    assert "in time" in texts["timeout"]
    assert "cancelled" in texts["cancelled"]
    for text in texts.values():
        assert "db_query write on users" in text
        assert "Do not retry" in text and "Explain to the user" in text
    with pytest.raises(ValueError):
        denial_message(gate, Resolution("approved", "once", "x", 0.0))
    # Anything shaped like a gate will do, e.g. a call described before any gate exists.
    call = SimpleNamespace(tool="ddgs_search", operation="read", tables=[])
    assert denial_message(call, Resolution("timeout", "once", "timeout", 0.0)).startswith(
        "No operator answered the approval request for the ddgs_search read call")


def test_the_inbox_line_keeps_what_a_tools_own_summary_says_of_where() -> None:
    """The console shows tool, operation and tables in the row's head, the summary's rest below:
    a prompt edit's "overwrite section 'x'" (what and where) must not go with the head."""
    generic = summarize("read_system_prompt", "read", [], {"section": "2.1"})
    assert summary_detail(generic, "read_system_prompt", "read", []) == "2.1"
    db = summarize("db_query", "write", ["users"], {"sql": "DELETE FROM users"})
    assert summary_detail(db, "db_query", "write", ["users"]) == "DELETE FROM users"
    own = "update_system_prompt overwrite section 'tone': Always answer in full sentences"
    assert summary_detail(own, "update_system_prompt", "write", []) == (
        "overwrite section 'tone': Always answer in full sentences")


async def test_a_session_grant_covers_the_same_statement_kinds_only(broker: GateBroker, bus: Bus) -> None:
    first = ask(broker, tables=("shop.t",), kinds=("insert",))
    (gate,) = await opened(bus, 1)
    assert gate["session_grant"] == ("later db_query calls of this session that run only INSERT on exactly "
                                     "shop.t pass without asking")
    broker.resolve(gate["id"], "approve", "session", by="op")
    assert (await first).approved
    # Another INSERT on the same table passes without asking ...
    again = await ask(broker, tables=("shop.t",), kinds=("insert",))
    assert again.by == "session-grant" and len(bus.named("gate")) == 1
    # ... a DELETE, a DROP, or an INSERT stacked with a DELETE on it are asked about.
    for n, kinds in enumerate((("delete",), ("ddl",), ("delete", "insert")), start=2):
        task = ask(broker, tables=("shop.t",), kinds=kinds)
        events = await opened(bus, n)
        broker.resolve(events[-1]["id"], "deny", by="op")
        assert (await task).decision == "denied"


async def test_an_mcp_tools_gate_names_it_as_the_rules_do(broker: GateBroker, bus: Bus) -> None:
    """The model calls it `time__get_current_time`; gates.toml and the operator say
    `mcp:time:get_current_time`, in the gate object and in what a session answer lets through."""
    task = ask(broker, tool="time__get_current_time", tool_type="mcp", operation="read", tables=(),
               args={"timezone": "UTC"}, rule_target="mcp:time:get_current_time")
    (gate,) = await opened(bus, 1)
    assert (gate["tool"], gate["rule_target"]) == ("time__get_current_time", "mcp:time:get_current_time")
    assert gate["session_grant"] == "later mcp:time:get_current_time read calls of this session pass without asking"
    broker.resolve(gate["id"], "approve", by="op")
    await task
    (resolved,) = bus.named("gate_resolved")
    assert resolved["rule_target"] == "mcp:time:get_current_time"


async def test_a_gate_that_cannot_be_granted_says_so(broker: GateBroker, bus: Bus) -> None:
    task = ask(broker, tables=(), grantable=False, kinds=("set",))
    (gate,) = await opened(bus, 1)
    assert gate["session_grant"] is None
    broker.resolve(gate["id"], "approve", "session", by="op")
    assert (await task).scope == "once"


async def test_a_session_grant_covers_the_tool_the_operator_approved_not_a_name_alike(
        broker: GateBroker, bus: Bus) -> None:
    """An approval for the session is matched on what the operator was shown (`mcp:x:_t`), not on
    the model's name for it: a name another server's tool may carry later must ask again."""
    first = ask(broker, tool="x___t", tool_type="mcp", tables=(), args={}, rule_target="mcp:x:_t")
    (gate,) = await opened(bus, 1)
    broker.resolve(gate["id"], "approve", "session", by="op")
    await first
    (grant,) = broker.grants("s1")
    assert grant.tool == "mcp:x:_t"
    again = await ask(broker, tool="x___t", tool_type="mcp", tables=(), args={}, rule_target="mcp:x:_t")
    assert again.by == "session-grant"
    other = ask(broker, tool="x___t", tool_type="mcp", tables=(), args={}, rule_target="mcp:x_:t")
    (_, asked) = await opened(bus, 2)
    assert asked["rule_target"] == "mcp:x_:t"
    broker.resolve(asked["id"], "deny", by="op")
    assert (await other).decision == "denied"
