"""SVG snapshots of the main screen, wide and narrow. Update with `pytest --snapshot-update`.

Deterministic by construction: no server (no port in the header), the console gate waits without a
deadline (∞, no countdown), ages under a minute read "now", and the cursor blink is frozen.
"""

from __future__ import annotations

from typing import Any

from tests.fakes.openai_server import Reply, call_tool_when
from tests.tui.conftest import ready, send, wait_chat, wait_for


async def _frozen(pilot: Any) -> Any:
    app = await ready(pilot)
    app.chat_input.cursor_blink = False
    return app


def test_main_screen_with_a_pending_gate_120x40(make_app, fake_openai, snap_compare):
    fake_openai.script(Reply.text("Checking the **disk** usage first, then I'll note it.", chunks=2))
    fake_openai.responder = call_tool_when("note", ("write_note", {"text": "db-2 disk at 91%"}))

    async def run_before(pilot: Any) -> None:
        app = await _frozen(pilot)
        await send(pilot, "how full is db-2?")
        await wait_chat(pilot, "then I'll note it.")
        await send(pilot, "note it for the on-call")
        await wait_for(pilot, lambda: app.inbox.gates, "the gate")
        await wait_chat(pilot, "waiting for operator approval (gates inbox)")

    assert snap_compare(make_app(), terminal_size=(120, 40), run_before=run_before)


def test_narrow_chat_80x24(make_app, fake_openai, snap_compare):
    fake_openai.script(Reply.text("All **three** replicas are in sync; lag is under 1 s.", chunks=2))

    async def run_before(pilot: Any) -> None:
        await _frozen(pilot)
        await send(pilot, "replication status?")
        await wait_chat(pilot, "lag is under 1 s.")

    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=run_before)


def test_narrow_gates_inbox_80x24(make_app, fake_openai, snap_compare):
    fake_openai.responder = call_tool_when("note", ("write_note", {"text": "rotate the backup keys"}))

    async def run_before(pilot: Any) -> None:
        app = await _frozen(pilot)
        await send(pilot, "note that we must rotate keys")
        await wait_for(pilot, lambda: app.inbox.gates, "the gate")
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: app.main.view == "gates", "the gates view")

    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=run_before)
