"""The event bus: fan-out, filtering, coalesced deltas, and a slow reader dropped without slowing
the publisher; and the typed events' wire form."""

from aiops.engine.bus import EventBus
from aiops.engine.events import Done, Notice, Tok, ToolCalled


def tok(text: str, session: str = "s", turn: str | None = None) -> Tok:
    return Tok(session_id=session, turn_id=turn, text=text)


def call(n: int, session: str = "s", turn: str | None = None) -> ToolCalled:
    return ToolCalled(session_id=session, turn_id=turn, call_id=f"c{n}", tool="x", arguments={"n": n})


async def test_every_subscriber_gets_every_event_of_its_session():
    bus = EventBus()
    a, b, other = bus.subscribe("s1"), bus.subscribe("s1"), bus.subscribe("s2")
    bus.publish(tok("x", "s1"))
    bus.publish(Done(session_id="s1", text="x", status="complete", model="m"))
    for sub in (a, b):
        assert [(await sub.get()).name for _ in range(2)] == ["tok", "done"]
    assert other.qsize() == 0


async def test_queued_deltas_of_one_turn_merge_into_one_event():
    bus = EventBus()
    sub = bus.subscribe(None, maxsize=5)
    for i in range(5000):  # a fast burst costs one slot, and no text is lost
        bus.publish(tok(str(i % 10), turn="t1"))
    bus.publish(call(0, turn="t1"))
    bus.publish(tok("after", turn="t1"))
    bus.publish(tok("other turn", turn="t2"))
    got = sub.pending()
    assert [e.name for e in got] == ["tok", "tool_call", "tok", "tok"]
    assert got[0].text == "0123456789" * 500
    assert (got[2].text, got[3].text) == ("after", "other turn")
    assert not sub.dropped


async def test_slow_reader_is_dropped_with_an_error_event():
    bus = EventBus()
    slow = bus.subscribe(None, maxsize=5)
    for i in range(50):  # publishing never blocks
        bus.publish(call(i))
    got = [e async for e in slow]
    assert got[-1].name == "error" and got[-1].code == "slow_consumer"
    assert len(got) == 6
    assert bus.subscriber_count == 0


async def test_a_waiting_reader_wakes_on_publish_and_ends_on_close():
    import asyncio

    bus = EventBus()
    sub = bus.subscribe("s")
    reader = asyncio.ensure_future(sub.get())
    await asyncio.sleep(0)
    bus.publish(Notice(session_id="s", text="hi"))
    assert (await reader).text == "hi"
    reader = asyncio.ensure_future(sub.get())
    await asyncio.sleep(0)
    sub.close()
    assert await reader is None


async def test_payload_carries_session_and_turn():
    bus = EventBus()
    ev = bus.publish(tok("x", turn="turn_1"))
    assert ev.payload() == {"text": "x", "session_id": "s", "turn_id": "turn_1"}


def _every_kind() -> list:
    import dataclasses

    from aiops.engine import events as e

    gate = e.GateInfo(id="g1", session_id="s", client_id="s", client_kind="api", tool="db_query",
                      tool_type="db", args={"sql": "DELETE FROM t"}, operation="write", tables=("test.t",),
                      summary="DELETE FROM t", created_at=1.0, expires_at=2.0, rule_target="db_query")
    ids = {"session_id": "s", "turn_id": "turn_1"}
    return [
        e.Tok(text="hi", **ids), e.Thinking(text="hmm", **ids),
        e.ToolCalled(call_id="c1", tool="db_query", arguments={"sql": "SELECT 1"}, **ids),
        e.ToolReturned(call_id="c1", tool="db_query", content="1", duration_ms=2.5, gate="approved",
                       result_data={"rows": [[1]]}, status="cancelled", **ids),
        e.GateOpened(gate=gate, **ids),
        e.GateResolved(gate=dataclasses.replace(gate, decision="approved", scope="once", by="console", at=3.0),
                       **ids),
        e.Notice(text="!help output", command="!help", ok=True, **ids),
        e.error_event("s", "model_error", "the model is down", "turn_1"),
        e.Done(text="answer", status="error", model="local", error=e.ErrorInfo("model_error", "down", "connection"),
               finish_reason="length", ended="too many tool calls",
               usage=e.TokenCounts(3, 4), **ids),
        e.Done(text="", status="complete", model="local", command=True, **ids),
        e.UserPosted(text="hello", model="other", **ids), e.UserPosted(text="!help", command=True, **ids),
        e.TurnStarted(model="local", **ids),
        e.SessionChanged(change="updated", session={"client_id": "s", "short_id": 101, "title": "t"},
                         session_id="s"),
        e.RateChanged(usage=(e.RateInfo("s", "db", 1, 5, 10.0, False),), session_id="s"),
        e.ModelsChanged(models=(e.ModelState("local", True, "", 5.0),
                                e.ModelState("gpt", False, "OPENAI_API_KEY is not set", 6.0, "key")), session_id=None),
    ]


def test_every_event_reads_back_from_its_wire_form():
    """What a remote view (an attached console, a swarm peer) rebuilds from the SSE stream is the
    event that was sent: same type, same fields."""
    from aiops.engine.events import from_wire

    for sent in _every_kind():
        got = from_wire(sent.name, sent.payload(), ts=sent.ts)
        assert type(got) is type(sent)
        assert got.payload() == sent.payload()
        assert (got.session_id, got.turn_id) == (sent.session_id, sent.turn_id)


def test_an_unknown_wire_event_is_refused_by_name():
    import pytest

    from aiops.engine.events import from_wire

    with pytest.raises(ValueError, match="'bogus'"):
        from_wire("bogus", {})
