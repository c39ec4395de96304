"""Classify MySQL/MariaDB statements as reads or writes, and name the tables they touch.

The SQL gate decides allow/ask/deny per table and per operation, so a write classified as a read
is a security hole while a read classified as a write only costs the operator a question. Every
rule below leans that way: whatever is not positively recognised as a read is a write.

How a string is classified:

1. sqlglot's MySQL tokenizer splits the string on `;` tokens, so a `;` inside a string or comment
   never splits and stacked statements (``SELECT 1; DELETE FROM t``) are each classified.
2. The leading keyword picks the path. Only statements whose tables matter are parsed by sqlglot:
   SELECT/WITH/TABLE/VALUES/``(``, SHOW, DESCRIBE/DESC/EXPLAIN, INSERT, REPLACE, UPDATE, DELETE and
   the DDL verbs CREATE/ALTER/DROP/TRUNCATE. Every other statement (CALL, SET, GRANT, LOCK,
   HANDLER, DO, FLUSH, KILL, USE, LOAD DATA, PREPARE/EXECUTE, transaction control, admin
   statements, anything unknown) is an opaque write that names no table.
3. A parsed tree is a read only if it is a query (or SHOW, or DESCRIBE/EXPLAIN of a read) with no
   hazard: no ``INTO`` (OUTFILE, DUMPFILE, @var), no locking clause (``FOR UPDATE``,
   ``FOR SHARE``, ``LOCK IN SHARE MODE``), no ``@var := ...`` assignment, no nested statement, and
   only calls to built-in functions known to have no side effects.
4. A statement that cannot be tokenized or parsed is a write.

Decisions on the ambiguous cases (see also docs/ARCHITECTURE.md's gate section):

* Transaction control (BEGIN, START TRANSACTION, COMMIT, ROLLBACK, SAVEPOINT, XA) is a write: it
  changes no rows by itself, but COMMIT is what makes earlier writes durable and every one of them
  releases locks; "unknown is a write" is the safe default.
* ``SELECT ... FOR UPDATE`` / ``FOR SHARE`` / ``LOCK IN SHARE MODE`` are writes: they take locks
  other sessions wait on.
* ``SLEEP()`` and ``BENCHMARK()`` are reads: they change nothing; bounding their cost is the job of
  the connection's query timeout, not of the gate.
* ``GET_LOCK``, ``RELEASE_LOCK``, ``NEXTVAL``/``SETVAL``, replication waits, ``LOAD_FILE`` (reads
  a server file, not a table) and ``LAST_INSERT_ID(expr)`` (sets session state) make a query a
  write. A call to a function that is not a known built-in may be a stored function, which can
  write anything, so it makes a query a write too; so does a schema-qualified call
  (``shop.f()``) and a call with a space before the parenthesis, which MySQL resolves to a stored
  function of that name.
* EXPLAIN of a write is a write (``EXPLAIN ANALYZE`` runs the statement).
* A statement carrying a MySQL/MariaDB executable comment (``/*! ... */``, ``/*M! ... */``) is a
  write: the server runs what the comment hides.
* A string literal with a backslash before a quote is a write: where that literal ends depends on
  the server's ``NO_BACKSLASH_ESCAPES`` mode, so text we read as data could be SQL to the server.
* Where sqlglot's lexer and MySQL's differ, we follow MySQL (a lone carriage return does not end
  a ``--``/``#`` comment) or, where we cannot, call every statement a write (a NUL byte, a
  non-ASCII space right after ``--``).
* Statements that sqlglot does not parse into a tree (RENAME TABLE, LOCK TABLES, LOAD DATA ...
  INTO TABLE, HANDLER, ANALYZE/OPTIMIZE/REPAIR/CHECK TABLE, FLUSH TABLES, GRANT/REVOKE ... ON,
  CREATE TRIGGER ... ON) still name the tables their grammar puts in known places, read from
  sqlglot's tokens; they stay `beyond_tables`, so the gate applies the rule for unknown targets
  *and* every named table's rule, the strictest winning. Naming a table can therefore only make
  the decision stricter: `RENAME TABLE users TO x` meets the `users` rule, not only [db.unknown].

``StatementClass.kind`` is one of: select, select_into, show, describe, explain, insert, replace,
update, delete, merge, ddl, load, call, set, do, lock, handler, use, transaction, prepare, admin,
unknown (recognised as a statement of no known kind), unparseable (sqlglot could not parse it).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.tokens import Token, TokenType

__all__ = ["Operation", "SqlClassification", "StatementClass", "classify_sql"]

Operation = Literal["read", "write"]

log = logging.getLogger(__name__)


class _WithoutStatement(logging.Filter):
    """sqlglot logs the statement it could not fully parse (`'…' contains unsupported syntax`).
    That statement is the model's text: a newline in it forges a line of aiops.log, and a CREATE
    USER in it carries a password. Its records keep their level and lose the SQL."""

    def filter(self, record: logging.LogRecord) -> bool:
        # Its messages are f-strings with the SQL inside: only the gist can be kept.
        gist = ("a statement used syntax it does not support" if "unsupported syntax" in str(record.msg)
                else "a problem with a statement")
        record.msg = f"sqlglot reported {gist} (the statement is not logged)"
        record.args = ()
        return True


if not any(isinstance(f, _WithoutStatement) for f in logging.getLogger("sqlglot").filters):
    logging.getLogger("sqlglot").addFilter(_WithoutStatement())

_DIALECT = Dialect.get_or_raise("mysql")

# MySQL runs `/*! ... */` (and `/*!50001 ... */`); MariaDB also runs `/*M! ... */`.
_EXECUTABLE_COMMENT = re.compile(r"/\*M?!", re.IGNORECASE)


@dataclass(frozen=True)
class StatementClass:
    """The classification of one statement of a (possibly stacked) SQL string."""

    sql: str
    kind: str
    operation: Operation
    tables: tuple[str, ...]
    # The statement also acts on something that is not a table: a file, a variable, a stored
    # routine, a database, the session or the server. Its table list alone does not describe it.
    beyond_tables: bool = False
    # A write that reads (some of) the tables it names: `INSERT INTO t SELECT * FROM secret`,
    # `UPDATE t ... WHERE`. False only for writes known to read none (`INSERT ... VALUES`).
    reads: bool = True
    # Known to touch no table at all (`SELECT 1`, `SELECT NOW()`, `USE shop`, `SHOW WARNINGS`):
    # its empty table list tells the whole story, so the `*` rule decides rather than [db.unknown].
    tableless: bool = False
    # The statement may change the database that bare table names in later statements of the same
    # call resolve to: `USE shop` (then `database` is "shop"), or dynamic SQL and executable
    # comments that could hide a USE (then `database` is None: not known).
    switches_database: bool = False
    database: str | None = None

    @property
    def unknown(self) -> bool:
        """True when the table list does not tell the whole story (-> the gate's unknown rule)."""
        return self.beyond_tables or (not self.tables and not self.tableless)


@dataclass(frozen=True)
class SqlClassification:
    """The classification of a whole SQL string: the strictest over its statements."""

    operation: Operation
    tables: tuple[str, ...]
    statements: tuple[StatementClass, ...]
    unknown: bool

    @property
    def write_reads(self) -> bool:
        """A write whose statements may read the tables they name: their read rules apply too."""
        return self.operation == "write" and any(s.reads for s in self.statements)

    def summary(self) -> str:
        """One line for the approval inbox, e.g. "write on orders, users" or "read (no table)"."""
        if not self.tables:
            return f"{self.operation} (no table)"
        text = f"{self.operation} on {', '.join(self.tables)}"
        return f"{text} (+ unknown)" if self.unknown else text


def classify_sql(sql: str) -> SqlClassification:
    """Classify every statement in ``sql``; raise ValueError when there is no statement at all."""
    lexed = _as_mysql_lexes(sql)
    statements = tuple(_classify_chunk_safely(lexed, chunk) for chunk in _split(sql, lexed))
    if not statements:
        raise ValueError("empty SQL: no statement, only whitespace, comments or semicolons")
    if _lexers_may_disagree(sql):
        # Where statements start and end is in doubt, so is every verdict.
        statements = tuple(replace(s, operation="write", beyond_tables=True) for s in statements)
    operation: Operation = "write" if any(s.operation == "write" for s in statements) else "read"
    tables = tuple(sorted({table for s in statements for table in s.tables}))
    return SqlClassification(
        operation=operation,
        tables=tables,
        statements=statements,
        unknown=any(s.unknown for s in statements),
    )


# --------------------------------------------------------------------------------------------
# Splitting


@dataclass(frozen=True)
class _Chunk:
    text: str  # the raw text between separators, comments included
    tokens: list[Token] | None  # None: the text could not be tokenized at all


def _as_mysql_lexes(sql: str) -> str:
    """``sql`` with the same length, adjusted where sqlglot's lexer differs from MySQL's.

    MySQL ends `--` and `#` comments at "\\n" only; sqlglot also at a lone "\\r", which would let
    text MySQL skips as comment (and everything after it) look different to us.
    """
    return re.sub(r"\r(?!\n)", " ", sql)


def _lexers_may_disagree(sql: str) -> bool:
    # sqlglot takes any Unicode space after `--` as the start of a comment, MySQL only ASCII
    # whitespace and control characters; a NUL byte may end the query early for the server.
    if "\x00" in sql:
        return True
    return any(c.isspace() and not c.isascii() for c in re.findall(r"--(.)", sql, re.DOTALL))


def _split(sql: str, lexed: str) -> list[_Chunk]:
    """Cut ``lexed`` into statements on `;` tokens; the chunks carry ``sql``'s original text."""
    try:
        tokens = _DIALECT.tokenize(lexed)
    except Exception:  # noqa: BLE001 - any tokenizer failure (unterminated string, ...) is a write
        return [_Chunk(sql, None)] if sql.strip() else []
    chunks: list[_Chunk] = []
    start = 0
    current: list[Token] = []
    for token in tokens:
        if token.token_type == TokenType.SEMICOLON:
            chunks.append(_Chunk(sql[start : token.start], current))
            start, current = token.end + 1, []
        else:
            current.append(token)
    chunks.append(_Chunk(sql[start:], current))
    # A chunk without tokens is only whitespace and comments: nothing runs, unless one of those
    # comments is executable, which the server does run.
    return [c for c in chunks if c.tokens or _EXECUTABLE_COMMENT.search(c.text)]


# --------------------------------------------------------------------------------------------
# One statement


@dataclass(frozen=True)
class _Verdict:
    kind: str
    operation: Operation
    tables: tuple[str, ...] = ()
    beyond_tables: bool = False
    reads: bool = True  # see StatementClass.reads
    tableless: bool = False  # see StatementClass.tableless
    switches_database: bool = False  # see StatementClass.switches_database
    database: str | None = None


_WRITE: Operation = "write"

# Statements classified by their keyword alone: always writes, no table named.
_OPAQUE_KINDS: dict[str, str] = {
    "LOAD": "load",
    "CALL": "call",
    "SET": "set",
    "DO": "do",
    "LOCK": "lock",
    "UNLOCK": "lock",
    "HANDLER": "handler",
    "BEGIN": "transaction",
    "COMMIT": "transaction",
    "ROLLBACK": "transaction",
    "SAVEPOINT": "transaction",
    "RELEASE": "transaction",
    "XA": "transaction",
    "PREPARE": "prepare",
    "EXECUTE": "prepare",
    "DEALLOCATE": "prepare",
    "RENAME": "ddl",
    "GRANT": "admin",
    "REVOKE": "admin",
    "FLUSH": "admin",
    "KILL": "admin",
    "ANALYZE": "admin",
    "OPTIMIZE": "admin",
    "REPAIR": "admin",
    "CHECK": "admin",
    "CHECKSUM": "admin",
    "RESET": "admin",
    "PURGE": "admin",
    "CHANGE": "admin",
    "STOP": "admin",
    "INSTALL": "admin",
    "UNINSTALL": "admin",
    "SHUTDOWN": "admin",
    "RESTART": "admin",
    "CACHE": "admin",
    "BINLOG": "admin",
    "CLONE": "admin",
    "IMPORT": "admin",
    "SIGNAL": "admin",
    "RESIGNAL": "admin",
}

# Statements parsed by sqlglot, with the kind to report when parsing fails.
_PARSED_KINDS: dict[str, str] = {
    "SELECT": "unparseable",
    "WITH": "unparseable",
    "TABLE": "unparseable",
    "VALUES": "unparseable",
    "(": "unparseable",
    "SHOW": "unparseable",
    "DESCRIBE": "unparseable",
    "DESC": "unparseable",
    "EXPLAIN": "unparseable",
    "INSERT": "insert",
    "REPLACE": "replace",
    "UPDATE": "update",
    "DELETE": "delete",
    "CREATE": "ddl",
    "ALTER": "ddl",
    "DROP": "ddl",
    "TRUNCATE": "ddl",
}

# Modifiers between the DML verb and the table. They change nothing about which tables are hit,
# and sqlglot mistakes some of them for table names (`DELETE QUICK FROM t` would name "quick").
_DML_VERBS = frozenset({"INSERT", "REPLACE", "UPDATE", "DELETE"})
_DML_MODIFIERS = frozenset({"LOW_PRIORITY", "HIGH_PRIORITY", "DELAYED", "QUICK", "IGNORE"})

# The export options that may follow `INTO OUTFILE 'file'`.
_EXPORT_WORDS = frozenset(
    {"CHARACTER", "SET", "CHARSET", "FIELDS", "COLUMNS", "TERMINATED", "OPTIONALLY", "ENCLOSED",
     "ESCAPED", "BY", "LINES", "STARTING"}
)


def _classify_chunk_safely(sql: str, chunk: _Chunk) -> StatementClass:
    """A statement's class; if classifying it fails in a way nobody foresaw, the strictest one
    (a write the table rules cannot describe): the gate must ask, never crash or wave it through."""
    try:
        return _classify_chunk(sql, chunk)
    except Exception:  # noqa: BLE001 - fail closed, and say so in the log
        log.exception("SQL classification failed; treating the statement as an unknown write")
        return StatementClass(sql=chunk.text.strip(), kind="unknown", operation=_WRITE, tables=(),
                              beyond_tables=True)


def _classify_chunk(sql: str, chunk: _Chunk) -> StatementClass:
    text = chunk.text.strip()
    if chunk.tokens is None:
        verdict = _Verdict("unparseable", _WRITE)
    elif not chunk.tokens:
        verdict = _Verdict("unknown", _WRITE, beyond_tables=True)  # an executable comment alone
    else:
        verdict = _classify_tokens(sql, chunk.tokens, _as_mysql_lexes(chunk.text))
        if _EXECUTABLE_COMMENT.search(chunk.text) or _has_mode_dependent_string(sql, chunk.tokens):
            verdict = replace(verdict, operation=_WRITE, beyond_tables=True)
    if verdict.kind in _MAY_SWITCH_DATABASE or _EXECUTABLE_COMMENT.search(chunk.text):
        # MariaDB runs `EXECUTE IMMEDIATE 'USE mysql'`, and an executable comment can hide a USE:
        # after such a statement the database that bare names mean is not known.
        verdict = replace(verdict, switches_database=True, database=None)
    return StatementClass(
        sql=text,
        kind=verdict.kind,
        operation=verdict.operation,
        tables=verdict.tables,
        beyond_tables=verdict.beyond_tables,
        reads=verdict.reads,
        tableless=verdict.tableless,
        switches_database=verdict.switches_database,
        database=verdict.database,
    )


# Kinds of statement that may run a USE the classifier cannot see: dynamic SQL, and statements of no
# known kind. (A query sqlglot cannot parse is still a query: it selects no database.)
_MAY_SWITCH_DATABASE = frozenset({"prepare", "unknown"})


def _classify_tokens(sql: str, tokens: list[Token], text: str) -> _Verdict:
    """``sql`` is the whole (lexed) string the tokens index into; ``text`` this statement alone."""
    # Multi-word command tokens ("LOCK TABLES") start with the statement's keyword.
    keyword = tokens[0].text.split()[0].upper() if tokens[0].text.strip() else ""
    if keyword == "START":
        is_transaction = len(tokens) > 1 and tokens[1].text.upper() == "TRANSACTION"
        return _Verdict("transaction" if is_transaction else "admin", _WRITE)
    if keyword == "USE":
        return _classify_use(text)
    if keyword == "SHOW":
        return _classify_show(text)
    if keyword not in _PARSED_KINDS:
        kind = _OPAQUE_KINDS.get(keyword, "unknown")
        # A qualified name anywhere in it is most likely a table it reads
        # (`SET @h = (SELECT authentication_string FROM mysql.user)`), and so is any name a query
        # inside it reads FROM or JOINs, bare ones too (`DO (SELECT v FROM secret)`): naming them
        # can only make the decision stricter, so a table's deny is not turned into a question by
        # wrapping the read.
        tables = (set(_opaque_tables(text)) | {n for n in _every_name(text) if "." in n}
                  | set(_read_names(text)) | set(_embedded_query_tables(text)))
        return _Verdict(kind, _WRITE, tuple(sorted(tables)), beyond_tables=True)

    outfile = _strip_into_file(tokens)
    if outfile is not None:
        # sqlglot cannot parse `INTO OUTFILE/DUMPFILE`; parsing the query without it still
        # names the tables read. Writing a server file is beyond any table.
        node = _parse(outfile, sql)
        read = _tables(node)[0] if node is not None else ()
        return _Verdict("select_into", _WRITE, read, beyond_tables=True)

    is_replace = keyword == "REPLACE"
    if is_replace:
        # The tokenizer hands back whatever follows REPLACE as one string; MySQL's REPLACE has
        # INSERT's grammar, which sqlglot parses.
        rest = tokens[1].text if len(tokens) > 1 else ""
        sql = f"INSERT {rest}"
        tokens = _tokenize(sql)
    node = _parse(_normalise_dml(tokens), sql)
    if node is None:
        # Valid MariaDB that sqlglot cannot read (`DROP TABLE t NOWAIT`, `DELETE ... RETURNING`):
        # every name in it counts as a table it may touch, so a table's deny still applies (more
        # names only make the decision stricter), and the unknown rule applies too.
        return _Verdict(_PARSED_KINDS[keyword], _WRITE, _every_name(text), beyond_tables=True)
    if isinstance(node, exp.Command) and str(node.this).upper() != "SHOW":
        # sqlglot recognised the verb but not the rest (CREATE TRIGGER, ALTER DATABASE, ...).
        kind = _PARSED_KINDS[keyword]
        return _Verdict("unknown" if kind == "unparseable" else kind, _WRITE,
                        _opaque_tables(text) or _every_name(text), True)
    verdict = _classify_node(node)
    if verdict.kind == "insert" and is_replace:
        verdict = replace(verdict, kind="replace")
    if verdict.operation == "read" and _calls_unsafe_function(tokens, _cte_names(node)):
        verdict = replace(verdict, operation=_WRITE, beyond_tables=True)
    elif verdict.kind in _DML_KINDS and _calls_unsafe_function(_dml_expressions(tokens), _cte_names(node)):
        # A stored function in a write (`UPDATE pub SET a = purge()`) may write any table, and
        # LOAD_FILE reads the server's files: not described by the tables the statement names.
        verdict = replace(verdict, beyond_tables=True)
    return verdict


_DML_KINDS = frozenset({"insert", "replace", "update", "delete"})
# Where a DML statement's expressions start; before them, `INSERT INTO t (a, b)` and `db.t (`
# are a table and its columns, not calls.
_EXPRESSION_STARTS = frozenset({"SET", "VALUES", "VALUE", "SELECT", "WHERE", "ON", "USING", "WITH"})


def _dml_expressions(tokens: Sequence[Token]) -> Sequence[Token]:
    start = next((i for i, t in enumerate(tokens) if t.text.upper() in _EXPRESSION_STARTS), len(tokens))
    return tokens[start:]


# --------------------------------------------------------------------------------------------
# USE and SHOW


def _classify_use(text: str) -> _Verdict:
    """`USE db` touches no table; it changes what bare names in later statements mean. A target
    that cannot be read leaves the database in effect unknown (and the statement a write)."""
    try:
        tokens = _FullTokenizer(dialect=_DIALECT).tokenize(text)
    except Exception:  # noqa: BLE001 - unreadable: the database in effect is unknown
        tokens = []
    if len(tokens) == 2 and _is_name(tokens[1]):
        return _Verdict("use", "read", tableless=True, switches_database=True, database=tokens[1].text.lower())
    return _Verdict("use", _WRITE, beyond_tables=True, switches_database=True)


# The account tables: MariaDB's mysql.global_priv (mysql.user is a view of it), MySQL's mysql.user.
ACCOUNT_TABLES = ("mysql.global_priv", "mysql.user")
# What other connections are running, and the statements they ran.
ACTIVITY_TABLES = ("information_schema.processlist",)
# Where SHOW forms that read the server's state rather than a table look, named as the table that
# holds the same facts (or, for the binary and relay logs, which no table holds, `mysql.binlog`),
# so the table rules decide them: `SHOW GRANTS` is a read of the account tables and meets their
# deny. Keys are the words after SHOW (and after FULL/GLOBAL/SESSION/...); the longest key wins.
_SHOW_READS: dict[tuple[str, ...], tuple[str, ...]] = {
    ("GRANTS",): ACCOUNT_TABLES,
    ("CREATE", "USER"): ACCOUNT_TABLES,
    ("CREATE", "ROLE"): ACCOUNT_TABLES,
    ("PROCESSLIST",): ACTIVITY_TABLES,
    ("EXPLAIN",): ACTIVITY_TABLES,  # SHOW EXPLAIN FOR <thread>: another connection's statement
    ("ANALYZE",): ACTIVITY_TABLES,
    # SHOW ENGINE ... STATUS/MUTEX: engine internals, with other connections' transactions and SQL.
    ("ENGINE",): ("information_schema.innodb_trx",),
    ("USER_STATISTICS",): ("information_schema.user_statistics",),
    ("CLIENT_STATISTICS",): ("information_schema.client_statistics",),
    ("INDEX_STATISTICS",): ("information_schema.index_statistics",),
    ("TABLE_STATISTICS",): ("information_schema.table_statistics",),
    ("BINLOG", "EVENTS"): ("mysql.binlog",),
    ("RELAYLOG", "EVENTS"): ("mysql.binlog",),
    ("TABLES",): ("information_schema.tables",),
    ("TABLE", "STATUS"): ("information_schema.tables",),
    ("OPEN", "TABLES"): ("information_schema.tables",),
    ("DATABASES",): ("information_schema.schemata",),
    ("SCHEMAS",): ("information_schema.schemata",),
    ("CREATE", "DATABASE"): ("information_schema.schemata",),
    ("CREATE", "SCHEMA"): ("information_schema.schemata",),
    ("TRIGGERS",): ("information_schema.triggers",),
    ("CREATE", "TRIGGER"): ("information_schema.triggers",),
    ("EVENTS",): ("information_schema.events",),
    ("CREATE", "EVENT"): ("information_schema.events",),
    ("PROCEDURE",): ("information_schema.routines",),  # STATUS, CODE
    ("FUNCTION",): ("information_schema.routines",),
    ("PACKAGE",): ("information_schema.routines",),
    ("CREATE", "PROCEDURE"): ("information_schema.routines",),
    ("CREATE", "FUNCTION"): ("information_schema.routines",),
    ("CREATE", "PACKAGE"): ("information_schema.routines",),
    ("VARIABLES",): ("information_schema.global_variables",),
    ("STATUS",): ("information_schema.global_status",),
    ("CHARACTER", "SET"): ("information_schema.character_sets",),
    ("CHARSET",): ("information_schema.character_sets",),
    ("COLLATION",): ("information_schema.collations",),
    ("ENGINES",): ("information_schema.engines",),
    ("STORAGE", "ENGINES"): ("information_schema.engines",),
    ("PLUGINS",): ("information_schema.plugins",),
    ("PROFILE",): ("information_schema.profiling",),
    ("PROFILES",): ("information_schema.profiling",),
    ("QUERY_RESPONSE_TIME",): ("information_schema.query_response_time",),
}
# SHOW forms that read a table named in the statement (sqlglot reads which).
_SHOW_OF_A_TABLE = frozenset({("COLUMNS",), ("FIELDS",), ("INDEX",), ("INDEXES",), ("KEYS",),
                              ("CREATE", "TABLE"), ("CREATE", "VIEW"), ("CREATE", "SEQUENCE")})
# SHOW forms about this connection alone, or about no data at all.
_SHOW_NOTHING = frozenset({("WARNINGS",), ("ERRORS",), ("COUNT",), ("PRIVILEGES",), ("AUTHORS",),
                           ("CONTRIBUTORS",), ("LOCALES",), ("MASTER", "STATUS"), ("BINLOG", "STATUS"),
                           ("BINARY", "LOGS"), ("MASTER", "LOGS")})
_SHOW_MODIFIERS = frozenset({"FULL", "GLOBAL", "SESSION", "LOCAL", "EXTENDED"})


def _classify_show(text: str) -> _Verdict:
    """Every SHOW is read-only; what it reads is named from its form. A form not known here reads
    something beyond any table (the unknown rule); a SHOW that runs a query or calls a function
    in its WHERE is classified the way that query would be."""
    try:
        tokens = _FullTokenizer(dialect=_DIALECT).tokenize(text)
    except Exception:  # noqa: BLE001 - the server judges it; for us it is unknown
        return _Verdict("show", "read", _every_name(text), beyond_tables=True)
    words = [t.text.upper() if t.token_type not in (TokenType.STRING, TokenType.IDENTIFIER) else ""
             for t in tokens]
    index = 1
    while index < len(words) and words[index] in _SHOW_MODIFIERS:
        index += 1
    form = tuple(words[index:index + 2])
    tables: tuple[str, ...] = ()
    tableless = beyond = False
    if form in _SHOW_READS or form[:1] in _SHOW_READS:
        tables = _SHOW_READS.get(form) or _SHOW_READS[form[:1]]
    elif form in _SHOW_OF_A_TABLE or form[:1] in _SHOW_OF_A_TABLE:
        node = _parse(_tokenize(text), text)
        named = _show_tables(node) if isinstance(node, exp.Show) else ()
        tables, beyond = (named, False) if named else ((), True)
    elif form in _SHOW_NOTHING or form[:1] in _SHOW_NOTHING:
        tableless = True
    else:
        beyond = True  # SLAVE STATUS, WSREP_*, a form of a later release: ask
    if "SELECT" in words:
        # `SHOW TABLES WHERE (SELECT ... FROM mysql.user) ...`: a query in its filter reads too.
        tables = tuple(sorted(set(tables) | set(_every_name(text))))
        tableless, beyond = False, True
    verdict = _Verdict("show", "read", tuple(tables), beyond, tableless=tableless)
    if _calls_unsafe_function(tokens, frozenset()):
        verdict = replace(verdict, operation=_WRITE, beyond_tables=True, tableless=False)
    return verdict


# --------------------------------------------------------------------------------------------
# Tables named by statements sqlglot does not parse


class _FullTokenizer(_DIALECT.tokenizer_class):  # type: ignore[name-defined,misc]
    # The dialect's tokenizer hands back everything after a command keyword (LOCK TABLES, RENAME,
    # ...) as one string; with no command keywords it tokenizes the whole statement.
    COMMANDS: set[TokenType] = set()


_NAME_TOKENS = (TokenType.VAR, TokenType.IDENTIFIER)


def _every_name(text: str) -> tuple[str, ...]:
    """Every name of a statement (words that are not keywords, and quoted names), with `a.b`
    pairs joined, sorted."""
    try:
        tokens = _FullTokenizer(dialect=_DIALECT).tokenize(text)
    except Exception:  # noqa: BLE001 - nothing readable: the unknown rule still applies
        return ()
    names: set[str] = set()
    index = 0
    while index < len(tokens):
        if tokens[index].token_type not in _NAME_TOKENS:
            index += 1
            continue
        parts, index = _name_at(tokens, index)
        names.add(".".join(parts).lower())
        names.update(p.lower() for p in parts)
        index += 1
    return tuple(sorted(names))


def _name_at(tokens: Sequence[Token], index: int) -> tuple[list[str], int]:
    """The parts of the (maybe dotted: `db.t`) name starting at `index`, and the index of its
    last token."""
    parts = [tokens[index].text]
    while (index + 2 < len(tokens) and tokens[index + 1].token_type == TokenType.DOT
           and tokens[index + 2].token_type in _NAME_TOKENS):
        parts.append(tokens[index + 2].text)
        index += 2
    return parts, index


_FROM_TOKENS = (TokenType.FROM, TokenType.JOIN)


def _read_names(text: str) -> tuple[str, ...]:
    """The names a statement's queries read (after FROM or JOIN, and each one after a comma of
    the same FROM list), as written: `db.t` or a bare `t`, lower case, sorted. For statements the
    parser does not read, where a query may sit inside (`SET @h = (SELECT ...)`, `DO (...)`)."""
    try:
        tokens = _FullTokenizer(dialect=_DIALECT).tokenize(text)
    except Exception:  # noqa: BLE001 - nothing readable: the unknown rule still applies
        return ()
    names: set[str] = set()
    want = False  # the next name is a table (after FROM, JOIN or a comma of a FROM list)
    in_from = False  # inside a FROM list: a comma brings the next table
    index = 0
    while index < len(tokens):
        kind = tokens[index].token_type
        if kind in _FROM_TOKENS:
            want = in_from = True
        elif kind in _NAME_TOKENS and want:
            parts, index = _name_at(tokens, index)
            names.add(".".join(parts).lower())
            want = False
        elif kind == TokenType.COMMA and in_from:
            want = True
        elif kind in _NAME_TOKENS or kind == TokenType.ALIAS:
            pass  # an alias (`FROM a x`, `AS s`): the FROM list goes on
        else:
            want = in_from = False
        index += 1
    return tuple(sorted(names))


_QUERY_STARTS = frozenset({"SELECT", "WITH", "TABLE", "VALUES"})
# Statements whose string operand is SQL the server runs: `PREPARE s FROM '...'`, `EXECUTE IMMEDIATE '...'`.
_DYNAMIC_SQL_STARTS = frozenset({"PREPARE", "EXECUTE"})


def _embedded_query_tables(text: str) -> tuple[str, ...]:
    """The tables read by the queries an opaque statement holds: each parenthesised query
    (`SET @h = (SELECT ... FROM a STRAIGHT_JOIN secret)`, `DO (...)`), read by the parser as any
    query is, every name in it when the parser cannot; and the tables of a literal statement that
    PREPARE or EXECUTE IMMEDIATE runs. A token scan of the FROM list alone misses joins, index
    hints, parenthesised tables and ON conditions."""
    try:
        tokens = _FullTokenizer(dialect=_DIALECT).tokenize(text)
    except Exception:  # noqa: BLE001 - nothing readable: the unknown rule still applies
        return ()
    names: set[str] = set()
    for index, token in enumerate(tokens):
        if (token.token_type == TokenType.L_PAREN and index + 1 < len(tokens)
                and tokens[index + 1].text.upper() in _QUERY_STARTS):
            depth = 0
            for close in range(index, len(tokens)):
                depth += {TokenType.L_PAREN: 1, TokenType.R_PAREN: -1}.get(tokens[close].token_type, 0)
                if depth == 0:
                    break
            inner = text[tokens[index + 1].start : tokens[close - 1].end + 1]
            node = _parse(_tokenize(inner), inner)
            names.update(_tables(node)[0] if node is not None else _every_name(inner))
    if tokens and tokens[0].text.split()[0].upper() in _DYNAMIC_SQL_STARTS:
        for token in tokens:
            if token.token_type == TokenType.STRING and token.text.strip():
                try:
                    names.update(classify_sql(token.text).tables)
                except Exception:  # noqa: BLE001 - not SQL: the unknown rule still applies
                    names.update(_every_name(token.text))
    return tuple(sorted(names))


def _opaque_tables(text: str) -> tuple[str, ...]:
    """The tables an opaque statement's grammar names, sorted; () when none can be read.

    Only names in fixed grammatical places are taken (``RENAME TABLE a TO b``, ``LOCK TABLES a
    READ``, ``INTO TABLE a``, ``HANDLER a``, ``ON a``); anything unexpected stops the reading, and
    the statement stays under the unknown rule either way.
    """
    try:
        tokens = _FullTokenizer(dialect=_DIALECT).tokenize(text)
    except Exception:  # noqa: BLE001 - nothing readable: the unknown rule still applies
        return ()
    if not tokens:
        return ()
    words = [t.text.upper() if t.token_type not in (TokenType.STRING, TokenType.IDENTIFIER) else ""
             for t in tokens]
    first = words[0].split()
    if not first:
        return ()  # it starts with a quoted name or a string: no grammar to read names from
    names: list[str] = []
    if first == ["LOCK", "TABLES"] or first == ["LOCK"]:
        start = 1 if len(first) == 2 else _after_words(words, 1, ("TABLE", "TABLES"))
        if start is not None:
            names = _name_list(tokens, start, skip_to_comma=True)
    elif first[0] == "RENAME" and len(first) == 1:
        start = _after_words(words, 1, ("TABLE", "TABLES"))
        if start is not None:
            names = _rename_pairs(tokens, words, start)
    elif first[0] == "LOAD":
        for i in range(len(tokens) - 2):
            if words[i] == "INTO" and words[i + 1] == "TABLE":
                names = _name_list(tokens, i + 2, single=True)
                break
    elif first[0] == "HANDLER":
        names = _name_list(tokens, 1, single=True)
    elif first[0] in ("ANALYZE", "OPTIMIZE", "REPAIR", "CHECK", "CHECKSUM", "FLUSH"):
        index = 1
        while index < len(words) and words[index] in ("NO_WRITE_TO_BINLOG", "LOCAL"):
            index += 1
        start = _after_words(words, index, ("TABLE", "TABLES"))
        if start is not None:
            names = _name_list(tokens, start)
    elif first[0] in ("GRANT", "REVOKE"):
        on = next((i for i, w in enumerate(words) if w == "ON"), None)
        if on is not None:
            start = on + 1
            if start < len(words) and words[start] == "TABLE":
                start += 1
            if start < len(words) and words[start] not in ("FUNCTION", "PROCEDURE", "PACKAGE"):
                names = _name_list(tokens, start, single=True)
    elif first[0] == "CREATE" and "TRIGGER" in words:
        after = words.index("TRIGGER")
        on = next((i for i in range(after, len(words)) if words[i] == "ON"), None)
        if on is not None:
            names = _name_list(tokens, on + 1, single=True)
    return tuple(sorted(set(names)))


def _after_words(words: Sequence[str], index: int, expected: tuple[str, ...]) -> int | None:
    return index + 1 if index < len(words) and words[index] in expected else None


def _table_at(tokens: Sequence[Token], index: int) -> tuple[str | None, int]:
    """A table name (``t``, ``db.t``, backticked or not) at ``index``, and the index after it."""
    parts: list[str] = []
    while index < len(tokens) and _is_name(tokens[index]):
        parts.append(tokens[index].text)
        index += 1
        if index < len(tokens) and tokens[index].token_type == TokenType.DOT:
            index += 1
            if index < len(tokens) and _is_name(tokens[index]):
                continue
            return None, index  # `db.*` is a wildcard, not a table
        break
    if not parts or len(parts) > 2:
        return None, index
    return ".".join(parts).lower(), index


def _is_name(token: Token) -> bool:
    return token.token_type in (TokenType.VAR, TokenType.IDENTIFIER) or (
        token.token_type != TokenType.STRING and _is_word(token))


def _name_list(tokens: Sequence[Token], index: int, *, single: bool = False,
               skip_to_comma: bool = False) -> list[str]:
    """Comma-separated table names from ``index``; stops at the first thing that is not one."""
    names: list[str] = []
    while True:
        name, index = _table_at(tokens, index)
        if name is None:
            return names
        names.append(name)
        if single:
            return names
        if skip_to_comma:  # `LOCK TABLES t AS a READ LOCAL, u WRITE`
            depth = 0
            while index < len(tokens) and not (depth == 0 and tokens[index].token_type == TokenType.COMMA):
                depth += {TokenType.L_PAREN: 1, TokenType.R_PAREN: -1}.get(tokens[index].token_type, 0)
                index += 1
        if index >= len(tokens) or tokens[index].token_type != TokenType.COMMA:
            return names
        index += 1


def _rename_pairs(tokens: Sequence[Token], words: Sequence[str], index: int) -> list[str]:
    """`a TO b, c TO d`: both sides are tables (renaming onto a name creates that table)."""
    names: list[str] = []
    while True:
        source, index = _table_at(tokens, index)
        if source is None or index >= len(words) or words[index] != "TO":
            return names + ([source] if source else [])
        target, index = _table_at(tokens, index + 1)
        names.append(source)
        if target is None:
            return names
        names.append(target)
        if index >= len(tokens) or tokens[index].token_type != TokenType.COMMA:
            return names
        index += 1


def _tokenize(sql: str) -> list[Token]:
    try:
        return _DIALECT.tokenize(sql)
    except Exception:  # noqa: BLE001 - the caller treats "no tokens" as unparseable
        return []


def _parse(tokens: list[Token], sql: str) -> exp.Expr | None:
    if not tokens:
        return None
    try:
        trees = [tree for tree in _DIALECT.parser().parse(tokens, sql) if tree is not None]
    except Exception:  # noqa: BLE001 - whatever sqlglot cannot parse (or chokes on) is a write
        return None
    return trees[0] if len(trees) == 1 else None


def _normalise_dml(tokens: list[Token]) -> list[Token]:
    out: list[Token] = []
    after_verb = False
    for token in tokens:
        word = token.text.upper()
        if after_verb and word in _DML_MODIFIERS and token.token_type != TokenType.IDENTIFIER:
            continue
        after_verb = word in _DML_VERBS and token.token_type != TokenType.IDENTIFIER
        out.append(token)
    return out


def _strip_into_file(tokens: list[Token]) -> list[Token] | None:
    """The tokens without `INTO OUTFILE|DUMPFILE 'file' [options]`, or None if there is none."""
    for index in range(len(tokens) - 2):
        if (
            tokens[index].token_type == TokenType.INTO
            and tokens[index + 1].text.upper() in ("OUTFILE", "DUMPFILE")
            and tokens[index + 2].token_type == TokenType.STRING
        ):
            end = index + 3  # INTO, OUTFILE, 'file'
            previous = ""
            while end < len(tokens):
                word = tokens[end].text.upper()
                is_word = tokens[end].token_type not in (TokenType.STRING, TokenType.IDENTIFIER)
                if is_word and word in _EXPORT_WORDS:
                    previous = word
                elif previous in ("BY", "SET", "CHARSET"):
                    previous = ""
                else:
                    break
                end += 1
            return tokens[:index] + tokens[end:]
    return None


def _has_mode_dependent_string(sql: str, tokens: Iterable[Token]) -> bool:
    """A literal whose end depends on NO_BACKSLASH_ESCAPES could hide SQL from one reading."""
    for token in tokens:
        # A command's trailing string token carries its raw text but not its offsets.
        for text in (sql[token.start : token.end + 1], token.text):
            if "\\'" in text or '\\"' in text:
                return True
    return False


# --------------------------------------------------------------------------------------------
# Trees


_READ_QUERIES = (exp.Select, exp.SetOperation, exp.Values)

# Nested nodes that have no business inside a read.
_STATEMENT_NODES = (exp.DML, exp.DDL, exp.Command, exp.Alter, exp.Drop, exp.TruncateTable, exp.Set, exp.Use, exp.Kill, exp.Transaction,
                    exp.Commit, exp.Rollback, exp.LoadData, exp.Grant, exp.Revoke, exp.Analyze,
                    exp.Execute)

_DDL_NODES = (exp.DDL, exp.Command, exp.Alter, exp.Drop, exp.TruncateTable, exp.AlterRename)

# SHOW statements whose target is a table.
_SHOW_TABLE_KINDS = frozenset(
    {"COLUMNS", "FIELDS", "INDEX", "INDEXES", "KEYS", "CREATE TABLE", "CREATE VIEW"}
)

# DDL object kinds that are tables (or view / index on a table); anything else (DATABASE,
# PROCEDURE, FUNCTION, TRIGGER, EVENT, USER, ...) is beyond tables and its name is no table.
_TABLE_DDL_KINDS = frozenset({"TABLE", "VIEW", "INDEX"})


def _classify_node(node: exp.Expr) -> _Verdict:
    query = node
    while isinstance(query, exp.Subquery):
        query = query.this
    if isinstance(query, _READ_QUERIES):
        return _classify_query(node)
    if isinstance(node, exp.Show):  # (SHOW statements are classified by _classify_show)
        return _Verdict("show", "read", _show_tables(node))
    if isinstance(node, exp.Describe):
        return _classify_describe(node)
    tables, beyond = _tables(node)
    # Only an INSERT or a DDL statement without a query in it reads none of the tables it names.
    reads = node.find(exp.Select) is not None
    if isinstance(node, exp.Insert):
        return _Verdict("insert", _WRITE, tables, beyond, reads=reads or bool(node.args.get("conflict")))
    if isinstance(node, exp.Update):
        return _Verdict("update", _WRITE, tables, beyond)
    if isinstance(node, exp.Delete):
        return _Verdict("delete", _WRITE, tables, beyond)
    if isinstance(node, exp.Merge):
        return _Verdict("merge", _WRITE, tables, beyond)
    if isinstance(node, _DDL_NODES):
        return _Verdict("ddl", _WRITE, tables, beyond, reads=reads)
    return _Verdict("unknown", _WRITE, tables, True)


def _classify_query(node: exp.Expr) -> _Verdict:
    tables, beyond = _tables(node)
    if any(True for _ in node.find_all(exp.Into)):
        return _Verdict("select_into", _WRITE, tables, True)
    if any(True for _ in node.find_all(exp.Lock)):
        return _Verdict("select", _WRITE, tables, beyond)
    if any(True for _ in node.find_all(exp.PropertyEQ)):  # `@x := ...` assigns a variable
        return _Verdict("select", _WRITE, tables, True)
    if any(not isinstance(n.this, exp.Subquery | exp.Query) for n in node.find_all(exp.Lateral)):
        # sqlglot reads `FROM lateral t` (a table named lateral, in MariaDB) as LATERAL t and
        # loses the table; MySQL's own LATERAL always takes a subquery.
        return _Verdict("unknown", _WRITE, tables, True)
    if any(n is not node for n in node.find_all(*_STATEMENT_NODES)):
        return _Verdict("select", _WRITE, tables, True)
    # `SELECT 1`, `SELECT NOW()`: a query that names no table reads none (a stored function,
    # which could, makes it a write beyond tables later on).
    return _Verdict("select", "read", tables, beyond, tableless=not tables and not beyond)


def _classify_describe(node: exp.Describe) -> _Verdict:
    target = node.this
    if isinstance(target, exp.Table | exp.Schema):
        return _Verdict("describe", "read", _tables(node)[0])
    if not isinstance(target, exp.Expr):
        return _Verdict("explain", _WRITE, (), True)
    inner = _classify_node(target)
    return replace(inner, kind="explain")


def _show_tables(node: exp.Show) -> tuple[str, ...]:
    target = node.args.get("target")
    if str(node.this).upper() not in _SHOW_TABLE_KINDS or not isinstance(target, exp.Identifier):
        return ()
    db = node.args.get("db")
    parts = [db.name, target.name] if isinstance(db, exp.Identifier) else [target.name]
    return (".".join(parts).lower(),)


def _tables(node: exp.Expr) -> tuple[tuple[str, ...], bool]:
    """The real tables under ``node`` (sorted), and whether it acts on a non-table object."""
    skipped: set[int] = set()
    beyond = False
    kind = str(node.args.get("kind") or "").upper()
    if isinstance(node, exp.Create | exp.Drop | exp.Alter) and kind not in _TABLE_DDL_KINDS:
        beyond = True
        skipped.update(id(t) for t in _ddl_object_tables(node))
    elif isinstance(node, exp.Drop) and kind == "INDEX":
        skipped.update(id(t) for t in _ddl_object_tables(node))  # index names, not tables

    targets = _delete_targets(node) if isinstance(node, exp.Delete) else []
    skipped.update(id(t) for t in targets)

    names: set[str] = set()
    aliases: dict[str, str] = {}
    for table in node.find_all(exp.Table):
        if id(table) in skipped or not _is_real_table(table):
            continue
        name = _table_name(table)
        names.add(name)
        if table.alias:
            aliases[table.alias.lower()] = name
    for table in targets:
        if not _is_real_table(table):
            continue
        name = _table_name(table)
        # In `DELETE o FROM orders o ...` the target `o` is the alias of `orders`.
        if not (table.alias or table.db) and name in aliases:
            continue
        names.add(name)
    return tuple(sorted(names)), beyond


def _ddl_object_tables(node: exp.Expr) -> list[exp.Table]:
    if isinstance(node, exp.Drop):
        return [t for t in node.args.get("tables") or [] if isinstance(t, exp.Table)]
    this = node.this
    if isinstance(this, exp.Table):
        return [this]
    if isinstance(this, exp.Expr):
        first = this.find(exp.Table)
        return [first] if first is not None else []
    return []


def _delete_targets(node: exp.Delete) -> list[exp.Table]:
    if node.args.get("using"):  # DELETE FROM a, b USING a JOIN b ...
        this = node.this
        return list(this.find_all(exp.Table)) if isinstance(this, exp.Expr) else []
    found: list[exp.Table] = []
    for target in node.args.get("tables") or []:  # DELETE a, b FROM a JOIN b ...
        found.extend(target.find_all(exp.Table))
    return found


def _is_real_table(table: exp.Table) -> bool:
    # Table functions (JSON_TABLE) and `INTO @var` targets are no tables; nor are CTE names,
    # nor MySQL's placeholder DUAL (`dual` in backticks is a real table).
    if not isinstance(table.this, exp.Identifier) or table.find_ancestor(exp.Into) is not None:
        return False
    if not table.db and table.name.upper() == "DUAL" and not table.this.quoted:
        return False
    return not _is_cte_reference(table)


def _table_name(table: exp.Table) -> str:
    return ".".join(part.name for part in table.parts).lower()


def _is_cte_reference(table: exp.Table) -> bool:
    """Whether an unqualified table name resolves to a CTE in scope where it appears."""
    if table.db or table.catalog:
        return False
    name = table.name.lower()
    child: exp.Expr = table
    parent = table.parent
    while parent is not None:
        if isinstance(parent, exp.With):
            # Inside a CTE body: earlier CTEs are visible, itself only if RECURSIVE.
            ctes = list(parent.expressions)
            position = ctes.index(child) if child in ctes else len(ctes)
            visible = ctes[: position + 1] if parent.args.get("recursive") else ctes[:position]
            if any(cte.alias_or_name.lower() == name for cte in visible):
                return True
        else:
            with_ = parent.args.get("with_")
            if isinstance(with_, exp.With) and with_ is not child:
                if any(cte.alias_or_name.lower() == name for cte in with_.expressions):
                    return True
        child, parent = parent, parent.parent
    return False


def _cte_names(node: exp.Expr) -> frozenset[str]:
    return frozenset(cte.alias_or_name.upper() for cte in node.find_all(exp.CTE))


# --------------------------------------------------------------------------------------------
# Function calls inside reads


def _calls_unsafe_function(tokens: Sequence[Token], cte_names: frozenset[str]) -> bool:
    """Whether the statement calls anything but a side-effect-free built-in function.

    Works on tokens because sqlglot maps many names to typed functions from other dialects, and
    a MySQL stored function of such a name (which may write anything) would hide behind them.
    """
    for index in range(len(tokens) - 1):
        name, paren = tokens[index], tokens[index + 1]
        if paren.token_type != TokenType.L_PAREN or not _is_word(name):
            continue
        previous = tokens[index - 1] if index else None
        if previous is not None and previous.token_type in (TokenType.ALIAS, TokenType.R_PAREN):
            continue  # `AS d(a, b)`, `CAST(x AS CHAR(3))`, `(subquery) d(a, b)`: no call
        word = name.text.upper()
        if name.token_type != TokenType.IDENTIFIER:
            if word in _STRUCTURAL_WORDS:
                continue  # reserved words cannot name a stored function: `IN (`, `OVER (`, ...
            after = _STRUCTURAL_AFTER.get(word)
            if after is not None and previous is not None and previous.text.upper() in after:
                continue
        if word in cte_names and _is_cte_column_list(tokens, index + 1):
            continue  # `WITH c (a, b) AS (...)`
        if name.token_type == TokenType.IDENTIFIER:
            return True  # `f`(...) always calls a stored or loadable function
        if previous is not None and previous.token_type == TokenType.DOT:
            return True  # shop.f(...) is a stored function
        if name.end + 1 != paren.start and word in _IGNORE_SPACE_FUNCTIONS:
            return True  # `now ()`: without IGNORE_SPACE MySQL looks up a stored `now`
        if word == "LAST_INSERT_ID":
            after = tokens[index + 2] if index + 2 < len(tokens) else None
            if after is None or after.token_type != TokenType.R_PAREN:
                return True  # LAST_INSERT_ID(expr) sets session state
            continue
        if word in _SIDE_EFFECT_FUNCTIONS or word not in _PURE_FUNCTIONS:
            return True
    return False


def _is_cte_column_list(tokens: Sequence[Token], open_index: int) -> bool:
    """Whether the parenthesis at ``open_index`` closes right before `AS (`."""
    depth = 0
    for index in range(open_index, len(tokens)):
        if tokens[index].token_type == TokenType.L_PAREN:
            depth += 1
        elif tokens[index].token_type == TokenType.R_PAREN:
            depth -= 1
            if depth == 0:
                following = [t.token_type for t in tokens[index + 1 : index + 3]]
                return following == [TokenType.ALIAS, TokenType.L_PAREN]
    return False


def _is_word(token: Token) -> bool:
    if token.token_type in (TokenType.VAR, TokenType.IDENTIFIER):
        return True
    text = token.text
    return text[:1].isalpha() and text.replace("_", "").replace("$", "").isalnum()


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Reserved in both MySQL 8 and MariaDB (so never an unquoted stored-function name) and seen
# right before a parenthesis in queries.
_STRUCTURAL_WORDS = _words(
    """
    ALL AND AS ASC BETWEEN BY CASE CROSS DESC DISTINCT DISTINCTROW DIV ELSE EXCEPT EXISTS FOR
    FORCE FROM GROUP HAVING IGNORE IN INDEX INNER INTERSECT INTO IS JOIN KEY LEFT LIKE LIMIT
    NATURAL NOT NULL ON OR ORDER OUTER OVER PARTITION RECURSIVE REGEXP RIGHT RLIKE ROW ROWS SELECT
    STRAIGHT_JOIN THEN UNION USE USING VALUES WHEN WHERE WITH XOR
    IF CHAR CHARACTER CONVERT DATABASE SCHEMA DEFAULT INSERT INTERVAL MATCH MOD REPEAT REPLACE
    CURRENT_DATE CURRENT_TIME CURRENT_TIMESTAMP CURRENT_USER LOCALTIME LOCALTIMESTAMP UTC_DATE
    UTC_TIME UTC_TIMESTAMP BINARY DECIMAL NUMERIC DOUBLE FLOAT INT INTEGER BIGINT SMALLINT TINYINT
    MEDIUMINT REAL VARCHAR VARBINARY DEC
    """
)

# Keywords that are not reserved everywhere, so only structural where they follow these tokens:
# `= ANY (`, `MEMBER OF (`, `JOIN LATERAL (`. Elsewhere they could name a stored function.
_STRUCTURAL_AFTER: dict[str, frozenset[str]] = {
    "ANY": _words("= <> != < > <= >= <=>"),
    "SOME": _words("= <> != < > <= >= <=>"),
    "OF": _words("MEMBER"),
    "LATERAL": _words("FROM JOIN ,"),
}

# Built-in functions with no side effects in both MySQL and MariaDB (plus type names used in
# CONVERT and JSON_TABLE's COLUMNS). A name built into MySQL only (BIN_TO_UUID, POINT, ...) calls
# a stored function of that name on MariaDB, so it is not here. A name missing here only costs a
# question to the operator.
_PURE_FUNCTIONS = _words(
    """
    ABS ACOS ADDDATE ADDTIME AES_DECRYPT AES_ENCRYPT AGAINST ASCII ASIN ATAN ATAN2 AVG BENCHMARK
    BIN BIT_AND BIT_COUNT BIT_LENGTH BIT_OR BIT_XOR CAST CEIL CEILING CHAR_LENGTH CHARACTER_LENGTH
    CHARSET CHR COALESCE COERCIBILITY COLLATION COMPRESS CONCAT CONCAT_WS CONNECTION_ID CONV
    CONVERT_TZ COS COT COUNT CRC32 CUME_DIST CURDATE CURRENT_ROLE CURTIME DATE DATE_ADD DATE_FORMAT
    DATE_SUB DATEDIFF DAY DAYNAME DAYOFMONTH DAYOFWEEK DAYOFYEAR DEGREES DENSE_RANK ELT EXP
    EXPORT_SET EXTRACT EXTRACTVALUE FIELD FIND_IN_SET FIRST_VALUE FLOOR FORMAT FOUND_ROWS
    FROM_BASE64 FROM_DAYS FROM_UNIXTIME GET_FORMAT GREATEST GROUP_CONCAT HEX HOUR IFNULL INET_ATON
    INET_NTOA INET6_ATON INET6_NTOA INSTR IS_FREE_LOCK IS_IPV4 IS_IPV4_COMPAT IS_IPV4_MAPPED
    IS_IPV6 IS_USED_LOCK ISNULL JSON_ARRAY JSON_ARRAY_APPEND JSON_ARRAY_INSERT JSON_ARRAYAGG
    JSON_COMPACT JSON_CONTAINS JSON_CONTAINS_PATH JSON_DEPTH JSON_DETAILED JSON_EQUALS JSON_EXISTS
    JSON_EXTRACT JSON_INSERT JSON_KEYS JSON_LENGTH JSON_LOOSE JSON_MERGE JSON_MERGE_PATCH
    JSON_MERGE_PRESERVE JSON_NORMALIZE JSON_OBJECT JSON_OBJECTAGG JSON_OVERLAPS JSON_PRETTY
    JSON_QUERY JSON_QUOTE JSON_REMOVE JSON_REPLACE JSON_SEARCH JSON_SET JSON_TABLE JSON_TYPE
    JSON_UNQUOTE JSON_VALID JSON_VALUE LAG LAST_DAY LAST_VALUE LASTVAL LCASE LEAD LEAST LENGTH
    LENGTHB LN LOCATE LOG LOG10 LOG2 LOWER LPAD LTRIM MAKE_SET MAKEDATE MAKETIME MAX MD5 MEDIAN
    MICROSECOND MID MIN MINUTE MONTH MONTHNAME NAME_CONST NATURAL_SORT_KEY NOW NTH_VALUE NTILE
    NULLIF NVL NVL2 OCT OCTET_LENGTH ORD PERCENT_RANK PERCENTILE_CONT PERCENTILE_DISC PERIOD_ADD
    PERIOD_DIFF PI POSITION POW POWER QUARTER QUOTE RADIANS RAND RANDOM_BYTES RANK REGEXP_INSTR
    REGEXP_REPLACE REGEXP_SUBSTR REVERSE ROUND ROW_COUNT ROW_NUMBER RPAD RTRIM SEC_TO_TIME SECOND
    SESSION_USER SFORMAT SHA SHA1 SHA2 SIGN SIN SLEEP SOUNDEX SPACE SQRT STD STDDEV STDDEV_POP
    STDDEV_SAMP STR_TO_DATE STRCMP SUBDATE SUBSTR SUBSTRING SUBSTRING_INDEX SUBTIME SUM SYSDATE
    SYSTEM_USER TAN TIME TIME_FORMAT TIME_TO_SEC TIMEDIFF TIMESTAMP TIMESTAMPADD TIMESTAMPDIFF
    TO_BASE64 TO_CHAR TO_DAYS TO_SECONDS TRIM TRUNCATE UCASE UNCOMPRESS UNCOMPRESSED_LENGTH UNHEX
    UNIX_TIMESTAMP UPPER USER UUID UUID_SHORT VAR_POP VAR_SAMP VARIANCE VERSION WEEK WEEKDAY
    WEEKOFYEAR WEIGHT_STRING YEAR YEARWEEK ADD_MONTHS ST_AREA ST_ASBINARY ST_ASGEOJSON ST_ASTEXT
    ST_ASWKB ST_ASWKT ST_BUFFER ST_CENTROID ST_CONTAINS ST_CONVEXHULL ST_CROSSES ST_DIFFERENCE
    ST_DIMENSION ST_DISJOINT ST_DISTANCE ST_DISTANCE_SPHERE ST_ENDPOINT ST_ENVELOPE ST_EQUALS
    ST_EXTERIORRING ST_GEOMETRYN ST_GEOMETRYTYPE ST_GEOMFROMGEOJSON ST_GEOMFROMTEXT ST_GEOMFROMWKB
    ST_INTERSECTION ST_INTERSECTS ST_ISCLOSED ST_ISEMPTY ST_ISSIMPLE ST_LENGTH ST_NUMGEOMETRIES
    ST_NUMPOINTS ST_OVERLAPS ST_POINTFROMTEXT ST_POINTN ST_SRID ST_STARTPOINT ST_SYMDIFFERENCE
    ST_TOUCHES ST_UNION ST_WITHIN ST_X ST_Y MBRCONTAINS MBRDISJOINT MBREQUALS MBRINTERSECTS
    MBROVERLAPS MBRTOUCHES MBRWITHIN COLUMNS DATETIME NCHAR JSON SIGNED UNSIGNED
    """
)

# The built-ins MySQL only recognises when "(" follows the name directly (unless IGNORE_SPACE).
_IGNORE_SPACE_FUNCTIONS = _words(
    """
    ADDDATE BIT_AND BIT_OR BIT_XOR CAST COUNT CURDATE CURTIME DATE_ADD DATE_SUB EXTRACT
    GROUP_CONCAT MAX MID MIN NOW POSITION SESSION_USER STD STDDEV STDDEV_POP STDDEV_SAMP SUBDATE
    SUBSTR SUBSTRING SUM SYSDATE SYSTEM_USER TRIM VARIANCE VAR_POP VAR_SAMP
    """
)

# Built-ins that take locks, wait on replication, advance sequences or read server files.
_SIDE_EFFECT_FUNCTIONS = _words(
    """
    GET_LOCK RELEASE_LOCK RELEASE_ALL_LOCKS MASTER_POS_WAIT SOURCE_POS_WAIT MASTER_GTID_WAIT
    WAIT_FOR_EXECUTED_GTID_SET WAIT_UNTIL_SQL_THREAD_AFTER_GTIDS NEXTVAL SETVAL LOAD_FILE
    """
)
