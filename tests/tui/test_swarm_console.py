"""A call from another aiops (`agent_call`) as the called instance's console shows it: a session of
kind `swarm`, its gate in the inbox, answered there."""

from __future__ import annotations

import asyncio
import uuid

from aiops.client import AgentClient
from aiops.integrations.swarm.hops import HOPS_HEADER
from aiops.tui.widgets.gates import GatesInbox
from tests.fakes.openai_server import call_tool_when
from tests.tui.conftest import SIZE, ready, region_text, screen_text, wait_for


async def test_a_swarm_call_is_a_swarm_session_whose_gate_is_approved_in_the_console(
        make_app, fake_openai, notes, monkeypatch):
    monkeypatch.delenv("AIOPS_OPERATOR_TOKEN", raising=False)  # loopback, no tokens: no auth needed
    fake_openai.responder = call_tool_when("note this", ("write_note", {"text": "from a peer"}))
    app = make_app(server=True)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        caller = AgentClient(app.server_urls[0], token="", headers={HOPS_HEADER: f"depth=1; via={uuid.uuid4().hex}"})
        async with caller:
            reply = asyncio.ensure_future(caller.send("please note this", client_id="swarm-peer-1", timeout=30))
            await wait_for(pilot, lambda: app.inbox.gates or reply.done(), "the swarm call's gate")
            assert not reply.done(), reply.result() if reply.done() else None
            gate = next(iter(app.inbox.gates.values()))
            assert (gate.client_kind, gate.tool) == ("swarm", "write_note")
            assert "swarm" in region_text(app, "#side")
            await wait_for(pilot, lambda: "swarm (1)" in screen_text(app), "the swarm session listed under its kind")
            await pilot.press("ctrl+g")
            assert isinstance(app.focused, GatesInbox)
            await pilot.press("a")
            result = await asyncio.wait_for(reply, 30)
        assert result["status"] == "complete"
        assert notes.notes == ["from a peer"]
