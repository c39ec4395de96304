"""MySQL/MariaDB execution layer behind the agent's `db_query` tool.

The caller (the tool, after the gate) has already classified the SQL as a read or a write and had it
approved. The runner does not classify again; it uses `operation` only to choose its protective
measures:

- reads run in `START TRANSACTION READ ONLY` … `COMMIT`, and on MariaDB every statement also carries
  `tx_read_only=1` (a read-only *transaction* alone lets DDL through, because DDL commits implicitly);
  statements that would leave the runner's transaction or switch the read-only state off are refused;
- writes run with autocommit off and are committed at the end, rolled back on any error;
- every statement carries the statement timeout (MariaDB: `SET STATEMENT max_statement_time=… FOR`;
  MySQL: the `max_execution_time` session variable), with a client-side watchdog as a backstop for
  what the server-side limit does not cover;
- the server is told to refuse multi-statement strings, so a string the splitter took for one
  statement can never run as several outside those limits.

Errors reach the caller as `DatabaseError` with text meant for the model and the operator; the
password never appears in logs or messages.

The settings and connection parameters are in mysql_settings, the results and their formatting in
mysql_results, statement splitting and the read-only refusals in mysql_statements; the names below
are importable from here.
"""

from __future__ import annotations

import asyncio
import contextlib
import decimal
import logging
import os
import re
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import aiomysql
from pymysql.constants import COMMAND

from aiops.integrations.mysql_results import QueryResult
from aiops.integrations.mysql_settings import ConnectionParams, MySQLSettings
from aiops.integrations.mysql_statements import Statement, parse_statements, read_refusal, split_statements

log = logging.getLogger(__name__)

Operation = Literal["read", "write"]
Flavour = Literal["mariadb", "mysql"]
ErrorKind = Literal["sql", "refused", "timeout", "connection", "config"]

__all__ = [
    "ConnectionParams",
    "DatabaseError",
    "MySQLRunner",
    "MySQLSettings",
    "QueryResult",
    "split_statements",
]


# ---- errors --------------------------------------------------------------------------------------


