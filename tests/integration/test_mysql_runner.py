"""MySQLRunner against the real MariaDB server (plus the pure parts: splitting, settings, rendering)."""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from aiops.integrations.mysql import DatabaseError, MySQLRunner, MySQLSettings, QueryResult, split_statements
from tests.support.mariadb import TableFactory

REPO_ROOT = Path(__file__).resolve().parents[2]

RunnerFactory = Callable[..., MySQLRunner]


@pytest.fixture
async def make_runner() -> AsyncIterator[RunnerFactory]:
    runners: list[MySQLRunner] = []

    def make(settings: MySQLSettings, **kwargs: object) -> MySQLRunner:
        runner = MySQLRunner(settings, **kwargs)  # type: ignore[arg-type]
        runners.append(runner)
        return runner

    yield make
    for runner in runners:
        await runner.close()


async def wait_until(condition: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


async def connection_gone(admin: TableFactory, connection_id: int) -> bool:
    rows = await admin.query("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s",
                             (connection_id,))
    return rows[0][0] == 0


async def running_sleep(admin: TableFactory, connection_id: int) -> bool:
    rows = await admin.query("SELECT COUNT(*) FROM information_schema.PROCESSLIST "
                             "WHERE ID = %s AND INFO LIKE '%%SLEEP%%'", (connection_id,))
    return rows[0][0] == 1


async def connection_id(runner: MySQLRunner) -> int:
    (result,) = await runner.execute("SELECT CONNECTION_ID()", "read")
    return int(result.rows[0][0])


# ---- reads and writes ----------------------------------------------------------------------------


async def test_read_returns_columns_and_rows(mariadb: MySQLSettings, mysql_table: TableFactory,
                                            make_runner: RunnerFactory) -> None:
    table = await mysql_table("id INT PRIMARY KEY, name VARCHAR(20)", [(1, "ada"), (2, None)])
    runner = make_runner(mariadb)

    (result,) = await runner.execute(f"SELECT id, name FROM {table} ORDER BY id", "read")

    assert result.columns == ["id", "name"]
    assert result.rows == [(1, "ada"), (2, None)]
    assert (result.total_rows, result.truncated, result.affected_rows) == (2, False, None)
    assert result.to_text().splitlines() == ["id | name", "---+-----", "1  | ada", "2  | NULL"]
    assert runner.flavour == "mariadb"


async def test_row_cap_reports_the_rows_not_shown(mariadb: MySQLSettings, mysql_table: TableFactory,
                                                 make_runner: RunnerFactory) -> None:
    table = await mysql_table("id INT PRIMARY KEY", [(i,) for i in range(250)])
    runner = make_runner(mariadb.model_copy(update={"max_rows": 200}))

    (result,) = await runner.execute(f"SELECT id FROM {table} ORDER BY id", "read")

    assert len(result.rows) == 200 and result.rows[-1] == (199,)
    assert result.total_rows == 250 and result.truncated
    assert result.to_text().endswith("\n50 more rows not shown")
    assert result.to_dict()["truncated"] is True


@pytest.mark.parametrize("smuggled", [
    "DELETE FROM {t}",
    "UPDATE {t} SET v = 'changed'",
    "DROP TABLE {t}",  # DDL commits implicitly: a read-only transaction alone would let it through
    "TRUNCATE TABLE {t}",
    "SET STATEMENT tx_read_only=0 FOR DELETE FROM {t}",
    "COMMIT; DELETE FROM {t}",
    "SELECT 1; START TRANSACTION; DELETE FROM {t}",
])
async def test_write_inside_a_read_is_refused_and_changes_nothing(
        smuggled: str, mariadb: MySQLSettings, mysql_table: TableFactory,
        make_runner: RunnerFactory) -> None:
    table = await mysql_table("id INT PRIMARY KEY, v VARCHAR(20)", [(1, "a"), (2, "b")])
    runner = make_runner(mariadb)

    with pytest.raises(DatabaseError) as caught:
        await runner.execute(smuggled.format(t=table), "read")

    assert caught.value.kind == "refused"
    assert "read-only" in str(caught.value)
    assert await mysql_table.query(f"SELECT id, v FROM {table} ORDER BY id") == [(1, "a"), (2, "b")]


async def test_write_commits_and_reports_affected_rows(mariadb: MySQLSettings, mysql_table: TableFactory,
                                                      make_runner: RunnerFactory) -> None:
    table = await mysql_table("id INT PRIMARY KEY, v VARCHAR(20)", [(1, "a")])
    runner = make_runner(mariadb)

    insert, update = await runner.execute(
        f"INSERT INTO {table} VALUES (2, 'b'), (3, 'c'); UPDATE {table} SET v = 'z' WHERE id >= 2", "write")

    assert (insert.affected_rows, update.affected_rows) == (2, 2)
    assert insert.columns == [] and not insert.has_result_set
    assert insert.to_text() == "2 rows affected"
    # Seen from another connection: committed.
    assert await mysql_table.query(f"SELECT id, v FROM {table} ORDER BY id") == [(1, "a"), (2, "z"), (3, "z")]


async def test_failed_write_rolls_back_every_statement(mariadb: MySQLSettings, mysql_table: TableFactory,
                                                      make_runner: RunnerFactory) -> None:
    table = await mysql_table("id INT PRIMARY KEY", [(1,)])
    runner = make_runner(mariadb)

    with pytest.raises(DatabaseError) as caught:
        await runner.execute(f"INSERT INTO {table} VALUES (2); INSERT INTO {table} VALUES (1)", "write")

    assert caught.value.code == 1062
    assert "statement 2 of 2" in str(caught.value) and "rolled back" in str(caught.value)
    assert await mysql_table.query(f"SELECT id FROM {table}") == [(1,)]


async def test_sql_error_carries_the_server_code_and_message(mariadb: MySQLSettings,
                                                            make_runner: RunnerFactory) -> None:
    runner = make_runner(mariadb)

    with pytest.raises(DatabaseError) as caught:
        await runner.execute("SELECT * FROM no_such_table_here", "read")

    assert caught.value.kind == "sql" and caught.value.code == 1146
    assert "1146" in str(caught.value) and "no_such_table_here' doesn't exist" in str(caught.value)
    # The runner is still usable afterwards.
    (result,) = await runner.execute("SELECT 1", "read")
    assert result.rows == [(1,)]


async def test_statement_timeout_interrupts_sleep(mariadb: MySQLSettings, make_runner: RunnerFactory) -> None:
    runner = make_runner(mariadb.model_copy(update={"statement_timeout_ms": 500}))

    started = time.monotonic()
    with pytest.raises(DatabaseError) as caught:
        await runner.execute("SELECT SLEEP(5)", "read")

    assert time.monotonic() - started < 4
    assert caught.value.kind == "timeout"
    assert str(caught.value).startswith("statement timeout")
    assert "500 ms" in str(caught.value)
    (result,) = await runner.execute("SELECT 2", "read")
    assert result.rows == [(2,)]


async def test_stacked_statements_give_one_result_each(mariadb: MySQLSettings,
                                                      make_runner: RunnerFactory) -> None:
    runner = make_runner(mariadb)

    results = await runner.execute("SELECT 1 AS a; SELECT 'x;y' AS b; -- a comment; not a statement\n"
                                   "SELECT 3 AS c /* ; */;", "read")

    assert [r.columns for r in results] == [["a"], ["b"], ["c"]]
    assert [r.rows for r in results] == [[(1,)], [("x;y",)], [(3,)]]
    assert results[1].statement == "SELECT 'x;y' AS b"


async def test_server_warnings_are_reported(mariadb: MySQLSettings, make_runner: RunnerFactory) -> None:
    runner = make_runner(mariadb)

    (result,) = await runner.execute("SELECT 1/0 AS q", "read")

    assert result.rows == [(None,)]
    assert any("Division by 0" in w for w in result.warnings)
    assert "warning: " in result.to_text()


async def test_to_dict_is_json_safe(mariadb: MySQLSettings, mysql_table: TableFactory,
                                    make_runner: RunnerFactory) -> None:
    table = await mysql_table(
        "id INT PRIMARY KEY, at DATETIME(6), day DATE, span TIME, price DECIMAL(10,2), raw VARBINARY(8), "
        "note VARCHAR(10)")
    # A literal rather than parameters: aiomysql 0.3 cannot escape bytes parameters.
    await mysql_table.query(f"INSERT INTO {table} VALUES "
                            "(1, '2024-01-02 03:04:05.123456', '2024-01-02', '-26:03:00', 12.50, X'00FF', NULL)")
    runner = make_runner(mariadb)

    (result,) = await runner.execute(f"SELECT * FROM {table}", "read")
    encoded = json.loads(json.dumps(result.to_dict()))

    assert isinstance(result.rows[0][1], dt.datetime) and isinstance(result.rows[0][4], decimal.Decimal)
    assert encoded["columns"] == ["id", "at", "day", "span", "price", "raw", "note"]
    assert encoded["rows"] == [[1, "2024-01-02T03:04:05.123456", "2024-01-02", "-26:03:00", "12.50", "0x00ff",
                                None]]
    assert encoded["total_rows"] == 1 and encoded["affected_rows"] is None


# ---- connections ---------------------------------------------------------------------------------


async def test_unreachable_server_gives_a_clear_error_quickly(make_runner: RunnerFactory) -> None:
    runner = make_runner(MySQLSettings(enabled=True, host="127.0.0.1", port=1), connect_timeout=2.0)

    started = time.monotonic()
    with pytest.raises(DatabaseError) as caught:
        await runner.execute("SELECT 1", "read")

    assert time.monotonic() - started < 3
    assert caught.value.kind == "connection"
    assert str(caught.value).startswith("cannot connect to MySQL at 127.0.0.1:1: ")
    assert "Traceback" not in str(caught.value)


async def test_killed_idle_connection_is_replaced_on_the_next_read(
        mariadb: MySQLSettings, mysql_table: TableFactory, make_runner: RunnerFactory) -> None:
    runner = make_runner(mariadb)
    first = await connection_id(runner)

    await mysql_table.query(f"KILL CONNECTION {first}")
    await wait_until(lambda: connection_gone(mysql_table, first))

    assert await connection_id(runner) != first


async def test_read_killed_mid_statement_is_retried(mariadb: MySQLSettings, mysql_table: TableFactory,
                                                    make_runner: RunnerFactory) -> None:
    runner = make_runner(mariadb)
    victim = await connection_id(runner)  # the pool's only connection, so the next call uses it again

    read = asyncio.create_task(runner.execute(
        f"SELECT CONNECTION_ID() AS id, SLEEP(IF(CONNECTION_ID() = {victim}, 30, 0)) AS slept", "read"))
    await wait_until(lambda: running_sleep(mysql_table, victim))
    await mysql_table.query(f"KILL CONNECTION {victim}")
    (result,) = await read

    assert result.rows[0][0] != victim and result.rows[0][1] == 0


async def test_write_killed_mid_transaction_is_not_retried(mariadb: MySQLSettings, mysql_table: TableFactory,
                                                           make_runner: RunnerFactory) -> None:
    table = await mysql_table("id INT PRIMARY KEY")
    runner = make_runner(mariadb)
    victim = await connection_id(runner)

    # On any other connection this write would finish at once, so a retry would leave a row behind.
    write = asyncio.create_task(runner.execute(
        f"INSERT INTO {table} VALUES (1); DO SLEEP(IF(CONNECTION_ID() = {victim}, 30, 0))", "write"))
    await wait_until(lambda: running_sleep(mysql_table, victim))
    await mysql_table.query(f"KILL CONNECTION {victim}")
    with pytest.raises(DatabaseError) as caught:
        await write

    assert caught.value.kind == "connection"
    assert "not committed" in str(caught.value)
    assert await mysql_table.query(f"SELECT id FROM {table}") == []


async def test_write_on_a_dead_pooled_connection_runs_exactly_once(
        mariadb: MySQLSettings, mysql_table: TableFactory, make_runner: RunnerFactory) -> None:
    table = await mysql_table("id INT AUTO_INCREMENT PRIMARY KEY, v INT")
    runner = make_runner(mariadb)
    first = await connection_id(runner)
    await mysql_table.query(f"KILL CONNECTION {first}")
    await wait_until(lambda: connection_gone(mysql_table, first))

    (result,) = await runner.execute(f"INSERT INTO {table} (v) VALUES (7)", "write")

    assert result.affected_rows == 1
    assert await mysql_table.query(f"SELECT v FROM {table}") == [(7,)]


async def test_cancelled_read_does_not_leave_the_query_running(
        mariadb: MySQLSettings, mysql_table: TableFactory, make_runner: RunnerFactory) -> None:
    runner = make_runner(mariadb)
    victim = await connection_id(runner)

    read = asyncio.create_task(runner.execute("SELECT SLEEP(30)", "read"))
    await wait_until(lambda: running_sleep(mysql_table, victim))
    read.cancel()
    with pytest.raises(asyncio.CancelledError):
        await read

    await wait_until(lambda: connection_gone(mysql_table, victim))
    assert await connection_id(runner) != victim


async def test_malformed_dsn_is_a_config_error_without_the_password(make_runner: RunnerFactory) -> None:
    settings = MySQLSettings(enabled=True, dsn_env="DSN")
    runner = make_runner(settings, env={"DSN": "postgres://u:s3cret@db/x"})

    with pytest.raises(DatabaseError) as caught:
        await runner.execute("SELECT 1", "read")

    assert caught.value.kind == "config" and "s3cret" not in str(caught.value)


# ---- the fixture's CI contract -------------------------------------------------------------------


@pytest.mark.parametrize(("ci", "outcome"), [("true", "1 error"), ("", "1 skipped")])
def test_unreachable_mariadb_fails_under_ci_and_skips_otherwise(ci: str, outcome: str, tmp_path: Path) -> None:
    (tmp_path / "test_needs_db.py").write_text(textwrap.dedent("""
        def test_needs_db(mariadb):
            pass
    """))
    env = {**os.environ, "CI": ci, "AIOPS_TEST_MYSQL_PORT": "1", "PYTHONPATH": str(REPO_ROOT),
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rfs", "-p", "tests.support.mariadb", "-c", os.devnull,
         "--rootdir", str(tmp_path), "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)

    assert outcome in proc.stdout, proc.stdout + proc.stderr
    assert "MariaDB is not reachable at 127.0.0.1:1" in proc.stdout


# ---- pure parts ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("sql", "expected"), [
    ("SELECT 1", ["SELECT 1"]),
    ("SELECT 1;;  SELECT 2 ;", ["SELECT 1", "SELECT 2"]),
    ("SELECT 'a;b', `c;d` FROM t; SELECT \"e;f\"", ["SELECT 'a;b', `c;d` FROM t", "SELECT \"e;f\""]),
    ("SELECT 'it\\'s;' AS x; SELECT 2", ["SELECT 'it\\'s;' AS x", "SELECT 2"]),
    ("SELECT 1 -- one; two\n; # three; four\nSELECT 2", ["SELECT 1 -- one; two", "# three; four\nSELECT 2"]),
    ("SELECT 1; /* only a comment; */", ["SELECT 1"]),
    ("  ;  -- nothing\n", []),
    ("SELECT CASE WHEN 1 THEN 2 END; SELECT 3", ["SELECT CASE WHEN 1 THEN 2 END", "SELECT 3"]),
    ("CREATE PROCEDURE p() BEGIN IF 1 THEN SELECT 1; END IF; CASE WHEN 1 THEN SELECT 2; END CASE; END; CALL p()",
     ["CREATE PROCEDURE p() BEGIN IF 1 THEN SELECT 1; END IF; CASE WHEN 1 THEN SELECT 2; END CASE; END",
      "CALL p()"]),
    ("BEGIN; INSERT INTO t VALUES (1); COMMIT", ["BEGIN", "INSERT INTO t VALUES (1)", "COMMIT"]),
    ("BEGIN NOT ATOMIC SELECT 1; SELECT 2; END; SELECT 3", ["BEGIN NOT ATOMIC SELECT 1; SELECT 2; END", "SELECT 3"]),
    ("SELECT 'unterminated", ["SELECT 'unterminated"]),
])
def test_split_statements(sql: str, expected: list[str]) -> None:
    assert split_statements(sql) == expected


