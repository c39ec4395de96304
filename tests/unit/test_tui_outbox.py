"""What the console's App receives from the outbox (aiops/tui/outbox.py): text deltas in batches,
merged per turn, in order; any other event at once, after the deltas before it."""

from __future__ import annotations

import asyncio

from aiops.engine import events as ev
from aiops.tui.outbox import EventOutbox


class Received:
    """What the App would be posted, in order: ("one", event) or ("deltas", [events])."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, object]] = []
        self.batches: asyncio.Queue[list[ev.Event]] = asyncio.Queue()

    def one(self, event: ev.Event) -> None:
        self.posts.append(("one", event))

    def deltas(self, events: list[ev.Event]) -> None:
        self.posts.append(("deltas", events))
        self.batches.put_nowait(events)


def tok(sid: str, text: str) -> ev.Tok:
    return ev.Tok(session_id=sid, turn_id=f"t-{sid}", text=text)


def texts(events: object) -> list[tuple[str | None, str, str]]:
    assert isinstance(events, list)
    return [(e.session_id, e.name, e.text) for e in events]


async def test_deltas_of_fifty_sessions_arrive_as_one_batch_merged_per_turn_in_order() -> None:
    got = Received()
    outbox = EventOutbox(got.one, got.deltas)
    sids = [f"s{i}" for i in range(50)]
    for word in ("one ", "two ", "three"):
        for sid in sids:
            outbox.put(tok(sid, word))
    outbox.put(ev.Thinking(session_id="s0", turn_id="t-s0", text="hmm"))
    outbox.put(tok("s0", " four"))
    assert got.posts == []  # waiting for the tick
    await asyncio.wait_for(got.batches.get(), 5)
    [(kind, batch)] = got.posts
    assert kind == "deltas"
    assert texts(batch) == [("s0", "tok", "one two three"), *[(sid, "tok", "one two three") for sid in sids[1:]],
                            ("s0", "thinking", "hmm"), ("s0", "tok", " four")]


async def test_a_gate_is_posted_at_once_after_the_deltas_before_it() -> None:
    got = Received()
    outbox = EventOutbox(got.one, got.deltas)
    outbox.put(tok("a", "let me "))
    outbox.put(tok("b", "elsewhere"))
    outbox.put(tok("a", "check"))
    gate = ev.GateOpened(session_id="a", turn_id="t-a", gate=ev.GateInfo.from_dict({"id": "g1", "tool": "write_note"}))
    outbox.put(gate)
    outbox.put(tok("a", "after"))
    # No tick waited for: the gate is there, the text before it first.
    assert [k for k, _ in got.posts] == ["deltas", "one"]
    assert texts(got.posts[0][1]) == [("a", "tok", "let me check"), ("b", "tok", "elsewhere")]
    assert got.posts[1][1] is gate
    got.batches.get_nowait()
    assert texts(await asyncio.wait_for(got.batches.get(), 5)) == [("a", "tok", "after")]  # at the tick
    assert len(got.posts) == 3


async def test_deltas_are_sent_when_the_outbox_is_flushed_and_never_twice() -> None:
    got = Received()
    outbox = EventOutbox(got.one, got.deltas)
    outbox.put(tok("a", "last words"))
    outbox.flush()  # the console stops listening
    assert [texts(b) for _, b in got.posts] == [[("a", "tok", "last words")]]
    await asyncio.sleep(0.1)  # past the tick its timer would have fired at: nothing more
    assert len(got.posts) == 1