class DatabaseError(Exception):
    """A failure phrased for the model: SQL error, refusal, timeout, connection or config problem.

    `code` is the server's (or client library's) error number when there is one.
    """

    def __init__(self, message: str, *, kind: ErrorKind = "sql", code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.kind: ErrorKind = kind
        self.code = code

    def __str__(self) -> str:
        return self.message


# Server/client error numbers.
_ER_READ_ONLY_TRANSACTION = 1792
_ER_STATEMENT_TIMEOUT = 1969  # MariaDB max_statement_time
_ER_QUERY_TIMEOUT = 3024  # MySQL max_execution_time
_ER_QUERY_INTERRUPTED = 1317  # KILL QUERY (our watchdog, or an operator)
# The connection is gone: server gone away / lost during query / killed / shutdown / idle timeout.
_LOST_CODES = frozenset({2006, 2013, 2055, 1927, 1053, 4031})


def _error_code(exc: BaseException) -> int | None:
    args = getattr(exc, "args", ())
    if args and isinstance(args[0], int):
        return args[0]
    return None


def _server_message(exc: BaseException) -> str:
    args = getattr(exc, "args", ())
    code = _error_code(exc)
    if code is not None and len(args) > 1:
        return f"MySQL error {code}: {args[1]}"
    return str(exc) or type(exc).__name__


# ---- the runner ----------------------------------------------------------------------------------


class _RunnerCursor(aiomysql.SSCursor):
    """Unbuffered, so a huge result streams past the row cap instead of filling memory."""

    async def _show_warnings(self, conn: Any) -> None:
        # aiomysql would raise Python warnings (printed over the console); the runner collects the
        # server's warnings into QueryResult.warnings instead.
        return None


@dataclass(slots=True)
class _Progress:
    index: int = -1  # statement being run (0-based); -1 before the first
    sent: bool = False  # whether any of the caller's statements reached the server
    phase: Literal["prepare", "statement", "commit"] = "prepare"


_WATCHDOG_GRACE_S = 1.0
_MAX_WARNINGS = 10
_DRAIN_CHUNK = 1000


class _Watchdog:
    """Kills the statement from a second connection if the server-side limit did not stop it."""

    def __init__(self, runner: MySQLRunner, thread_id: int, delay: float) -> None:
        self.fired = False
        self._runner = runner
        self._thread_id = thread_id
        self._task = asyncio.create_task(self._run(delay))

    async def _run(self, delay: float) -> None:
        await asyncio.sleep(delay)
        self.fired = True
        log.warning("statement on MySQL connection %d outlived its timeout; killing the query",
                    self._thread_id)
        await self._runner._kill(self._thread_id, "QUERY")

    async def stop(self) -> None:
        if not self.fired:
            self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


class MySQLRunner:
    """Runs already-gated SQL against MySQL or MariaDB through a lazily created aiomysql pool."""

    def __init__(self, settings: MySQLSettings, env: Mapping[str, str] = os.environ, *,
                 connect_timeout: float = 5.0) -> None:
        self._settings = settings
        self._env = env
        self._connect_timeout = connect_timeout
        self._params: ConnectionParams | None = None
        self._pool: aiomysql.Pool | None = None
        self._pool_lock = asyncio.Lock()
        self._closed = False
        self._flavour: Flavour | None = None
        self._server_version: str | None = None
        self._read_only_var = "tx_read_only"
        # Connections already switched to single-statement mode (and, on MySQL, given the timeout).
        self._prepared: weakref.WeakSet[aiomysql.Connection] = weakref.WeakSet()
        # Connections that must not go back to the pool (a KILL may still be aimed at them).
        self._poisoned: weakref.WeakSet[aiomysql.Connection] = weakref.WeakSet()
        self._background: set[asyncio.Task[None]] = set()

    @property
    def settings(self) -> MySQLSettings:
        return self._settings

    @property
    def flavour(self) -> Flavour | None:
        """"mariadb" or "mysql" once a connection was made, else None."""
        return self._flavour

    @property
    def server_version(self) -> str | None:
        return self._server_version

    # -- public API --

    async def execute(self, sql: str, operation: Operation, *,
                      max_rows: int | None = None) -> list[QueryResult]:
        """Run every statement of `sql`; one result per statement, in order.

        Reads run read-only and are retried once on a fresh connection if the connection was lost;
        writes run in one transaction, committed at the end, and are only retried when the connection
        proved dead before any of their statements reached the server.
        """
        if operation not in ("read", "write"):
            raise ValueError(f"operation must be 'read' or 'write', not {operation!r}")
        if self._closed:
            raise DatabaseError("the MySQL runner is closed", kind="connection")
        statements = parse_statements(sql)
        if not statements:
            raise DatabaseError("nothing to run: the SQL holds no statement", kind="refused")
        if operation == "read":
            for i, stmt in enumerate(statements):
                reason = read_refusal(stmt)
                if reason:
                    raise DatabaseError(
                        f"refused: {_which(i, len(statements))}is not allowed in a read-only query "
                        f"({reason}); reads run in the runner's own read-only transaction",
                        kind="refused")
        cap = self._settings.max_rows if max_rows is None else max(1, max_rows)

        for attempt in (1, 2):
            pool = await self._ensure_pool()
            conn = await self._acquire(pool)
            progress = _Progress()
            try:
                if operation == "read":
                    return await self._run_read(conn, statements, cap, progress)
                return await self._run_write(conn, statements, cap, progress)
            except aiomysql.Error as exc:
                if not (conn.closed or _error_code(exc) in _LOST_CODES):
                    raise self._sql_error(exc, statements, progress, operation) from exc
                conn.close()
                await self._drop_idle_connections(pool)
                safe_to_retry = operation == "read" or not progress.sent
                if attempt == 1 and safe_to_retry:
                    log.info("MySQL connection lost (%s); retrying on a fresh connection",
                             _server_message(exc))
                    continue
                raise self._lost_error(exc, progress, operation, retried=attempt > 1) from exc
            except asyncio.CancelledError:
                # The turn was stopped mid-statement: don't leave the query running on the server.
                if progress.phase == "statement":
                    self._spawn(self._kill(conn.thread_id(), "CONNECTION"))
                conn.close()
                raise
            finally:
                if conn in self._poisoned:
                    conn.close()
                pool.release(conn)
        raise AssertionError("unreachable")  # pragma: no cover

    async def close(self) -> None:
        self._closed = True
        pool, self._pool = self._pool, None
        for task in list(self._background):
            with contextlib.suppress(Exception):
                await task
        if pool is not None:
            pool.close()
            await pool.wait_closed()

    # -- connection handling --

    async def _ensure_pool(self) -> aiomysql.Pool:
        async with self._pool_lock:
            if self._closed:
                raise DatabaseError("the MySQL runner is closed", kind="connection")
            if self._pool is None:
                try:
                    params = self._settings.connection_params(self._env)
                except ValueError as exc:
                    raise DatabaseError(f"MySQL is misconfigured: {exc}", kind="config") from None
                self._params = params
                log.info("creating MySQL pool for %s (size %d)", params.describe(),
                         self._settings.pool_size)
                self._pool = await aiomysql.create_pool(
                    minsize=0, maxsize=self._settings.pool_size, host=params.host, port=params.port,
                    user=params.user, password=params.password, db=params.database or None,
                    charset="utf8mb4", autocommit=True, connect_timeout=self._connect_timeout)
            return self._pool

    def _require_params(self) -> ConnectionParams:
        assert self._params is not None, "pool not created"
        return self._params

    async def _acquire(self, pool: aiomysql.Pool) -> aiomysql.Connection:
        try:
            return await pool.acquire()
        except (aiomysql.Error, OSError) as exc:
            raise self._connect_error(exc) from exc

    def _connect_error(self, exc: BaseException) -> DatabaseError:
        params = self._require_params()
        code = _error_code(exc)
        cause = exc.__cause__
        if code == 2003 and cause is not None:
            # aiomysql's own text only names the host; the cause says what actually happened.
            reason = (f"timed out after {self._connect_timeout:g} s" if isinstance(cause, TimeoutError)
                      else str(cause) or type(cause).__name__)
        else:
            reason = _server_message(exc)
        return DatabaseError(f"cannot connect to MySQL at {params.address}: {reason}",
                             kind="connection", code=code)

    async def _drop_idle_connections(self, pool: aiomysql.Pool) -> None:
        # A lost connection usually means the server restarted or killed idle sessions: the other
        # idle connections in the pool are likely dead too.
        with contextlib.suppress(aiomysql.Error, OSError):
            await pool.clear()

    async def _prepare(self, conn: aiomysql.Connection) -> None:
        if self._flavour is None:
            await self._detect_flavour(conn)
        if conn not in self._prepared:
            await _single_statement_mode(conn)
            if self._flavour == "mysql" and self._settings.statement_timeout_ms:
                await conn.query(f"SET SESSION max_execution_time = {self._settings.statement_timeout_ms:d}")
            self._prepared.add(conn)
        # Every call starts in the configured database whatever an earlier `USE` did; this round trip
        # also proves a pooled connection alive before any of the caller's SQL is sent.
        database = self._require_params().database
        if database:
            await conn.select_db(database)

    async def _detect_flavour(self, conn: aiomysql.Connection) -> None:
        async with conn.cursor() as cur:
            await cur.execute("SELECT VERSION()")
            row = await cur.fetchone()
        version = str(row[0]) if row else ""
        self._server_version = version
        self._flavour = "mariadb" if "mariadb" in version.lower() else "mysql"
        m = re.match(r"(\d+)\.(\d+)", version)
        if self._flavour == "mariadb" and m and (int(m[1]), int(m[2])) >= (11, 1):
            self._read_only_var = "transaction_read_only"
        log.info("MySQL server at %s is %s %s", self._require_params().address, self._flavour, version)

    async def _kill(self, thread_id: int, what: Literal["QUERY", "CONNECTION"]) -> None:
        """KILL from a separate, short-lived connection (the pool may be exhausted)."""
        params = self._require_params()
        try:
            conn = await aiomysql.connect(host=params.host, port=params.port, user=params.user,
                                          password=params.password, connect_timeout=self._connect_timeout)
        except (aiomysql.Error, OSError) as exc:
            log.warning("could not connect to kill MySQL connection %d: %s", thread_id, exc)
            return
        try:
            await conn.query(f"KILL {what} {int(thread_id)}")
        except aiomysql.Error as exc:
            # 1094: unknown thread, i.e. it already ended.
            if _error_code(exc) != 1094:
                log.warning("KILL %s %d failed: %s", what, thread_id, _server_message(exc))
        finally:
            conn.close()

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- transactions --

    async def _run_read(self, conn: aiomysql.Connection, statements: Sequence[Statement], cap: int,
                        progress: _Progress) -> list[QueryResult]:
        await self._prepare(conn)
        mysql = self._flavour == "mysql"
        if mysql:
            # MySQL has no per-statement SET STATEMENT: make the whole session read-only meanwhile,
            # which (unlike a read-only transaction alone) also stops DDL.
            await conn.query("SET SESSION TRANSACTION READ ONLY")
        try:
            await conn.query("START TRANSACTION READ ONLY")
            results = []
            for i, stmt in enumerate(statements):
                progress.index, progress.sent, progress.phase = i, True, "statement"
                results.append(await self._run_statement(conn, stmt.text, cap, read_only=True))
            progress.phase = "commit"
            await conn.commit()
            return results
        except BaseException:
            await _rollback_quietly(conn)
            raise
        finally:
            if mysql and not conn.closed:
                try:
                    await conn.query("SET SESSION TRANSACTION READ WRITE")
                except (aiomysql.Error, OSError):
                    conn.close()

    async def _run_write(self, conn: aiomysql.Connection, statements: Sequence[Statement], cap: int,
                         progress: _Progress) -> list[QueryResult]:
        await self._prepare(conn)
        await conn.autocommit(False)
        try:
            results = []
            for i, stmt in enumerate(statements):
                progress.index, progress.sent, progress.phase = i, True, "statement"
                results.append(await self._run_statement(conn, stmt.text, cap, read_only=False))
            progress.phase = "commit"
            await conn.commit()
            return results
        except BaseException:
            await _rollback_quietly(conn)
            raise
        finally:
            if not conn.closed:
                try:
                    await conn.autocommit(True)
                except (aiomysql.Error, OSError):
                    conn.close()

    def _with_limits(self, text: str, *, read_only: bool) -> str:
        if self._flavour != "mariadb":
            return text
        options = []
        timeout_ms = self._settings.statement_timeout_ms
        if timeout_ms:
            seconds = format(decimal.Decimal(timeout_ms) / 1000, "f")
            options.append(f"max_statement_time={seconds}")
        if read_only:
            options.append(f"{self._read_only_var}=1")
        return f"SET STATEMENT {', '.join(options)} FOR {text}" if options else text

    async def _run_statement(self, conn: aiomysql.Connection, text: str, cap: int, *,
                             read_only: bool) -> QueryResult:
        timeout_ms = self._settings.statement_timeout_ms
        watchdog = (_Watchdog(self, conn.thread_id(), timeout_ms / 1000 + _WATCHDOG_GRACE_S)
                    if timeout_ms else None)
        started = time.perf_counter()
        cur = _RunnerCursor(conn)
        try:
            await cur.execute(self._with_limits(text, read_only=read_only))
            if cur.description:
                columns = [d[0] for d in cur.description]
                rows = [tuple(r) for r in await cur.fetchmany(cap)]
                total = len(rows)
                while chunk := await cur.fetchmany(_DRAIN_CHUNK):
                    total += len(chunk)
                affected: int | None = None
            else:
                columns, rows, total, affected = [], [], 0, cur.rowcount
            result_info = cur._result
            warning_count = getattr(result_info, "warning_count", 0) or 0
            await cur.close()
            warnings = await _fetch_warnings(conn) if warning_count else []
        except aiomysql.Error as exc:
            if watchdog is not None and watchdog.fired and _error_code(exc) == _ER_QUERY_INTERRUPTED:
                raise _TimedOut(exc) from exc
            raise
        finally:
            if watchdog is not None:
                await watchdog.stop()
                if watchdog.fired:
                    self._poisoned.add(conn)
        return QueryResult(columns=columns, rows=rows, total_rows=total, truncated=total > len(rows),
                           affected_rows=affected, elapsed_ms=(time.perf_counter() - started) * 1000,
                           statement=text, warnings=warnings)

    # -- error phrasing --

    def _sql_error(self, exc: aiomysql.Error, statements: Sequence[Statement], progress: _Progress,
                   operation: Operation) -> DatabaseError:
        code = _error_code(exc)
        which = _which(progress.index, len(statements)) if progress.index >= 0 else ""
        server = _server_message(exc)
        undone = "; the write was rolled back" if operation == "write" and progress.sent else ""
        if isinstance(exc, _TimedOut) or code in (_ER_STATEMENT_TIMEOUT, _ER_QUERY_TIMEOUT):
            ms = self._settings.statement_timeout_ms
            origin = exc.original if isinstance(exc, _TimedOut) else exc
            return DatabaseError(
                f"statement timeout: {which}ran longer than {ms} ms and was interrupted{undone} "
                f"({_server_message(origin)})", kind="timeout", code=_error_code(origin))
        if code == _ER_READ_ONLY_TRANSACTION and operation == "read":
            return DatabaseError(
                f"refused: {which}tried to change data in a read-only query; nothing was changed "
                f"({server})", kind="refused", code=code)
        if progress.phase == "prepare":
            return DatabaseError(f"could not prepare the MySQL connection: {server}", code=code)
        return DatabaseError(f"{which}failed: {server}{undone}", code=code)

    def _lost_error(self, exc: aiomysql.Error, progress: _Progress, operation: Operation, *,
                    retried: bool) -> DatabaseError:
        where = self._require_params().address
        reason = _server_message(exc)
        if operation == "write" and progress.phase == "commit":
            outcome = "; the connection dropped during COMMIT, so the write may or may not have been applied"
        elif operation == "write" and progress.sent:
            outcome = ("; the transaction was not committed (the server rolls it back), though statements "
                       "that commit implicitly, such as DDL, may have taken effect — check before retrying")
        else:
            outcome = " (after one retry)" if retried else ""
        return DatabaseError(f"lost the connection to MySQL at {where}: {reason}{outcome}",
                             kind="connection", code=_error_code(exc))


class _TimedOut(aiomysql.OperationalError):
    """A KILL QUERY sent by the runner's watchdog, as opposed to one from an operator."""

    def __init__(self, original: aiomysql.Error) -> None:
        super().__init__(*original.args)
        self.original = original


def _which(index: int, count: int) -> str:
    return f"statement {index + 1} of {count} " if count > 1 else "the statement "


async def _rollback_quietly(conn: aiomysql.Connection) -> None:
    if conn.closed:
        return
    try:
        await conn.rollback()
    except (aiomysql.Error, OSError):
        # State unknown: never hand this connection back to the pool.
        conn.close()


async def _fetch_warnings(conn: aiomysql.Connection) -> list[str]:
    async with conn.cursor() as cur:
        await cur.execute(f"SHOW WARNINGS LIMIT {_MAX_WARNINGS}")
        rows = await cur.fetchall()
    return [f"{row[0]} {row[1]}: {row[2]}" for row in rows]


async def _single_statement_mode(conn: aiomysql.Connection) -> None:
    # aiomysql always negotiates CLIENT_MULTI_STATEMENTS; COM_SET_OPTION(MULTI_STATEMENTS_OFF) turns
    # it off for this session, so "a; b" is a syntax error rather than a second statement running
    # outside SET STATEMENT. aiomysql has no public call for it, hence the protocol-level helpers.
    await conn._execute_command(COMMAND.COM_SET_OPTION, b"\x01\x00")
    await conn._read_packet()
