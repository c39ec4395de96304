"""The event bus: fan-out, filtering, coalesced deltas, and a slow reader dropped without slowing
the publisher."""

from aiops.engine.events import EventBus


async def test_every_subscriber_gets_every_event_of_its_session():
    bus = EventBus()
    a, b, other = bus.subscribe("s1"), bus.subscribe("s1"), bus.subscribe("s2")
    bus.publish("tok", "s1", {"text": "x"})
    bus.publish("done", "s1", {"text": "x"})
    for sub in (a, b):
        assert [(await sub.get()).name for _ in range(2)] == ["tok", "done"]
    assert other.qsize() == 0


async def test_queued_deltas_of_one_turn_merge_into_one_event():
    bus = EventBus()
    sub = bus.subscribe(None, maxsize=5)
    for i in range(5000):  # a fast burst costs one slot, and no text is lost
        bus.publish("tok", "s", {"text": str(i % 10)}, "t1")
    bus.publish("tool_call", "s", {"name": "x"}, "t1")
    bus.publish("tok", "s", {"text": "after"}, "t1")
    bus.publish("tok", "s", {"text": "other turn"}, "t2")
    got = sub.pending()
    assert [e.name for e in got] == ["tok", "tool_call", "tok", "tok"]
    assert got[0].data["text"] == "0123456789" * 500
    assert (got[2].data["text"], got[3].data["text"]) == ("after", "other turn")
    assert not sub.dropped


async def test_slow_reader_is_dropped_with_an_error_event():
    bus = EventBus()
    slow = bus.subscribe(None, maxsize=5)
    for i in range(50):  # publishing never blocks
        bus.publish("tool_call", "s", {"n": i})
    got = [e async for e in slow]
    assert got[-1].name == "error" and got[-1].data["code"] == "slow_consumer"
    assert len(got) == 6
    assert bus.subscriber_count == 0


async def test_a_waiting_reader_wakes_on_publish_and_ends_on_close():
    import asyncio

    bus = EventBus()
    sub = bus.subscribe("s")
    reader = asyncio.ensure_future(sub.get())
    await asyncio.sleep(0)
    bus.publish("notice", "s", {"text": "hi"})
    assert (await reader).data["text"] == "hi"
    reader = asyncio.ensure_future(sub.get())
    await asyncio.sleep(0)
    sub.close()
    assert await reader is None


async def test_payload_carries_session_and_turn():
    bus = EventBus()
    ev = bus.publish("tok", "s", {"text": "x"}, "turn_1")
    assert ev.payload() == {"text": "x", "session_id": "s", "turn_id": "turn_1"}
