"""The gates inbox: a tool call that asks shows up, keys answer it, answers from elsewhere clear it."""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Callable
from typing import Any

import pytest
from textual import events
from textual.widgets import Markdown, TabbedContent

from aiops.engine import events as ev
from aiops.engine.engine import Engine
from aiops.engine.events import GateInfo
from aiops.integrations.mysql_plugin import MySQLPlugin
from aiops.tui.app import AiopsApp
from aiops.tui.screens.modals import GateDetailsScreen
from aiops.tui.widgets.chat import ToolCallBlock
from aiops.tui.widgets.chat_input import ChatInput
from aiops.tui.widgets.gates import ARM_SECONDS, GatesInbox
from tests.fakes.openai_server import call_tool_when
from tests.support.mariadb import PASSWORD_ENV
from tests.tui.conftest import (
    SIZE,
    ManualClock,
    chat_text,
    color_of,
    console_config,
    ready,
    region_text,
    screen_text,
    send,
    type_text,
    wait_chat,
    wait_for,
    wait_text,
)

NOTE = ("write_note", {"text": "disk at 91%"})


async def _ask(pilot, app, fake_openai, trigger: str = "note this") -> GateInfo:
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
        assert gate.tool == "write_note" and gate.operation == "write"
        # Seen without stealing focus: the inbox, the header badge, the bell. The row comes first;
        # the count follows it in the next frame. No toast: the row is in sight.
        inbox = region_text(app, "#side")
        assert "write_note write" in inbox and "disk at 91%" in inbox
        await wait_for(pilot, lambda: "Gates (1)" in region_text(app, "#side"), "the tab's count")
        assert "⚑ 1 gate" in screen_text(app)
        assert not any("approval needed" in (n.title or "") for n in app._notifications)
        assert app.bells == 1
        assert isinstance(app.focused, ChatInput)
        await wait_chat(pilot, "waiting for operator approval (gates inbox)")
        assert app.sessions_list.sessions[app.selected]["state"] == "waiting"
        # The call's own block says it waits (and where it is answered), not "running…"; once.
        assert chat_text(app).count("waiting for operator approval") == 1
        block = app.chat.query(ToolCallBlock).last()
        assert "waiting for operator approval (gates inbox)" in str(block.title) and "running" not in str(block.title)
        # The global key jumps to the oldest gate; `a` approves it once.
        await pilot.press("ctrl+g")
        assert isinstance(app.focused, GatesInbox)
        await pilot.press("a")
        await wait_chat(pilot, "tool said: noted: disk at 91%")
        assert isinstance(app.focused, ChatInput)  # back where the operator was
        assert notes.notes == ["disk at 91%"]
        assert not app.inbox.gates
        assert "⚑ 1 gate" not in screen_text(app)
        assert "approved by console" in chat_text(app)
        assert "waiting" not in str(block.title) and "✓" in str(block.title)
        # The wait is over: its block says so, as the history (which never had the wait) shows it.
        assert "waiting for operator approval" not in chat_text(app)
        history = await app.adapter.engine.history(app.selected)
        gate_records = [m for m in history if m.role == "gate"]
        assert gate_records[-1].meta["decision"] == "approved" and gate_records[-1].meta["by"] == "console"


@pytest.mark.parametrize(("answer", "outcome", "decision"), [
    ("a", "✓", "approved by console"),
    ("d", "denied", "denied by console"),
    (None, "timeout", "timed out"),
])
async def test_a_waiting_gate_is_said_once_on_its_call_until_answered(make_app, fake_openai, notes, answer,
                                                                    outcome, decision):
    # The call's block says it waits, and nothing else in the chat says it again; the answer
    # (a key, or nobody within the wait) changes the block, and the session reopened from the store
    # reads as the live chat ended.
    app = make_app(extra_files={"gates.toml": "[wait]\nconsole = 2\n"} if answer is None else None)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await _ask(pilot, app, fake_openai)
        await wait_chat(pilot, "waiting for operator approval")
        assert chat_text(app).count("waiting for operator approval") == 1
        block_title = region_text(app, "#chat .tool CollapsibleTitle")
        assert "⏳ waiting for operator approval (gates inbox)" in block_title
        if answer is not None:
            await pilot.press("ctrl+g", answer)
        await wait_chat(pilot, "tool said:")
        await wait_for(pilot, lambda: not app.chat_input.busy, "the turn to end")
        live = chat_text(app)
        assert "waiting" not in live and decision in live
        assert outcome in region_text(app, "#chat .tool CollapsibleTitle")
        await app.select_session(app.selected)
        await wait_for(pilot, lambda: app.chat.session_id is not None and decision in chat_text(app), "the reload")
        reopened = chat_text(app)
        assert "waiting" not in reopened and outcome in region_text(app, "#chat .tool CollapsibleTitle")
        assert reopened.count(decision) == live.count(decision) == 1


