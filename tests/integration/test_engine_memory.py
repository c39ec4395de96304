"""Sessions in memory are a cache of the store: idle ones beyond `[engine] cached_sessions` leave
memory, and coming back to one loses nothing; busy ones always stay."""

from __future__ import annotations

import asyncio

from aiops.engine.events import DONE
from tests.fakes.openai_server import Reply, message_text
from tests.support.engine import next_event

SMALL_CACHE = {"aiops.toml": "[engine]\ncached_sessions = 2\n", "plugins.toml": "[mysql]\nenabled = false\n"}


def conversation(body: dict) -> list[tuple[str, str]]:
    """(role, text) of every non-system message the model was sent."""
    return [(m["role"], message_text(m)) for m in body["messages"] if m["role"] != "system"]


async def test_idle_sessions_leave_memory_and_come_back_whole(engine_factory, fake_openai):
    engine = await engine_factory(extra_files=SMALL_CACHE)
    for n in range(6):
        result = await engine.run(f"api-{n}", f"hello from {n}", kind="api", timeout=10)
        assert result.text == f"echo: hello from {n}"
    assert engine.status()["sessions_live"] <= 2  # the other four are in the store only

    # The oldest one, long gone from memory, continues with its whole history.
    result = await engine.run("api-0", "and again", kind="api", timeout=10)
    assert result.status == "complete"
    assert conversation(fake_openai.last_request.json) == [
        ("user", "hello from 0"), ("assistant", "echo: hello from 0"), ("user", "and again")]
    listed = {s["client_id"]: s for s in await engine.list_sessions()}
    assert sorted(listed) == [f"api-{n}" for n in range(6)]
    assert listed["api-0"]["message_count"] == 4 and listed["api-5"]["message_count"] == 2
    assert listed["api-0"]["short_id"] == 101  # the same session, not a new one


async def test_a_busy_session_stays_however_many_others_come(engine_factory, fake_openai):
    engine = await engine_factory(extra_files=SMALL_CACHE)
    # Held at the fake (after the role frame) until the others have come and gone.
    fake_openai.script(Reply.text("slow answer", hold_after=1))
    sub = engine.bus.subscribe("api-busy")
    busy = await engine.submit("api-busy", "take your time", kind="api")
    await fake_openai.wait_for_held_async(1)
    for n in range(5):
        await engine.run(f"api-{n}", f"quick {n}", kind="api", timeout=30)
    assert engine.session_state("api-busy") == "running"
    # A second message to the busy session queues behind its running turn, on the same session.
    second = await engine.submit("api-busy", "one more", kind="api")
    fake_openai.release()
    assert (await busy.wait(30)).text == "slow answer"
    assert (await second.wait(30)).text == "echo: one more"
    last = conversation(fake_openai.last_request.json)
    assert last == [("user", "take your time"), ("assistant", "slow answer"), ("user", "one more")]
    await next_event(sub, DONE)
    sub.close()


async def test_messages_racing_the_cache_still_run_one_turn_at_a_time(engine_factory, fake_openai):
    """Two messages to one idle, uncached session, sent while new sessions push others out: the
    second must queue behind the first on the same session and see its answer."""
    engine = await engine_factory(extra_files=SMALL_CACHE)
    await engine.run("api-a", "start", kind="api", timeout=10)
    for n in range(3):
        await engine.run(f"api-{n}", f"filler {n}", kind="api", timeout=10)  # api-a leaves memory
    fake_openai.reset()
    # A listing first: the store's writes then queue behind it on its thread, so every submit
    # below waits for the store, where the others overtake it.
    listing, *turns = await asyncio.gather(
        engine.list_sessions(),
        engine.submit("api-a", "first", kind="api"),
        *(engine.submit(f"api-new-{n}", f"new {n}", kind="api") for n in range(4)),
        engine.submit("api-a", "second", kind="api"),
    )
    assert len(listing) == 4
    results = [await t.wait(10) for t in turns]
    assert all(r.status == "complete" for r in results)
    to_a = [conversation(r.json) for r in fake_openai.requests
            if conversation(r.json)[0] == ("user", "start")]
    assert to_a == [
        [("user", "start"), ("assistant", "echo: start"), ("user", "first")],
        [("user", "start"), ("assistant", "echo: start"), ("user", "first"), ("assistant", "echo: first"),
         ("user", "second")],
    ]
