"""Durable history: sessions, messages, gate audit, in SQLite (WAL) — the SQL.

The schema (PRAGMA user_version + ordered migrations) and every statement. They run on one
connection driven by `sqlite_worker.SQLiteWorker`, in the order they were issued, on its thread:
one-row writes group-committed (see there). Each write commits before its
coroutine returns: once a caller has awaited `add_message`, a SIGKILL cannot lose it.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiops.engine.sqlite_worker import SQLiteWorker, StoreError
from aiops.engine.types import Message, SessionKey, ToolCall, is_short_id
from aiops.paths import DataDirUnusable

__all__ = ["MIGRATIONS", "OWNER_KEY", "SQLITE_MAX_INT", "AuditRow", "SessionRow", "Store", "StoreError"]

SQLITE_MAX_INT = 2**63 - 1
_LEFT_OPEN_TAIL = 200  # messages per session read for turns a dead process cut off
_PAGE_SCAN = 64  # messages read at a time (at least; twice the page's limit) to find a page's turns
_IN_CHUNK = 500  # ids or turn ids per `IN (...)` list

# Who created a session through the server (a token's name, `loopback:<addr>`): a key of the
# session's metadata. Listings filter on it, so a client's sessions are found by the index below.
OWNER_KEY = "owner"
OWNER_SQL = f"json_extract(meta, '$.{OWNER_KEY}')"

# Ordered upgrade steps; PRAGMA user_version records how many have run. Never edit a released
# step: add a new one.
MIGRATIONS: list[str] = [
    # 1: sessions, messages, never-reused shorthand ids, the gate audit log
    """
    CREATE TABLE sessions (
        id          TEXT PRIMARY KEY,
        short_id    INTEGER NOT NULL UNIQUE,
        kind        TEXT NOT NULL,
        model       TEXT,
        title       TEXT NOT NULL DEFAULT '',
        epoch       INTEGER NOT NULL DEFAULT 0,
        created_at  REAL NOT NULL,
        updated_at  REAL NOT NULL,
        meta        TEXT NOT NULL DEFAULT '{}'
    );
    CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
    INSERT INTO counters VALUES ('next_short_id', 101);
    CREATE TABLE messages (
        id           INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id   TEXT NOT NULL,
        epoch        INTEGER NOT NULL DEFAULT 0,
        turn_id      TEXT,
        role         TEXT NOT NULL,
        content      TEXT NOT NULL DEFAULT '',
        tool_calls   TEXT,
        tool_call_id TEXT,
        name         TEXT,
        thinking     TEXT NOT NULL DEFAULT '',
        meta         TEXT NOT NULL DEFAULT '{}',
        status       TEXT NOT NULL DEFAULT 'complete',
        created_at   REAL NOT NULL
    );
    CREATE INDEX messages_by_session ON messages(session_id, epoch, id);
    CREATE TABLE audit (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        ts          REAL NOT NULL,
        session_id  TEXT,
        event       TEXT NOT NULL,
        gate_id     TEXT,
        tool        TEXT,
        operation   TEXT,
        decision    TEXT,
        scope       TEXT,
        actor       TEXT,
        data        TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX audit_by_session ON audit(session_id, ts);
    CREATE INDEX audit_by_ts ON audit(ts);
    """,
    # 2: a client's own sessions, found without reading everyone's. Partial (only sessions with an
    # owner) and on the owner alone: adding a message changes `updated_at`, never `meta`, so the
    # index costs nothing on the chat path.
    f"""
    CREATE INDEX sessions_by_owner ON sessions({OWNER_SQL}) WHERE {OWNER_SQL} IS NOT NULL;
    """,
    # 3: a turn's messages, found without reading the whole session (history pages keep turns
    # whole: each asks where the turns on it began).
    """
    CREATE INDEX messages_by_turn ON messages(session_id, epoch, turn_id);
    """,
    # 4: the sessions listing's order (most recently updated first, then by id), so that a page
    # of it, from the top or after a session's key (keyset paging), is read from the index instead
    # of sorting every session. Adding a message moves its session's entry: one row of the index.
    """
    CREATE INDEX sessions_by_update ON sessions(updated_at, id);
    """,
]


@dataclass(slots=True)
class SessionRow:
    id: str
    short_id: int
    kind: str
    model: str | None
    title: str
    epoch: int
    created_at: float
    updated_at: float
    meta: dict[str, Any]
    message_count: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "client_id": self.id, "short_id": self.short_id, "kind": self.kind, "model": self.model,
            "title": self.title, "created_at": self.created_at, "updated_at": self.updated_at,
            "message_count": self.message_count, "owner": self.owner,
        }

    @property
    def owner(self) -> str | None:
        """Who created it through the server; None for sessions made elsewhere (console, Slack)."""
        owner = self.meta.get(OWNER_KEY)
        return owner if isinstance(owner, str) else None


@dataclass(slots=True)
class AuditRow:
    id: int
    ts: float
    session_id: str | None
    event: str
    gate_id: str | None
    tool: str | None
    operation: str | None
    decision: str | None
    scope: str | None
    actor: str | None
    data: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "ts": self.ts, "session_id": self.session_id, "event": self.event,
            "gate_id": self.gate_id, "tool": self.tool, "operation": self.operation,
            "decision": self.decision, "scope": self.scope, "by": self.actor, "data": self.data,
        }


def migrate(conn: sqlite3.Connection) -> int:
    """Run the upgrade steps this database has not seen yet; return the resulting version."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > len(MIGRATIONS):
        raise StoreError(
            f"the database schema (version {version}) is newer than this aiops understands "
            f"({len(MIGRATIONS)}); upgrade aiops or use another --data-dir"
        )
    for step, sql in enumerate(MIGRATIONS[version:], start=version + 1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            for stmt in sql.split(";"):
                if stmt.strip():
                    conn.execute(stmt)
            conn.execute(f"PRAGMA user_version = {step}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return len(MIGRATIONS)


def _prepare(conn: sqlite3.Connection) -> None:
    migrate(conn)


_TURN_ENDING_NOTICES = frozenset({"cancelled", "command", "ended", "interrupted"})


def _ends_turn(row: sqlite3.Row) -> bool:
    """Whether a turn whose last stored message is `row` ended (see Store.left_open)."""
    meta = json.loads(row["meta"] or "{}")
    if meta.get("imported"):
        return True
    if row["role"] == "assistant":
        # Calls of the chat client's tools only: the turn waits for the client, it was not cut off.
        client = meta.get("client_calls") or {}
        return not row["tool_calls"] or all(c["id"] in client for c in json.loads(row["tool_calls"]))
    if row["role"] == "notice":
        return meta.get("kind") in _TURN_ENDING_NOTICES
    return row["role"] == "error"


def _row_to_audit(r: sqlite3.Row) -> AuditRow:
    return AuditRow(r["id"], r["ts"], r["session_id"], r["event"], r["gate_id"], r["tool"],
                    r["operation"], r["decision"], r["scope"], r["actor"], json.loads(r["data"]))


def _row_to_message(r: sqlite3.Row) -> Message:
    calls = [ToolCall.from_dict(d) for d in json.loads(r["tool_calls"])] if r["tool_calls"] else []
    return Message(
        role=r["role"], content=r["content"], tool_calls=calls, tool_call_id=r["tool_call_id"],
        name=r["name"], thinking=r["thinking"], meta=json.loads(r["meta"]), created_at=r["created_at"],
        id=r["id"], turn_id=r["turn_id"], status=r["status"],
    )


def title_after(title: str, msg: Message) -> str:
    """A session's title once `msg` is committed: the first words of its first text message; until
    it has one, those of its first command line, so that a session holding only commands (a chat
    UI's `!help`, which the proxy keeps as the start of that chat) is listed by them rather than
    as new. A text message replaces a title that starts with `!` (a command's, as a rule: only a
    chat UI's `!word` that names no command is text, and it is replaced once, by the next text)."""
    if msg.role != "user":
        return title
    shown = msg.meta.get("title")  # the question alone, when a chat UI wrapped it (Engine.submit)
    words = " ".join((shown if isinstance(shown, str) and shown.strip() else msg.content).split()[:8])[:60]
    if msg.meta.get("command"):
        return title or words
    return words if not title or title.startswith("!") else title


def _row_to_session(r: sqlite3.Row) -> SessionRow:
    keys = r.keys()
    return SessionRow(
        id=r["id"], short_id=r["short_id"], kind=r["kind"], model=r["model"], title=r["title"],
        epoch=r["epoch"], created_at=r["created_at"], updated_at=r["updated_at"],
        meta=json.loads(r["meta"]), message_count=r["message_count"] if "message_count" in keys else 0,
    )


class Store:
    """The SQL of sessions, messages and the audit log; its statements run on a SQLiteWorker."""

    def __init__(self, path: Path, *, inline_writes: bool = True) -> None:
        self.path = path
        self.worker = SQLiteWorker(path, prepare=_prepare, inline_writes=inline_writes)

    async def open(self) -> None:
        try:
            await self.worker.open()
        except (OSError, sqlite3.OperationalError) as e:
            # A data dir that is read-only, or whose database cannot be opened: the operator's to
            # fix, said as such by every command that reaches the store (`aiops audit`, the engine).
            raise DataDirUnusable(self.path.parent, e, self.path) from None

    async def close(self) -> None:
        await self.worker.close()

    # -- sessions --

    async def create_session(self, session_id: str, kind: str, model: str | None,
                             meta: dict[str, Any] | None = None) -> SessionRow:
        now = time.time()

        def run(conn: sqlite3.Connection) -> SessionRow:
            def body() -> SessionRow:
                existing = conn.execute("SELECT * FROM sessions WHERE id=?", (session_id,)).fetchone()
                if existing:
                    return _row_to_session(existing)
                short = conn.execute("SELECT value FROM counters WHERE name='next_short_id'").fetchone()[0]
                conn.execute("UPDATE counters SET value=value+1 WHERE name='next_short_id'")
                conn.execute(
                    "INSERT INTO sessions(id, short_id, kind, model, created_at, updated_at, meta) "
                    "VALUES (?,?,?,?,?,?,?)",
                    (session_id, short, kind, model, now, now, json.dumps(meta or {})),
                )
                return SessionRow(session_id, short, kind, model, "", 0, now, now, meta or {})

            return self.worker.tx(conn, body)

        return await self.worker.run(run, small=True)

    async def get_or_create_session(self, session_id: str, kind: str, model: str | None,
                                    meta: dict[str, Any] | None = None) -> tuple[SessionRow, bool]:
        """The session `session_id` (by full id), created with `meta` when missing, in one round
        trip; and whether it was created. Each new client conversation needs exactly this."""
        now = time.time()

        def run(conn: sqlite3.Connection) -> tuple[SessionRow, bool]:
            def body() -> tuple[SessionRow, bool]:
                existing = conn.execute(
                    "SELECT s.*, (SELECT COUNT(*) FROM messages m WHERE m.session_id=s.id "
                    "AND m.epoch=s.epoch) AS message_count FROM sessions s WHERE s.id=?",
                    (session_id,)).fetchone()
                if existing:
                    return _row_to_session(existing), False
                short = conn.execute("SELECT value FROM counters WHERE name='next_short_id'").fetchone()[0]
                conn.execute("UPDATE counters SET value=value+1 WHERE name='next_short_id'")
                conn.execute(
                    "INSERT INTO sessions(id, short_id, kind, model, created_at, updated_at, meta) "
                    "VALUES (?,?,?,?,?,?,?)", (session_id, short, kind, model, now, now, json.dumps(meta or {})))
                return SessionRow(session_id, short, kind, model, "", 0, now, now, dict(meta or {})), True

            return self.worker.tx(conn, body)

        return await self.worker.run(run, small=True)

    async def get_session(self, ref: str) -> SessionRow | None:
        """By full id, or by shorthand id given as digits."""

        def run(conn: sqlite3.Connection) -> SessionRow | None:
            sql = ("SELECT s.*, (SELECT COUNT(*) FROM messages m WHERE m.session_id=s.id "
                   "AND m.epoch=s.epoch) AS message_count FROM sessions s WHERE ")
            row = conn.execute(sql + "s.id=?", (ref,)).fetchone()
            # A shorthand id past SQLite's integers names no session (and int() of thousands of
            # digits raises): checked by length before it is read as a number.
            if row is None and is_short_id(ref) and len(ref) <= 19 and int(ref) <= SQLITE_MAX_INT:
                row = conn.execute(sql + "s.short_id=?", (int(ref),)).fetchone()
            return _row_to_session(row) if row else None

        return await self.worker.run(run)  # counts the messages: the thread

    async def list_sessions(self, kind: str | None = None, limit: int = 1000, offset: int = 0, *,
                            owner: str | None = None, before: SessionKey | None = None) -> list[SessionRow]:
        """Sessions, most recently updated first (then by id, descending: one order, ties
        included); only those of `kind` and of `owner` when given, and only those after `before`
        in that order (keyset paging: the next page is the one after the last session read, which
        sessions deleted or updated meanwhile do not shift, as they shift an offset)."""

        def run(conn: sqlite3.Connection) -> list[SessionRow]:
            sql = ("SELECT s.*, (SELECT COUNT(*) FROM messages m WHERE m.session_id=s.id "
                   "AND m.epoch=s.epoch) AS message_count FROM sessions s")
            where: list[str] = []
            args: list[Any] = []
            if kind:
                where.append("s.kind=?")
                args.append(kind)
            if owner is not None:
                where.append(f"{OWNER_SQL}=?")  # as indexed, so the index serves it
                args.append(owner)
            if before is not None:
                where.append("(s.updated_at, s.id) < (?, ?)")  # a range of sessions_by_update
                args += [before.updated_at, before.client_id]
            if where:
                sql += " WHERE " + " AND ".join(where)
            sql += " ORDER BY s.updated_at DESC, s.id DESC LIMIT ? OFFSET ?"
            args += [limit, offset]
            return [_row_to_session(r) for r in conn.execute(sql, args)]

        return await self.worker.run(run)

    async def session_ids(self, kind: str) -> list[str]:
        """Every session id of `kind`, oldest first: the ids alone, without the per-session counts
        list_sessions computes (the proxy indexes its conversations from this once)."""
        return await self.worker.run(lambda c: [r[0] for r in c.execute(
            "SELECT id FROM sessions WHERE kind=? ORDER BY created_at, short_id", (kind,))])

    async def histories(self, session_ids: Sequence[str]) -> list[tuple[SessionRow, list[Message]]]:
        """The sessions of `session_ids` that exist, each with its history (the current epoch's
        messages, oldest first), in one statement for the rows and one for the messages: the proxy
        reads a conversation's every fork so after a start, where a read each cost two round trips."""

        def run(conn: sqlite3.Connection) -> list[tuple[SessionRow, list[Message]]]:
            marks = ",".join("?" * len(session_ids))
            rows = {r["id"]: _row_to_session(r) for r in conn.execute(
                f"SELECT * FROM sessions WHERE id IN ({marks})", list(session_ids))}
            msgs: dict[str, list[Message]] = {sid: [] for sid in rows}
            for r in conn.execute(f"SELECT m.* FROM messages m JOIN sessions s ON s.id=m.session_id "
                                  f"AND s.epoch=m.epoch WHERE m.session_id IN ({marks}) ORDER BY m.id",
                                  list(session_ids)):
                msgs[r["session_id"]].append(_row_to_message(r))
            for sid, row in rows.items():
                row.message_count = len(msgs[sid])
            return [(row, msgs[sid]) for sid, row in rows.items()]

        if not session_ids:
            return []
        return await self.worker.run(run)

    async def count_sessions(self) -> int:
        return await self.worker.run(lambda c: c.execute("SELECT COUNT(*) FROM sessions").fetchone()[0])

    async def update_session(self, session_id: str, **fields: Any) -> None:
        allowed = {"model", "title", "kind", "meta"}
        bad = set(fields) - allowed
        if bad:
            raise ValueError(f"cannot update {bad}")
        if "meta" in fields:
            fields["meta"] = json.dumps(fields["meta"])
        fields["updated_at"] = time.time()
        cols = ", ".join(f"{k}=?" for k in fields)

        def run(conn: sqlite3.Connection) -> None:
            conn.execute(f"UPDATE sessions SET {cols} WHERE id=?", (*fields.values(), session_id))

        await self.worker.run(run, small=True)

    async def reset_session(self, session_id: str) -> int:
        """Start afresh: later reads see an empty history; the old epoch stays archived."""

        def run(conn: sqlite3.Connection) -> int:
            conn.execute("UPDATE sessions SET epoch=epoch+1, title='', updated_at=? WHERE id=?",
                         (time.time(), session_id))
            return conn.execute("SELECT epoch FROM sessions WHERE id=?", (session_id,)).fetchone()[0]

        return await self.worker.run(run, small=True)

    async def delete_session(self, session_id: str) -> bool:
        """Deletes the session and its messages; the audit log keeps its records."""

        def run(conn: sqlite3.Connection) -> bool:
            def body() -> bool:
                conn.execute("DELETE FROM messages WHERE session_id=?", (session_id,))
                return conn.execute("DELETE FROM sessions WHERE id=?", (session_id,)).rowcount > 0

            return self.worker.tx(conn, body)

        return await self.worker.run(run)

    # -- messages --

    async def add_message(self, session_id: str, msg: Message) -> Message:
        """Commit one message; returns it with its row id set."""
        tool_calls = json.dumps([tc.to_dict() for tc in msg.tool_calls]) if msg.tool_calls else None

        def run(conn: sqlite3.Connection) -> int:
            def body() -> int:
                epoch_row = conn.execute("SELECT epoch, title FROM sessions WHERE id=?",
                                         (session_id,)).fetchone()
                if epoch_row is None:
                    raise StoreError(f"no session {session_id!r}")
                cur = conn.execute(
                    "INSERT INTO messages(session_id, epoch, turn_id, role, content, tool_calls, "
                    "tool_call_id, name, thinking, meta, status, created_at) "
                    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                    (session_id, epoch_row["epoch"], msg.turn_id, msg.role, msg.content, tool_calls,
                     msg.tool_call_id, msg.name, msg.thinking, json.dumps(msg.meta), msg.status,
                     msg.created_at),
                )
                title = title_after(epoch_row["title"], msg)
                conn.execute("UPDATE sessions SET updated_at=?, title=? WHERE id=?",
                             (msg.created_at, title, session_id))
                return int(cur.lastrowid or 0)

            return self.worker.tx(conn, body)

        msg.id = await self.worker.run(run, small=True)
        return msg

    async def history(self, session_id: str, *, limit: int | None = None,
                      before_id: int | None = None, epoch: int | None = None) -> list[Message]:
        """Messages of the current epoch (or a given one), oldest first.

        With `limit`, the latest `limit` messages (before `before_id` when given): the console
        loads the end of a long history first and pages back on demand.
        """

        def run(conn: sqlite3.Connection) -> list[Message]:
            ep = epoch
            if ep is None:
                row = conn.execute("SELECT epoch FROM sessions WHERE id=?", (session_id,)).fetchone()
                if row is None:
                    return []
                ep = row["epoch"]
            sql = "SELECT * FROM messages WHERE session_id=? AND epoch=?"
            args: list[Any] = [session_id, ep]
            if before_id is not None:
                sql += " AND id<?"
                args.append(before_id)
            if limit is not None:
                sql += " ORDER BY id DESC LIMIT ?"
                args.append(limit)
                return [_row_to_message(r) for r in reversed(conn.execute(sql, args).fetchall())]
            sql += " ORDER BY id"
            return [_row_to_message(r) for r in conn.execute(sql, args)]

        return await self.worker.run(run)

    async def history_page(self, session_id: str, *, limit: int,
                           before_id: int | None = None) -> tuple[list[Message], bool]:
        """A page of whole turns, as a transcript; and whether older messages exist.

        The turns that began below `before_id`, latest first, until they hold at least `limit`
        messages (or none are left); listed in the order they began, each turn's messages
        together in the order stored. A message without a turn (older records) is a turn of its
        own. A turn is on the page where its first message falls, with all of its messages, so
        paging on with `before_id` = the page's first message reads every message once, in one
        transcript order, and never splits a turn.

        Not by id alone: a message sent while a turn runs is stored before that turn's answer, so
        turns interleave by id, and a hundred queued messages would put their answers on one
        page and their questions on another.
        """

        def run(conn: sqlite3.Connection) -> tuple[list[Message], bool]:
            row = conn.execute("SELECT epoch FROM sessions WHERE id=?", (session_id,)).fetchone()
            if row is None:
                return [], False
            scope = "session_id=? AND epoch=?"
            key = [session_id, row["epoch"]]
            starts: dict[str | int, int] = {}  # turn id (or a turn-less message's id) -> first id
            sizes: dict[str | int, int] = {}
            frontier = before_id  # every message from here up to before_id has been read
            chosen: list[str | int] = []
            while True:
                below = " AND id<?" if frontier is not None else ""
                scan = max(2 * limit, _PAGE_SCAN)
                rows = conn.execute(f"SELECT id, turn_id FROM messages WHERE {scope}{below} ORDER BY id DESC "
                                    f"LIMIT ?", [*key, *([frontier] if frontier is not None else []), scan]).fetchall()
                new = list({r["turn_id"] for r in rows if r["turn_id"] and r["turn_id"] not in starts})
                for i in range(0, len(new), _IN_CHUNK):
                    part = new[i:i + _IN_CHUNK]
                    for t, first, n in conn.execute(
                            f"SELECT turn_id, MIN(id), COUNT(*) FROM messages WHERE {scope} AND turn_id IN "
                            f"({','.join('?' * len(part))}) GROUP BY turn_id", [*key, *part]):
                        starts[t], sizes[t] = first, n
                for r in rows:
                    if not r["turn_id"]:
                        starts[r["id"]], sizes[r["id"]] = r["id"], 1
                done = len(rows) < scan
                if rows:
                    frontier = rows[-1]["id"]
                # Turns that began at or above the frontier are all known: take them latest first.
                # (One that began lower may yet be passed by one not read so far.)
                # (Not done means a full scan: rows were read, so the frontier is set.)
                ready = sorted((k for k, first in starts.items()
                                if done or (frontier is not None and first >= frontier)),
                               key=starts.__getitem__, reverse=True)
                chosen, total = [], 0
                for k in ready:
                    chosen.append(k)
                    total += sizes[k]
                    if total >= limit:
                        break
                if total >= limit or done:
                    break
            if not chosen:
                return [], False
            turns = [k for k in chosen if isinstance(k, str)]
            loose = [k for k in chosen if isinstance(k, int)]
            found: list[sqlite3.Row] = []
            for column, values in (("turn_id", turns), ("id", loose)):
                for i in range(0, len(values), _IN_CHUNK):
                    part = values[i:i + _IN_CHUNK]
                    found += conn.execute(f"SELECT * FROM messages WHERE {scope} AND {column} IN "
                                          f"({','.join('?' * len(part))})", [*key, *part]).fetchall()
            found.sort(key=lambda r: (starts[r["turn_id"] or r["id"]], r["id"]))
            low = min(starts[k] for k in chosen)
            more = conn.execute(f"SELECT 1 FROM messages WHERE {scope} AND id<? LIMIT 1", [*key, low]).fetchone()
            return [_row_to_message(r) for r in found], more is not None

        return await self.worker.run(run)

    async def left_open(self, since: float, until: float) -> tuple[list[tuple[str, str]], list[AuditRow]]:
        """What a process that ran from `since` and died (SIGKILL, a crash) before `until` left
        open: its turns that never ended, as (session id, turn id), oldest first; and its gates
        opened and never resolved. A turn ended when its last message says so: an answer (no
        tool calls), an error, or a notice that ends a turn (cancelled, a command's output, a
        limit that ended it). Anything else (a question, a tool call or result, a gate record, a
        tool's progress note) means it was cut off. History imported from a chat client is not
        a turn aiops ran."""

        def run(conn: sqlite3.Connection) -> tuple[list[tuple[str, str]], list[AuditRow]]:
            since_ = since - 1.0  # clocks of one machine; a second of slack costs nothing
            last: dict[tuple[str, str], sqlite3.Row] = {}
            # Only a session's latest messages: what a dead process cut off is its running turn and
            # those queued behind it. Bounded by the sessions it touched, not by how long it ran.
            for session in conn.execute("SELECT id, epoch FROM sessions WHERE updated_at >= ?", (since_,)).fetchall():
                tail = conn.execute("SELECT * FROM messages WHERE session_id = ? AND epoch = ? AND created_at >= ? "
                                    "AND created_at < ? ORDER BY id DESC LIMIT ?",
                                    (session["id"], session["epoch"], since_, until, _LEFT_OPEN_TAIL)).fetchall()
                for row in reversed(tail):
                    if row["turn_id"] is not None:
                        last[(row["session_id"], row["turn_id"])] = row
            turns = [key for key, row in last.items() if not _ends_turn(row)]
            gates = [_row_to_audit(r) for r in conn.execute(
                "SELECT * FROM audit a WHERE a.event = 'gate_opened' AND a.ts >= ? AND a.ts < ? "
                "AND a.gate_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM audit b WHERE b.gate_id = a.gate_id "
                "AND b.id > a.id AND b.event IN ('gate_resolved', 'gate_granted')) ORDER BY a.id", (since_, until))]
            return turns, gates

        return await self.worker.run(run)

    # -- audit --

    async def add_audit(self, event: str, *, session_id: str | None, gate_id: str | None = None,
                        tool: str | None = None, operation: str | None = None,
                        decision: str | None = None, scope: str | None = None,
                        actor: str | None = None, data: dict[str, Any] | None = None) -> None:
        now = time.time()

        def run(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO audit(ts, session_id, event, gate_id, tool, operation, decision, scope, "
                "actor, data) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (now, session_id, event, gate_id, tool, operation, decision, scope, actor,
                 json.dumps(data or {}, default=str)),
            )

        await self.worker.run(run, small=True)

    async def audit(self, session_id: str | None = None, since: float | None = None,
                    limit: int = 10_000) -> list[AuditRow]:
        """The newest `limit` matching rows, oldest first: a long-lived install shows its latest."""

        def run(conn: sqlite3.Connection) -> list[AuditRow]:
            sql = "SELECT * FROM audit WHERE 1=1"
            args: list[Any] = []
            if session_id:
                sql += " AND session_id=?"
                args.append(session_id)
            if since is not None:
                sql += " AND ts>=?"
                args.append(since)
            sql = f"SELECT * FROM ({sql} ORDER BY id DESC LIMIT ?) ORDER BY id"
            args.append(limit)
            return [_row_to_audit(r) for r in conn.execute(sql, args)]

        return await self.worker.run(run)

    async def integrity_check(self) -> str:
        return await self.worker.run(lambda c: c.execute("PRAGMA integrity_check").fetchone()[0])