async def test_two_calls_of_one_tool_each_wait_on_their_own_block(make_app, fake_openai, notes):
    # One answer calls write_note twice: each gate the engine opens names its call (`call_id`),
    # and the block that waits is the one whose gate is still open. (The order of the events that
    # the old matching by tool name got wrong is in test_chat_turns.py.)
    fake_openai.responder = call_tool_when("two notes", ("write_note", {"text": "first"}),
                                           ("write_note", {"text": "second"}))
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "please take two notes")
        await wait_for(pilot, lambda: len(app.inbox.gates) == 2, "two gates in the inbox")
        gates = {g.args["text"]: g for g in app.inbox.gates.values()}
        blocks = {b.call_id: b for b in app.chat.query(ToolCallBlock)}
        assert {gates["first"].call_id, gates["second"].call_id} == set(blocks)
        await wait_for(pilot, lambda: all(b.waiting for b in blocks.values()), "both blocks waiting")
        # The second note's gate answered: its block runs on; the first's still waits.
        app.adapter.engine.resolve_gate(gates["second"].id, "approved", by="test")
        await wait_for(pilot, lambda: notes.notes == ["second"], "the second note")
        await wait_for(pilot, lambda: blocks[gates["second"].call_id].result is not None, "its result")
        assert blocks[gates["second"].call_id].waiting is None
        assert blocks[gates["first"].call_id].waiting and blocks[gates["first"].call_id].result is None
        app.adapter.engine.resolve_gate(gates["first"].id, "denied", by="test")
        await wait_for(pilot, lambda: not app.chat_input.busy, "the turn to end")
        assert notes.notes == ["second"]


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
        await send(pilot, "!model")
        await wait_chat(pilot, "Models (* = this session")
        fake_openai.responder = call_tool_when("clean up", ("run_sql", {"sql": "DELETE FROM users WHERE id = 3"}))
        await send(pilot, "clean up user 3")
        await wait_for(pilot, lambda: app.inbox.gates, "the gate")
        assert "users" in region_text(app, "#side")
        await pilot.press("ctrl+g", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, GateDetailsScreen), "the details")
        text = screen_text(app)
        assert "DELETE FROM users WHERE id = 3" in text
        assert "tables: users" in text and "what the session was doing" in text and "clean up user 3" in text
        assert "Models (" not in text and "!model" not in text  # the operator's commands are not context
        assert "DELETE FROM users WHERE id = 3" in str(app.screen.query_one("#gate-sql").visual)
        assert not app.screen.query("#gate-args")  # the SQL was the only argument: not shown twice
        # Highlighted: the keyword and the table name are drawn in different colours.
        assert color_of(app, "DELETE", "#gate-sql") != color_of(app, "users", "#gate-sql")
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
        app.adapter.engine.gatekeeper.broker.resolve(gate.id, "approve", by="api:ops")
        await wait_for(pilot, lambda: not isinstance(app.screen, GateDetailsScreen), "the details to close")
        await wait_for(pilot, lambda: not app.inbox.gates, "the inbox to empty")
        assert "No gate is waiting." in region_text(app, "#side")
        await wait_chat(pilot, "approved by api:ops")


def _quiet_app(make_app: Any, fake_openai: Any) -> Any:
    """A console without the bell whose model writes a note (a gated call) when asked to."""
    fake_openai.responder = call_tool_when("note", NOTE)
    return make_app(extra_files={"aiops.toml": "[console]\nbell = false\n"})


