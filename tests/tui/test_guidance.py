"""The model guidance: the header's warning and the banner above the chat say what the turn's own
model and failure were, advise after the failure's cause, and stay small on a small terminal."""

from __future__ import annotations

import socket

from aiops.tui.screens.modals import HelpScreen
from tests.fakes.fixtures import openai_model_entry
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.tui.conftest import (
    chat_text,
    prompt_copy,
    ready,
    region_lines,
    region_text,
    screen_text,
    send,
    wait_chat,
    wait_for,
)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _shown(app) -> bool:
    return app.main.query_one("#guidance").has_class("-shown") and app.main.query_one("#guidance").display


async def test_a_failed_one_turn_model_is_the_one_marked_not_the_sessions(make_app, fake_openai, tmp_path):
    """`@down hi` on a session of a working model: `down` failed, the session's model did not."""
    port = _closed_port()
    models = {"local": openai_model_entry(fake_openai, system_prompt_folder=str(prompt_copy(tmp_path))),
              "down": {"type": "openai", "model_id": "m", "base_url": f"http://127.0.0.1:{port}/v1"}}
    app = make_app(models=models, default="local")
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await wait_for(pilot, lambda: set(app.guidance.probes) == {"local", "down"}, "the start-up probe")
        await send(pilot, "@down hi there")
        await wait_for(pilot, lambda: "error (model_error)" in chat_text(app), "the model error")
        assert "model 'down'" in chat_text(app)
        # The turn's own failure (the probe said "cannot connect"), on the model it ran on.
        await wait_for(pilot, lambda: "connection refused" in app.guidance.probes["down"].reason, "down marked")
        assert not app.guidance.probes["down"].ok
        assert app.guidance.probes["local"].ok
        status = region_text(app, "StatusBar")
        assert "#101 local" in status and "unreachable" not in status
        assert not _shown(app)


async def test_a_server_error_is_not_called_unreachable_nor_advised_a_key(make_app, fake_openai):
    """An HTTP 500: the server answered. The chat says the error; no banner, no warning, no key advice."""
    fake_openai.script(Reply.error(500, "internal upstream failure xyz"))
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await wait_for(pilot, lambda: "local" in app.guidance.probes, "the start-up probe")
        await send(pilot, "hello")
        await wait_chat(pilot, "internal upstream failure xyz")
        await wait_for(pilot, lambda: app.sessions_list.sessions[app.chat.session_id].get("state") == "idle",
                       "the turn's end")
        await pilot.pause()
        assert app.guidance.probes["local"].ok
        screen = screen_text(app)
        assert "unreachable" not in screen and "not reachable" not in screen
        assert ".env" not in screen and "key" not in region_text(app, "StatusBar")
        assert not _shown(app)


async def test_a_keyless_local_model_refused_is_given_server_advice_not_key_advice(make_app):
    """No api_key_env and nothing listening: check the server and base_url; no key to set."""
    port = _closed_port()
    models = {"lan": {"type": "openai", "model_id": "m", "base_url": f"http://127.0.0.1:{port}/v1"}}
    app = make_app(models=models, default="lan")
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await wait_for(pilot, lambda: "not reachable" in region_text(app, "#guidance"), "the probe's guidance")
        await send(pilot, "hello?")
        await wait_for(pilot, lambda: "connection refused" in region_text(app, "#guidance"), "the turn's guidance")
        guidance = region_text(app, "#guidance")
        assert "key in the environment" not in guidance and ".env" not in guidance and "API key" not in guidance
        assert "base_url" in guidance and "server runs" in guidance
        assert f"Model lan is not reachable: connection refused (openai m at http://127.0.0.1:{port}/v1)." in guidance
        assert "no model reachable" in region_text(app, "StatusBar")


async def test_on_80x24_the_banner_keeps_to_three_lines_and_f4_hides_it(make_app, fake_openai, monkeypatch):
    monkeypatch.delenv("AIOPS_TEST_UNSET_KEY", raising=False)
    models = {"gpt": {"type": "openai", "model_id": "gpt-x", "api_key_env": "AIOPS_TEST_UNSET_KEY"},
              "local": openai_model_entry(fake_openai)}
    app = make_app(models=models, default="gpt")
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        banner = app.main.query_one("#guidance")
        await wait_for(pilot, lambda: _shown(app) and banner.region.height > 0, "the banner")
        lines = region_lines(app, "#guidance")
        assert len(lines) <= 3, lines
        assert "AIOPS_TEST_UNSET_KEY" in lines[0] and "f4 hides this" in lines[2]
        # The header keeps the warning whole: our address gives way.
        assert "⚠ model gpt needs a key" in region_text(app, "StatusBar")
        chat_height = app.chat.region.height
        await pilot.press("f4")
        await wait_for(pilot, lambda: banner.region.height == 0, "the banner hidden")
        assert app.chat.region.height == chat_height + len(lines)
        assert "⚠ model gpt needs a key" in region_text(app, "StatusBar")  # the warning stays
        await pilot.press("f1")  # the whole text, whatever the banner cut
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "the help")
        assert "Set AIOPS_TEST_UNSET_KEY in the environment" in app.screen.help_markdown
        await pilot.press("escape")
        await pilot.press("f4")
        await wait_for(pilot, lambda: banner.region.height == len(lines), "the banner back")


async def test_the_hide_key_follows_the_keymap(make_app, fake_openai: FakeOpenAI):
    port = _closed_port()
    models = {"lan": {"type": "openai", "model_id": "m", "base_url": f"http://127.0.0.1:{port}/v1"}}
    app = make_app(models=models, default="lan",
                   extra_files={"aiops.toml": '[console.keymap]\n"app.hide_guidance" = "ctrl+b"\n'})
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        banner = app.main.query_one("#guidance")
        await wait_for(pilot, lambda: "ctrl+b hides this" in region_text(app, "#guidance"), "the banner")
        await pilot.press("ctrl+b")
        await wait_for(pilot, lambda: banner.region.height == 0, "the banner hidden")
