"""A session deleted while something else is using it: a message being taken, a turn crashing, a
delete that is itself cancelled, a proxy request between its claim and its submit."""

from __future__ import annotations

import asyncio
import sqlite3

from aiops.engine.events import DONE, ERROR, SESSION
from aiops.integrations.server.owners import Caller, claim, owner_meta
from tests.fakes.openai_server import Reply, call_tool_when
from tests.support.plugins import SlowStopPlugin

MYSQL_OFF = {"plugins.toml": "[mysql]\nenabled = false\n"}


async def test_a_message_with_commands_and_text_racing_a_delete_is_answered_not_an_error(
        engine_factory, fake_openai) -> None:
    engine = await engine_factory(extra_files=MYSQL_OFF)
    await engine.run("api-race", "hi", kind="api", timeout=10)
    submit = asyncio.ensure_future(engine.submit("api-race", "!help\nhello there", kind="api"))
    await asyncio.sleep(0)  # the submit holds the session and is writing the command's echo
    deleting = asyncio.ensure_future(engine.delete_session("api-race"))
    turn, deleted = await asyncio.gather(submit, deleting)
    assert deleted is True
    result = await turn.wait(10)
    assert "!help" in result.text and "not run" in result.text and "deleted" in result.text
    assert await engine.store.get_session("api-race") is None
    # The id is free again: the next message starts it afresh.
    again = await engine.run("api-race", "hello again", kind="api", timeout=10)
    assert (again.status, again.text) == ("complete", "echo: hello again")


def _refuse_writes_of(engine, roles: tuple[str, ...]) -> None:
    """The database refuses some messages, as a full disk would (a trigger, from a second
    connection: the engine's own code runs unchanged)."""
    conn = sqlite3.connect(engine.config.paths.db_path)
    in_list = ", ".join(f"'{r}'" for r in roles)
    conn.execute(f"CREATE TRIGGER refuse BEFORE INSERT ON messages WHEN NEW.role IN ({in_list}) "
                 f"BEGIN SELECT RAISE(ABORT, 'disk I/O error (simulated)'); END")
    conn.commit()
    conn.close()


async def test_a_turn_that_crashes_ends_with_error_and_done_and_its_session_goes_idle(
        engine_factory, fake_openai) -> None:
    engine = await engine_factory(extra_files=MYSQL_OFF)
    await engine.run("api-crash", "hi", kind="api", timeout=10)
    _refuse_writes_of(engine, ("assistant", "error"))  # the answer and the record of its failure
    fake_openai.script(Reply.text("hello"))
    sub = engine.bus.subscribe("api-crash")
    turn = await engine.submit("api-crash", "again", kind="api")
    result = await turn.wait(10)
    assert result.status == "error" and result.error["code"] == "internal_error"
    assert "disk I/O error" in result.error["message"]
    seen = []
    async with asyncio.timeout(5):
        async for e in sub:
            seen.append(e.name)
            if e.name == DONE:
                assert e.data["status"] == "error"
                break
    sub.close()
    assert ERROR in seen
    # Idle, as after any failed turn: not "running" for good (never evicted, never idle again).
    assert engine.session_state("api-crash") == "idle"
    [row] = [r for r in await engine.list_sessions() if r["client_id"] == "api-crash"]
    assert row["state"] == "idle"


async def test_a_delete_cancelled_while_it_waits_for_the_turn_leaves_the_session_usable(
        engine_factory, fake_openai) -> None:
    plugin = SlowStopPlugin()
    engine = await engine_factory(extra_files={"plugins.toml": "[mysql]\nenabled = false\n"
                                                               "[slowstop]\nenabled = true\n"}, plugins=[plugin])
    fake_openai.responder = call_tool_when("slow job", ("slow_job", {"text": ""}))
    turn = await engine.submit("api-cx", "start the slow job", kind="api")
    await asyncio.wait_for(plugin.running.wait(), 10)
    deleting = asyncio.ensure_future(engine.delete_session("api-cx"))
    await asyncio.wait_for(plugin.winding_down.wait(), 10)  # the delete stopped the turn and waits for it
    deleting.cancel()  # e.g. the caller's own timeout
    await asyncio.gather(deleting, return_exceptions=True)
    assert (await turn.wait(10)).status == "cancelled"
    assert await engine.store.get_session("api-cx") is not None  # not deleted...
    result = await engine.run("api-cx", "are you there?", kind="api", timeout=10)  # ...so it answers
    assert (result.status, result.text) == ("complete", "echo: are you there?")


async def test_a_session_deleted_between_a_proxy_claim_and_its_submit_is_restarted_as_the_callers(
        engine_factory, fake_openai) -> None:
    engine = await engine_factory(extra_files=MYSQL_OFF)
    bot = Caller("bot", operator=False)
    sid = "bot:conv-1"
    await claim(engine, sid, bot, kind="proxy", model=None)
    await engine.run(sid, "hi", kind="proxy", timeout=10)
    # The order the proxy allows: its claim returns, a DELETE's task runs, then its submit's.
    live = await claim(engine, sid, bot, kind="proxy", model=None)
    assert live.row.owner == "bot"
    sub = engine.bus.subscribe(sid, names=(SESSION,))
    deleting = asyncio.ensure_future(engine.delete_session(sid))
    submit = asyncio.ensure_future(engine.submit(sid, "hello", kind="proxy", meta=owner_meta(bot)))
    turn = await submit
    assert await deleting is True
    assert (await turn.wait(10)).text == "echo: hello"
    row = await engine.store.get_session(sid)
    assert row is not None and row.owner == "bot"  # the client's own again, not operator-only
    changes = []
    while sub.qsize():
        changes.append((await sub.get()).data["change"])
    sub.close()
    assert changes[:2] == ["deleted", "created"]  # consoles and streams see the old one go, a new one come
