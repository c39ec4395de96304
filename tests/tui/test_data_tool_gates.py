"""Data tools under the shipped gate policy, in the console: a web search runs without asking; a
Drive delete waits in the inbox until the operator approves it, and then moves the file to trash."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from aiops.engine.engine import Engine
from aiops.integrations.drive import GoogleDrivePlugin
from aiops.integrations.search import TavilySearchPlugin
from aiops.tui.app import AiopsApp
from tests.fakes.drive_server import FakeDrive
from tests.fakes.openai_server import call_tool_when
from tests.fakes.search_servers import FakeTavily
from tests.support.data_tools import plugins_toml, service_account_file
from tests.tui.conftest import SIZE, chat_text, console_config, ready, region_text, send, wait_chat, wait_for

FOLDER = "folderAAA111"


@pytest.fixture
def services(tmp_path: Path) -> Iterator[tuple[FakeTavily, FakeDrive, Path]]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    with FakeTavily() as tavily, FakeDrive(public_key=key.public_key()) as drive:
        yield tavily, drive, service_account_file(tmp_path / "sa.json", key, drive.token_uri)


def make_console(tmp_path, fake_openai, notes, services, max_result_chars: int = 8000) -> AiopsApp:
    tavily, drive, sa = services
    # Only the plugins' tables: the gates are the shipped ones (reads allowed, writes ask).
    plugins = "[notes]\nenabled = true\n" + plugins_toml({
        "tavily_search": {"base_url": tavily.base_url, "max_result_chars": max_result_chars},
        "google_drive": {"base_url": drive.base_url, "folder_id": FOLDER}})
    cfg = console_config(tmp_path, fake_openai, extra_files={"plugins.toml": plugins})
    engine = Engine(cfg, plugins=[notes, TavilySearchPlugin(), GoogleDrivePlugin()], discover_plugins=False,
                    env={"TAVILY_API_KEY": tavily.api_key, "GOOGLE_APPLICATION_CREDENTIALS": str(sa)})
    return AiopsApp(cfg, engine=engine, server=False)


async def test_a_web_search_is_allowed_without_asking(tmp_path, fake_openai, notes, services):
    tavily, _, _ = services
    tavily.results = [{"title": "Nginx 502 guide", "url": "https://docs.example/502", "content": "check upstream"}]
    tavily.results += [{"title": f"Page {i}", "url": f"https://docs.example/{i}", "content": "filler " * 40}
                       for i in range(2, 6)]
    app = make_console(tmp_path, fake_openai, notes, services, max_result_chars=600)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        fake_openai.responder = call_tool_when("look it up", ("tavily_search", {"query": "nginx 502"}))
        await send(pilot, "please look it up")
        await wait_chat(pilot, "tool said: tavily_search results for 'nginx 502'")
        assert not app.inbox.gates and app.bells == 0
        assert "waiting for operator approval" not in chat_text(app)
        tool = next(m for m in await app.adapter.engine.history(app.selected) if m.role == "tool")
        assert tool.meta["gate"] == "allow" and "https://docs.example/502" in tool.content
        # The model got a cut copy; the operator reads the whole result in the console.
        assert "characters cut here" in tool.content and "https://docs.example/3" not in tool.content
        await send(pilot, "!fulltext")
        await wait_chat(pilot, "https://docs.example/3")


async def test_a_drive_delete_asks_and_runs_once_approved_in_the_console(tmp_path, fake_openai, notes, services):
    _, drive, _ = services
    doomed = drive.add_file("old-report.txt", "stale", parents=[FOLDER], file_id="oldReport1")
    app = make_console(tmp_path, fake_openai, notes, services)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        fake_openai.responder = call_tool_when(
            "clean up", ("google_drive", {"operation": "delete", "file_id": "oldReport1"}))
        await send(pilot, "please clean up")
        await wait_for(pilot, lambda: app.inbox.gates, "a gate in the inbox")
        gate = next(iter(app.inbox.gates.values()))
        assert (gate.tool, gate.tool_type, gate.operation) == ("google_drive", "drive", "write")
        assert gate.summary == "google_drive delete file oldReport1 (moved to the Drive trash)"
        assert "google_drive write" in region_text(app, "#side") and "delete file oldReport1" in region_text(app, "#side")
        assert not doomed.trashed  # nothing happens before the operator answers
        await pilot.press("ctrl+g", "a")
        await wait_chat(pilot, "tool said: moved 'old-report.txt' (id oldReport1) to the Drive trash")
        assert doomed.trashed and "oldReport1" in drive.files
        assert "approved by console" in chat_text(app)
        # A delete is never covered by a session approval: no grant was made.
        assert app.adapter.engine.gatekeeper.broker.grants(app.selected) == []