async def _gate_from(pilot: Any, client_id: str, kind: str, count: int) -> Any:
    """A turn of `kind` from `client_id` whose note waits at a gate: the inbox then holds `count`."""
    app = pilot.app
    turn = await app.adapter.engine.submit(client_id, f"note from {kind}", kind=kind)
    await wait_for(pilot, lambda: len(app.inbox.gates) == count, f"gate {count} in the inbox")
    return turn


async def test_gates_from_every_session_oldest_first(make_app, fake_openai):
    app = _quiet_app(make_app, fake_openai)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        first = await _gate_from(pilot, "api-1", "api", 1)
        second = await _gate_from(pilot, "slack-1", "slack", 2)
        side = region_text(app, "#side")
        assert side.index("api") < side.index("slack")  # oldest first
        assert app.bells == 0  # [console] bell = false
        await pilot.press("ctrl+g", "a")
        await first.wait(10)
        await wait_for(pilot, lambda: len(app.inbox.gates) == 1, "one gate left")
        assert "slack" in region_text(app, "#side")
        await pilot.press("ctrl+g", "d")
        await second.wait(10)
        await wait_for(pilot, lambda: not app.inbox.gates, "no gate left")


async def test_more_gates_than_the_inbox_holds_scroll_and_the_newest_is_reached(make_app, fake_openai):
    # A new row repaints the inbox without reflowing the screen; a scrollbar, when the rows
    # outgrow the pane, still comes (and is placed), and the keys reach the last gate.
    app = _quiet_app(make_app, fake_openai)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        count = 14  # three lines each: more than the inbox's ~33 at 120x40
        for i in range(count):
            await _gate_from(pilot, f"api-{i}", "api", i + 1)
        inbox = app.inbox
        await wait_for(pilot, lambda: inbox.show_vertical_scrollbar and inbox.vertical_scrollbar.region,
                       "the inbox's scrollbar on screen")
        oldest, *_, newest = inbox.ordered()
        short = app.sessions_list.short_id
        assert f"api {short(oldest.session_id)} " in region_text(app, "#gates")
        assert f"api {short(newest.session_id)} " not in region_text(app, "#gates")
        await pilot.press("ctrl+g", "end")
        await wait_for(pilot, lambda: f"api {short(newest.session_id)} " in region_text(app, "#gates"),
                       "the newest gate scrolled into view")
        assert inbox.highlighted_option is not None and inbox.highlighted_option.id == newest.id


@pytest.mark.parametrize("size", [SIZE, (80, 24)], ids=["120x40", "80x24"])
async def test_after_answering_the_gate_jumped_to_typing_goes_to_the_input_not_the_inbox(
        make_app, fake_openai, notes, size):
    fake_openai.responder = call_tool_when("note", NOTE)
    app = make_app(extra_files={"aiops.toml": "[console]\nbell = false\n"})
    async with app.run_test(size=size) as pilot:
        await ready(pilot)
        engine = app.adapter.engine
        first = await engine.submit("api-1", "note from api", kind="api")
        await wait_for(pilot, lambda: len(app.inbox.gates) == 1, "the first gate")
        second = await engine.submit("slack-1", "note from slack", kind="slack")
        await wait_for(pilot, lambda: len(app.inbox.gates) == 2, "the second gate")
        await type_text(pilot, "half a ")
        await pilot.press("ctrl+g", "a")
        await first.wait(10)
        # The focus is back in the input (on a narrow terminal: the chat view is back), so every
        # letter of the next message lands there; none of a/s/d/x answers the slack gate.
        await type_text(pilot, "sentence: deny access, approve nothing, stay")
        assert app.chat_input.text == "half a sentence: deny access, approve nothing, stay"
        assert isinstance(app.focused, ChatInput)
        assert len(app.inbox.gates) == 1 and not second.done
        assert "approve nothing" in region_text(app, "#input")
        # The details view, reached through the jump, returns there too.
        await pilot.press("ctrl+g", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, GateDetailsScreen), "the details")
        await pilot.press("d")
        await second.wait(10)
        await wait_for(pilot, lambda: isinstance(app.focused, ChatInput), "the input again")
        await type_text(pilot, "!")
        assert app.chat_input.text.endswith("stay!")
        assert notes.notes == ["disk at 91%"]


