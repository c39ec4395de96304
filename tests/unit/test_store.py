"""The SQLite store: migrations, shorthand ids, history paging, reset archive, audit."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest

from aiops.engine.store import MIGRATIONS, Store, StoreError
from aiops.engine.types import Message, SessionKey, ToolCall


@pytest.fixture
async def store(tmp_path):
    s = Store(tmp_path / "db.sqlite3")
    await s.open()
    yield s
    await s.close()


@pytest.fixture
async def threaded_store(tmp_path):
    """A store whose one-row writes are all group-committed on its thread (`inline_writes=False`;
    the default commits the first of a loop iteration on the loop when the thread is idle)."""
    s = Store(tmp_path / "db.sqlite3", inline_writes=False)
    await s.open()
    yield s
    await s.close()


@pytest.fixture
async def inline_store(tmp_path):
    """A store whose first small write of a loop iteration runs on the loop (`inline_writes`)."""
    s = Store(tmp_path / "db.sqlite3", inline_writes=True)
    await s.open()
    yield s
    await s.close()


async def test_schema_is_versioned_and_wal(store, tmp_path):
    conn = sqlite3.connect(tmp_path / "db.sqlite3")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_reopen_keeps_data_and_does_not_rerun_migrations(tmp_path):
    s = Store(tmp_path / "db.sqlite3")
    await s.open()
    await s.create_session("a", "api", None)
    await s.add_message("a", Message("user", "hello"))
    await s.close()
    s2 = Store(tmp_path / "db.sqlite3")
    await s2.open()
    assert [m.content for m in await s2.history("a")] == ["hello"]
    await s2.close()


async def test_newer_schema_is_refused_with_a_clear_message(tmp_path):
    conn = sqlite3.connect(tmp_path / "db.sqlite3")
    conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 5}")
    conn.close()
    s = Store(tmp_path / "db.sqlite3")
    with pytest.raises(StoreError, match="newer than this aiops"):
        await s.open()


async def test_short_ids_start_at_101_and_are_never_reused(store):
    a = await store.create_session("a", "api", None)
    b = await store.create_session("b", "console", None)
    assert (a.short_id, b.short_id) == (101, 102)
    await store.delete_session("b")
    c = await store.create_session("c", "api", None)
    assert c.short_id == 103
    assert (await store.get_session("101")).id == "a"
    assert await store.get_session("102") is None


async def test_tool_calls_round_trip_and_history_pages_from_the_end(store):
    await store.create_session("s", "api", "gpt")
    await store.add_message("s", Message("user", "q"))
    call = ToolCall("c1", "db_query", {"sql": "SELECT 1"})
    await store.add_message("s", Message("assistant", "", tool_calls=[call]))
    await store.add_message("s", Message("tool", "1", tool_call_id="c1", name="db_query"))
    for i in range(5):
        await store.add_message("s", Message("assistant", f"a{i}"))
    full = await store.history("s")
    assert full[1].tool_calls[0].arguments == {"sql": "SELECT 1"}
    last = await store.history("s", limit=3)
    assert [m.content for m in last] == ["a2", "a3", "a4"]
    earlier = await store.history("s", limit=3, before_id=last[0].id)
    assert [m.content for m in earlier] == ["1", "a0", "a1"]


async def test_a_history_page_holds_whole_turns_in_the_order_they_began(store):
    """Turns overlap by id when messages are queued during a turn: here each turn's answer comes
    after the next turn's question, a chain. A page is whole turns, each on the page where it
    began, listed as a transcript."""
    await store.create_session("s", "api", None)
    await store.add_message("s", Message("user", "before", turn_id="t0"))
    await store.add_message("s", Message("assistant", "before done", turn_id="t0"))
    for role, text, turn in [("user", "q1", "t1"), ("user", "q2", "t2"), ("assistant", "a1", "t1"),
                             ("user", "q3", "t3"), ("assistant", "a2", "t2"), ("assistant", "a3", "t3")]:
        await store.add_message("s", Message(role, text, turn_id=turn))
    page, more = await store.history_page("s", limit=1)
    assert [m.content for m in page] == ["q3", "a3"] and more
    page, more = await store.history_page("s", limit=3)
    assert [m.content for m in page] == ["q2", "a2", "q3", "a3"] and more
    older, more = await store.history_page("s", limit=3, before_id=page[0].id)
    assert [m.content for m in older] == ["before", "before done", "q1", "a1"] and not more
    # Messages without a turn (older records) are turns of their own.
    await store.create_session("n", "api", None)
    for text in ("x", "y", "z"):
        await store.add_message("n", Message("user", text))
    page, more = await store.history_page("n", limit=2)
    assert [m.content for m in page] == ["y", "z"] and more
    assert await store.history_page("missing", limit=5) == ([], False)


async def test_history_pages_of_a_long_queue_read_as_one_transcript(store):
    """A script fires 300 messages while a turn runs: every question is stored before every
    answer. Paged at any size, the pages together are the transcript, question then answer, and
    no page holds an answer whose question is on another."""
    await store.create_session("q", "api", None)
    await store.add_message("q", Message("user", "slow", turn_id="t-slow"))
    for i in range(300):
        await store.add_message("q", Message("user", f"q{i}", turn_id=f"t{i}"))
    await store.add_message("q", Message("assistant", "slow done", turn_id="t-slow"))
    for i in range(300):
        await store.add_message("q", Message("assistant", f"a{i}", turn_id=f"t{i}"))
    expected = ["slow", "slow done"] + [x for i in range(300) for x in (f"q{i}", f"a{i}")]
    for limit in (1, 7, 50, 200, 1000):
        seen: list[str] = []
        before = None
        while True:
            page, more = await store.history_page("q", limit=limit, before_id=before)
            assert limit <= len(page) <= limit + 1 or not more, (limit, len(page))
            turns = [m.turn_id for m in page]
            assert all(turns.count(t) == 2 for t in turns)  # whole turns only
            seen[:0] = [m.content for m in page]
            if not more:
                break
            before = page[0].id
        assert seen == expected, limit


async def test_a_history_page_of_ever_overlapping_turns_pages_on_in_order(store, tmp_path):
    """A session that always has a message waiting overlaps every turn with the next: a page
    stays the size asked for, and paging on reads every message once, in transcript order."""
    await store.create_session("busy", "api", None)
    await store.add_message("busy", Message("user", "q0", turn_id="t0"))
    for i in range(1, 300):  # q(i) is stored before a(i-1): each turn overlaps the next
        await store.add_message("busy", Message("user", f"q{i}", turn_id=f"t{i}"))
        await store.add_message("busy", Message("assistant", f"a{i - 1}", turn_id=f"t{i - 1}"))
    await store.add_message("busy", Message("assistant", "a299", turn_id="t299"))
    seen: list[str] = []
    before = None
    while True:
        page, more = await store.history_page("busy", limit=5, before_id=before)
        assert len(page) <= 6
        seen[:0] = [m.content for m in page]
        if not more:
            break
        before = page[0].id
    assert seen == [x for i in range(300) for x in (f"q{i}", f"a{i}")]
    # Where each turn began is read from an index, not from the whole session.
    conn = sqlite3.connect(tmp_path / "db.sqlite3")
    plan = " ".join(str(r) for r in conn.execute(
        "EXPLAIN QUERY PLAN SELECT turn_id, MIN(id), COUNT(*) FROM messages WHERE session_id=? AND epoch=? "
        "AND turn_id IN (?, ?) GROUP BY turn_id", ("busy", 0, "t1", "t2")))
    assert "messages_by_turn" in plan, plan


async def test_turns_left_open_by_a_dead_process_are_those_whose_last_message_does_not_end_them(store):
    """Crash recovery asks which turns a killed process cut off: a turn ended only when its last
    message says so (an answer, an error, a notice that ends a turn); a progress note or a
    notice written at a turn's start does not, and history imported from a chat client is not a
    turn aiops ran."""
    since = time.time()
    await store.create_session("s", "api", None)
    rows = [
        ("answered", Message("user", "q")), ("answered", Message("assistant", "a")),
        ("failed", Message("user", "q")), ("failed", Message("error", "model down")),
        ("stopped", Message("user", "q")), ("stopped", Message("notice", "turn cancelled", meta={"kind": "cancelled"})),
        ("limited", Message("user", "q")), ("limited", Message("notice", "ended the turn", meta={"kind": "ended"})),
        ("command", Message("user", "!help", meta={"command": True})),
        ("command", Message("notice", "help text", meta={"kind": "command"})),
        ("imported", Message("user", "an old question", meta={"imported": True})),
        ("mid-tool", Message("user", "q")), ("mid-tool", Message("assistant", "", tool_calls=[ToolCall("c1", "t", {})])),
        ("progress", Message("user", "q")), ("progress", Message("notice", "50 % done")),
        ("queued", Message("user", "q")),
    ]
    for turn, msg in rows:
        msg.turn_id = turn
        await store.add_message("s", msg)
    await store.add_audit("gate_opened", session_id="s", gate_id="g1", tool="t")
    await store.add_audit("gate_opened", session_id="s", gate_id="g2", tool="t")
    await store.add_audit("gate_resolved", session_id="s", gate_id="g2", tool="t", decision="approved")
    turns, gates = await store.left_open(since, time.time() + 1)
    assert turns == [("s", "mid-tool"), ("s", "progress"), ("s", "queued")]
    assert [g.gate_id for g in gates] == ["g1"]
    # Work done after the new process took the lock is its own, not the dead one's.
    assert await store.left_open(since, since - 5) == ([], [])


async def test_reset_archives_old_history(store):
    await store.create_session("s", "api", None)
    await store.add_message("s", Message("user", "old question"))
    await store.reset_session("s")
    assert await store.history("s") == []
    assert [m.content for m in await store.history("s", epoch=0)] == ["old question"]


async def test_title_comes_from_the_first_user_message(store):
    await store.create_session("s", "api", None)
    await store.add_message("s", Message("user", "!help", meta={"command": True}))
    await store.add_message("s", Message("user", "how many orders shipped last week in total"))
    row = await store.get_session("s")
    assert row.title.startswith("how many orders shipped")
    assert row.message_count == 2


async def test_audit_filters_by_session_and_time(store):
    await store.add_audit("gate_opened", session_id="a", tool="db_query", data={"x": 1})
    await store.add_audit("gate_opened", session_id="b", tool="db_query")
    rows = await store.audit("a")
    assert [r.session_id for r in rows] == ["a"] and rows[0].data == {"x": 1}
    assert await store.audit(since=rows[0].ts + 3600) == []


async def test_engine_start_does_not_load_stored_sessions(tmp_path):
    from aiops.config import load_config, resolve_paths
    from aiops.engine.engine import Engine

    cfg = load_config(resolve_paths(tmp_path / "cfg", tmp_path / "data"), load_dotenv=False)
    s = Store(cfg.paths.db_path)
    await s.open()
    for i in range(2000):
        await s.create_session(f"api-{i}", "api", None)
    await s.close()
    engine = Engine(cfg, discover_plugins=False)
    await engine.start()
    try:
        assert len(engine.cache) == 0  # nothing loaded until a session is used
        assert len(await engine.list_sessions(limit=5)) == 5
        live = await engine.session("1500")  # shorthand 1500 → the 1400th session created
        assert live is not None and live.id == "api-1399" and live._history is None
    finally:
        await engine.stop()


async def test_sessions_list_by_owner_and_kind_in_pages(store):
    for i, (kind, owner) in enumerate([("api", "bot"), ("proxy", "bot"), ("api", "ops"), ("console", None),
                                       ("api", "bot"), ("api", "bot")]):
        await store.create_session(f"s{i}", kind, None, meta={"owner": owner} if owner else None)
        await store.add_message(f"s{i}", Message("user", f"q{i}"))  # later ones are more recent
    assert [r.id for r in await store.list_sessions(owner="bot")] == ["s5", "s4", "s1", "s0"]
    assert [r.id for r in await store.list_sessions("api", owner="bot")] == ["s5", "s4", "s0"]
    assert [r.id for r in await store.list_sessions("api", limit=2, offset=1, owner="bot")] == ["s4", "s0"]
    assert [r.owner for r in await store.list_sessions(owner="ops")] == ["ops"]
    assert await store.list_sessions(owner="nobody") == []
    everyone = await store.list_sessions()
    assert [r.id for r in everyone] == ["s5", "s4", "s3", "s2", "s1", "s0"]
    assert [r.to_dict()["owner"] for r in everyone] == ["bot", "bot", None, "ops", "bot", "bot"]


def old_database(path: Path, version: int, sessions: str) -> None:
    """A database as an aiops of schema `version` left it, holding the `sessions` rows (SQL values)."""
    conn = sqlite3.connect(path)
    for step in MIGRATIONS[:version]:
        conn.executescript(step)
    conn.execute(f"INSERT INTO sessions(id, short_id, kind, created_at, updated_at, meta) VALUES {sessions}")
    conn.execute("UPDATE counters SET value=103")
    conn.execute(f"PRAGMA user_version = {version}")
    conn.commit()
    conn.close()


async def test_a_version_1_database_upgrades_and_lists_by_owner(tmp_path):
    path = tmp_path / "db.sqlite3"
    old_database(path, 1, "('old-bot', 101, 'api', 1, 1, '{\"owner\": \"bot\"}'), "
                          "('old-console', 102, 'console', 2, 2, '{}')")
    s = Store(path)
    await s.open()
    try:
        assert [r.id for r in await s.list_sessions(owner="bot")] == ["old-bot"]
        assert [r.id for r in await s.list_sessions()] == ["old-console", "old-bot"]
        new = await s.create_session("new-bot", "api", None, meta={"owner": "bot"})
        assert new.short_id == 103
        assert [r.id for r in await s.list_sessions(owner="bot")] == ["new-bot", "old-bot"]
    finally:
        await s.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    # A client's listing reads its own sessions through the index, not the whole table.
    plan = conn.execute("EXPLAIN QUERY PLAN SELECT id FROM sessions WHERE json_extract(meta, '$.owner')=?",
                        ("bot",)).fetchall()
    assert "sessions_by_owner" in str(plan)
    conn.close()


async def test_keyset_pages_list_every_session_once_ties_by_id_whatever_moves_meanwhile(store):
    """A page `before` a session's key is the sessions after it in the listing's one order (most
    recently updated first, ties by id, descending): sessions deleted or active since the last page
    shift none of the rest past the next, as they shift an offset."""
    for i in range(10):
        await store.create_session(f"s{i}", "api", None)
    conn = sqlite3.connect(store.path)
    with conn:  # s0-s3 updated at one instant: the id orders them
        conn.executemany("UPDATE sessions SET updated_at=? WHERE id=?",
                         [(1000.0 if i < 4 else 1000.0 + i, f"s{i}") for i in range(10)])
    conn.close()
    order = ["s9", "s8", "s7", "s6", "s5", "s4", "s3", "s2", "s1", "s0"]
    assert [r.id for r in await store.list_sessions()] == order

    first = await store.list_sessions(limit=4)
    assert [r.id for r in first] == order[:4]
    # Meanwhile two listed sessions are deleted, and a later one is active (to the top).
    await store.delete_session("s9")
    await store.delete_session("s7")
    await store.add_message("s2", Message("user", "back again"))
    after = SessionKey.of(first[-1].to_dict())
    assert after == SessionKey(first[-1].updated_at, "s6")
    second = await store.list_sessions(limit=4, before=after)
    assert [r.id for r in second] == ["s5", "s4", "s3", "s1"]  # (s2 moved above: it is listed anew)
    third = await store.list_sessions(limit=4, before=SessionKey.of(second[-1].to_dict()))
    assert [r.id for r in third] == ["s0"]
    assert await store.list_sessions(before=SessionKey(0.0, "s0")) == []
    # Within a tie, by id: after s3 at 1000.0 come s1 and s0 (s2 is no longer at 1000.0).
    assert [r.id for r in await store.list_sessions(before=SessionKey(1000.0, "s3"))] == ["s1", "s0"]
    # With the filters and an offset counted from the key.
    await store.create_session("p", "proxy", None, meta={"owner": "bot"})
    assert [r.id for r in await store.list_sessions("api", limit=2, offset=1, before=after)] == ["s4", "s3"]
    assert await store.list_sessions(owner="bot", before=after) == []


async def test_a_client_tokens_sessions_tied_in_time_page_by_key_each_once(store):
    """A client token's listing (by owner) is read through the owner's index and sorted apart:
    sessions updated at one instant still come in the one order, ties by id, so paging by key
    neither skips nor repeats one."""
    ids = [f"k{i:02d}" for i in (7, 3, 15, 0, 11, 19, 4, 8, 13, 1, 17, 5, 10, 2, 18, 6, 14, 9, 16, 12)]
    for sid in ids:
        await store.create_session(sid, "api", None, meta={"owner": "bot"})
    conn = sqlite3.connect(store.path)
    with conn:
        conn.execute("UPDATE sessions SET updated_at=1000.0")
    conn.close()
    seen: list[str] = []
    after = None
    while True:
        page = await store.list_sessions(limit=3, owner="bot", before=after)
        seen += [r.id for r in page]
        if len(page) < 3:
            break
        after = SessionKey.of(page[-1].to_dict())
    assert seen == sorted(ids, reverse=True)


def test_a_session_key_is_read_from_its_wire_form_or_refused_saying_why():
    key = SessionKey(1732800000.123456, "api-a,b+c")
    assert SessionKey.from_wire(key.to_wire()) == key  # the same float, an id with a comma
    assert SessionKey.from_wire("1e+20,x") == SessionKey(1e20, "x")
    for text, why in [("", "expected"), ("1732800000.5", "expected"), ("1732800000.5,", "expected"),
                      ("soon,api-a", "not a number"), ("nan,api-a", "finite"), ("-inf,api-a", "finite")]:
        with pytest.raises(ValueError, match=why):
            SessionKey.from_wire(text)


async def test_a_version_3_database_gains_the_index_the_listing_pages_by(tmp_path):
    path = tmp_path / "db.sqlite3"
    old_database(path, 3, "('old', 101, 'api', 1, 1, '{}'), ('older', 102, 'api', 1, 1, '{}')")
    s = Store(path)
    await s.open()
    try:
        assert [r.id for r in await s.list_sessions()] == ["older", "old"]
        assert [r.id for r in await s.list_sessions(before=SessionKey(1.0, "older"))] == ["old"]
    finally:
        await s.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    # A page is read from the index, from the key on: not every session sorted.
    for where in ("", "WHERE (updated_at, id) < (?, ?) "):
        plan = str(conn.execute(f"EXPLAIN QUERY PLAN SELECT id FROM sessions {where}ORDER BY updated_at DESC, "
                                f"id DESC LIMIT 10", (1.0, "x") if where else ()).fetchall())
        assert "sessions_by_update" in plan and "TEMP B-TREE" not in plan, plan
    conn.close()


# ---- group commit: writes issued together share a transaction ------------------------------------


def committed(path) -> list[tuple[str, str]]:
    """(session, content) of every message another connection can read: what is on disk."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT session_id, content FROM messages ORDER BY id").fetchall()
    finally:
        conn.close()


