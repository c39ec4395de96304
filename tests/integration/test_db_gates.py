"""db_query through the gate, end to end: a model turn (fake OpenAI server, real SDK) calls the tool,
the gate decides, the operator answers, and the real MariaDB shows what happened."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tomllib

import pytest

from aiops.engine.events import DONE, GATE, GATE_RESOLVED
from tests.fakes.openai_server import Reply
from tests.support.engine import next_event
from tests.support.mariadb import PASSWORD_ENV

pytestmark = pytest.mark.mariadb


def plugins_toml(settings, **over) -> str:
    d = settings.model_dump() | {"enabled": True} | over
    lines = ["[mysql]"] + [f"{k} = {json.dumps(v)}" for k, v in d.items() if v is not None]
    return "\n".join(lines) + "\n"


def gates_toml(table: str = "", write: str = "ask", wait_api: float = 0) -> str:
    extra = f'[db.tables."{table}"]\nwrite = "{write}"\n' if table else ""
    return ('[defaults]\nread = "allow"\nwrite = "ask"\n[db.tables."*"]\nread = "allow"\nwrite = "ask"\n'
            f'{extra}[db.unknown]\nread = "ask"\nwrite = "ask"\n[wait]\napi = {wait_api}\nconsole = 0\n')


def db_env(**extra: str) -> dict[str, str]:
    # The fixture's password variable is named in plugins.toml, so it must be set: empty means the
    # CI server's password-less root.
    return {**os.environ, PASSWORD_ENV: os.environ.get(PASSWORD_ENV, ""), **extra}


async def db_engine(engine_factory, mariadb, gates: str | None = None, limits: str | None = None, **over):
    files = {"plugins.toml": plugins_toml(mariadb, **over)}
    if gates:
        files["gates.toml"] = gates
    if limits:
        files["limits.toml"] = limits
    engine = await engine_factory(extra_files=files, env=db_env())
    assert engine.tools.get("db_query") is not None, engine.plugin_status
    return engine


async def approve_next(engine, sub, scope: str = "once") -> dict:
    """Answer the next gate on `sub` as the operator; returns the gate object."""
    gate = (await next_event(sub, GATE)).data
    engine.gatekeeper.broker.resolve(gate["id"], "approve", scope, by="op")
    return gate


def run_cli(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aiops.cli", "--config-dir", str(tmp_path / "config"),
                           "--data-dir", str(tmp_path / "data"), *args],
                          capture_output=True, text=True, timeout=60, env=db_env())


def last_tool_result(fake) -> str:
    """What the model was told by the most recent tool call."""
    return tool_results(fake)[-1]


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
    # Bare names are qualified with the configured database, so rules on either spelling apply.
    assert gate["operation"] == "write" and gate["tables"] == [f"{mariadb.database}.{t}"]
    assert gate["tool"] == "db_query"
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


async def test_read_is_allowed_without_a_gate_and_capped_at_max_rows(engine_factory, mariadb, mysql_table,
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
    assert told.splitlines()[0].strip() == "id"
    assert [line.strip() for line in told.splitlines()[2:5]] == ["0", "1", "2"]
    assert "7 more rows not shown" in told
    # The console gets the same capped rows, structured.
    (result,) = [m for m in await engine.history("api-r") if m.role == "tool"]
    (data,) = result.meta["data"]
    assert data["rows"] == [[0], [1], [2]] and data["total_rows"] == 10 and data["truncated"] is True


async def test_read_runs_in_a_read_only_transaction(engine_factory, mariadb, mysql_table, fake_openai):
    # A write the classifier cannot see: a view over a stored function that inserts. `SELECT * FROM
    # view` is a read by every rule of the gate, so only the read-only transaction can stop it.
    log = await mysql_table("id INT")
    fn, view = f"{log}_fn", f"{log}_v"
    await mysql_table.query(f"CREATE FUNCTION `{fn}`() RETURNS INT MODIFIES SQL DATA "
                            f"BEGIN INSERT INTO `{log}` VALUES (1); RETURN 1; END")
    try:
        await mysql_table.query(f"CREATE VIEW `{view}` AS SELECT `{fn}`() AS x")
        engine = await db_engine(engine_factory, mariadb)
        fake_openai.script(Reply.tool_calls(("db_query", {"sql": f"SELECT * FROM {view}"})),
                           Reply.text("done"))
        sub = engine.bus.subscribe(names=[GATE])
        await engine.run("api-ro", "read the view", kind="api", timeout=10)
        assert not sub.pending()  # allowed as a read, no gate
        told = tool_results(fake_openai)[0]
        assert told.startswith("error: refused") and "read-only" in told, told
        assert await mysql_table.query(f"SELECT COUNT(*) FROM `{log}`") == [(0,)]
        # Outside a read-only transaction the same SELECT does write: the check above can fail.
        await mysql_table.query(f"SELECT * FROM `{view}`")
        assert await mysql_table.query(f"SELECT COUNT(*) FROM `{log}`") == [(1,)]
    finally:
        await mysql_table.query(f"DROP VIEW IF EXISTS `{view}`")
        await mysql_table.query(f"DROP FUNCTION IF EXISTS `{fn}`")


async def test_statement_timeout_through_the_tool(engine_factory, mariadb, mysql_table, fake_openai):
    t = await mysql_table("id INT", [(1,)])
    engine = await db_engine(engine_factory, mariadb, statement_timeout_ms=300)
    fake_openai.script(Reply.tool_calls(("db_query", {"sql": f"SELECT SLEEP(5) FROM {t}"})),
                       Reply.text("too slow"))
    result = await engine.run("api-slow", "sleep", kind="api", timeout=20)
    assert result.status == "complete" and result.text == "too slow"
    told = tool_results(fake_openai)[0]
    assert told.startswith("error: statement timeout") and "300 ms" in told, told


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
    assert notes[-1] == "turn cancelled: stopped db_query (1 pending gate cancelled)"
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
    # The call the grant let through is on record: in the audit log and in the session's history.
    granted = [a for a in await engine.store.audit("api-g") if a.event == "gate_granted"]
    assert [(a.decision, a.scope, a.actor) for a in granted] == [("approved", "session", "session-grant")]
    assert granted[0].data["grant"]["id"] == grant_id
    assert granted[0].data["gate"]["args"] == {"sql": f"INSERT INTO {t} VALUES (1)"}
    gates = [m.content for m in await engine.history("api-g") if m.role == "gate"]
    assert gates[-1].startswith("approved (session grant): db_query write")
    assert "revoked" in (await engine.run("console-x", f"!gates revoke {grant_id}", kind="console",
                                          is_operator=True)).text
    revoked = [a for a in await engine.store.audit("api-g") if a.event == "grant_revoked"]
    assert [(a.actor, a.data["grant"]["id"]) for a in revoked] == [("operator:console", grant_id)]
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


@pytest.mark.parametrize("kind", ["proxy", "api", "slack"])
async def test_operator_commands_are_refused_to_proxy_and_client_sessions(engine_factory, mariadb,
                                                                            mysql_table, kind):
    t = await mysql_table("id INT", [(1,)])
    engine = await db_engine(engine_factory, mariadb)
    # "api" without is_operator is a client-token session.
    for cmd in ("!gates", f"!gate db:{t} write deny", "!limits", "!limits enable db", "!limits set db 1 1",
                f"!db DELETE FROM {t}"):
        out = (await engine.run(f"{kind}-1", cmd, kind=kind, is_operator=False)).text
        assert out.startswith("not permitted"), (cmd, out)
    assert await mysql_table.query(f"SELECT COUNT(*) FROM {t}") == [(1,)]
    assert engine.gatekeeper.rules.decide("db_query", "db", "write", [t]) == "ask"
    assert engine.gatekeeper.limiter.config.rate["db"].calls != 1
    # The same commands work for the operator: the console, or an API client with an operator token.
    out = (await engine.run("console-1", f"!db SELECT COUNT(*) AS n FROM {t}", kind="console",
                            is_operator=True)).text
    assert f"[read on {t}]" in out and "n" in out.splitlines()[1]
    out = (await engine.run("api-op", "!gates", kind="api", is_operator=True)).text
    assert out.startswith("Rules (gates.toml):"), out


async def test_gate_rule_change_applies_and_saves(engine_factory, mariadb, mysql_table, fake_openai, tmp_path):
    t = await mysql_table("id INT", [(1,)])
    engine = await db_engine(engine_factory, mariadb)
    out = (await engine.run("console-1", f"!gate db:{t} write deny --save", kind="console",
                            is_operator=True)).text
    assert "saved to" in out

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
    t = await mysql_table("id INT", [(1,)])
    engine = await db_engine(engine_factory, mariadb)
    fake_openai.script(Reply.tool_calls(("db_query", {"sql": f"DELETE FROM {t}"})), Reply.text("ok"))
    sub = engine.bus.subscribe(names=[GATE])
    turn = await engine.submit("api-audit", "delete", kind="api")
    gate = (await next_event(sub, GATE)).data
    engine.gatekeeper.broker.resolve(gate["id"], "deny", by="console")
    await turn.wait(10)
    await engine.stop()
    r = await asyncio.to_thread(run_cli, tmp_path, "audit", "--session", "101", "--json")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [(x["event"], x["decision"], x["by"]) for x in rows] == [
        ("gate_opened", None, None), ("gate_resolved", "denied", "console")]
    assert rows[0]["data"]["gate"]["args"] == {"sql": f"DELETE FROM {t}"}
    r = await asyncio.to_thread(run_cli, tmp_path, "audit", "--since", "1h")
    assert "gate_resolved" in r.stdout and "denied" in r.stdout and "by console" in r.stdout


async def test_session_approval_of_a_statement_naming_no_table_covers_only_that_call(
        engine_factory, mariadb, mysql_table, fake_openai):
    t = await mysql_table("id INT", [(1,)])
    engine = await db_engine(engine_factory, mariadb)
    sub = engine.bus.subscribe(names=[GATE, GATE_RESOLVED])
    fake_openai.script(Reply.tool_calls(("db_query", {"sql": "SET @x = 1"})), Reply.text("set"))
    approver = asyncio.create_task(approve_next(engine, sub, "session"))
    await engine.run("api-n", "set x", kind="api", timeout=10)
    await approver
    resolved = (await next_event(sub, GATE_RESOLVED)).data
    # The operator asked for the session; what was granted (and recorded) is this call only.
    assert (resolved["decision"], resolved["scope"]) == ("approved", "once")
    assert engine.gatekeeper.broker.grants() == []
    audit = [(a.event, a.scope) for a in await engine.store.audit("api-n")]
    assert audit == [("gate_opened", None), ("gate_resolved", "once")]

    # Another statement under the unknown rule asks again, and is not run when denied.
    fake_openai.script(Reply.tool_calls(("db_query", {"sql": f"RENAME TABLE {t} TO {t}_x"})),
                       Reply.text("renamed?"))
    turn = await engine.submit("api-n", "rename", kind="api")
    gate = (await next_event(sub, GATE)).data
    assert gate["tables"] == sorted([f"{mariadb.database}.{t}", f"{mariadb.database}.{t}_x"])
    engine.gatekeeper.broker.resolve(gate["id"], "deny", by="op")
    await turn.wait(10)
    assert await mysql_table.query(f"SHOW TABLES LIKE '{t}%'") == [(t,)]


async def test_session_approval_of_an_update_does_not_cover_into_outfile(engine_factory, mariadb, mysql_table,
                                                                         fake_openai):
    t = await mysql_table("id INT", [(1,)])
    engine = await db_engine(engine_factory, mariadb, gates=gates_toml())
    sub = engine.bus.subscribe(names=[GATE])
    fake_openai.script(Reply.tool_calls(("db_query", {"sql": f"UPDATE {t} SET id = 2"})), Reply.text("1"))
    approver = asyncio.create_task(approve_next(engine, sub, "session"))
    await engine.run("api-o", "update", kind="api", timeout=10)
    await approver
    assert len(engine.gatekeeper.broker.grants("api-o")) == 1
    # Same tables, but it writes a server file: the grant does not cover it. (The directory does
    # not exist, so the approved statement fails on the server and leaves no file behind.)
    outfile = f"/nonexistent-aiops-test-dir/{t}.csv"
    fake_openai.script(Reply.tool_calls(("db_query", {"sql": f"SELECT * FROM {t} INTO OUTFILE '{outfile}'"})),
                       Reply.text("2"))
    turn = await engine.submit("api-o", "export", kind="api")
    gate = (await next_event(sub, GATE)).data
    assert "OUTFILE" in gate["args"]["sql"]
    engine.gatekeeper.broker.resolve(gate["id"], "approve", "session", by="op")
    await turn.wait(10)
    # Approved once only; the UPDATE grant is still the only one.
    assert [g.gate_id for g in engine.gatekeeper.broker.grants("api-o")] != [gate["id"]]
    assert len(engine.gatekeeper.broker.grants("api-o")) == 1


async def test_an_explicit_db_query_rule_applies_and_unknown_targets_are_refused(
        engine_factory, mariadb, mysql_table, fake_openai):
    t = await mysql_table("id INT", [(1,)])
    engine = await db_engine(engine_factory, mariadb)
    out = (await engine.run("console-1", "!gate db_query write deny", kind="console", is_operator=True)).text
    assert out.startswith("db_query write → deny"), out
    fake_openai.script(Reply.tool_calls(("db_query", {"sql": f"DELETE FROM {t}"})), Reply.text("no"))
    await engine.run("api-x", "delete", kind="api", timeout=10)
    assert "policy denies" in tool_results(fake_openai)[0]
    assert await mysql_table.query(f"SELECT COUNT(*) FROM {t}") == [(1,)]

    before = engine.gatekeeper.rules
    for target in ("nosuchtool", "mcp:", "mcp::x"):
        out = (await engine.run("console-1", f"!gate {target} read deny", kind="console", is_operator=True)).text
        assert out.startswith("!gate: ") and "db_query" in out and "db:TABLE" in out, out
    assert engine.gatekeeper.rules == before
    assert "nosuchtool" not in engine.gatekeeper.rules.tools
    # MCP names need no running server: rules may be written before it is configured.
    out = (await engine.run("console-1", "!gate mcp:fs:rm write deny", kind="console", is_operator=True)).text
    assert out.startswith("mcp:fs:rm write → deny"), out


@pytest.mark.parametrize("statement", [
    "RENAME TABLE {t} TO {t}_x",
    "LOCK TABLES {t} WRITE",
    "LOAD DATA INFILE '/tmp/nothing.csv' INTO TABLE {t}",
    "HANDLER {t} OPEN",
    # Valid MariaDB that sqlglot does not parse at all.
    "DROP TABLE {t} NOWAIT",
    "TRUNCATE {t} WAIT 1",
])
async def test_a_table_deny_applies_to_statements_sqlglot_cannot_parse(engine_factory, mariadb, mysql_table,
                                                                       fake_openai, statement):
    t = await mysql_table("id INT", [(1,)])
    engine = await db_engine(engine_factory, mariadb, gates=gates_toml(t, "deny"))
    fake_openai.script(Reply.tool_calls(("db_query", {"sql": statement.format(t=t)})), Reply.text("no"))
    sub = engine.bus.subscribe(names=[GATE])
    await engine.run("api-u", "do it", kind="api", timeout=10)
    assert "policy denies" in tool_results(fake_openai)[0]
    assert not sub.pending()  # denied outright, never asked
    assert await mysql_table.query(f"SHOW TABLES LIKE '{t}%'") == [(t,)]


async def test_a_rule_on_the_qualified_name_matches_a_bare_table(engine_factory, mariadb, mysql_table,
                                                                  fake_openai):
    t = await mysql_table("id INT", [(1,)])
    engine = await db_engine(engine_factory, mariadb, gates=gates_toml(f"{mariadb.database}.{t}", "deny"))
    fake_openai.script(Reply.tool_calls(("db_query", {"sql": f"DELETE FROM {t}"})), Reply.text("no"))
    await engine.run("api-q", "delete", kind="api", timeout=10)
    assert "policy denies" in tool_results(fake_openai)[0]
    assert await mysql_table.query(f"SELECT COUNT(*) FROM {t}") == [(1,)]


async def test_db_command_takes_sql_verbatim_and_to_the_end_of_the_message(engine_factory, mariadb, mysql_table,
                                                                           fake_openai):
    t = await mysql_table("id INT, name VARCHAR(20)", [(1, "O'Brien"), (2, "Smith")])
    engine = await db_engine(engine_factory, mariadb)
    for sql in (f"SELECT id FROM {t} WHERE name = 'O\\'Brien'", f"SELECT id FROM {t} WHERE name = 'O''Brien'",
                f"SELECT id FROM {t} WHERE name LIKE \"O'%\" -- don't"):
        out = (await engine.run("console-1", f"!db {sql}", kind="console", is_operator=True)).text
        assert out.splitlines()[-1].strip() == "1", (sql, out)
    out = (await engine.run("console-1", f"!db SELECT name\nFROM {t}\nWHERE id = 2", kind="console",
                            is_operator=True, timeout=10)).text
    assert out.splitlines()[-1].strip() == "Smith", out
    assert fake_openai.requests == []  # no line of the SQL went to the model
    audit = [a.data["sql"] for a in await engine.store.audit() if a.event == "operator_db"]
    assert audit[-1] == f"SELECT name\nFROM {t}\nWHERE id = 2"


async def test_limits_enable_brings_back_an_auto_disabled_tool_type(engine_factory, mariadb, mysql_table,
                                                                     fake_openai):
    t = await mysql_table("id INT", [(1,)])
    limits = "max_tool_iterations = 10\n[rate.db]\ncalls = 1\nwindow_seconds = 60\nauto_disable = true\n"
    engine = await db_engine(engine_factory, mariadb, limits=limits)
    q = ("db_query", {"sql": f"SELECT * FROM {t}"})

    async def call(session: str) -> str:
        fake_openai.script(Reply.tool_calls(q), Reply.text("x"))
        await engine.run(session, "q", kind="api", timeout=10)
        return last_tool_result(fake_openai)

    assert (await call("api-a")).startswith("id")
    assert "now disabled for this session" in await call("api-a")
    assert "disabled for this session" in await call("api-a")
    assert (await call("api-b")).startswith("id")  # other sessions are not affected

    out = (await engine.run("console-1", "!limits enable db api-a", kind="console", is_operator=True)).text
    assert out.startswith("db re-enabled for"), out
    assert (await call("api-a")).startswith("id")  # with a fresh window
    out = (await engine.run("console-1", "!limits enable db api-b", kind="console", is_operator=True)).text
    assert out.startswith("db was not disabled for"), out
    out = (await engine.run("console-1", "!limits enable db nope", kind="console", is_operator=True)).text
    assert "no session 'nope'" in out
    # From the session itself (a client token) it is not permitted.
    assert (await engine.run("api-a", "!limits enable db", kind="api")).text.startswith("not permitted")


async def test_audit_text_shows_what_each_entry_was_about(engine_factory, mariadb, mysql_table, fake_openai,
                                                          tmp_path):
    t = await mysql_table("id INT", [(1,)])
    u = await mysql_table("id INT", [(1,)])
    engine = await db_engine(engine_factory, mariadb, gates=gates_toml(u, "deny"))
    sub = engine.bus.subscribe(names=[GATE])
    ins = ("db_query", {"sql": f"INSERT INTO {t} VALUES (2)"})
    fake_openai.script(Reply.tool_calls(ins), Reply.text("1"))
    approver = asyncio.create_task(approve_next(engine, sub, "session"))
    await engine.run("api-a", "x", kind="api", timeout=10)
    await approver
    fake_openai.script(Reply.tool_calls(ins), Reply.text("2"), Reply.tool_calls(
        ("db_query", {"sql": f"DELETE FROM {u} WHERE id = 1"})), Reply.text("3"))
    await engine.run("api-a", "x", kind="api", timeout=10)
    await engine.run("api-a", "y", kind="api", timeout=10)
    await engine.run("console-1", f"!db SELECT COUNT(*) FROM {t}", kind="console", is_operator=True)
    grant_id = engine.gatekeeper.broker.grants()[0].id
    await engine.run("console-1", f"!gates revoke {grant_id}", kind="console", is_operator=True)
    await engine.stop()
    r = await asyncio.to_thread(run_cli, tmp_path, "audit")
    assert r.returncode == 0, r.stderr
    lines = {line.split()[3]: line for line in r.stdout.splitlines()}
    assert f"DELETE FROM {u} WHERE id = 1" in lines["policy_denied"]
    assert f"SELECT COUNT(*) FROM {t}" in lines["operator_db"]
    assert f"INSERT INTO {t} VALUES (2)" in lines["gate_granted"] and grant_id in lines["gate_granted"]
    assert grant_id in lines["grant_revoked"] and "by operator:console" in lines["grant_revoked"]


async def test_plugin_is_skipped_when_a_named_secret_is_missing(engine_factory, mariadb):
    for over, var in (({"dsn_env": "NOPE_DSN"}, "NOPE_DSN"), ({"password_env": "NOPE_PW"}, "NOPE_PW")):
        engine = await engine_factory(extra_files={"plugins.toml": plugins_toml(mariadb, **over)}, env=db_env())
        (status,) = [s for s in engine.plugin_status if s.name == "mysql"]
        assert status.state == "skipped" and status.reason.startswith(f"environment variable {var} is not set")
        assert engine.tools.get("db_query") is None
        await engine.stop()
    # Set, even empty, is enough: an empty password is a valid one.
    engine = await engine_factory(extra_files={"plugins.toml": plugins_toml(mariadb, password_env="EMPTY_PW")},
                                  env=db_env(EMPTY_PW=""))
    assert [s.state for s in engine.plugin_status if s.name == "mysql"] == ["started"]


async def test_server_down_at_start_is_reported_but_does_not_stop_start_up(engine_factory, mariadb, tmp_path):
    engine = await db_engine(engine_factory, mariadb, port=1)
    await engine.plugins_ready()  # the connection check runs in the background
    (status,) = [s for s in engine.plugin_status if s.name == "mysql"]
    assert status.state == "started" and "could not connect" in status.reason and "127.0.0.1:1" in status.reason
    await engine.stop()
    r = await asyncio.to_thread(run_cli, tmp_path, "plugins")
    assert r.returncode == 0, r.stderr
    assert any(line.startswith("mysql") and "could not connect" in line for line in r.stdout.splitlines()), r.stdout


async def test_a_statement_too_long_to_check_is_refused_before_any_gate(engine_factory, mariadb, mysql_table,
                                                                     fake_openai):
    """Classifying SQL runs on the event loop: a 400 kB statement once stalled every client."""
    from aiops.integrations.mysql_plugin import SQL_MAX_CHARS

    t = await mysql_table("id INT", [(1,)])
    engine = await db_engine(engine_factory, mariadb)
    huge = f"INSERT INTO {t} (id) VALUES " + ",".join(["(2)"] * (SQL_MAX_CHARS // 4))
    fake_openai.script(Reply.tool_calls(("db_query", {"sql": huge})), Reply.text("too long"))
    sub = engine.bus.subscribe(names=[GATE])
    await engine.run("api-huge", "insert many", kind="api", timeout=10)
    assert f"at most {SQL_MAX_CHARS} characters" in tool_results(fake_openai)[0]
    assert not sub.pending()
    assert await mysql_table.query(f"SELECT COUNT(*) FROM {t}") == [(1,)]
