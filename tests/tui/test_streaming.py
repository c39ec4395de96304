"""Streamed text in the console: deltas reach the App in batches (aiops/tui/outbox.py), and what the
operator sees stays whole and in order: the text before a tool call above it, a gate shown, a
session picked mid-stream complete while others stream."""

from __future__ import annotations

from aiops.tui.widgets.chat import AssistantMessage
from tests.fakes.openai_server import Reply
from tests.tui.conftest import SIZE, chat_text, ready, send, wait_chat, wait_for

NOTE = ("write_note", {"text": "disk at 91%"})


def _words(prefix: str, n: int) -> str:
    return " ".join(f"{prefix}{i}" for i in range(n))


async def test_text_streamed_before_a_tool_call_is_drawn_above_it_and_its_gate_is_shown(make_app, fake_openai):
    # The whole reply in one write: its text deltas, the call and the gate reach the console
    # within a few milliseconds, well inside one batch of deltas.
    fake_openai.script(Reply.tool_calls(NOTE, text="Let me write that down first.", chunks=6, one_write=True),
                       Reply.text("Noted."))
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "note the disk")
        await wait_for(pilot, lambda: app.inbox.gates, "the gate in the inbox")
        await wait_chat(pilot, "waiting for")
        text = chat_text(app)
        assert text.index("› you note the disk") < text.index("Let me write that down first.") \
            < text.index("write_note") < text.index("waiting for"), text
        assert [m.text for m in app.chat.query(AssistantMessage)] == ["Let me write that down first."]


async def test_a_session_picked_mid_stream_shows_its_text_whole_and_in_order_while_another_streams(
        make_app, fake_openai):
    # Two chat UIs' sessions stream at once, word by word; the first is held halfway until it is
    # shown, the second runs on meanwhile, their deltas sharing the console's batches.
    first, second = _words("a", 60), _words("b", 60)
    fake_openai.script(Reply.text(first, chunks=60, chunk_delay=0.002, hold_after=30),
                       Reply.text(second, chunks=60, chunk_delay=0.002))
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        engine = app.adapter.engine
        turn_a = await engine.submit("chat-a", "count with a", kind="proxy")
        await fake_openai.wait_for_held_async()
        turn_b = await engine.submit("chat-b", "count with b", kind="proxy")
        await wait_for(pilot, lambda: "b3" in app.live.partial_text("chat-b"), "the second session streaming")
        await app.select_session("chat-a")
        await wait_chat(pilot, "a28")  # what streamed before it was shown
        assert not turn_a.done
        fake_openai.release()
        await turn_a.wait(30)
        await turn_b.wait(30)
        await wait_chat(pilot, "a59")
        assert [m.text for m in app.chat.query(AssistantMessage)] == [first]
        assert "b1" not in chat_text(app)
        await app.select_session("chat-b")
        await wait_chat(pilot, "b59")
        assert [m.text for m in app.chat.query(AssistantMessage)] == [second]