async def test_writes_issued_together_are_all_committed_in_order_when_awaited(store, tmp_path):
    await store.create_session("a", "api", None)
    await store.create_session("b", "api", None)
    sent = [(sid, f"{sid}{n}") for n in range(20) for sid in ("a", "b")]
    done = await asyncio.gather(*(store.add_message(sid, Message("user", text)) for sid, text in sent))
    assert committed(tmp_path / "db.sqlite3") == sent  # durable once awaited, in the order issued
    assert [m.id for m in done] == sorted(m.id for m in done)
    assert [m.content for m in await store.history("a")] == [t for s, t in sent if s == "a"]
    assert (await store.get_session("a")).message_count == 20


async def test_a_failing_write_fails_alone(store, tmp_path):
    await store.create_session("a", "api", None)
    results = await asyncio.gather(
        store.add_message("a", Message("user", "before")),
        store.add_message("nope", Message("user", "to nobody")),
        store.create_session("c", "api", None),
        store.add_message("a", Message("user", "after")),
        return_exceptions=True)
    assert isinstance(results[1], StoreError) and "no session 'nope'" in str(results[1])
    assert committed(tmp_path / "db.sqlite3") == [("a", "before"), ("a", "after")]
    assert results[2].short_id == 102 and (await store.get_session("c")) is not None