async def test_a_gate_that_slides_under_the_cursor_is_not_answered_by_a_stray_key(make_app, fake_openai, notes):
    fake_openai.responder = call_tool_when("note", NOTE)
    clock = ManualClock()
    app = make_app(extra_files={"aiops.toml": "[console]\nbell = false\n"}, clock=clock)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)

        def warnings() -> int:
            return sum("moved under the cursor" in n.message for n in app._notifications)

        # The operator went to the inbox on their own (no jump) and stays there.
        app.main.show_pane("gates")
        await wait_for(pilot, lambda: isinstance(app.focused, GatesInbox), "the inbox")
        turn = await app.adapter.engine.submit("api-1", "note from api", kind="api")
        await wait_for(pilot, lambda: app.inbox.gates, "the gate")
        await pilot.press("a")  # a key pressed as the gate arrived: not an answer
        await wait_for(pilot, lambda: warnings() == 1, "the warning")
        clock.advance(ARM_SECONDS / 2)
        await pilot.press("a")  # still too soon to have read it
        await wait_for(pilot, lambda: warnings() == 2, "the warning again")
        assert app.inbox.gates and notes.notes == []
        clock.advance(ARM_SECONDS / 2 + 0.01)  # a second to look
        await pilot.press("a")
        await turn.wait(10)
        assert notes.notes == ["disk at 91%"] and warnings() == 2
        assert isinstance(app.focused, GatesInbox)  # no jump, so no return: ready for the next one


async def test_a_burst_typed_in_the_inbox_goes_to_the_input_answer_letters_included(make_app, fake_openai, notes):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await _ask(pilot, app, fake_openai)
        app.main.show_pane("gates")
        await wait_for(pilot, lambda: isinstance(app.focused, GatesInbox), "the inbox")
        # One terminal read (common over SSH) delivers both keys before the App has moved the
        # focus for the first: `a` (approve) is already queued for the inbox when `h` leaves it.
        app.post_message(events.Key("h", "h"))
        app.post_message(events.Key("a", "a"))
        await wait_for(pilot, lambda: app.chat_input.text == "ha", "both letters in the input")
        await pilot.pause()
        assert isinstance(app.focused, ChatInput)
        assert app.inbox.gates and notes.notes == []  # still pending: nothing approved it


async def test_a_finite_wait_counts_down_in_the_row_and_the_details_then_times_out(make_app, fake_openai, notes):
    fake_openai.responder = call_tool_when("note", NOTE)
    app = make_app(extra_files={"gates.toml": "[wait]\napi = 8\n"})

    def left(text: str, pattern: str) -> int | None:
        found = re.search(pattern, text)
        return int(found.group(1)) if found else None

    async def counts_down(read: Callable[[], int | None], what: str) -> None:
        # Whatever is shown first, a smaller value follows: no race with the second it shows.
        await wait_for(pilot, lambda: read() is not None, what)
        first = read()
        assert first is not None and 0 < first <= 8
        await wait_for(pilot, lambda: (now := read()) is not None and now < first, f"{what} counting down")

    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        turn = await app.adapter.engine.submit("api-1", "note from api", kind="api")
        await wait_for(pilot, lambda: app.inbox.gates, "the gate")
        await counts_down(lambda: left(region_text(app, "#side"), r"\b0:(0\d)\b"), "the row's time left")
        assert "∞" not in region_text(app, "#side")
        app.inbox.focus()
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, GateDetailsScreen), "the details")
        await counts_down(lambda: left(screen_text(app), r"time left: 0:(0\d)"), "the details' time left")
        # Nobody answers: the gate times out, the details close and the inbox empties at once.
        await turn.wait(10)
        await wait_for(pilot, lambda: not isinstance(app.screen, GateDetailsScreen), "the details to close")
        await wait_for(pilot, lambda: not app.inbox.gates, "the inbox to empty")
        assert "No gate is waiting." in region_text(app, "#side") and notes.notes == []
        history = await app.adapter.engine.history("api-1")
        assert [m.meta.get("decision") for m in history if m.role == "gate"] == ["timeout"]


