"""Context building: protocol-valid conversations and trimming that never splits a call from its result."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from aiops.engine.context import (
    CANCELLED_RESULT,
    INCOMPLETE_REPLY,
    NO_REPLY,
    NO_REPLY_GIVEN,
    as_text_protocol,
    conversation,
    trim,
)
from aiops.engine.types import Message, ToolCall


def _call_block(i: int, n: int = 1) -> list[Message]:
    calls = [ToolCall(f"c{i}_{k}", "t", {"k": k}) for k in range(n)]
    return [Message("assistant", "", tool_calls=calls)] + [
        Message("tool", f"r{i}_{k}", tool_call_id=f"c{i}_{k}", name="t") for k in range(n)
    ]


def test_notices_and_commands_are_not_context():
    h = [Message("user", "!help", meta={"command": True}), Message("notice", "help text"),
         Message("user", "hi"), Message("gate", "approved"), Message("assistant", "hello")]
    assert [m.content for m in conversation(h)] == ["hi", "hello"]


def test_unanswered_calls_get_a_placeholder_result():
    h = [Message("user", "q"), Message("assistant", "", tool_calls=[ToolCall("c1", "t", {})]),
         Message("notice", "turn cancelled"), Message("user", "again")]
    conv = conversation(h)
    assert [m.role for m in conv] == ["user", "assistant", "tool", "user"]
    assert conv[2].content == CANCELLED_RESULT and conv[2].tool_call_id == "c1"


def test_trim_keeps_the_call_block_whole():
    msgs = [Message("user", "q1"), Message("assistant", "a1"), Message("user", "q2"), *_call_block(1, 3),
            Message("assistant", "done")]
    out = trim(msgs, 4)
    # the 4 newest would cut the block; the whole block goes and the context starts at a user turn
    assert all(not (m.role == "tool") or any(c.id == m.tool_call_id for a in out for c in a.tool_calls)
               for m in out)
    assert out[0].role == "user" or out == msgs[-1:]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.just("u"), st.just("a"), st.integers(1, 4)), min_size=1, max_size=30),
       st.integers(1, 20))
def test_trim_never_orphans_a_tool_result(shape, limit):
    msgs: list[Message] = []
    for i, s in enumerate(shape):
        if s == "u":
            msgs.append(Message("user", f"u{i}"))
        elif s == "a":
            msgs.append(Message("assistant", f"a{i}"))
        else:
            msgs.extend(_call_block(i, s))
    out = trim(msgs, limit)
    assert out, "the newest block is always kept"
    ids = {c.id for m in out for c in m.tool_calls}
    for m in out:
        if m.role == "tool":
            assert m.tool_call_id in ids
    for m in out:
        for c in m.tool_calls:
            assert any(r.tool_call_id == c.id for r in out if r.role == "tool")


def test_text_protocol_writes_calls_as_markup_and_results_as_user_turns():
    h = [Message("user", "q"), *_call_block(1), Message("assistant", "answer")]
    out = as_text_protocol(h)
    assert [m.role for m in out] == ["user", "assistant", "user", "assistant"]
    assert "<tool_call>" in out[1].content and '"name": "t"' in out[1].content
    assert out[2].content.startswith('<tool_result name="t">')


def test_a_reply_cut_short_goes_back_marked_incomplete():
    h = [Message("user", "q"), Message("assistant", "The disk is fu", status="error"),
         Message("error", "connection dropped"), Message("user", "again"),
         Message("assistant", "Rotating", status="cancelled"), Message("notice", "turn cancelled"),
         Message("user", "why stop?"), Message("assistant", "", thinking="hmm", status="cancelled")]
    conv = conversation(h)
    assert [(m.role, m.content) for m in conv] == [
        ("user", "q"), ("assistant", f"The disk is fu\n\n{INCOMPLETE_REPLY['error']}"),
        ("user", "again"), ("assistant", f"Rotating\n\n{INCOMPLETE_REPLY['cancelled']}"),
        # Stopped before any text: the note stands in for the reply, so the question is not
        # taken for one still to answer.
        ("user", "why stop?"), ("assistant", NO_REPLY["cancelled"])]
    assert h[1].content == "The disk is fu"  # the history itself is untouched


def test_a_message_that_got_no_reply_is_followed_by_a_note_in_its_place():
    """A message whose turn was cancelled while queued (its client hung up, a !stop, a shutdown)
    records no reply: without a note the next turn's model saw two questions in a row and
    answered the withdrawn one too (and strict chat templates refuse two user turns in a row)."""
    h = [Message("user", "q1"), Message("assistant", "a1"),
         Message("user", "withdrawn"), Message("notice", "turn cancelled before it started: the client disconnected"),
         Message("user", "also failed"), Message("assistant", "", status="error"),
         Message("user", "!help", meta={"command": True}), Message("notice", "help text"),
         Message("user", "q5")]
    assert [(m.role, m.content) for m in conversation(h)] == [
        ("user", "q1"), ("assistant", "a1"),
        ("user", "withdrawn"), ("assistant", NO_REPLY_GIVEN),
        ("user", "also failed"), ("assistant", NO_REPLY["error"]),
        ("user", "q5")]


def test_a_call_answered_by_a_stop_keeps_that_answer():
    h = [Message("user", "q"), Message("assistant", "", tool_calls=[ToolCall("c1", "slow", {})]),
         Message("tool", "cancelled: the turn was stopped before slow finished", tool_call_id="c1", name="slow",
                 status="cancelled"),
         Message("notice", "turn cancelled: stopped slow"), Message("user", "again")]
    conv = conversation(h)
    assert [m.role for m in conv] == ["user", "assistant", "tool", "user"]
    assert conv[2].content.startswith("cancelled: the turn was stopped")
