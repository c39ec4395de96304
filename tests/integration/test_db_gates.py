"""db_query through the gate, end to end: a model turn (fake OpenAI server, real SDK) calls the tool,
the gate decides, the operator answers, and the real MariaDB shows what happened."""

from __future__ import annotations

import asyncio
import json

import pytest

from aiops.engine.events import DONE, GATE, GATE_RESOLVED
from tests.fakes.openai_server import Reply
from tests.support.engine import next_event

pytestmark = pytest.mark.mariadb


def plugins_toml(settings, **over) -> str:
    d = settings.model_dump() | {"enabled": True} | over
    lines = ["[mysql]"] + [f"{k} = {json.dumps(v)}" for k, v in d.items() if v is not None]
    return "\n".join(lines) + "\n"


def gates_toml(table: str = "", write: str = "ask", wait_api: float = 0) -> str:
    extra = f'[db.tables.{table}]\nwrite = "{write}"\n' if table else ""
    return ('[defaults]\nread = "allow"\nwrite = "ask"\n[db.tables."*"]\nread = "allow"\nwrite = "ask"\n'
            f'{extra}[db.unknown]\nread = "ask"\nwrite = "ask"\n[wait]\napi = {wait_api}\nconsole = 0\n')


async def db_engine(engine_factory, mariadb, gates: str | None = None, limits: str | None = None, **over):
    files = {"plugins.toml": plugins_toml(mariadb, **over)}
    if gates:
        files["gates.toml"] = gates
    if limits:
        files["limits.toml"] = limits
    engine = await engine_factory(extra_files=files)
    assert engine.tools.get("db_query") is not None, engine.plugin_status
    return engine


def tool_results(fake) -> list[str]:
    """What the model was told by tools, from the fake server's request log."""
    out = []
    for req in fake.requests:
        for m in req.json.get("messages", []):
            if m.get("role") == "tool":
                out.append(m["content"])
    return out


async def test_gated_write_approved_is_executed(engine_factory, mariadb, mysql_table, fake_openai):
    t = await mysql_table("id INT PRIMARY KEY, name VARCHAR(20)", [(1, "a")])
    engine = await db_engine(engine_factory, mariadb)
    fake_openai.script(Reply.tool_calls(("db_query", {"sql": f"UPDATE {t} SET name='b' WHERE id=1"})),
                       Reply.text("updated"))
    sub = engine.bus.subscribe()
    turn = await engine.submit("api-w", "rename a to b", kind="api")
    gate = (await next_event(sub, GATE)).data
    assert gate["operation"] == "write" and gate["tables"] == [t] and gate["tool"] == "db_query"
    assert gate["client_kind"] == "api" and gate["session_id"] == "api-w"
    engine.gatekeeper.broker.resolve(gate["id"], "approve", by="test-operator")
    result = await turn.wait(10)
    assert result.status == "complete" and result.text == "updated"
    assert await mysql_table.query(f"SELECT name FROM {t}") == [("b",)]
    assert "1 row affected" in tool_results(fake_openai)[0]
    audit = await engine.store.audit("api-w")
    assert [(a.event, a.decision, a.actor) for a in audit] == [
        ("gate_opened", None, None), ("gate_resolved", "approved", "test-operator")]
    history = await engine.history("api-w")
    assert any(m.role == "gate" and m.meta["decision"] == "approved" for m in history)


async def test_gated_write_denied_is_not_executed(engine_factory, mariadb, mysql_table, fake_openai):
    t = await mysql_table("id INT PRIMARY KEY", [(1,), (2,)])
    engine = await db_engine(engine_factory, mariadb)
    fake_openai.script(Reply.tool_calls(("db_query", {"sql": f"DELETE FROM {t}"})), Reply.text("ok"))
    sub = engine.bus.subscribe()
    turn = await engine.submit("api-d", "delete everything", kind="api")
    gate = (await next_event(sub, GATE)).data
    engine.gatekeeper.broker.resolve(gate["id"], "deny", by="test-operator")
    resolved = (await next_event(sub, GATE_RESOLVED)).data
    assert resolved["decision"] == "denied" and resolved["by"] == "test-operator"
    await turn.wait(10)
    assert await mysql_table.query(f"SELECT COUNT(*) FROM {t}") == [(2,)]
    told = tool_results(fake_openai)[0]
    assert "did not allow" in told and "Do not retry" in told


async def test_read_is_allowed_without_a_gate_and_runs_read_only(engine_factory, mariadb, mysql_table,
                                                                   fake_openai):
    t = await mysql_table("id INT", [(i,) for i in range(10)])
    engine = await db_engine(engine_factory, mariadb, max_rows=3)
    fake_openai.script(Reply.tool_calls(("db_query", {"sql": f"SELECT id FROM {t} ORDER BY id"})),
                       Reply.text("done"))
    sub = engine.bus.subscribe()
    await engine.run("api-r", "list ids", kind="api", timeout=10)
    names = [e.name for e in sub.pending()]
    assert GATE not in names
    told = tool_results(fake_openai)[0]
    assert "7 more rows not shown" in told and told.splitlines()[0].strip() == "id"


