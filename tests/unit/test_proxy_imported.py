"""What a session records of a chat client's earlier messages (proxy.imported): tool exchanges
as a live round trip records them, and a view matching compares as it compared the client's."""

from __future__ import annotations

from aiops.engine.client_tools import CLIENT_CALLS, UNANSWERED, ClientTool, open_client_calls
from aiops.engine.context import conversation
from aiops.engine.types import ToolSpec
from aiops.integrations.server.proxy.imported import model_names, records, taken_in
from aiops.integrations.server.proxy.matching import client_view, session_view
from aiops.integrations.server.proxy.messages import ClientMessage, ClientToolCall, folded


def _same(name: str) -> str:
    return name


def _chat() -> list[ClientMessage]:
    """Two rounds of calls in one answer (Ollama's: no ids, results naming the tool), text between."""
    return [
        ClientMessage("user", "the time and date, then the time in PST?"),
        ClientMessage("assistant", "", tool_calls=(ClientToolCall(None, "get_time", {"tz": "UTC"}),
                                                   ClientToolCall(None, "get_date", {}))),
        ClientMessage("tool", "2026-11-27", tool_name="get_date"),
        ClientMessage("tool", "10:42", tool_name="get_time"),
        ClientMessage("assistant", "*⏳ waiting for operator approval: x*\n\nOne more.",
                      tool_calls=(ClientToolCall("c3", "get_time", {"tz": "PST"}),)),
        ClientMessage("tool", "02:42", tool_call_id="c3"),
        ClientMessage("assistant", "10:42 UTC, 02:42 PST."),
        ClientMessage("user", "thanks"),
    ]


def test_an_answer_with_tool_calls_is_recorded_as_a_round_trip_in_its_turn() -> None:
    chat = folded(_chat())
    recs = records(taken_in(chat[:-1]), _same)
    assert [(m.role, m.content) for m in recs] == [
        ("user", "the time and date, then the time in PST?"), ("assistant", ""), ("tool", "2026-11-27"), ("tool", "10:42"),
        ("assistant", "One more."), ("tool", "02:42"), ("assistant", "10:42 UTC, 02:42 PST.")]
    assert len({m.turn_id for m in recs}) == 1
    first, third = recs[1], recs[4]
    # Results paired with their calls by the tool's name when the calls carry no id (then given one).
    assert [c.name for c in first.tool_calls] == ["get_time", "get_date"] and all(c.id for c in first.tool_calls)
    assert [m.tool_call_id for m in recs[2:4]] == [c.id for c in reversed(first.tool_calls)]
    assert third.tool_calls[0].id == "c3" and recs[5].tool_call_id == "c3"
    assert first.meta[CLIENT_CALLS] == {c.id: c.name for c in first.tool_calls}
    assert all(m.meta.get("imported") for m in recs)
    assert all(m.meta.get("client") for m in recs if m.role == "tool")
    # Nothing left open for a turn to wait on, and the model gets every call with its result.
    assert open_client_calls(recs) is None
    assert [m.role for m in conversation(recs)] == ["user", "assistant", "tool", "tool", "assistant", "tool",
                                                    "assistant"]
    # Matching compares texts only: the session's view is the client's.
    assert session_view(recs) == client_view(chat[:-1])


def test_a_call_without_its_result_is_recorded_unanswered_and_a_stray_result_left_out() -> None:
    chat = folded([
        ClientMessage("user", "time?"),
        ClientMessage("assistant", "", tool_calls=(ClientToolCall("c1", "get_time", {}),)),
        ClientMessage("user", "never mind"),
        ClientMessage("tool", "orphan", tool_call_id="c9"),
        ClientMessage("assistant", "ok"),
        ClientMessage("user", "bye"),
    ])
    recs = records(taken_in(chat[:-1]), _same)
    assert [(m.role, m.content, m.tool_call_id) for m in recs] == [
        ("user", "time?", None), ("assistant", "", None), ("tool", UNANSWERED, "c1"),
        ("user", "never mind", None), ("assistant", "ok", None)]
    assert recs[2].meta.get("unanswered") and recs[2].turn_id == recs[0].turn_id != recs[3].turn_id


def test_a_client_tool_named_like_an_agent_tool_is_recorded_under_the_name_the_model_knows() -> None:
    offered = (ClientTool("read_system_prompt", ToolSpec("client_read_system_prompt", "", {})),)
    rename = model_names(offered, {"read_system_prompt", "db_query"})
    assert [rename(n) for n in ("read_system_prompt", "db_query", "get_time")] == [
        "client_read_system_prompt", "client_db_query", "get_time"]
    (_, call, result) = records([ClientMessage("user", "q"), *folded([
        ClientMessage("assistant", "", tool_calls=(ClientToolCall("c1", "db_query", {}),)),
        ClientMessage("tool", "42", tool_call_id="c1")])], rename)
    assert call.tool_calls[0].name == result.name == "client_db_query"
    assert call.meta[CLIENT_CALLS] == {"c1": "db_query"}  # the client's name, as a live call keeps it


def test_a_result_naming_a_call_id_nobody_made_is_left_out_not_paired_with_a_waiting_call() -> None:
    """As a live continuation refuses it (tool_results.pair): paired with the first waiting call,
    one tool's result would be recorded as another's (review finding)."""
    chat = folded([
        ClientMessage("user", "time and weather?"),
        ClientMessage("assistant", "", tool_calls=(ClientToolCall("c1", "get_time", {}),
                                                   ClientToolCall("c2", "get_weather", {}))),
        ClientMessage("tool", "sunny", tool_call_id="c2"),
        ClientMessage("tool", "rm -rf says hi", tool_call_id="c9"),  # no call c9 was made
        ClientMessage("assistant", "ok"),
        ClientMessage("user", "bye"),
    ])
    recs = records(taken_in(chat[:-1]), _same)
    assert [(m.role, m.content, m.tool_call_id) for m in recs] == [
        ("user", "time and weather?", None), ("assistant", "", None), ("tool", "sunny", "c2"),
        ("tool", UNANSWERED, "c1"), ("assistant", "ok", None)]
