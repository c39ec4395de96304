"""Start-up (issue 27): the console draws and takes keys before its engine has started; what is
sent meanwhile waits, said under the input, and goes out in order once the engine is up, or comes
back to the input when it cannot start. The header says "starting…" until then."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiops.config import load_config, resolve_paths
from aiops.engine.plugins import Plugin
from aiops.integrations.remote import RemoteEngine
from aiops.tui.adapter import SESSIONS_PAGE
from aiops.tui.app import AiopsApp
from tests.fakes.openai_server import FakeOpenAI
from tests.tui.conftest import (
    SIZE,
    NotesPlugin,
    console_config,
    region_text,
    screen_text,
    send,
    wait_for,
    wait_text,
)


class HeldStart(Plugin):
    """A plugin whose start waits until the test lets it go: the engine's start waits with it
    (the plugins start before the engine reports itself started)."""

    name = "heldstart"

    def __init__(self) -> None:
        super().__init__()
        self.reached = asyncio.Event()
        self.release = asyncio.Event()

    async def start(self) -> None:
        self.reached.set()
        await self.release.wait()


async def test_messages_sent_while_the_engine_starts_go_out_in_order_once_it_has(
        tmp_path: Path, fake_openai: FakeOpenAI, notes: NotesPlugin) -> None:
    cfg = console_config(tmp_path, fake_openai, extra_files={
        "plugins.toml": "[notes]\nenabled = true\n\n[heldstart]\nenabled = true\n"})
    held = HeldStart()
    app = AiopsApp(cfg, plugins=[notes, held], discover_plugins=False, server=False)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, held.reached.is_set, "the engine's start to reach the plugins")
        # Drawn and taking keys, the engine not started: the header says so.
        assert "starting…" in region_text(app, "#status")
        assert app.focused is app.chat_input
        await send(pilot, "typed at once")
        await send(pilot, "and another")
        await wait_text(pilot, "2 messages waiting for the engine to start")
        assert app.chat_input.text == ""
        assert fake_openai.requests == []

        held.release.set()
        await wait_text(pilot, "echo: and another")
        await wait_text(pilot, "echo: typed at once")
        sent = [r.json["messages"][-1]["content"] for r in fake_openai.requests]
        assert sent == ["typed at once", "and another"]
        assert "waiting for the engine" not in screen_text(app)
        # Drawn once each in the chat (sent before the history page was shown, the first was drawn
        # twice now and then: from the page and from its live events).
        shown = screen_text(app)
        assert shown.count("▌ typed at once") == 1 and shown.count("▌ and another") == 1, shown
        assert "starting…" not in region_text(app, "#status")
        # Sent once each, into the console session the start selected.
        history = [m.content for m in await app.adapter.engine.history(app.selected) if m.role == "user"]
        assert history == ["typed at once", "and another"]


class HangingServer:
    """An endpoint that accepts connections and answers nothing until `drop` closes them: an
    aiops hung at start-up, then gone."""

    def __init__(self) -> None:
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []
        self.connected = asyncio.Event()

    async def start(self) -> str:
        async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.writers.append(writer)
            self.connected.set()

        self.server = await asyncio.start_server(hold, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def drop(self) -> None:
        assert self.server is not None
        self.server.close()
        for w in self.writers:
            w.transport.abort()
        await self.server.wait_closed()


async def test_what_was_sent_comes_back_to_the_input_when_the_engine_cannot_start(
        tmp_path: Path, fake_openai: FakeOpenAI) -> None:
    hanging = HangingServer()
    url = await hanging.start()
    cfg = load_config(resolve_paths(console_config(tmp_path, fake_openai).paths.config_dir, tmp_path / "attached"),
                      load_dotenv=False)
    app = AiopsApp(cfg, remote=RemoteEngine(url), server=False)
    try:
        async with app.run_test(size=SIZE, notifications=True) as pilot:
            await wait_for(pilot, hanging.connected.is_set, "the console to reach the server")
            assert "starting…" in region_text(app, "#status")
            await send(pilot, "first line")
            await send(pilot, "second line")
            await wait_text(pilot, "2 messages waiting for the engine to start")

            await hanging.drop()
            await wait_for(pilot, lambda: "engine failed" in region_text(app, "#status"), "the failure shown")
            # Nothing was sent; both are back in the input, in order, ready to send again.
            assert app.chat_input.text == "first line\nsecond line"
            assert "waiting for the engine" not in screen_text(app)
            # A later Enter says why instead of queueing it for an engine that will not come.
            await pilot.press("enter")
            await wait_text(pilot, "not sent:")
            assert app.chat_input.text == "first line\nsecond line"
    finally:
        if hanging.server is not None and hanging.server.is_serving():
            await hanging.drop()


async def test_every_stored_session_is_listed_the_first_page_at_start_the_rest_once_it_is_up(
        tmp_path: Path, fake_openai: FakeOpenAI, notes: NotesPlugin) -> None:
    """A year of history is more than the first page (`SESSIONS_PAGE`, shown at start): the older
    sessions follow in pages once the console is up, each at the bottom of its kind, and the
    operator can reach the oldest one."""
    from benchmarks import history

    cfg = console_config(tmp_path, fake_openai)
    stored = 2 * SESSIONS_PAGE + 300
    history.build(cfg.paths.db_path, stored, 2)
    app = AiopsApp(cfg, plugins=[notes], discover_plugins=False, server=False)
    async with app.run_test(size=SIZE) as pilot:
        sessions = app.sessions_list
        await wait_for(pilot, lambda: len(sessions.sessions) >= stored, "every stored session listed", timeout=30)
        await pilot.pause(0.2)  # (the list redraws at most ten times a second)
        listing = sessions.listing()
        headings = [line for line in listing if " (" in line]
        counts = {h.split(" (")[0]: int(h.rsplit("(", 1)[1].rstrip(")")) for h in headings}
        assert sum(counts.values()) == len(sessions.sessions) == len(listing) - len(headings)
        # Each kind newest first: the oldest stored session (built first, a console one) is the last
        # row of the console kind, which comes first.
        assert listing[0] == f"console ({counts['console']})"
        assert listing[counts["console"]] == f"console-{0:08x}"
        sessions.focus()
        sessions.cursor = f"console-{0:08x}"
        await pilot.pause()
        assert " 101 · " in region_text(app, "#sessions")  # its row (shorthand id 101), in sight


async def test_sessions_deleted_while_the_older_ones_load_take_none_of_the_rest_with_them(
        tmp_path: Path, fake_openai: FakeOpenAI, notes: NotesPlugin) -> None:
    """Another client deletes sessions of the first page while the older ones are being read page
    by page, and a page fails to come once: every session that is still stored is listed all the
    same. Each page is read after the last session of the one before (a deletion moves none of the
    rest past it), the failed one again from the same session."""
    from benchmarks import history

    cfg = console_config(tmp_path, fake_openai)
    stored = 2 * SESSIONS_PAGE + 300
    history.build(cfg.paths.db_path, stored, 2)
    app = AiopsApp(cfg, plugins=[notes], discover_plugins=False, server=False)
    reads: list[dict[str, Any]] = []
    pages: list[list[dict[str, Any]]] = []
    read = app.adapter.sessions

    async def another_client_meanwhile(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        reads.append(kwargs)
        engine = app.adapter.engine
        if len(reads) == 2:  # the first older page: three sessions of the first page go first
            newest = await engine.list_sessions(limit=3)
            for s in newest:
                await engine.delete_session(s["client_id"])
            await wait_until(lambda: all(s["client_id"] not in app.sessions_list.sessions for s in newest))
        if len(reads) == 3:  # the next read does not come (the attached aiops away for a moment)
            raise ConnectionError("the aiops went away")
        pages.append(await read(*args, **kwargs))
        return pages[-1]

    app.adapter.sessions = another_client_meanwhile  # type: ignore[method-assign]
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(reads) >= 4 and not any(
            w.name == "older_sessions" and not w.is_finished for w in app.workers), "the older pages read", 30)
        await pilot.pause(0.2)
        kept = {s["client_id"] for s in await app.adapter.engine.list_sessions(limit=10 * stored)}
        assert len(kept) == stored - 3
        assert set(app.sessions_list.sessions) == kept
        # Each older page after the last session of the page before; the one that failed, again
        # from the same session; then no more.
        assert [len(p) for p in pages] == [SESSIONS_PAGE, SESSIONS_PAGE, 300]
        after = [(p[-1]["updated_at"], p[-1]["client_id"]) for p in pages[:2]]
        assert [r.get("before") for r in reads[1:]] == [after[0], after[1], after[1]], reads


async def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.01)


async def test_once_up_the_console_has_loaded_what_the_first_answers_code_would_load_on_its_loop(
        tmp_path: Path, fake_openai: FakeOpenAI, notes: NotesPlugin) -> None:
    """The first fence in each language loads its Pygments lexer and compiles its rules (2-70 ms on a
    2-core machine), in the middle of a streamed answer, where the operator's keys wait behind it.
    The console does it in a thread once it is up (aiops/tui/widgets/answer.py, WARM_LANGUAGES)."""
    from pygments.lexer import RegexLexer
    from pygments.lexers import get_lexer_by_name

    from aiops.tui.widgets.answer import WARM_LANGUAGES

    # (JSON's lexer is written by hand: its cost is its module's import, done by get_lexer_by_name.)
    lexers = {lexer for lexer in (type(get_lexer_by_name(language)) for language in WARM_LANGUAGES)
              if issubclass(lexer, RegexLexer)}
    assert len(lexers) >= 6
    for lexer in lexers:  # Pygments' own cache of compiled rules, emptied: as in a new process
        if "_tokens" in lexer.__dict__:
            delattr(lexer, "_tokens")
    app = AiopsApp(console_config(tmp_path, fake_openai), plugins=[notes], discover_plugins=False,
                   server=False)
    async with app.run_test(size=SIZE) as pilot:
        # Waited for by its effect: the worker that does it may be gone from `app.workers` before a
        # first look (it was, once, in CI).
        await wait_for(pilot, lambda: all("_tokens" in lexer.__dict__ for lexer in lexers),
                       "the lexers of " + ", ".join(sorted(lexer.__name__ for lexer in lexers)) + " loaded")
