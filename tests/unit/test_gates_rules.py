"""gates.toml: the policy decides allow/ask/deny the way the file reads."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from pydantic import ValidationError

from aiops.gates.rules import GatesConfig

SHIPPED = Path(__file__).resolve().parents[2] / "config" / "gates.toml"

EXAMPLE = """
[defaults]
read = "allow"
write = "ask"
[tools.ddgs_search]
read = "allow"
[tools.shell]
write = "deny"
[tools."mcp:filesystem"]
read = "ask"
write = "ask"
[tools."mcp:filesystem:read_file"]
read = "allow"
[tools."mcp:git:push"]
write = "deny"
[db.tables."*"]
read = "allow"
write = "ask"
[db.tables.users]
read = "ask"
write = "deny"
[db.tables."shop.orders"]
write = "deny"
[db.tables.audit]
read = "deny"
[db.unknown]
read = "ask"
write = "ask"
[wait]
console = 0
api = 120
proxy = 120
slack = 300
swarm = 60
mcp = 120
"""


def load(text: str) -> GatesConfig:
    return GatesConfig.model_validate(tomllib.loads(text))


@pytest.fixture
def cfg() -> GatesConfig:
    return load(EXAMPLE)


def test_shipped_file_is_the_model_default_and_safe() -> None:
    shipped = GatesConfig.model_validate(tomllib.loads(SHIPPED.read_text()))
    assert shipped == GatesConfig()
    assert shipped.decide("anything", "search", "read") == "allow"
    assert shipped.decide("anything", "search", "write") == "ask"
    assert shipped.decide("update_system_prompt", "prompt", "write") == "ask"
    assert shipped.decide("db_query", "db", "read", ["users"]) == "allow"
    assert shipped.decide("db_query", "db", "write", ["users"]) == "ask"
    # The server's accounts and password hashes are not the model's to read.
    assert shipped.decide("db_query", "db", "read", ["mysql.user"]) == "deny"
    assert shipped.decide("db_query", "db", "read", ["MySQL.Global_Priv", "t"]) == "deny"
    assert shipped.decide("mcp:fs:rm", "mcp", "write") == "ask"


def test_strictest_rule_over_all_tables_wins(cfg: GatesConfig) -> None:
    assert cfg.decide("db_query", "db", "read", ["products"]) == "allow"
    assert cfg.decide("db_query", "db", "read", ["products", "users"]) == "ask"
    assert cfg.decide("db_query", "db", "read", ["users", "audit", "products"]) == "deny"
    assert cfg.decide("db_query", "db", "write", ["products"]) == "ask"
    assert cfg.decide("db_query", "db", "write", ["products", "users"]) == "deny"


def test_unknown_tables_add_the_unknown_rule(cfg: GatesConfig) -> None:
    assert cfg.decide("db_query", "db", "read", [], unknown_tables=True) == "ask"
    assert cfg.decide("db_query", "db", "read", ["products"], unknown_tables=True) == "ask"
    assert cfg.decide("db_query", "db", "write", ["users"], unknown_tables=True) == "deny"


def test_a_write_that_reads_a_table_meets_its_read_rule_too(cfg: GatesConfig) -> None:
    """`audit` may not be read: copying it into a scratch table is reading it."""
    from aiops.gates.sql import classify_sql

    def decide(sql: str) -> str:
        c = classify_sql(sql)
        return cfg.decide("db_query", "db", c.operation, c.tables, unknown_tables=c.unknown,
                          reads_tables=c.write_reads)

    assert decide("SELECT * FROM audit") == "deny"
    for sql in ("INSERT INTO scratch SELECT * FROM audit", "CREATE TABLE scratch AS SELECT * FROM audit",
                "UPDATE scratch SET a = (SELECT max(a) FROM audit)", "DELETE FROM audit WHERE a = 1"):
        assert decide(sql) == "deny", sql
    # A write that reads nothing meets the write rule alone.
    assert decide("INSERT INTO audit (a) VALUES (1)") == "ask"
    assert decide("INSERT INTO scratch SELECT * FROM products") == "ask"


def test_schema_qualified_table_matches_qualified_then_bare_then_star(cfg: GatesConfig) -> None:
    # "shop.orders" has its own rule; "shop.users" falls to "users"; "shop.items" to "*".
    assert cfg.decide("db_query", "db", "write", ["shop.orders"]) == "deny"
    assert cfg.decide("db_query", "db", "write", ["shop.users"]) == "deny"
    assert cfg.decide("db_query", "db", "read", ["shop.users"]) == "ask"
    assert cfg.decide("db_query", "db", "write", ["shop.items"]) == "ask"
    # A qualified rule missing the operation falls back to the bare name, then "*".
    assert cfg.decide("db_query", "db", "read", ["shop.orders"]) == "allow"
    # A bare "orders" is not the qualified "shop.orders".
    assert cfg.decide("db_query", "db", "write", ["orders"]) == "ask"


def test_table_names_ignore_case_and_quoting(cfg: GatesConfig) -> None:
    assert cfg.decide("db_query", "db", "write", ["`Users`"]) == "deny"
    assert cfg.decide("db_query", "db", "write", ["SHOP.ORDERS"]) == "deny"
    assert cfg.decide("db_query", "db", "write", ['"shop"."users"']) == "deny"


def test_table_rules_differing_only_in_case_are_rejected() -> None:
    with pytest.raises(ValidationError, match="same table"):
        load('[db.tables.users]\nread = "ask"\n[db.tables.Users]\nread = "deny"\n')


def test_mcp_tool_rule_then_server_rule_then_defaults(cfg: GatesConfig) -> None:
    assert cfg.decide("mcp:filesystem:read_file", "mcp", "read") == "allow"
    # The tool rule has no "write": the server rule answers.
    assert cfg.decide("mcp:filesystem:read_file", "mcp", "write") == "ask"
    assert cfg.decide("mcp:filesystem:list_dir", "mcp", "read") == "ask"
    assert cfg.decide("mcp:git:push", "mcp", "write") == "deny"
    # No server rule for git: defaults.
    assert cfg.decide("mcp:git:push", "mcp", "read") == "allow"
    assert cfg.decide("mcp:other:x", "mcp", "write") == "ask"


def test_unnamed_tools_use_defaults(cfg: GatesConfig) -> None:
    assert cfg.decide("fetch_url", "extract", "read") == "allow"
    assert cfg.decide("fetch_url", "extract", "write") == "ask"


def test_missing_operation_falls_back_to_defaults(cfg: GatesConfig) -> None:
    assert cfg.decide("ddgs_search", "search", "read") == "allow"
    assert cfg.decide("ddgs_search", "search", "write") == "ask"
    assert cfg.decide("shell", "shell", "write") == "deny"
    assert cfg.decide("shell", "shell", "read") == "allow"


def test_missing_sections_take_defaults() -> None:
    cfg = load('[defaults]\nread = "deny"\n')
    assert cfg.decide("x", "search", "read") == "deny"
    assert cfg.decide("x", "search", "write") == "ask"
    assert cfg.wait_seconds("api") == 120


@pytest.mark.parametrize(
    "text",
    [
        '[defaults]\nreed = "allow"\n',
        '[tool.ddgs_search]\nread = "allow"\n',
        '[tools.ddgs_search]\nread = "alow"\n',
        '[tools.ddgs_search]\nexecute = "allow"\n',
        '[db.table."*"]\nread = "allow"\n',
        '[db.unknown]\nwrite = "maybe"\n',
        '[wait]\nconsol = 0\n',
        '[wait]\napi = -1\n',
    ],
)
def test_typos_and_bad_values_are_rejected(text: str) -> None:
    with pytest.raises(ValidationError):
        load(text)


def test_wait_seconds(cfg: GatesConfig) -> None:
    assert cfg.wait_seconds("console") is None
    assert cfg.wait_seconds("slack") == 300
    assert cfg.wait_seconds("swarm") == 60
    # An unknown kind gets the api wait rather than waiting forever.
    assert load("[wait]\napi = 7\n").wait_seconds("fax") == 7


def roundtrip(cfg: GatesConfig) -> GatesConfig:
    text = tomli_w.dumps(cfg.to_toml_dict())
    return GatesConfig.model_validate(tomllib.loads(text))


def test_round_trip_through_toml(cfg: GatesConfig) -> None:
    again = roundtrip(cfg)
    assert again == cfg
    data: dict[str, Any] = tomllib.loads(tomli_w.dumps(cfg.to_toml_dict()))
    # Left-out operations stay left out rather than being written as explicit values.
    assert data["tools"]["ddgs_search"] == {"read": "allow"}
    assert data["wait"]["console"] == 0


def test_set_rule_returns_a_new_config_and_round_trips(cfg: GatesConfig) -> None:
    new = cfg.set_rule("ddgs_search", "write", "deny")
    new = new.set_rule("db:Users", "read", "allow")
    new = new.set_rule("db:shop.items", "write", "deny")
    new = new.set_rule("mcp:filesystem:read_file", "write", "deny")
    new = new.set_rule("db:*", "write", "deny")
    # The original is untouched.
    assert cfg.decide("ddgs_search", "search", "write") == "ask"
    assert cfg.decide("db_query", "db", "read", ["users"]) == "ask"

    for c in (new, roundtrip(new)):
        assert c.decide("ddgs_search", "search", "write") == "deny"
        assert c.decide("db_query", "db", "read", ["users"]) == "allow"
        assert c.decide("db_query", "db", "write", ["shop.items"]) == "deny"
        assert c.decide("db_query", "db", "write", ["products"]) == "deny"
        assert c.decide("mcp:filesystem:read_file", "mcp", "write") == "deny"
    # "db:Users" updated the existing "users" entry instead of adding a second one.
    assert sorted(new.db.tables) == ["*", "audit", "shop.items", "shop.orders", "users"]


def test_set_rule_rejects_bad_values(cfg: GatesConfig) -> None:
    with pytest.raises(ValueError):
        cfg.set_rule("x", "write", "maybe")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        cfg.set_rule("x", "delete", "deny")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        cfg.set_rule("db:", "read", "deny")


def test_an_explicit_db_tool_rule_takes_part_with_the_table_rules(cfg: GatesConfig) -> None:
    # `!gate db_query write deny`: every write is denied, whatever the table rules say.
    strict = cfg.set_rule("db_query", "write", "deny")
    assert strict.decide("db_query", "db", "write", ["products"]) == "deny"
    assert strict.decide("db_query", "db", "write", []) == "deny"
    assert strict.decide("db_query", "db", "read", ["products"]) == "allow"  # only the named operation
    # Strictest wins both ways: a tool rule can tighten but never loosen a table rule.
    loose = cfg.set_rule("db_query", "write", "allow")
    assert loose.decide("db_query", "db", "write", ["products"]) == "ask"
    assert loose.decide("db_query", "db", "write", ["users"]) == "deny"
    # Without an explicit tool rule, [defaults] plays no part for db tools.
    assert cfg.set_rule("db:*", "write", "allow").decide("db_query", "db", "write", ["products"]) == "allow"


@pytest.mark.parametrize("sql", [
    "RENAME TABLE users TO users_old",
    "LOCK TABLES users WRITE",
    "LOAD DATA INFILE '/tmp/x' INTO TABLE users",
    "HANDLER users OPEN",
    "TRUNCATE TABLE users",
])
def test_statements_naming_a_denied_table_are_denied(cfg: GatesConfig, sql: str) -> None:
    from aiops.gates.sql import classify_sql

    c = classify_sql(sql)
    assert cfg.decide("db_query", "db", c.operation, c.tables, unknown_tables=c.unknown) == "deny"
    # The same statement on another table still asks: the unknown rule applies as well.
    other = classify_sql(sql.replace("users", "products"))
    assert cfg.decide("db_query", "db", other.operation, other.tables, unknown_tables=other.unknown) == "ask"


def test_a_schema_wildcard_covers_every_table_of_that_database() -> None:
    cfg = GatesConfig()  # the shipped rules
    for table in ("mysql.general_log", "mysql.servers", "performance_schema.threads", "sys.processlist",
                  "information_schema.processlist", "information_schema.innodb_trx"):
        assert cfg.decide("db_query", "db", "read", [table]) == "deny", table
    assert cfg.decide("db_query", "db", "read", ["information_schema.tables"]) == "allow"
    # A bare rule meant for one's own `user` table does not loosen mysql.* for mysql.user's kin.
    loose = cfg.set_rule("db:db", "read", "allow")
    assert loose.decide("db_query", "db", "read", ["mysql.db"]) == "deny"
    assert loose.decide("db_query", "db", "read", ["shop.db"]) == "allow"


def test_a_statement_known_to_touch_no_table_meets_the_star_rule(cfg: GatesConfig) -> None:
    # `SELECT 1` reads nothing: decided by [db.tables."*"], like any table, not by [db.unknown].
    assert cfg.decide("db_query", "db", "read", []) == "allow"
    asking = cfg.set_rule("db:*", "read", "ask")
    assert asking.decide("db_query", "db", "read", []) == "ask"
    assert cfg.decide("db_query", "db", "read", [], unknown_tables=True) == "ask"