def test_settings_resolve_password_and_dsn_from_the_environment() -> None:
    settings = MySQLSettings(host="db1", port=3307, user="app", database="shop", dsn_env="APP_DSN")

    plain = settings.connection_params({"MYSQL_PASSWORD": "pw"})
    assert (plain.host, plain.port, plain.user, plain.password, plain.database) == ("db1", 3307, "app", "pw", "shop")
    assert "pw" not in repr(plain) and "pw" not in plain.describe()
    assert settings.connection_params({}).password == ""

    dsn = settings.connection_params({"APP_DSN": "mysql://ro%40x:p%3Ass@db2:3310/sales", "MYSQL_PASSWORD": "pw"})
    assert (dsn.host, dsn.port, dsn.user, dsn.password, dsn.database) == ("db2", 3310, "ro@x", "p:ss", "sales")
    partial = settings.connection_params({"APP_DSN": "mariadb://db3", "MYSQL_PASSWORD": "pw"})
    assert (partial.host, partial.port, partial.user, partial.password, partial.database) == (
        "db3", 3306, "app", "pw", "shop")


def test_settings_reject_unknown_keys() -> None:
    with pytest.raises(ValueError, match="extra"):
        MySQLSettings.model_validate({"enabled": True, "pasword_env": "X"})


def test_to_text_clips_long_cells_and_counts_writes() -> None:
    table = QueryResult(columns=["k", "v"], rows=[(1, "x" * 500), (2, "two\nlines")], total_rows=2,
                        truncated=False, affected_rows=None, elapsed_ms=1.0)
    lines = table.to_text(max_cell_chars=20).splitlines()
    assert lines[2] == "1 | " + "x" * 19 + "…"
    assert lines[3] == "2 | two\\nlines"
    assert QueryResult([], [], 0, False, 1, 0.5).to_text() == "1 row affected"
    empty = QueryResult(["a"], [], 0, False, None, 0.5)
    assert empty.to_text().splitlines() == ["a", "-", "(0 rows)"]


