"""The cross-client flow: a chat UI asks through the console's own server, the operator answers in
the console, and the chat UI's HTTP response completes with the tool's result."""

from __future__ import annotations

import asyncio
import logging
import socket

import openai

from aiops.tui.widgets.gates import GatesInbox
from tests.fakes.openai_server import call_tool_when
from tests.tui.conftest import SIZE, ready, region_text, screen_text, wait_for, wait_text


async def test_a_gate_from_the_openai_proxy_is_approved_in_the_console(make_app, fake_openai, notes,
                                                                        monkeypatch):
    monkeypatch.delenv("AIOPS_OPERATOR_TOKEN", raising=False)  # loopback, no tokens: no auth needed
    fake_openai.responder = call_tool_when("note this", ("write_note", {"text": "from the chat UI"}))
    app = make_app(server=True)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app.server_urls and app.server_urls[0].startswith("http://127.0.0.1:")
        await wait_text(pilot, app.server_urls[0])  # the header shows where the server listens
        client = openai.AsyncOpenAI(base_url=app.server_urls[0] + "/v1", api_key="unused", max_retries=0)
        try:
            names = [m.id async for m in client.models.list()]
            assert "aiops" in names
            request = asyncio.ensure_future(client.chat.completions.create(
                model="aiops", messages=[{"role": "user", "content": "please note this for me"}], timeout=30))
            await wait_for(pilot, lambda: app.inbox.gates or request.done(), "the proxy's gate")
            assert not request.done(), request.result() if request.done() else None
            gate = next(iter(app.inbox.gates.values()))
            assert gate.client_kind == "proxy" and gate.tool == "write_note"
            side = region_text(app, "#side")
            assert "proxy" in side and "write_note write" in side and "from the chat UI" in side
            await wait_text(pilot, "proxy (1)")  # the chat UI's session is listed with its kind (redraws come at 10 Hz)
            await pilot.press("ctrl+g")
            assert isinstance(app.focused, GatesInbox)
            await pilot.press("a")
            response = await asyncio.wait_for(request, 30)
        finally:
            await client.close()
        assert response.choices[0].message.content == "tool said: noted: from the chat UI"
        assert response.choices[0].finish_reason == "stop"
        assert notes.notes == ["from the chat UI"]
        await wait_for(pilot, lambda: not app.inbox.gates, "the inbox to empty")


async def test_a_port_in_use_is_said_in_one_line_and_the_console_runs_without_a_server(
        make_app, monkeypatch, caplog):
    monkeypatch.delenv("AIOPS_OPERATOR_TOKEN", raising=False)
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    try:
        app = make_app(server=True)
        app.port = port
        with caplog.at_level(logging.ERROR, logger="aiops"):
            async with app.run_test(size=SIZE, notifications=True) as pilot:
                await ready(pilot)
                await wait_for(pilot, lambda: any("in use" in n.message for n in app._notifications),
                               "the notice")
                (note,) = [n.message for n in app._notifications if "in use" in n.message]
                assert f"port {port} is in use by another program" in note and "Error" not in note
                assert "server failed" in screen_text(app)
    finally:
        held.close()
    records = [r for r in caplog.records if "did not start" in r.getMessage()]
    assert len(records) == 1 and records[0].exc_info is None  # said, not a traceback


async def test_the_shown_session_deleted_by_another_client_is_said(make_app):
    app = make_app()
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await app.adapter.engine.run("api-doomed", "hello", kind="api", timeout=10)
        await wait_for(pilot, lambda: "api-doomed" in app.sessions_list.sessions, "the api session")
        await app.select_session("api-doomed")
        await app.adapter.engine.delete_session("api-doomed")  # a script's DELETE
        await wait_for(pilot, lambda: app.selected != "api-doomed", "another session shown")
        assert any("(api-doomed) was deleted" in n.message for n in app._notifications)


async def test_the_console_opens_on_its_own_last_session_not_on_the_last_aiops_chat(make_app, fake_openai,
                                                                                   capsys):
    """Issue 21: `aiops chat` turns were stored as console sessions, so the console opened on the
    last one a script ran. They are kind `cli` now: listed apart, never opened at start."""
    import argparse

    from aiops.cli.chat import _chat

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press(*"typed in the console", "enter")
        await wait_text(pilot, "echo: typed in the console")
    cfg = app.cfg
    args = argparse.Namespace(text="sent from a script", session=None, model=None, json=False)
    assert await _chat(cfg, args) == 0
    assert "echo: sent from a script" in capsys.readouterr().out
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await wait_text(pilot, "echo: typed in the console")
        assert "sent from a script" not in region_text(app, "#chat")
        await wait_text(pilot, "cli (1)")
        assert "console (1)" in screen_text(app)
        assert {s["kind"] for s in app.sessions_list.sessions.values()} == {"console", "cli"}
