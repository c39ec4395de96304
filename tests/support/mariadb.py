"""pytest plugin: the real MariaDB server that MySQL tests run against.

Fixtures:
- `mariadb` — a `MySQLSettings` (enabled) pointing at the test server. When the server is not
  reachable the test is skipped, or fails loudly when CI=true (CI must never skip silently).
- `mysql_table` — a factory creating uniquely named tables (`t_<test>_<hex>`) that are dropped at
  teardown, pass or fail; it can also run admin SQL on its own connection, independent of the code
  under test.

Tests using `mariadb` get the `mariadb` marker automatically, so `-m "not mariadb"` deselects them.
Environment overrides: AIOPS_TEST_MYSQL_HOST / _PORT / _USER / _PASSWORD / _DATABASE.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiomysql
import pymysql
import pytest

from aiops.integrations.mysql import MySQLSettings

PASSWORD_ENV = "AIOPS_TEST_MYSQL_PASSWORD"


@dataclass(frozen=True, slots=True)
class MariaDBTarget:
    settings: MySQLSettings
    reachable: bool
    reason: str
    version: str = ""


def _target_settings() -> MySQLSettings:
    env = os.environ
    return MySQLSettings(
        enabled=True,
        host=env.get("AIOPS_TEST_MYSQL_HOST", "127.0.0.1"),
        port=int(env.get("AIOPS_TEST_MYSQL_PORT", "3306")),
        user=env.get("AIOPS_TEST_MYSQL_USER", "root"),
        # The runner reads the password from this variable; unset means an empty password.
        password_env=PASSWORD_ENV,
        database=env.get("AIOPS_TEST_MYSQL_DATABASE", "test"),
    )


def pytest_configure(config: pytest.Config) -> None:
    # Also declared in pyproject; repeated so the plugin stands alone (e.g. `-p tests.support.mariadb`).
    config.addinivalue_line("markers", "mariadb: needs the MariaDB server at 127.0.0.1:3306")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "mariadb" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.mariadb)


@pytest.fixture(scope="session")
def mariadb_target() -> MariaDBTarget:
    """Probe the server once per session (a short synchronous connect, before any event loop)."""
    settings = _target_settings()
    params = settings.connection_params()
    try:
        conn = pymysql.connect(host=params.host, port=params.port, user=params.user,
                               password=params.password, database=params.database, connect_timeout=3)
    except pymysql.Error as exc:
        reason = (f"MariaDB is not reachable at {params.address} as {params.user!r}, database "
                  f"{params.database!r}: {exc} (start it with `start-stop-daemon --start --oknodo "
                  f"--background --exec /usr/sbin/mariadbd`, or set AIOPS_TEST_MYSQL_*)")
        return MariaDBTarget(settings, False, reason)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT VERSION()")
            row = cur.fetchone()
    finally:
        conn.close()
    return MariaDBTarget(settings, True, "", str(row[0]) if row else "")


@pytest.fixture
def mariadb(mariadb_target: MariaDBTarget) -> MySQLSettings:
    """Settings for the test server; a fresh copy per test, so tests may `model_copy(update=…)` it."""
    if not mariadb_target.reachable:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(mariadb_target.reason, pytrace=False)
        pytest.skip(mariadb_target.reason)
    return mariadb_target.settings.model_copy()


class TableFactory:
    """Creates tables for one test and drops them afterwards; also an independent admin connection."""

    def __init__(self, settings: MySQLSettings, test_name: str) -> None:
        self._settings = settings
        self._prefix = "t_" + (re.sub(r"[^a-z0-9_]+", "_", test_name.lower()).strip("_")[:40] or "test")
        self._conn: aiomysql.Connection | None = None
        self.created: list[str] = []

    async def _connection(self) -> aiomysql.Connection:
        if self._conn is None or self._conn.closed:
            p = self._settings.connection_params()
            self._conn = await aiomysql.connect(host=p.host, port=p.port, user=p.user, password=p.password,
                                                db=p.database, autocommit=True, charset="utf8mb4")
        return self._conn

    async def __call__(self, columns: str, rows: Sequence[Sequence[Any]] = (), *,
                       options: str = "ENGINE=InnoDB") -> str:
        """CREATE TABLE <unique name> (<columns>) <options>, insert `rows`, return the name."""
        name = f"{self._prefix}_{uuid.uuid4().hex[:8]}"
        conn = await self._connection()
        async with conn.cursor() as cur:
            await cur.execute(f"CREATE TABLE `{name}` ({columns}) {options}")
            self.created.append(name)
            if rows:
                marks = ", ".join(["%s"] * len(rows[0]))
                await cur.executemany(f"INSERT INTO `{name}` VALUES ({marks})", [tuple(r) for r in rows])
        return name

    async def query(self, sql: str, args: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        """Run SQL on the fixture's own connection (autocommit), e.g. to check what a test changed."""
        conn = await self._connection()
        async with conn.cursor() as cur:
            await cur.execute(sql, args)
            return [tuple(r) for r in await cur.fetchall()] if cur.description else []

    async def aclose(self) -> None:
        try:
            if self.created:
                conn = await self._connection()
                async with conn.cursor() as cur:
                    await cur.execute("DROP TABLE IF EXISTS " + ", ".join(f"`{n}`" for n in self.created))
        finally:
            if self._conn is not None:
                self._conn.close()


@pytest.fixture
async def mysql_table(mariadb: MySQLSettings, request: pytest.FixtureRequest) -> AsyncIterator[TableFactory]:
    factory = TableFactory(mariadb, request.node.name)
    try:
        yield factory
    finally:
        await factory.aclose()