async def test_a_read_sees_every_write_issued_before_it(store):
    await store.create_session("a", "api", None)
    writes = [asyncio.ensure_future(store.add_message("a", Message("user", str(n)))) for n in range(5)]
    await asyncio.sleep(0)  # one loop turn: each write is issued; all but the first wait for their batch
    assert not all(w.done() for w in writes)
    history = await store.history("a")  # issued after the writes, before their batch is committed
    assert [m.content for m in history] == ["0", "1", "2", "3", "4"]
    await asyncio.gather(*writes)


async def test_a_batch_that_cannot_start_fails_its_writers_instead_of_leaving_them_waiting(threaded_store, tmp_path):
    """Another process (`aiops audit`, a backup) holding the write lock past the busy timeout."""
    await threaded_store.create_session("a", "api", None)
    threaded_store.worker.connection.execute("PRAGMA busy_timeout = 50")  # the environment, not our code: a short wait
    other = sqlite3.connect(tmp_path / "db.sqlite3", isolation_level=None)
    try:
        assert (await threaded_store.add_message("a", Message("user", "first"))).content == "first"
        second = asyncio.ensure_future(threaded_store.add_message("a", Message("user", "second")))
        third = asyncio.ensure_future(threaded_store.add_message("a", Message("user", "third")))
        other.execute("BEGIN IMMEDIATE")  # before their batch begins: it finds the database locked
        for write in (second, third):
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                await asyncio.wait_for(write, 5)
    finally:
        other.close()
    await threaded_store.add_message("a", Message("user", "fourth"))  # the store still works
    assert committed(tmp_path / "db.sqlite3") == [("a", "first"), ("a", "fourth")]