async def test_policy_deny_never_asks(engine_factory, mariadb, mysql_table, fake_openai):
    t = await mysql_table("id INT", [(1,)])
    engine = await db_engine(engine_factory, mariadb, gates=gates_toml(table=t, write="deny"))
    fake_openai.script(Reply.tool_calls(("db_query", {"sql": f"DROP TABLE {t}"})), Reply.text("no"))
    await engine.run("api-p", "drop it", kind="api", timeout=10)
    assert await mysql_table.query(f"SELECT COUNT(*) FROM {t}") == [(1,)]
    assert "policy denies" in tool_results(fake_openai)[0]
    assert not engine.gatekeeper.broker.pending()


async def test_wait_timeout_denies(engine_factory, mariadb, mysql_table, fake_openai):
    t = await mysql_table("id INT", [(1,)])
    engine = await db_engine(engine_factory, mariadb, gates=gates_toml(wait_api=0.3))
    fake_openai.script(Reply.tool_calls(("db_query", {"sql": f"DELETE FROM {t}"})), Reply.text("ok"))
    sub = engine.bus.subscribe()
    await engine.submit("api-t", "delete", kind="api")
    resolved = (await next_event(sub, GATE_RESOLVED)).data
    assert resolved["decision"] == "timeout"
    await next_event(sub, DONE)
    assert await mysql_table.query(f"SELECT COUNT(*) FROM {t}") == [(1,)]
    assert "in time" in tool_results(fake_openai)[0]


async def test_stop_cancels_the_pending_gate(engine_factory, mariadb, mysql_table, fake_openai):
    t = await mysql_table("id INT", [(1,)])
    engine = await db_engine(engine_factory, mariadb)
    fake_openai.script(Reply.tool_calls(("db_query", {"sql": f"DELETE FROM {t}"})))
    sub = engine.bus.subscribe()
    turn = await engine.submit("api-s", "delete", kind="api")
    await next_event(sub, GATE)
    assert engine.session_state("api-s") == "waiting"
    engine.stop_turn("api-s")
    result = await turn.wait(10)
    assert result.status == "cancelled"
    resolved = (await next_event(sub, GATE_RESOLVED)).data
    assert resolved["decision"] == "cancelled" and resolved["by"] == "stop"
    assert await mysql_table.query(f"SELECT COUNT(*) FROM {t}") == [(1,)]
    notes = [m.content for m in await engine.history("api-s") if m.role == "notice"]
    assert notes[-1] == "turn cancelled (1 pending gate cancelled)"
    assert not engine.gatekeeper.broker.pending()


async def test_session_scope_approval_and_revocation(engine_factory, mariadb, mysql_table, fake_openai):
    t = await mysql_table("id INT", [])
    engine = await db_engine(engine_factory, mariadb)
    ins = ("db_query", {"sql": f"INSERT INTO {t} VALUES (1)"})
    sub = engine.bus.subscribe(names=[GATE])

    async def approve_next(scope: str) -> None:
        gate = (await next_event(sub, GATE)).data
        engine.gatekeeper.broker.resolve(gate["id"], "approve", scope, by="op")

    fake_openai.script(Reply.tool_calls(ins), Reply.text("1"))
    approver = asyncio.create_task(approve_next("session"))
    await engine.run("api-g", "insert", kind="api", timeout=10)
    await approver
    # Same session, same tool, operation and table: no gate this time.
    fake_openai.script(Reply.tool_calls(ins), Reply.text("2"))
    await engine.run("api-g", "again", kind="api", timeout=10)
    assert await mysql_table.query(f"SELECT COUNT(*) FROM {t}") == [(2,)]
    assert not sub.pending()
    out = (await engine.run("console-x", "!gates", kind="console", is_operator=True)).text
    grant_id = engine.gatekeeper.broker.grants()[0].id
    assert grant_id in out
    assert "revoked" in (await engine.run("console-x", f"!gates revoke {grant_id}", kind="console",
                                          is_operator=True)).text
    fake_openai.script(Reply.tool_calls(ins), Reply.text("3"))
    approver = asyncio.create_task(approve_next("once"))
    await engine.run("api-g", "third", kind="api", timeout=10)
    await approver  # a gate opened again after the revocation


