"""A data dir holding a year of a busy team's history, made fast and kept between runs.

The operator benchmarks (benchmarks.startup, benchmarks.feel) measure each case twice: with an empty
data dir and with `sessions` stored sessions of `messages` messages each (10,000 × 100 by default:
a million messages). Writing those through the engine would take an hour; here the store's own
schema (`aiops.engine.store.migrate`, so the file is exactly what aiops opens) is filled with one
`executemany` per table in a single transaction, which takes seconds. The result is cached in the
temp dir under a name that carries the schema version and the sizes; each case gets a copy (runs
write to it).

    python -m benchmarks.history [--sessions N] [--messages M]   # builds (or finds) it, prints its path
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path

DB_NAME = "aiops.sqlite3"  # aiops.config.Paths.db_path's file name
_KINDS = ("console", "api", "proxy", "slack", "api", "proxy")  # the mix of a team's clients
_WORDS = ("the replica lag on db-3 rose after the deploy; check the slow query log and the "
          "binlog position, then compare with yesterday's numbers before paging anyone").split()


def _text(i: int, n: int) -> str:
    """A message of about `n` characters, different per `i` (so SQLite pages are not all alike)."""
    out: list[str] = []
    size = 0
    k = i
    while size < n:
        w = _WORDS[k % len(_WORDS)]
        out.append(w)
        size += len(w) + 1
        k = k * 7 + 3
    return " ".join(out)


def build(db: Path, sessions: int, messages: int) -> None:
    """Write `sessions` sessions of `messages` messages each (user/assistant turns, a tool call and
    its result every fourth turn) into a new database at `db`, spread over the past year."""
    from aiops.engine.store import migrate

    db.parent.mkdir(parents=True, exist_ok=True)
    tmp = db.with_suffix(".building")
    for p in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
        p.unlink(missing_ok=True)
    conn = sqlite3.connect(tmp, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    migrate(conn)
    now = time.time()
    year = 365 * 86400.0
    conn.execute("BEGIN")
    srows = []
    for s in range(sessions):
        sid = f"{_KINDS[s % len(_KINDS)]}-{s:08x}"
        created = now - year + year * s / max(sessions, 1)
        srows.append((sid, 101 + s, _KINDS[s % len(_KINDS)], "bench", _text(s, 40)[:60], created,
                      created + messages * 30.0, "{}"))
    conn.executemany("INSERT INTO sessions(id, short_id, kind, model, title, created_at, updated_at, meta) "
                     "VALUES (?,?,?,?,?,?,?,?)", srows)
    conn.execute("UPDATE counters SET value=? WHERE name='next_short_id'", (101 + sessions,))

    def rows():
        for s, (sid, *_rest) in enumerate(srows):
            t0 = _rest[4]
            turn = ""
            for m in range(messages):
                at = t0 + m * 30.0
                kind = m % 10  # u a u a u a u a(call) tool a: every fourth turn uses a tool
                if kind in (0, 2, 4, 6):
                    turn = f"t{s:x}-{m:x}"
                    yield (sid, turn, "user", _text(s * messages + m, 80), None, None, at)
                elif kind == 7:
                    call = [{"id": f"c{s:x}-{m:x}", "name": "db_query",
                             "arguments": {"sql": "select count(*) from orders"}}]
                    yield (sid, turn, "assistant", "", json.dumps(call), None, at)
                elif kind == 8:
                    yield (sid, turn, "tool", "count(*)\n4211", None, f"c{s:x}-{m - 1:x}", at)
                else:
                    yield (sid, turn, "assistant", _text(s * messages + m, 400), None, None, at)

    conn.executemany("INSERT INTO messages(session_id, turn_id, role, content, tool_calls, tool_call_id, "
                     "created_at) VALUES (?,?,?,?,?,?,?)", rows())
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    Path(f"{tmp}-wal").unlink(missing_ok=True)
    Path(f"{tmp}-shm").unlink(missing_ok=True)
    os.replace(tmp, db)


def cached(sessions: int, messages: int) -> Path:
    """The cached database of this size (built on first use); copy it, don't write to it."""
    from aiops.engine.store import MIGRATIONS

    name = f"aiops-bench-history-v{len(MIGRATIONS)}-{sessions}x{messages}"
    db = Path(tempfile.gettempdir()) / name / DB_NAME
    if not db.exists():
        t0 = time.perf_counter()
        print(f"history: building {sessions:,} sessions × {messages} messages in {db.parent} "
              f"(once; cached for later runs)", flush=True)
        build(db, sessions, messages)
        print(f"history: built in {time.perf_counter() - t0:.1f} s, {db.stat().st_size / 1e6:.0f} MB", flush=True)
    return db


def data_dir(dest: Path, sessions: int, messages: int) -> Path:
    """`dest` made a data dir holding a copy of the cached history (empty when `sessions` is 0)."""
    dest.mkdir(parents=True, exist_ok=True)
    if sessions:
        shutil.copyfile(cached(sessions, messages), dest / DB_NAME)
        # On disk before the case starts, as a year of history is: left as 350 MB of dirty pages,
        # the copy was written back during the run, and SQLite's checkpoint as the last connection
        # closes (an fsync of the file) waited for all of it (~130 ms of `aiops chat`'s exit).
        fd = os.open(dest / DB_NAME, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return dest


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=10_000)
    p.add_argument("--messages", type=int, default=100)
    args = p.parse_args()
    print(cached(args.sessions, args.messages))


if __name__ == "__main__":
    main()