def test_a_named_secret_that_is_not_set_is_reported() -> None:
    dsn = MySQLSettings.model_validate({"enabled": True, "dsn_env": "NOPE_DSN"})
    assert dsn.missing_secret({}) == "environment variable NOPE_DSN is not set (dsn_env in [mysql])"
    assert dsn.missing_secret({"NOPE_DSN": "mysql://db"}) is None
    named = MySQLSettings.model_validate({"enabled": True, "password_env": "DB_PW"})
    assert named.missing_secret({}) == "environment variable DB_PW is not set (password_env in [mysql])"
    assert named.missing_secret({"DB_PW": ""}) is None  # set but empty: a server without a password
    # Left out of the file, the default MYSQL_PASSWORD stays optional.
    assert MySQLSettings.model_validate({"enabled": True}).missing_secret({}) is None


@pytest.mark.parametrize(("sql", "database", "tables"), [
    ("DELETE FROM users", "test", ("test.users",)),
    ("SELECT * FROM users JOIN shop.orders", "Test", ("shop.orders", "test.users")),
    ("SELECT * FROM information_schema.tables", "test", ("information_schema.tables",)),
    # A bare name means the database in effect where its statement runs: after a USE, that one.
    ("USE shop; DELETE FROM users", "test", ("shop.users",)),
    ("SELECT * FROM a; USE `Shop`; DELETE FROM b; USE test; SELECT * FROM c", "test",
     ("shop.b", "test.a", "test.c")),
    ("DELETE FROM users", "", ("users",)),
])
def test_gate_tables_qualify_bare_names_with_the_configured_database(sql: str, database: str,
                                                                     tables: tuple[str, ...]) -> None:
    from aiops.gates.sql import classify_sql
    from aiops.integrations.mysql_plugin import gate_tables

    assert gate_tables(classify_sql(sql), database) == tables


def test_db_query_classification_says_when_its_tables_do_not_describe_the_call() -> None:
    # What the gatekeeper keeps session approvals from (tests/integration/test_db_gates.py shows
    # the end-to-end effect): no table named, or a statement acting beyond its tables.
    from aiops.integrations.mysql_plugin import DbQueryArgs, make_classifier

    classify = make_classifier("test")
    described = classify(DbQueryArgs(sql="UPDATE users SET a = 1"))
    assert described.tables == ("test.users",) and not described.unknown_tables
    for sql in ("SET @x = 1", "RENAME TABLE users TO x", "SELECT * FROM users INTO OUTFILE '/tmp/x'",
                "DROP DATABASE shop", "SELECT 1"):
        c = classify(DbQueryArgs(sql=sql))
        assert c.unknown_tables or not c.tables, sql
