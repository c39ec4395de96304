"""A Slack thread's gate lands in the console's inbox; the operator's key answers it and the thread
says so (the real slack-sdk clients against the fake Slack, the console driven by Pilot)."""

from __future__ import annotations

from aiops.engine.engine import Engine
from aiops.integrations.slack.gate_blocks import APPROVE
from aiops.integrations.slack.plugin import SlackPlugin
from aiops.tui.app import AiopsApp
from tests.fakes.openai_server import call_tool_when
from tests.support.slack import SLACK_ENV, slack_table
from tests.tui.conftest import SIZE, console_config, ready, region_text, wait_for

NOTE = ("write_note", {"text": "disk at 91%"})


def slack_console(tmp_path, fake_openai, fake_slack, notes) -> tuple[Engine, AiopsApp]:
    cfg = console_config(tmp_path, fake_openai, extra_files={
        "plugins.toml": "[notes]\nenabled = true\n\n" + slack_table(fake_slack, approvers=["UBOSS"])})
    engine = Engine(cfg, plugins=[notes, SlackPlugin()], discover_plugins=False, env=SLACK_ENV)
    return engine, AiopsApp(cfg, engine=engine, server=False)


async def gate_in_thread(fake_slack, thread_ts: str):
    return await fake_slack.wait_for(
        lambda: next((m for m in fake_slack.thread("C1", thread_ts) if "approval:" in m.text), None),
        "the gate in the thread")


async def test_a_slack_gate_is_approved_in_the_console_and_the_thread_says_so(fake_slack, tmp_path,
                                                                              fake_openai, notes):
    engine, app = slack_console(tmp_path, fake_openai, fake_slack, notes)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await fake_slack.wait_connected()
        fake_openai.responder = call_tool_when("note this", NOTE)
        event = fake_slack.mention("U1", "please note this")
        await fake_slack.send_event(event)
        # In the inbox like any client's gate, named as a Slack session's.
        await wait_for(pilot, lambda: app.inbox.gates, "the Slack gate in the inbox")
        (gate,) = engine.pending_gates()
        assert list(app.inbox.gates) == [gate.id]
        assert gate.client_kind == "slack" and gate.session_id == f"slack-C1-{event['ts']}"
        assert "write_note write" in region_text(app, "#side")
        gate_msg = await gate_in_thread(fake_slack, event["ts"])
        assert gate_msg.text.startswith(":hourglass_flowing_sand: waiting for operator approval: `write_note write")
        await pilot.press("ctrl+g", "a")
        await fake_slack.wait_for(lambda: gate_msg.text.startswith(":white_check_mark:"), "the outcome in the thread")
        assert gate_msg.text.startswith(":white_check_mark: approved by console: `write_note write")
        assert not any(b["type"] == "actions" for b in gate_msg.blocks)  # the buttons are gone
        placeholder = fake_slack.thread("C1", event["ts"])[0]
        await fake_slack.wait_for(lambda: placeholder.text == "tool said: noted: disk at 91%", "the answer")
        assert notes.notes == ["disk at 91%"] and not app.inbox.gates
        # A Slack approver pressing the button as the update reaches them: told who answered first.
        await fake_slack.press("UBOSS", gate_msg, APPROVE)
        await fake_slack.wait_for(lambda: fake_slack.ephemerals("UBOSS"), "the late answer's reply")
        assert fake_slack.ephemerals("UBOSS") == ["Already answered: approved by console."]


async def test_a_button_approval_in_slack_clears_the_console_inbox(fake_slack, tmp_path, fake_openai, notes):
    engine, app = slack_console(tmp_path, fake_openai, fake_slack, notes)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await fake_slack.wait_connected()
        fake_openai.responder = call_tool_when("note this", NOTE)
        event = fake_slack.mention("U1", "please note this")
        await fake_slack.send_event(event)
        await wait_for(pilot, lambda: app.inbox.gates, "the Slack gate in the inbox")
        gate_msg = await gate_in_thread(fake_slack, event["ts"])
        await fake_slack.press("UBOSS", gate_msg, APPROVE)
        # Answered in Slack: the console's inbox lets it go, and the thread names the approver.
        await wait_for(pilot, lambda: not app.inbox.gates, "the inbox to let the gate go")
        assert "write_note write" not in region_text(app, "#side")
        await fake_slack.wait_for(lambda: gate_msg.text.startswith(":white_check_mark: approved by <@UBOSS>"),
                                  "the outcome in the thread")
        await fake_slack.wait_for(lambda: notes.notes == ["disk at 91%"], "the approved call to run")
