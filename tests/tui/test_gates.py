"""The gates inbox: a tool call that asks shows up, keys answer it, answers from elsewhere clear it."""

from __future__ import annotations

from aiops.tui.screens.modals import GateDetailsScreen
from aiops.tui.widgets.chat_input import ChatInput
from aiops.tui.widgets.gates import GatesInbox
from tests.fakes.openai_server import call_tool_when
from tests.tui.conftest import (
    SIZE,
    chat_text,
    ready,
    region_text,
    screen_text,
    send,
    wait_chat,
    wait_for,
)

NOTE = ("write_note", {"text": "disk at 91%"})


async def _ask(pilot, app, fake_openai, trigger: str = "note this") -> dict:
    """Send a message whose turn calls write_note; return the gate once it is in the inbox."""
    fake_openai.responder = call_tool_when(trigger, NOTE)
    await send(pilot, f"please {trigger}")
    await wait_for(pilot, lambda: app.inbox.gates, "a gate in the inbox")
    return next(iter(app.inbox.gates.values()))


async def test_a_gated_call_lands_in_the_inbox_and_a_key_approves_it(make_app, fake_openai, notes):
    app = make_app()
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        gate = await _ask(pilot, app, fake_openai)
        assert gate["tool"] == "write_note" and gate["operation"] == "write"
        # Seen without stealing focus: the inbox, the header badge, a notification, the bell.
        inbox = region_text(app, "#side")
        assert "write_note write" in inbox and "disk at 91%" in inbox and "Gates (1)" in inbox
        assert "⚑ 1 gate" in screen_text(app)
        assert any("approval needed" in (n.title or "") for n in app._notifications)
        assert app.bells == 1
        assert isinstance(app.focused, ChatInput)
        await wait_chat(pilot, "waiting for operator approval: write_note write")
        assert app.sessions_list.sessions[app.selected]["state"] == "waiting"
        # The global key jumps to the oldest gate; `a` approves it once.
        await pilot.press("ctrl+g")
        assert isinstance(app.focused, GatesInbox)
        await pilot.press("a")
        await wait_chat(pilot, "tool said: noted: disk at 91%")
        assert notes.notes == ["disk at 91%"]
        assert not app.inbox.gates
        assert "⚑ 1 gate" not in screen_text(app)
        assert "approved by console" in chat_text(app)
        history = await app.adapter.engine.history(app.selected)
        gate_records = [m for m in history if m.role == "gate"]
        assert gate_records[-1].meta["decision"] == "approved" and gate_records[-1].meta["by"] == "console"


async def test_deny_tells_the_model_and_runs_nothing(make_app, fake_openai, notes):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await _ask(pilot, app, fake_openai)
        await pilot.press("ctrl+g", "d")
        await wait_chat(pilot, "tool said: The operator did not allow the write_note write call")
        assert notes.notes == []
        assert "denied by console" in chat_text(app)
        assert not app.inbox.gates


async def test_approve_for_session_lets_the_same_call_through_afterwards(make_app, fake_openai, notes):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await _ask(pilot, app, fake_openai)
        await pilot.press("ctrl+g", "s")
        await wait_chat(pilot, "tool said: noted: disk at 91%")
        assert "approved for the session by console" in chat_text(app)
        # The same tool and operation again: no gate this time.
        app.chat_input.focus()
        await send(pilot, "note this again")
        await wait_for(pilot, lambda: notes.notes == ["disk at 91%", "disk at 91%"], "the second note")
        assert app.bells == 1 and not app.inbox.gates
        grants = app.adapter.engine.gatekeeper.broker.grants(app.selected)
        assert [(g.tool, g.operation) for g in grants] == [("write_note", "write")]


async def test_deny_and_stop_cancels_the_turn(make_app, fake_openai, notes):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await _ask(pilot, app, fake_openai)
        await pilot.press("ctrl+g", "x")
        await wait_chat(pilot, "turn cancelled")
        await wait_for(pilot, lambda: not app.chat_input.busy, "the turn to end")
        assert notes.notes == [] and not app.inbox.gates
        assert "tool said" not in chat_text(app)


async def test_details_show_the_arguments_with_sql_and_answer_from_there(make_app, fake_openai, notes):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        fake_openai.responder = call_tool_when("clean up", ("run_sql", {"sql": "DELETE FROM users WHERE id = 3"}))
        await send(pilot, "clean up user 3")
        await wait_for(pilot, lambda: app.inbox.gates, "the gate")
        assert "users" in region_text(app, "#side")
        await pilot.press("ctrl+g", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, GateDetailsScreen), "the details")
        text = screen_text(app)
        assert "DELETE FROM users WHERE id = 3" in text
        assert "tables: users" in text and "what the session was doing" in text and "clean up user 3" in text
        sql = app.screen.query_one("#gate-sql")
        assert sql.visual is not None  # highlighted by the SQL lexer
        await pilot.press("a")
        await wait_chat(pilot, "tool said: 1 row affected")
        assert notes.sql == ["DELETE FROM users WHERE id = 3"]
        assert not isinstance(app.screen, GateDetailsScreen)


async def test_a_gate_answered_elsewhere_leaves_at_once(make_app, fake_openai):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        gate = await _ask(pilot, app, fake_openai)
        await pilot.press("ctrl+g", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, GateDetailsScreen), "the details")
        # An operator answers through the API (the broker is what the API calls).
        app.adapter.engine.gatekeeper.broker.resolve(gate["id"], "approve", by="api:ops")
        await wait_for(pilot, lambda: not isinstance(app.screen, GateDetailsScreen), "the details to close")
        await wait_for(pilot, lambda: not app.inbox.gates, "the inbox to empty")
        assert "No gate is waiting." in region_text(app, "#side")
        await wait_chat(pilot, "approved by api:ops")


async def test_gates_from_every_session_oldest_first(make_app, fake_openai):
    fake_openai.responder = call_tool_when("note", NOTE)
    app = make_app(extra_files={"aiops.toml": "[console]\nbell = false\n"})
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        engine = app.adapter.engine
        first = await engine.submit("api-1", "note from api", kind="api")
        await wait_for(pilot, lambda: len(app.inbox.gates) == 1, "the first gate")
        second = await engine.submit("slack-1", "note from slack", kind="slack")
        await wait_for(pilot, lambda: len(app.inbox.gates) == 2, "the second gate")
        side = region_text(app, "#side")
        assert side.index("api") < side.index("slack")  # oldest first
        assert app.bells == 0  # [console] bell = false
        await pilot.press("ctrl+g", "a")
        await first.wait(10)
        await wait_for(pilot, lambda: len(app.inbox.gates) == 1, "one gate left")
        assert "slack" in region_text(app, "#side")
        await pilot.press("d")
        await second.wait(10)
        await wait_for(pilot, lambda: not app.inbox.gates, "no gate left")
