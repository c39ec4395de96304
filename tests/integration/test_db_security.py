"""Issue 20's database findings, end to end through the real db_query path: a model turn (fake OpenAI
server, real SDK) sends the statement, the shipped (or a stated) gate policy decides, and the real
MariaDB shows whether it ran: the rows the model was told, or the write in the table.

Items: 1 (USE must not turn a table's deny into a question), 2 (SHOW forms that expose accounts
or other connections), 5 (credentials and forged lines in logs, audit and the gate view), 7 (a
session approval covers the same statement kinds only), 9 (the internal schemas are denied)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aiops.engine.events import GATE
from aiops.logs import log_file_handler
from tests.fakes.openai_server import Reply
from tests.integration.test_db_gates import db_engine, gates_toml, tool_results
from tests.support.engine import next_event
from tests.support.mariadb import TableFactory

pytestmark = pytest.mark.mariadb

PASSWORD = "Probe-Secret-4711"


@pytest.fixture
async def probe_user(mariadb, mysql_table: TableFactory) -> AsyncIterator[str]:
    """An account with a password, so that a leak of the account tables has a hash to leak."""
    name = f"aiops_probe_{uuid.uuid4().hex[:6]}"
    await mysql_table.query(f"CREATE USER '{name}'@'localhost' IDENTIFIED BY '{PASSWORD}'")
    try:
        yield name
    finally:
        await mysql_table.query(f"DROP USER IF EXISTS '{name}'@'localhost'")


@pytest.fixture
async def other_db(mariadb, mysql_table: TableFactory) -> AsyncIterator[str]:
    """A second database, to USE."""
    name = f"aiops_sec_{uuid.uuid4().hex[:6]}"
    await mysql_table.query(f"CREATE DATABASE {name}")
    try:
        yield name
    finally:
        await mysql_table.query(f"DROP DATABASE IF EXISTS {name}")


async def password_hash(mysql_table: TableFactory, user: str) -> str:
    ((value,),) = await mysql_table.query(
        "SELECT JSON_VALUE(Priv, '$.authentication_string') FROM mysql.global_priv WHERE User = %s", [user])
    assert value and value.startswith("*")
    return str(value)


async def model_runs(engine, fake_openai, sql: str, session: str = "api-sec") -> str:
    """One turn whose model calls db_query(sql); what the tool told the model."""
    fake_openai.script(Reply.tool_calls(("db_query", {"sql": sql})), Reply.text("ok"))
    await engine.run(session, "go", kind="api", timeout=20)
    return tool_results(fake_openai)[-1]  # the newest tool message of the last request


# ---- item 1: USE ----------------------------------------------------------------------------------


@pytest.mark.parametrize("sql", [
    "USE mysql; SELECT User, Priv FROM global_priv",
    "USE `mysql`; SELECT * FROM `global_priv` WHERE User <> ''",
    "SELECT 1; USE mysql; SELECT User FROM global_priv",
])
async def test_use_does_not_turn_the_account_tables_deny_into_a_question(engine_factory, mariadb, mysql_table,
                                                                         fake_openai, probe_user, sql):
    secret = await password_hash(mysql_table, probe_user)
    engine = await db_engine(engine_factory, mariadb)  # the shipped gates.toml
    sub = engine.bus.subscribe(names=[GATE])
    told = await model_runs(engine, fake_openai, sql)
    assert "policy denies db_query read on" in told and "mysql.global_priv" in told
    assert secret not in told
    assert not sub.pending()  # denied by policy: nobody was asked
    (denied,) = [a for a in await engine.store.audit("api-sec") if a.event == "policy_denied"]
    assert "mysql.global_priv" in denied.data["tables"]
    # MariaDB would have answered it: the operator's own !db runs the same SQL.
    out = (await engine.run("console-1", f"!db {sql}", kind="console", is_operator=True)).text
    assert probe_user in out


async def test_a_bare_name_after_use_meets_the_rule_of_the_database_it_means(engine_factory, mariadb,
                                                                            mysql_table, fake_openai, other_db):
    await mysql_table.query(f"CREATE TABLE {other_db}.keep (id INT)")
    await mysql_table.query(f"INSERT INTO {other_db}.keep VALUES (1), (2)")
    gates = gates_toml(table=f"{other_db}.keep", write="deny")
    engine = await db_engine(engine_factory, mariadb, gates=gates)
    told = await model_runs(engine, fake_openai, f"USE {other_db}; DELETE FROM keep")
    assert f"policy denies db_query write on {other_db}.keep" in told
    assert await mysql_table.query(f"SELECT COUNT(*) FROM {other_db}.keep") == [(2,)]
    # A read there is allowed, and reads the table the rule was about.
    told = await model_runs(engine, fake_openai, f"USE {other_db}; SELECT COUNT(*) AS n FROM keep")
    assert told.splitlines()[-1].strip() == "2"


async def test_a_use_hidden_in_dynamic_sql_makes_later_bare_names_refused(engine_factory, mariadb,
                                                                         mysql_table, fake_openai):
    t = await mysql_table("id INT", [(1,)])
    engine = await db_engine(engine_factory, mariadb)
    told = await model_runs(engine, fake_openai,
                            f"EXECUTE IMMEDIATE 'USE mysql'; SELECT Priv FROM global_priv; DELETE FROM {t}")
    assert "could not be checked" in told and "name it with its database" in told
    assert not engine.gatekeeper.broker.pending()
    assert await mysql_table.query(f"SELECT COUNT(*) FROM {t}") == [(1,)]


# ---- item 2 and 9: SHOW forms and the internal schemas ------------------------------------------------


@pytest.mark.parametrize("template", [
    "SHOW CREATE USER '{user}'@'localhost'",
    "SHOW GRANTS FOR '{user}'@'localhost'",
    "SHOW GRANTS",
    "SELECT authentication_string FROM mysql.user WHERE User = '{user}'",
    "SET @h = (SELECT authentication_string FROM mysql.user WHERE User = '{user}'); SELECT @h",
])
async def test_statements_exposing_the_account_tables_are_denied(engine_factory, mariadb, mysql_table,
                                                                 fake_openai, probe_user, template):
    sql = template.format(user=probe_user)
    secret = await password_hash(mysql_table, probe_user)
    engine = await db_engine(engine_factory, mariadb)
    told = await model_runs(engine, fake_openai, sql)
    assert "policy denies" in told and "mysql.global_priv" in told or "mysql.user" in told, told
    assert secret not in told
    stored = [m for m in await engine.history("api-sec") if m.role == "tool"]
    assert all(secret not in str(m.meta) for m in stored)  # nor in the stored rows
    if template.startswith("SHOW") and "{user}" in template:
        # What the gate kept from the model: MariaDB answers it with the hash (the operator's
        # own !db shows it, clipped to the cell width).
        out = (await engine.run("console-1", f"!db {sql}", kind="console", is_operator=True)).text
        assert "IDENTIFIED BY PASSWORD" in out and probe_user in out


@pytest.mark.parametrize("template", [
    "SET @h = (SELECT v FROM {t} LIMIT 1); SELECT @h AS leaked",
    "SET @h = (SELECT v FROM `{t}` LIMIT 1); SELECT @h AS leaked",
    "DO (SELECT v FROM {t} LIMIT 1)",
    # The FROM list goes on past a join keyword, an index hint, a parenthesised
    # table and an ON condition (review: each of these was asked, not denied).
    "SET @h = (SELECT v FROM (SELECT 1 AS x) a STRAIGHT_JOIN {t} LIMIT 1); SELECT @h AS leaked",
    "SET @h = (SELECT {t}.v FROM mysql.help_topic USE INDEX (PRIMARY), {t} LIMIT 1); SELECT @h AS leaked",
    "SET @h = (SELECT v FROM (({t})) LIMIT 1); SELECT @h AS leaked",
    "SET @h = (SELECT v FROM (SELECT 1 AS x) a JOIN ({t}) ON 1 LIMIT 1); SELECT @h AS leaked",
    "SET @h = (SELECT v FROM (SELECT 1 AS x) a JOIN (SELECT 2 AS y) b ON 1, {t} LIMIT 1); SELECT @h AS leaked",
    "PREPARE s FROM 'SELECT v FROM {t}'; EXECUTE s",
    "EXECUTE IMMEDIATE 'SELECT v FROM {t}'",
])
async def test_a_tables_deny_holds_when_a_statement_wraps_its_read_and_names_it_bare(
        engine_factory, mariadb, mysql_table, fake_openai, template):
    """A statement the parser does not read (SET, DO, ...) counts every name in it as a table it
    may touch, bare ones too: a table's deny is not turned into a question an operator could wave
    through by wrapping the read (found by a QA pass: the secret came back after a 'y')."""
    t = await mysql_table("v VARCHAR(20)", [("s3cret-value",)])
    table = f"{mariadb.database}.{t}"
    gates = ('[defaults]\nread = "allow"\nwrite = "ask"\n[db.tables."*"]\nread = "allow"\nwrite = "ask"\n'
             f'[db.tables."{table}"]\nread = "deny"\nwrite = "deny"\n'
             '[db.unknown]\nread = "ask"\nwrite = "ask"\n[wait]\napi = 5\nconsole = 0\n')
    engine = await db_engine(engine_factory, mariadb, gates=gates)
    sub = engine.bus.subscribe(names=[GATE])
    told = await model_runs(engine, fake_openai, template.format(t=t))
    assert "policy denies" in told and table in told, told
    assert "s3cret-value" not in told
    assert not sub.pending()  # refused outright: no gate was opened


@pytest.mark.parametrize(("sql", "table"), [
    ("SHOW FULL PROCESSLIST", "information_schema.processlist"),
    ("SELECT * FROM information_schema.PROCESSLIST", "information_schema.processlist"),
    ("SHOW ENGINE INNODB STATUS", "information_schema.innodb_trx"),
    ("SELECT * FROM mysql.general_log", "mysql.general_log"),
    ("SELECT * FROM performance_schema.threads", "performance_schema.threads"),
    ("SHOW BINLOG EVENTS", "mysql.binlog"),
])
async def test_internal_schemas_exposing_other_connections_are_denied(engine_factory, mariadb, fake_openai,
                                                                      sql, table):
    engine = await db_engine(engine_factory, mariadb)
    told = await model_runs(engine, fake_openai, sql)
    assert told.startswith(f"The gate policy denies db_query read on {table}"), told


@pytest.mark.parametrize("sql", ["SHOW TABLES", "DESCRIBE {t}", "EXPLAIN SELECT * FROM {t}", "SELECT 1 + 1 AS two",
                                 "SHOW COLUMNS FROM {t}", "SELECT NOW() IS NOT NULL AS ok"])
async def test_introspection_and_constant_reads_run_without_a_gate(engine_factory, mariadb, mysql_table,
                                                                   fake_openai, sql):
    # Issue 21 item 4: what the shipped prompt tells the model to run first needs no approval.
    t = await mysql_table("id INT PRIMARY KEY", [(1,)])
    engine = await db_engine(engine_factory, mariadb)
    sub = engine.bus.subscribe(names=[GATE])
    told = await model_runs(engine, fake_openai, sql.format(t=t))
    assert not sub.pending()
    assert "error" not in told.lower() and "denies" not in told
    if sql == "SHOW TABLES":
        assert t in told


# ---- item 7: session approvals by statement kind ----------------------------------------------------


async def test_a_session_approval_of_insert_does_not_let_delete_through(engine_factory, mariadb, mysql_table,
                                                                        fake_openai):
    t = await mysql_table("id INT", [(1,)])
    engine = await db_engine(engine_factory, mariadb)
    table = f"{mariadb.database}.{t}"
    sub = engine.bus.subscribe(names=[GATE])
    fake_openai.script(Reply.tool_calls(("db_query", {"sql": f"INSERT INTO {t} VALUES (2)"})), Reply.text("1"))
    run = asyncio.create_task(engine.run("api-k", "insert", kind="api", timeout=20))
    gate = (await next_event(sub, GATE)).data
    # What the inbox and the details view show for `s`, word for word.
    assert gate["session_grant"] == (f"later db_query calls of this session that run only INSERT on "
                                     f"exactly {table} pass without asking")
    engine.gatekeeper.broker.resolve(gate["id"], "approve", "session", by="op")
    await run
    # Another INSERT into the same table passes by the grant...
    await model_runs(engine, fake_openai, f"INSERT INTO {t} VALUES (3)", session="api-k")
    assert not sub.pending()
    assert await mysql_table.query(f"SELECT id FROM {t} ORDER BY id") == [(1,), (2,), (3,)]
    # ...a DELETE on it does not: it asks, and denied, the rows stay.
    for sql in (f"DELETE FROM {t} WHERE id = 2", f"UPDATE {t} SET id = 9", f"DROP TABLE {t}",
                f"INSERT INTO {t} VALUES (4); DELETE FROM {t}"):
        fake_openai.script(Reply.tool_calls(("db_query", {"sql": sql})), Reply.text("no"))
        run = asyncio.create_task(engine.run("api-k", "more", kind="api", timeout=20))
        gate = (await next_event(sub, GATE)).data
        assert gate["args"] == {"sql": sql}
        engine.gatekeeper.broker.resolve(gate["id"], "deny", by="op")
        await run
    assert await mysql_table.query(f"SELECT id FROM {t} ORDER BY id") == [(1,), (2,), (3,)]


# ---- item 5: credentials and forged lines -------------------------------------------------------------


@pytest.fixture
def aiops_log(tmp_path: Path) -> AsyncIterator[Path]:
    """aiops.log as `aiops serve` writes it (its handler and formatter, on the root logger)."""
    path = tmp_path / "aiops.log"
    handler = log_file_handler(path)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield path
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        handler.close()


async def test_a_password_in_sql_is_masked_in_the_gate_the_audit_and_the_log(engine_factory, mariadb,
                                                                             mysql_table, fake_openai, aiops_log):
    user = f"aiops_pw_{uuid.uuid4().hex[:6]}"
    sql = f"CREATE USER '{user}'@'localhost' IDENTIFIED BY '{PASSWORD}'"
    engine = await db_engine(engine_factory, mariadb)
    sub = engine.bus.subscribe(names=[GATE])
    fake_openai.script(Reply.tool_calls(("db_query", {"sql": sql})), Reply.text("no"))
    run = asyncio.create_task(engine.run("api-pw", "make a user", kind="api", timeout=20))
    gate = (await next_event(sub, GATE)).data
    # The operator sees the statement with the password masked, in the arguments and the summary.
    assert gate["args"] == {"sql": f"CREATE USER '{user}'@'localhost' IDENTIFIED BY '***'"}
    assert "IDENTIFIED BY '***'" in gate["summary"] and PASSWORD not in gate["summary"]
    engine.gatekeeper.broker.resolve(gate["id"], "deny", by="op")
    await run
    assert await mysql_table.query("SELECT COUNT(*) FROM mysql.global_priv WHERE User = %s", [user]) == [(0,)]
    # The operator's own !db runs it as written, and audits it masked.
    try:
        out = (await engine.run("console-1", f"!db {sql}", kind="console", is_operator=True)).text
        assert "0 rows affected" in out
        assert await mysql_table.query("SELECT COUNT(*) FROM mysql.global_priv WHERE User = %s", [user]) == [(1,)]
        await engine.run("console-1", f"!db ALTER USER '{user}'@'localhost' IDENTIFIED BY '{PASSWORD}2'",
                         kind="console", is_operator=True)
        await engine.run("console-1", f"!db SET PASSWORD FOR '{user}'@'localhost' = PASSWORD('{PASSWORD}3')",
                         kind="console", is_operator=True)
    finally:
        await mysql_table.query(f"DROP USER IF EXISTS '{user}'@'localhost'")
    audit = await engine.store.audit()
    assert [a.data["sql"] for a in audit if a.event == "operator_db"] == [
        f"CREATE USER '{user}'@'localhost' IDENTIFIED BY '***'",
        f"ALTER USER '{user}'@'localhost' IDENTIFIED BY '***'",
        f"SET PASSWORD FOR '{user}'@'localhost' = '***'"]
    assert all(PASSWORD not in str(a.data) for a in audit)
    text = aiops_log.read_text()
    assert PASSWORD not in text


async def test_sql_crafted_to_forge_log_lines_stays_on_one_line(engine_factory, mariadb, fake_openai, aiops_log):
    # sqlglot logs a statement it only half understands; this one carries a forged record and a
    # terminal escape.
    forged = "2030-01-01 00:00:00,000 ERROR aiops.auth: operator token leaked"
    sql = f"ALTER DATABASE test\n{forged}\n\x1b[2J CHARACTER SET = utf8mb4"
    engine = await db_engine(engine_factory, mariadb)
    fake_openai.script(Reply.tool_calls(("db_query", {"sql": sql})), Reply.text("no"),
                       Reply.tool_calls(("db_query", {"sql": "SELECT x FROM\n" + forged})), Reply.text("no"))
    sub = engine.bus.subscribe(names=[GATE])

    async def deny_every_gate() -> None:
        while True:
            gate = (await next_event(sub, GATE, timeout=30)).data
            engine.gatekeeper.broker.resolve(gate["id"], "deny", by="op")

    denier = asyncio.create_task(deny_every_gate())
    try:
        await engine.run("api-log", "alter", kind="api", timeout=20)
        await engine.run("api-log", "select", kind="api", timeout=20)
    finally:
        denier.cancel()
    lines = aiops_log.read_text().splitlines()
    # sqlglot did log about the statement, without it.
    assert any("sqlglot reported a statement used syntax it does not support" in line for line in lines)
    assert not any(line.startswith(forged) for line in lines)
    assert not any("\x1b" in line for line in lines)
    assert not any("operator token leaked" in line for line in lines if "sqlglot" in line)
