"""The `mysql` plugin: the agent's `db_query(sql)` tool and the operator's `!db SQL`.

The SQL is classified (sqlglot, every statement, every table) before the gate decides, so the gate
sees `operation` and `tables`; the runner then adds its own second line of defence (read-only
transactions for reads, a statement timeout for everything).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, Field

from aiops.engine.commands import Command, CommandContext, CommandError
from aiops.engine.plugins import Plugin, PluginAPI, PluginUnavailable
from aiops.engine.tools import Classification, Tool, ToolContext, ToolOutput
from aiops.gates.redact import mask_sql_secrets
from aiops.integrations.mysql_settings import MySQLSettings

if TYPE_CHECKING:
    from aiops.gates.sql import SqlClassification
    from aiops.integrations.mysql import MySQLRunner, QueryResult

# sqlglot (the SQL classifier) and aiomysql (the driver) take about 0.15 s to import: they are
# imported when the plugin is set up, so a run with the plugin disabled (or one that never gets
# that far, `aiops --help`) does not pay for them.

log = logging.getLogger(__name__)

# How long start-up waits for the connection check; a slow server only delays that note.
_PROBE_SECONDS = 3.0


# Classifying SQL for the gate takes ~6 µs a character on the event loop: a 400 kB statement
# stalled every client for seconds. The model is told the limit and can split its work.
SQL_MAX_CHARS = 32_768


class DbQueryArgs(BaseModel):
    sql: str = Field(..., max_length=SQL_MAX_CHARS,
                     description="One or more MySQL statements. Reads run read-only; writes need "
                     f"operator approval. At most {SQL_MAX_CHARS} characters.")


def gate_tables(c: SqlClassification, database: str) -> tuple[str, ...]:
    """The classification's tables, bare names qualified with the database in effect where each
    statement runs: the configured one (the runner starts every call there), or the one a `USE`
    earlier in the same call selected. `USE mysql; SELECT * FROM global_priv` reads
    `mysql.global_priv`, and that is the name the table rules must meet.

    Raises ValueError when a statement names a bare table after one that may have switched the
    database in a way that cannot be read (`EXECUTE IMMEDIATE 'USE …'`, an executable comment):
    which table it means is then unknown, and guessing could miss a deny.
    """
    current = database.lower() or None
    known = True
    names: set[str] = set()
    for index, statement in enumerate(c.statements, 1):
        for table in statement.tables:
            if "." in table:
                names.add(table)
            elif not known:
                raise ValueError(
                    f"statement {index} names the table {table!r} after a statement that may change the "
                    f"database in effect in a way aiops cannot read; name it with its database "
                    f"(db.{table}) or run it in a separate call")
            else:
                names.add(f"{current}.{table}" if current else table)
        if statement.switches_database:
            current, known = statement.database, statement.database is not None
    return tuple(sorted(names))


def make_classifier(database: str) -> Callable[[DbQueryArgs], Classification]:
    from aiops.gates.sql import classify_sql

    def classify(args: DbQueryArgs) -> Classification:
        c = classify_sql(args.sql)
        tables = gate_tables(c, database)
        sql_line = " ".join(mask_sql_secrets(args.sql).split())
        if len(sql_line) > 160:
            sql_line = sql_line[:159] + "…"
        named = ", ".join(tables) if tables else "no named table"
        # Whether a session approval may cover it is the gatekeeper's rule for every db tool.
        reads = " (and reads them)" if c.write_reads and tables else ""
        # A session approval covers the same statement kinds only: INSERT is no licence to DELETE.
        kinds = tuple(sorted({s.kind for s in c.statements}))
        return Classification(c.operation, tables, c.unknown,
                              summary=f"db_query {c.operation} on {named}{reads}: {sql_line}",
                              reads_tables=c.write_reads, kinds=kinds)

    return classify


def results_text(results: list[QueryResult]) -> str:
    if len(results) == 1:
        return results[0].to_text()
    return "\n\n".join(f"-- statement {i}: {r.statement[:80]}\n{r.to_text()}"
                       for i, r in enumerate(results, 1))


class MySQLPlugin(Plugin):
    name = "mysql"
    description = "db_query: MySQL/MariaDB through aiomysql"
    settings_model: ClassVar[Any] = MySQLSettings
    requires = ("aiomysql", "sqlglot")

    def __init__(self) -> None:
        super().__init__()
        self.runner: MySQLRunner | None = None
        self._probe: asyncio.Task[None] | None = None

    async def setup(self, api: PluginAPI) -> None:
        from aiops.gates.sql import classify_sql
        from aiops.integrations.mysql import DatabaseError, MySQLRunner

        settings: MySQLSettings = self.settings
        missing = settings.missing_secret(api.env)
        if missing:
            raise PluginUnavailable(missing)
        try:
            params = settings.connection_params(api.env)
        except ValueError as e:
            raise PluginUnavailable(str(e)) from None
        self.runner = MySQLRunner(settings, dict(api.env))
        where = params.describe()

        async def execute(args: DbQueryArgs, ctx: ToolContext) -> ToolOutput:
            assert self.runner is not None
            op = classify_sql(args.sql).operation
            try:
                results = await self.runner.execute(args.sql, op)
            except DatabaseError as e:
                return ToolOutput(f"error: {e}", is_error=True)
            return ToolOutput(results_text(results), data=[r.to_dict() for r in results])

        api.register_tool(Tool(
            "db_query",
            f"Run SQL on the MySQL/MariaDB database {where}. Returns a text table (at most "
            f"{settings.max_rows} rows). Reads are allowed by policy per table; writes wait for the "
            f"operator's approval.",
            DbQueryArgs, "db", execute, classify=make_classifier(params.database)))

        async def db_command(ctx: CommandContext, argv: list[str], raw: str) -> str:
            if not raw:
                raise CommandError("expected SQL after !db")
            try:
                c = classify_sql(raw)
            except ValueError as e:
                raise CommandError(str(e)) from None
            try:
                tables = list(gate_tables(c, params.database))
            except ValueError:
                tables = list(c.tables)  # the operator's own SQL: audited as written
            # The audit log keeps the statement with its credentials masked.
            await ctx.engine.store.add_audit(
                "operator_db", session_id=await ctx.audit_session_id(), tool="db_query", operation=c.operation,
                decision="approved", actor=f"operator:{ctx.client_kind}",
                data={"sql": mask_sql_secrets(raw), "tables": tables})
            head = f"[{c.summary()}]"
            assert self.runner is not None
            try:
                results = await self.runner.execute(raw, c.operation)
            except DatabaseError as e:
                return f"{head}\nerror: {e}"
            return f"{head}\n{results_text(results)}"

        # raw: SQL is taken verbatim (apostrophes, quotes) and may span the rest of the message.
        api.register_command(Command("db", "!db SQL", "run SQL as the operator (classified, audited)",
                                     db_command, operator_only=True, raw=True))

    async def start(self) -> None:
        """Check the connection once, in the background, so `aiops plugins` and the status can say
        the server was unreachable without start-up waiting on a host that does not answer.

        A server that is down does not stop start-up: every db_query reports it, and the pool
        connects as soon as the server is back.
        """
        self._probe = asyncio.get_running_loop().create_task(self._check_connection())

    async def _check_connection(self) -> None:
        from aiops.integrations.mysql import DatabaseError

        assert self.runner is not None and self.api is not None
        note = ""
        try:
            await asyncio.wait_for(self.runner.execute("SELECT 1", "read"), _PROBE_SECONDS)
        except DatabaseError as e:
            note = f"could not connect at start-up: {e}"
        except TimeoutError:
            note = f"could not connect at start-up: no answer in {_PROBE_SECONDS:g} s"
        if note:
            log.warning("mysql: %s", note)
            self.api.report(note)

    async def ready(self) -> None:
        if self._probe is not None:
            await asyncio.shield(self._probe)

    async def stop(self) -> None:
        if self._probe is not None and not self._probe.done():
            self._probe.cancel()
            await asyncio.gather(self._probe, return_exceptions=True)
        if self.runner is not None:
            await self.runner.close()