async def test_a_batch_that_cannot_start_fails_its_writers_instead_of_leaving_them_waiting_with_inline_writes(
        inline_store, tmp_path):
    """As above, where the first write of an iteration runs on the loop, on its own."""
    await inline_store.create_session("a", "api", None)
    inline_store.worker.connection.execute("PRAGMA busy_timeout = 50")  # the environment, not our code: a short wait
    other = sqlite3.connect(tmp_path / "db.sqlite3", isolation_level=None)
    try:
        first = asyncio.ensure_future(inline_store.add_message("a", Message("user", "first")))
        second = asyncio.ensure_future(inline_store.add_message("a", Message("user", "second")))
        await asyncio.sleep(0)  # the first commits inline; the second waits for its batch
        other.execute("BEGIN IMMEDIATE")  # ...which now finds the database locked
        assert (await first).content == "first"
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            await asyncio.wait_for(second, 5)
    finally:
        other.close()
    await inline_store.add_message("a", Message("user", "third"))  # the store still works
    assert committed(tmp_path / "db.sqlite3") == [("a", "first"), ("a", "third")]


async def test_a_full_disk_fails_every_write_of_its_batch_with_the_real_cause(threaded_store, tmp_path):
    await threaded_store.create_session("a", "api", None)
    await threaded_store.add_message("a", Message("user", "kept"))
    pages = threaded_store.worker.connection.execute("PRAGMA page_count").fetchone()[0]
    threaded_store.worker.connection.execute(f"PRAGMA max_page_count = {pages + 2}")  # a disk with two pages left
    results = await asyncio.gather(
        threaded_store.add_message("a", Message("user", "small")),
        threaded_store.add_message("a", Message("user", "x" * 100_000)),
        threaded_store.add_message("a", Message("user", "small too")),
        return_exceptions=True)
    # One batch; SQLite undoes all of it, and every writer hears why
    assert all(isinstance(r, sqlite3.OperationalError) and "full" in str(r) for r in results)
    assert committed(tmp_path / "db.sqlite3") == [("a", "kept")]
    assert (await threaded_store.add_message("a", Message("user", "small"))).id  # what fits still does


