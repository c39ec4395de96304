"""The `mysql` plugin: the agent's `db_query(sql)` tool and the operator's `!db SQL`.

The SQL is classified (sqlglot, every statement, every table) before the gate decides, so the gate
sees `operation` and `tables`; the runner then adds its own second line of defence (read-only
transactions for reads, a statement timeout for everything).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, Field

from aiops.engine.commands import Command, CommandContext, CommandError
from aiops.engine.plugins import Plugin, PluginAPI
from aiops.engine.tools import Classification, Tool, ToolContext, ToolOutput
from aiops.gates.sql import classify_sql
from aiops.integrations.mysql import DatabaseError, MySQLRunner, MySQLSettings, QueryResult


class DbQueryArgs(BaseModel):
    sql: str = Field(..., description="One or more MySQL statements. Reads run read-only; writes need "
                     "operator approval.")


def classify(args: DbQueryArgs) -> Classification:
    c = classify_sql(args.sql)
    sql_line = " ".join(args.sql.split())
    if len(sql_line) > 160:
        sql_line = sql_line[:159] + "…"
    tables = ", ".join(c.tables) if c.tables else "no named table"
    return Classification(c.operation, c.tables, c.unknown,
                          summary=f"db_query {c.operation} on {tables}: {sql_line}")


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

    async def setup(self, api: PluginAPI) -> None:
        settings: MySQLSettings = self.settings
        try:
            settings.connection_params(api.env)
        except ValueError as e:
            from aiops.engine.plugins import PluginUnavailable

            raise PluginUnavailable(str(e)) from None
        self.runner = MySQLRunner(settings, dict(api.env))
        where = settings.connection_params(api.env).describe()

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
            DbQueryArgs, "db", execute, classify=classify))

        async def db_command(ctx: CommandContext, argv: list[str], raw: str) -> str:
            if not raw:
                raise CommandError("expected SQL after !db")
            try:
                c = classify_sql(raw)
            except ValueError as e:
                raise CommandError(str(e)) from None
            await ctx.engine.store.add_audit(
                "operator_db", session_id=ctx.session_id, tool="db_query", operation=c.operation,
                decision="approved", actor=f"operator:{ctx.client_kind}",
                data={"sql": raw, "tables": list(c.tables)})
            head = f"[{c.summary()}]"
            assert self.runner is not None
            try:
                results = await self.runner.execute(raw, c.operation)
            except DatabaseError as e:
                return f"{head}\nerror: {e}"
            return f"{head}\n{results_text(results)}"

        api.register_command(Command("db", "!db SQL", "run SQL as the operator (classified, audited)",
                                     db_command, operator_only=True))

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.close()
