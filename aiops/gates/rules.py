"""Gate policy: what `gates.toml` says about each tool call — allow, ask an operator, or deny.

The policy is pure data plus one decision function. It knows nothing about sessions or operators;
the broker asks an operator when the decision is "ask", and the engine runs or refuses the tool.

Table names are matched case-insensitively, with SQL quoting (backticks, double quotes, brackets)
removed, so `DELETE FROM `Users`` cannot slip past a rule written for `users`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Decision = Literal["allow", "ask", "deny"]
Operation = Literal["read", "write"]

DECISIONS: tuple[Decision, ...] = ("allow", "ask", "deny")
OPERATIONS: tuple[Operation, ...] = ("read", "write")
CLIENT_KINDS: tuple[str, ...] = ("console", "cli", "api", "proxy", "slack", "swarm", "mcp")

_STRICTNESS: dict[str, int] = {"allow": 0, "ask": 1, "deny": 2}


def strictest(decisions: Sequence[Decision]) -> Decision:
    """deny > ask > allow; an empty sequence is "ask" so a caller bug never silently allows."""
    if not decisions:
        return "ask"
    return max(decisions, key=lambda d: _STRICTNESS[d])


def normalize_table(name: str) -> str:
    """`Shop`.`Users` → shop.users — the form rules and lookups are compared in."""
    parts = [p.strip().strip('`"[]').strip() for p in name.split(".")]
    return ".".join(p.lower() for p in parts if p)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OperationRules(_Strict):
    """Per-target rules; an operation left out falls back to the next broader rule."""

    read: Decision | None = None
    write: Decision | None = None

    def get(self, operation: Operation) -> Decision | None:
        return self.read if operation == "read" else self.write


class DefaultRules(_Strict):
    """The last fallback, so both operations always have a value."""

    read: Decision = "allow"
    write: Decision = "ask"

    def get(self, operation: Operation) -> Decision:
        return self.read if operation == "read" else self.write


class UnknownTableRules(DefaultRules):
    # Statements whose tables cannot be named could touch anything, so both default to asking.
    read: Decision = "ask"
    write: Decision = "ask"


# The server's own schemas and tables that expose accounts, secrets or other connections' activity:
# nothing the model needs, and connected as root it could read them. `mysql.*` holds the accounts
# and their password hashes (MySQL's mysql.user, MariaDB's mysql.global_priv), the general and
# slow query logs and FEDERATED server passwords; `mysql.binlog` is how SHOW BINLOG/RELAYLOG
# EVENTS are named. performance_schema and sys hold every connection's statements; the
# information_schema tables below show other connections' running SQL and per-user statistics.
INTERNAL_DENIES: tuple[str, ...] = (
    "mysql.*", "mysql.user", "mysql.global_priv", "performance_schema.*", "sys.*",
    "information_schema.processlist", "information_schema.innodb_trx",
    "information_schema.user_statistics", "information_schema.client_statistics",
    "information_schema.query_cache_info",
)


def _default_tables() -> dict[str, OperationRules]:
    tables = {"*": OperationRules(read="allow", write="ask")}
    tables.update({name: OperationRules(read="deny", write="deny") for name in INTERNAL_DENIES})
    return tables


class DbRules(_Strict):
    tables: dict[str, OperationRules] = Field(default_factory=_default_tables)
    unknown: UnknownTableRules = Field(default_factory=UnknownTableRules)

    @field_validator("tables")
    @classmethod
    def _no_case_duplicates(cls, v: dict[str, OperationRules]) -> dict[str, OperationRules]:
        seen: dict[str, str] = {}
        for key in v:
            norm = normalize_table(key) if key != "*" else "*"
            if not norm:
                raise ValueError(f"table rule {key!r} names no table")
            if norm in seen:
                raise ValueError(f"table rules {seen[norm]!r} and {key!r} name the same table "
                                 "(table names are matched case-insensitively)")
            seen[norm] = key
        return v


class WaitRules(_Strict):
    """Seconds a gate waits for an operator, per client kind; 0 waits until answered or stopped."""

    console: float = Field(0, ge=0)
    cli: float = Field(0, ge=0)  # `aiops chat` asks on its terminal (or, without one, denies at once)
    api: float = Field(120, ge=0)
    proxy: float = Field(120, ge=0)
    slack: float = Field(300, ge=0)
    swarm: float = Field(60, ge=0)
    mcp: float = Field(120, ge=0)


def _default_tools() -> dict[str, OperationRules]:
    # Editing the system prompt changes every later answer, so it always asks (as shipped). The
    # delegation tools are reads (a delegate's own call meets its tool's rule): named so the
    # shipped file shows where to tighten them.
    return {"update_system_prompt": OperationRules(write="ask"),
            "llm_clean_text": OperationRules(read="allow"),
            "llm_clean_tool": OperationRules(read="allow")}


class GatesConfig(_Strict):
    """The whole of `gates.toml`. `GatesConfig()` equals the shipped default file.

    Instances are treated as immutable: `set_rule` returns a new config, so a turn that already
    holds a config keeps deciding consistently while an operator edits the rules.
    """

    defaults: DefaultRules = Field(default_factory=DefaultRules)
    tools: dict[str, OperationRules] = Field(default_factory=_default_tools)
    db: DbRules = Field(default_factory=DbRules)
    wait: WaitRules = Field(default_factory=WaitRules)

    # ---- deciding ---------------------------------------------------------------------------------

    def decide(
        self,
        tool: str,
        tool_type: str,
        operation: Operation,
        tables: Sequence[str] = (),
        unknown_tables: bool = False,
        reads_tables: bool = False,
    ) -> Decision:
        """`reads_tables`: a write that also reads the tables it names, so that a table denied
        for reading is not copied out by `INSERT INTO scratch SELECT * FROM it`."""
        if operation not in OPERATIONS:
            raise ValueError(f"operation must be 'read' or 'write', not {operation!r}")
        if tool_type == "db":
            decisions = [self._decide_db(operation, tables, unknown_tables)]
            if operation == "write" and reads_tables:
                decisions.append(self._decide_db("read", tables, unknown_tables))
            # An explicit rule for the tool itself (`!gate db_query write deny`) takes part too;
            # strictest wins, so it can tighten the table rules but never loosen them.
            rule = self.tools.get(tool)
            explicit = rule.get(operation) if rule else None
            if explicit:
                decisions.append(explicit)
            return strictest(decisions)
        if tool.startswith("mcp:"):
            return self._decide_mcp(tool, operation)
        rule = self.tools.get(tool)
        found = rule.get(operation) if rule else None
        return found or self.defaults.get(operation)

    def _decide_mcp(self, tool: str, operation: Operation) -> Decision:
        parts = tool.split(":", 2)
        candidates = [tool]
        if len(parts) == 3:
            candidates.append(f"mcp:{parts[1]}")
        for name in candidates:
            rule = self.tools.get(name)
            found = rule.get(operation) if rule else None
            if found:
                return found
        return self.defaults.get(operation)

    def _table_index(self) -> dict[str, OperationRules]:
        return {("*" if k == "*" else normalize_table(k)): v for k, v in self.db.tables.items()}

    def _decide_table(self, index: dict[str, OperationRules], table: str, operation: Operation) -> Decision:
        name = normalize_table(table)
        candidates = [name]
        if "." in name:
            schema, bare = name.rsplit(".", 1)
            # `mysql.*` (every table of a database) before a bare `user` rule meant for one's own
            # tables: a rule written for a whole internal schema must not be loosened by it.
            candidates += [f"{schema}.*", bare]
        candidates.append("*")
        for key in candidates:
            rule = index.get(key)
            found = rule.get(operation) if rule else None
            if found:
                return found
        return self.defaults.get(operation)

    def _decide_db(self, operation: Operation, tables: Sequence[str], unknown_tables: bool) -> Decision:
        index = self._table_index()
        decisions: list[Decision] = [self._decide_table(index, t, operation) for t in tables]
        if unknown_tables:
            decisions.append(self.db.unknown.get(operation))
        elif not tables:
            # Known to touch no table (`SELECT 1`, `USE shop`): the rule for every table decides,
            # so an operator who asks for every read is asked for these too.
            decisions.append(self._decide_table(index, "*", operation))
        return strictest(decisions)

    def wait_seconds(self, client_kind: str) -> float | None:
        """Gate timeout for a client kind; None means wait until answered or stopped.

        A kind not in [wait] waits like "api": a finite wait, so a new kind of client can never
        hang on a gate forever, and a gate can never crash a turn over a missing key.
        """
        kind = client_kind if client_kind in CLIENT_KINDS else "api"
        seconds = float(getattr(self.wait, kind))
        return None if seconds == 0 else seconds

    # ---- editing ----------------------------------------------------------------------------------

    def set_rule(self, target: str, operation: Operation, decision: Decision) -> GatesConfig:
        """A copy with one rule set; `self` is left unchanged.

        `target` is a tool name (`ddgs_search`, `mcp:fs`, `mcp:fs:write_file`) or `db:TABLE`
        (`db:users`, `db:shop.users`, `db:*`).
        """
        if operation not in OPERATIONS:
            raise ValueError(f"operation must be 'read' or 'write', not {operation!r}")
        if decision not in DECISIONS:
            raise ValueError(f"decision must be one of {', '.join(DECISIONS)}, not {decision!r}")
        if not target:
            raise ValueError("empty rule target")
        new = self.model_copy(deep=True)
        if target.startswith("db:"):
            table = target[3:]
            key = "*" if table == "*" else normalize_table(table)
            if not key:
                raise ValueError(f"rule target {target!r} names no table")
            # Reuse an existing spelling of the same table so the file keeps one entry per table.
            existing = next((k for k in new.db.tables
                             if ("*" if k == "*" else normalize_table(k)) == key), key)
            rule = new.db.tables.setdefault(existing, OperationRules())
        else:
            rule = new.tools.setdefault(target, OperationRules())
        setattr(rule, operation, decision)
        return new

    def to_toml_dict(self) -> dict[str, Any]:
        """Plain data for tomli-w: operations left out stay out, whole-number seconds stay ints."""
        data = self.model_dump(mode="python", exclude_none=True)
        data["wait"] = {k: (int(v) if float(v).is_integer() else v) for k, v in data["wait"].items()}
        return data