async def test_a_db_gate_shows_its_tables_and_highlighted_sql_in_the_row(make_app, fake_openai):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        fake_openai.responder = call_tool_when("clean up", ("run_sql", {"sql": "DELETE FROM users WHERE id = 3"}))
        await send(pilot, "clean up user 3")
        await wait_for(pilot, lambda: app.inbox.gates, "the gate")
        side = region_text(app, "#side")
        assert "run_sql write ∞" in side and "tables users" in side and "DELETE FROM users WHERE id = 3" in side
        # Highlighted: the keyword is drawn in another colour than the table name.
        assert color_of(app, "DELETE", "#side") != color_of(app, "users WHERE", "#side")


async def test_a_prompt_edit_gate_says_in_the_row_what_it_does_and_where(make_app, fake_openai):
    """An overwrite and a create of the system prompt are both `update_system_prompt write`: the
    row says which (and which section) before the text, so `a` is not pressed blind."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        fake_openai.responder = call_tool_when("be terse", ("update_system_prompt", {
            "section": "1", "operation": "overwrite", "content": "Answer in one line."}))
        await send(pilot, "please be terse from now on")
        await wait_for(pilot, lambda: app.inbox.gates, "the gate")
        side = region_text(app, "#side")
        assert "overwrite section '1': Answer in" in side, side  # (the pane cuts the rest of the text)


async def test_a_gate_resolved_through_the_engine_leaves_the_inbox_and_returns_the_focus(make_app, fake_openai):
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        gate = await _ask(pilot, app, fake_openai)
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: isinstance(app.focused, GatesInbox), "the inbox")
        # Answered through the API while the operator looks at it (the broker is what the API calls).
        app.adapter.engine.gatekeeper.broker.resolve(gate.id, "deny", by="api:ops")
        await wait_for(pilot, lambda: not app.inbox.gates, "the inbox to empty")
        await wait_for(pilot, lambda: isinstance(app.focused, ChatInput), "the input")
        await wait_chat(pilot, "denied by api:ops")


async def test_a_rebound_jump_key_is_the_one_the_console_names(make_app, fake_openai):
    app = make_app(extra_files={"aiops.toml": '[console.keymap]\n"app.jump_gate" = "ctrl+o"\n'})
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await ready(pilot)
        await _ask(pilot, app, fake_openai)
        toast = next(n for n in app._notifications if "approval needed" in (n.title or ""))
        assert "ctrl+o" in toast.title and "ctrl+g" not in toast.title + toast.message
        footer = screen_text(app).splitlines()[-1]
        assert "^o Gate" in footer and "^g" not in footer
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: isinstance(app.focused, GatesInbox), "the inbox")
        assert "^o Gate" in screen_text(app).splitlines()[-1]
        await pilot.press("f1")
        await wait_text(pilot, "Help · Gates inbox")
        text = " ".join(app.screen.query_one(Markdown).source.split())
        assert "**ctrl+o** jumps here" in text and "ctrl+g" not in text


@pytest.mark.mariadb
async def test_a_real_db_query_gate_shows_tables_and_sql_and_runs_when_approved(
        tmp_path, fake_openai, mariadb, mysql_table):
    t = await mysql_table("id INT PRIMARY KEY, name VARCHAR(20)", [(1, "a"), (2, "b")])
    settings = mariadb.model_dump() | {"enabled": True}
    plugins = "[mysql]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items() if v is not None)
    cfg = console_config(tmp_path, fake_openai, extra_files={"plugins.toml": plugins})
    env = {**os.environ, PASSWORD_ENV: os.environ.get(PASSWORD_ENV, "")}
    engine = Engine(cfg, env=env, plugins=[MySQLPlugin()], discover_plugins=False)
    sql = f"DELETE FROM {t} WHERE id = 2"
    fake_openai.responder = call_tool_when("clean up", ("db_query", {"sql": sql}))
    app = AiopsApp(cfg, engine=engine, server=False)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert engine.tools.get("db_query") is not None, engine.plugin_status
        await send(pilot, "clean up row 2")
        await wait_for(pilot, lambda: app.inbox.gates, "the gate")
        # The row: the operation, the table (qualified with the database) and the SQL, cut to the pane.
        side = region_text(app, "#side")
        assert "db_query write ∞" in side and f"tables {mariadb.database}.t_" in side and "DELETE FROM t_" in side
        await pilot.press("ctrl+g", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, GateDetailsScreen), "the details")
        text = screen_text(app)
        assert f"tables: {mariadb.database}.{t}" in text and sql in text
        assert color_of(app, "DELETE", "#gate-sql") != color_of(app, t, "#gate-sql")
        # What `s` would let through, word for word (issue 20, item 7).
        assert " ".join(region_text(app, "#gate-session-grant").split()) == (
            f"s (for session): later db_query calls of this session that run only DELETE on exactly "
            f"{mariadb.database}.{t} pass without asking (until restart)")
        assert "s → only DELETE on exactly test.t" in " ".join(side.split())
        await pilot.press("a")
        await wait_chat(pilot, "1 row affected")
        assert isinstance(app.focused, ChatInput)
    assert await mysql_table.query(f"SELECT id FROM {t}") == [(1,)]


async def test_a_gate_answered_before_its_toast_is_drawn_leaves_no_toast_and_no_count(make_app, fake_openai):
    # The row is drawn first and the toast and count a frame later: a gate another operator answers
    # in between must not leave an "approval needed" toast or a count for nothing behind.
    app = make_app(extra_files={"aiops.toml": "[console]\nbell = false\n"})
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        app.main.query_one("#side", TabbedContent).active = "tab-log"  # the inbox out of sight: a toast is due
        engine = app.adapter.engine
        answered: list[str] = []

        def answer_at_once(event: ev.Event) -> None:
            if isinstance(event, ev.GateOpened):
                answered.append(event.gate.id)
                gate_id = event.gate.id
                asyncio.get_running_loop().call_soon(
                    lambda: engine.gatekeeper.broker.resolve(gate_id, "approve", by="api:ops"))

        engine.bus.add_listener(answer_at_once)
        fake_openai.responder = call_tool_when("note this", NOTE)
        await send(pilot, "please note this")
        await wait_chat(pilot, "approved by api:ops")
        await wait_for(pilot, lambda: not app.inbox.gates, "the inbox to empty")
        await pilot.pause(0.2)  # a frame or two: a toast scheduled for the row would be up by now
        assert answered
        assert not any("approval needed" in (n.title or "") for n in app._notifications)
        assert "Gates (0)" in region_text(app, "#side") and "⚑ 1 gate" not in screen_text(app)


async def test_a_gate_whose_row_is_out_of_sight_is_announced_by_a_toast_naming_its_key(make_app, fake_openai):
    """The toast says a gate waits and which key jumps to it, where the inbox does not show its
    row: another side tab active, or the side pane hidden."""
    app = make_app(extra_files={"aiops.toml": "[console]\nbell = false\n"})
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        side = app.main.query_one("#side", TabbedContent)
        side.active = "tab-log"
        await pilot.pause()
        gate = await _ask(pilot, app, fake_openai)
        toast = await wait_for(pilot, lambda: next(
            (n for n in app._notifications if "approval needed" in (n.title or "")), None), "the toast")
        assert "ctrl+g" in toast.title and toast.message == f"console {app.sessions_list.short_id(app.selected)} · " \
            "write_note write"  # short: the badge and the inbox carry the rest
        app.adapter.engine.gatekeeper.broker.resolve(gate.id, "approve", by="api:ops")
        await wait_for(pilot, lambda: not app.inbox.gates, "the inbox to empty")
        app.clear_notifications()
        await pilot.press("f3")  # the side pane hidden, the Gates tab active again behind it
        side.active = "tab-gates"
        await pilot.pause()
        await _ask(pilot, app, fake_openai, "note that")
        await wait_for(pilot, lambda: any("approval needed" in (n.title or "") for n in app._notifications),
                       "the toast, the side pane hidden")



async def test_a_gate_row_under_other_toasts_still_up_gets_a_toast_of_its_own(make_app, fake_openai):
    app = make_app(extra_files={"aiops.toml": "[console]\nbell = false\n"})
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        for n in range(10):  # stacked at the bottom right, up over the whole side pane
            app.notify("\n".join(f"something else {n}.{k}" for k in range(4)), timeout=30)
        await pilot.pause()
        await _ask(pilot, app, fake_openai)
        inbox = app.inbox.scrollable_content_region
        assert any(t.region.overlaps(inbox) for t in app.screen.query("Toast")), [
            t.region for t in app.screen.query("Toast")]  # the row is drawn, under the toasts
        await wait_for(pilot, lambda: any("approval needed" in (n.title or "") for n in app._notifications),
                       "the gate's own toast")


async def test_an_mcp_gate_names_its_server_and_tool_as_gates_toml_does(tmp_path, fake_openai, notes):
    """The model calls the time server's tool `time__get_current_time`; the operator answering its
    gate reads `mcp:time:get_current_time`, the name a rule in gates.toml gives it, in the row and
    in the details (which also say what the model calls it)."""
    import sys
    from pathlib import Path

    from aiops.integrations.mcp.host import McpPlugin

    server = json.dumps(str(Path(sys.executable).parent / "mcp-server-time"))
    cfg = console_config(tmp_path, fake_openai, extra_files={
        "plugins.toml": "[notes]\nenabled = true\n[mcp]\nenabled = true\n",
        "mcp.toml": f'[servers.time]\ncommand = {server}\nargs = ["--local-timezone", "UTC"]\n',
        "gates.toml": '[tools."mcp:time"]\nread = "ask"\n'})
    host = McpPlugin()
    app = AiopsApp(cfg, plugins=[notes, host], discover_plugins=False, server=False, port=0)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await host.ready()
        fake_openai.responder = call_tool_when("what time", ("time__get_current_time", {"timezone": "UTC"}))
        await send(pilot, "what time is it?")
        await wait_for(pilot, lambda: app.inbox.gates, "the gate")
        # The row: who and what kind of call, then the tool on a line of its own, then its arguments.
        side = region_text(app, "#side")
        assert ("⚑ console 101 · mcp read ∞ tool mcp:time:get_current_time {\"timezone\": \"UTC\"} "
                "s → mcp:time:get_current_time rea") in side, side
        assert "time__get_current_time" not in side
        await pilot.press("ctrl+g", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, GateDetailsScreen), "the details")
        text = screen_text(app)
        assert "· mcp:time:get_current_time read · mcp" in text
        assert "the model calls it time__get_current_time" in text
        await pilot.press("d")
        await wait_for(pilot, lambda: not app.inbox.gates, "the gate answered")


def test_a_gate_that_a_session_answer_cannot_cover_says_why_in_its_own_terms():
    # QA as a new user: "it is not described by its tables alone" for a system-prompt edit.
    from aiops.tui.widgets.gates import session_grant_text

    def gate(tool: str, tool_type: str) -> GateInfo:
        return GateInfo(id="g", session_id="s", client_id="s", client_kind="console", tool=tool,
                        tool_type=tool_type, args={}, operation="write", tables=(), summary="",
                        created_at=0.0, expires_at=None)

    prompt = session_grant_text(gate("update_system_prompt", "prompt"))
    assert prompt.startswith("approves this call only") and "depends on its arguments" in prompt
    assert "tables" not in prompt
    assert "not described by its tables alone" in session_grant_text(gate("db_query", "db"))


async def test_the_gate_details_keep_their_keys_on_an_80x24_terminal(make_app, fake_openai, notes):
    # QA as a new user: on 80x24 the arguments and the context pushed the row of keys (approve,
    # for session, deny, deny+stop) out of the dialog; the body scrolls instead.
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        long_note = "\n".join(f"line {i}: the disk on web-{i} is 91% full" for i in range(30))
        fake_openai.responder = call_tool_when("note all", ("write_note", {"text": long_note}))
        await send(pilot, "please note all of it")
        await wait_for(pilot, lambda: app.inbox.gates, "a gate in the inbox")
        await pilot.press("ctrl+g", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, GateDetailsScreen), "the details")
        await pilot.pause()
        text = screen_text(app)
        for label in ("Approve", "For session", "Deny", "Deny+stop"):
            assert label in text, text
        button = app.screen.query_one("#b-stop")
        assert button.region.height > 0 and button.region.bottom <= 24