async def test_rate_limit_refuses_without_using_a_slot(engine_factory, mariadb, mysql_table, fake_openai):
    t = await mysql_table("id INT", [(1,)])
    limits = "max_tool_iterations = 10\n[rate.db]\ncalls = 2\nwindow_seconds = 60\n"
    engine = await db_engine(engine_factory, mariadb, limits=limits)
    q = ("db_query", {"sql": f"SELECT * FROM {t}"})
    for i in range(3):
        fake_openai.script(Reply.tool_calls(q), Reply.text(str(i)))
        await engine.run("api-l", f"q{i}", kind="api", timeout=10)
    told = tool_results(fake_openai)
    assert "rate limit exceeded: 2 calls in 60 s for db" in told[-1]
    usage = [u for u in engine.gatekeeper.limiter.usage("api-l") if u.tool_type == "db"][0]
    assert (usage.used, usage.limit) == (2, 2)


async def test_unreachable_server_is_a_clear_tool_error(engine_factory, mariadb, fake_openai):
    engine = await db_engine(engine_factory, mariadb, port=1)
    fake_openai.script(Reply.tool_calls(("db_query", {"sql": "SELECT * FROM orders"})), Reply.text("sorry"))
    result = await engine.run("api-u", "q", kind="api", timeout=30)
    assert result.status == "complete"
    told = tool_results(fake_openai)[0]
    assert told.startswith("error:") and "127.0.0.1:1" in told


async def test_operator_commands_are_refused_to_proxy_and_client_sessions(engine_factory, mariadb,
                                                                            mysql_table):
    t = await mysql_table("id INT", [(1,)])
    engine = await db_engine(engine_factory, mariadb)
    for cmd in ("!gates", f"!gate db:{t} write deny", "!limits", f"!db DELETE FROM {t}"):
        out = (await engine.run("proxy-1", cmd, kind="proxy")).text
        assert out.startswith("not permitted"), (cmd, out)
    assert await mysql_table.query(f"SELECT COUNT(*) FROM {t}") == [(1,)]
    out = (await engine.run("console-1", f"!db SELECT COUNT(*) AS n FROM {t}", kind="console",
                            is_operator=True)).text
    assert f"[read on {t}]" in out and "n" in out.splitlines()[1]


async def test_gate_rule_change_applies_and_saves(engine_factory, mariadb, mysql_table, fake_openai, tmp_path):
    t = await mysql_table("id INT", [(1,)])
    engine = await db_engine(engine_factory, mariadb)
    out = (await engine.run("console-1", f"!gate db:{t} write deny --save", kind="console",
                            is_operator=True)).text
    assert "saved to" in out
    import tomllib

    saved = tomllib.loads((tmp_path / "config" / "gates.toml").read_text())
    assert saved["db"]["tables"][t]["write"] == "deny"
    assert saved["wait"]["slack"] == 300  # the other settings are kept
    fake_openai.script(Reply.tool_calls(("db_query", {"sql": f"DELETE FROM {t}"})), Reply.text("no"))
    await engine.run("api-x", "delete", kind="api", timeout=10)
    assert "policy denies" in tool_results(fake_openai)[0]
    out = (await engine.run("console-1", "!limits set db 7 30 --save", kind="console",
                            is_operator=True)).text
    assert "7 calls / 30s" in out
    assert tomllib.loads((tmp_path / "config" / "limits.toml").read_text())["rate"]["db"]["calls"] == 7


async def test_audit_log_survives_a_restart(engine_factory, mariadb, mysql_table, fake_openai, tmp_path):
    import subprocess
    import sys

    t = await mysql_table("id INT", [(1,)])
    engine = await db_engine(engine_factory, mariadb)
    fake_openai.script(Reply.tool_calls(("db_query", {"sql": f"DELETE FROM {t}"})), Reply.text("ok"))
    sub = engine.bus.subscribe(names=[GATE])
    turn = await engine.submit("api-audit", "delete", kind="api")
    gate = (await next_event(sub, GATE)).data
    engine.gatekeeper.broker.resolve(gate["id"], "deny", by="console")
    await turn.wait(10)
    await engine.stop()
    r = await asyncio.to_thread(subprocess.run, [
        sys.executable, "-m", "aiops.cli", "--config-dir", str(tmp_path / "config"), "--data-dir",
        str(tmp_path / "data"), "audit", "--session", "101", "--json"], capture_output=True, text=True,
        timeout=60)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [(x["event"], x["decision"], x["by"]) for x in rows] == [
        ("gate_opened", None, None), ("gate_resolved", "denied", "console")]
    assert rows[0]["data"]["gate"]["args"] == {"sql": f"DELETE FROM {t}"}
    r = await asyncio.to_thread(subprocess.run, [
        sys.executable, "-m", "aiops.cli", "--config-dir", str(tmp_path / "config"), "--data-dir",
        str(tmp_path / "data"), "audit", "--since", "1h"], capture_output=True, text=True, timeout=60)
    assert "gate_resolved" in r.stdout and "denied" in r.stdout and "by console" in r.stdout