async def test_a_full_disk_fails_every_write_of_its_batch_with_the_real_cause_with_inline_writes(
        inline_store, tmp_path):
    await inline_store.create_session("a", "api", None)
    await inline_store.add_message("a", Message("user", "kept"))
    pages = inline_store.worker.connection.execute("PRAGMA page_count").fetchone()[0]
    inline_store.worker.connection.execute(f"PRAGMA max_page_count = {pages + 2}")  # a disk with two pages left
    results = await asyncio.gather(
        inline_store.add_message("a", Message("user", "small")),
        inline_store.add_message("a", Message("user", "x" * 100_000)),
        inline_store.add_message("a", Message("user", "small too")),
        return_exceptions=True)
    # "small" committed inline on its own; SQLite undoes the whole batch of the other two
    assert results[0].content == "small"
    assert all(isinstance(r, sqlite3.OperationalError) and "full" in str(r) for r in results[1:])
    assert committed(tmp_path / "db.sqlite3") == [("a", "kept"), ("a", "small")]


async def test_writes_issued_while_the_store_closes_end_either_committed_or_refused(tmp_path):
    """A handler still running at shutdown writes while the connection closes: each write ends, as
    committed (on disk) or refused with "store is closed", never left waiting."""
    store = Store(tmp_path / "db.sqlite3")
    await store.open()
    await store.create_session("a", "api", None)
    closing = asyncio.ensure_future(store.close())
    writes: list[tuple[str, asyncio.Future[Message]]] = []

    def write() -> None:
        text = f"late {len(writes)}"
        writes.append((text, asyncio.ensure_future(store.add_message("a", Message("user", text)))))

    for _ in range(1000):  # some writes in each loop iteration until the close is done
        if closing.done():
            break
        for _ in range(3):
            write()
        time.sleep(0.001)  # noqa: ASYNC251 - a busy loop: the close may end before the next iteration
        await asyncio.sleep(0)
    await closing
    for _ in range(3):
        write()
    results = await asyncio.wait_for(
        asyncio.gather(*(w for _, w in writes), return_exceptions=True), 5)
    on_disk = [text for _, text in committed(tmp_path / "db.sqlite3")]
    for (text, _), r in zip(writes, results, strict=True):
        if isinstance(r, BaseException):
            assert isinstance(r, StoreError) and "closed" in str(r) and text not in on_disk
        else:
            assert text in on_disk
    assert isinstance(results[-1], StoreError)  # the last ones came after the close


async def test_a_write_that_fails_alone_is_undone_and_the_next_one_commits(store, tmp_path):
    """A quiet hour's write is a batch of its own: one that fails leaves no transaction open."""
    await store.create_session("a", "api", None)
    with pytest.raises(StoreError, match="no session 'nope'"):
        await store.add_message("nope", Message("user", "to nobody"))
    assert (await store.add_message("a", Message("user", "next"))).content == "next"
    assert committed(tmp_path / "db.sqlite3") == [("a", "next")]


async def test_a_read_after_close_is_refused_not_left_waiting(tmp_path):
    store = Store(tmp_path / "db.sqlite3")
    await store.open()
    await store.create_session("a", "api", None)
    await store.close()
    await store.close()  # twice (an app's cleanup after the engine's stop): nothing to do
    with pytest.raises(StoreError, match="closed"):
        await asyncio.wait_for(store.history("a"), 5)
    with pytest.raises(StoreError, match="closed"):
        await asyncio.wait_for(store.add_message("a", Message("user", "late")), 5)
