"""Console tests: the real engine, the fake model server, the App driven by Pilot.

Every test runs with the task factory `App.run` installs in production (eager tasks), which
`App.run_test` leaves out. Data and config dirs live in tmp_path; the system prompt is a copy, so
edits never touch the repository's tree.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from textual.pilot import Pilot

from aiops.config import SHIPPED_PROMPT_DIR, Config, load_config, resolve_paths
from aiops.engine.plugins import Plugin, PluginAPI
from aiops.engine.tools import Classification, Tool, ToolContext, ToolOutput
from aiops.tui.app import AiopsApp
from tests.fakes.fixtures import make_config_dir, openai_model_entry
from tests.fakes.openai_server import WAIT_S, FakeOpenAI
from tests.support.terminal import terminal  # noqa: F401  # a fixture: the model terminal

SIZE = (120, 40)


@pytest.fixture(autouse=True)
async def production_task_factory() -> Any:
    """Install the task factory `App.run` installs in production and `App.run_test` does not.

    textual/app.py (run_async): `if hasattr(asyncio, "eager_task_factory"):
    loop.set_task_factory(asyncio.eager_task_factory)`. On Python 3.11 there is none, and production
    runs with the default factory, as here.
    """
    loop = asyncio.get_running_loop()
    previous = loop.get_task_factory()
    factory = getattr(asyncio, "eager_task_factory", None)
    if factory is not None:
        loop.set_task_factory(factory)
    yield
    loop.set_task_factory(previous)


# ---- a plugin with tools that ask ----------------------------------------------------------------------


class NoteArgs(BaseModel):
    text: str = ""


class SqlArgs(BaseModel):
    sql: str


class NotesPlugin(Plugin):
    """`write_note` is a write (the default gate asks), `read_note` a read (allowed); both are tool
    type "notes". `run_sql` is a db write on the table `users`. `slow_read` (a read) runs until its
    turn is stopped; `slow_started` is set once it runs."""

    name = "notes"

    def __init__(self) -> None:
        super().__init__()
        self.notes: list[str] = []
        self.sql: list[str] = []
        self.slow_started = asyncio.Event()

    async def setup(self, api: PluginAPI) -> None:
        async def write(args: NoteArgs, ctx: ToolContext) -> ToolOutput:
            self.notes.append(args.text)
            return ToolOutput(f"noted: {args.text}")

        async def read(args: NoteArgs, ctx: ToolContext) -> ToolOutput:
            return ToolOutput("notes: " + ", ".join(self.notes))

        async def run_sql(args: SqlArgs, ctx: ToolContext) -> ToolOutput:
            self.sql.append(args.sql)
            return ToolOutput("1 row affected")

        api.register_tool(Tool("write_note", "Write a note.", NoteArgs, "notes", write, operation="write"))
        api.register_tool(Tool("read_note", "Read the notes.", NoteArgs, "notes", read, operation="read"))
        async def slow_read(args: NoteArgs, ctx: ToolContext) -> ToolOutput:
            self.slow_started.set()
            await asyncio.get_running_loop().create_future()  # never done: only a stop ends it
            return ToolOutput("unreachable")

        api.register_tool(Tool("slow_read", "Read the notes, slowly.", NoteArgs, "notes", slow_read,
                               operation="read"))
        api.register_tool(Tool("run_sql", "Run SQL.", SqlArgs, "db", run_sql,
                               classify=lambda a: Classification("write", ("users",))))


# ---- config and app ------------------------------------------------------------------------------------


def prompt_copy(tmp_path: Path) -> Path:
    dest = tmp_path / "prompt"
    if not dest.exists():
        shutil.copytree(SHIPPED_PROMPT_DIR / "default", dest)
    return dest


def console_config(tmp_path: Path, fake: FakeOpenAI, *, extra_files: dict[str, str] | None = None,
                   models: dict[str, dict[str, Any]] | None = None, default: str = "local") -> Config:
    prompt = prompt_copy(tmp_path)
    if models is None:
        models = {
            "local": openai_model_entry(fake, system_prompt_folder=str(prompt)),
            "other": openai_model_entry(fake, "other-model", system_prompt_folder=str(prompt)),
        }
    files = {"plugins.toml": "[notes]\nenabled = true\n", **(extra_files or {})}
    config_dir = make_config_dir(tmp_path, models, default, files)
    return load_config(resolve_paths(config_dir, tmp_path / "data"), load_dotenv=False)


@pytest.fixture
def notes() -> NotesPlugin:
    return NotesPlugin()


@pytest.fixture
def make_app(tmp_path: Path, fake_openai: FakeOpenAI, notes: NotesPlugin) -> Callable[..., AiopsApp]:
    def make(*, extra_files: dict[str, str] | None = None, server: bool = False,
             models: dict[str, dict[str, Any]] | None = None, default: str = "local",
             **kw: Any) -> AiopsApp:
        cfg = console_config(tmp_path, fake_openai, extra_files=extra_files, models=models, default=default)
        return AiopsApp(cfg, plugins=[notes], discover_plugins=False, server=server, port=0, **kw)

    return make


# ---- reading the screen and waiting ----------------------------------------------------------------------


def screen_text(app: AiopsApp) -> str:
    """What the terminal shows right now, as plain text (the active screen, modals included)."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def region_text(app: AiopsApp, selector: str) -> str:
    """The words a widget shows on screen, line breaks from wrapping folded into spaces."""
    widget = app.screen.query_one(selector)
    region = widget.region
    strips = app.screen._compositor.render_strips()[region.y:region.bottom]
    lines = [strip.crop(region.x, region.right).text for strip in strips]
    text = " ".join(lines)
    # Borders and bars (box drawing and block elements) are decoration, not text.
    text = "".join(" " if 0x2500 <= ord(c) <= 0x259F else c for c in text)
    return " ".join(text.split())


def region_lines(app: AiopsApp, selector: str) -> list[str]:
    """The lines a widget shows on screen, as drawn (borders included)."""
    widget = app.screen.query_one(selector)
    region = widget.region
    strips = app.screen._compositor.render_strips()[region.y:region.bottom]
    return [strip.crop(region.x, region.right).text for strip in strips]


def color_of(app: AiopsApp, word: str, selector: str | None = None) -> Any:
    """The foreground colour the terminal draws `word` in (its first cell), inside `selector`'s region
    or anywhere on screen. Fails when the word is not on screen."""
    strips = app.screen._compositor.render_strips()
    region = app.screen.query_one(selector).region if selector else None
    for y, strip in enumerate(strips):
        if region is not None and not region.y <= y < region.bottom:
            continue
        line = strip.crop(region.x, region.right) if region is not None else strip
        x = line.text.find(word)
        if x < 0:
            continue
        for segment in line.crop(x, x + 1):
            return segment.style.color if segment.style else None
    raise AssertionError(f"{word!r} is not on screen:\n{screen_text(app)}")


def chat_text(app: AiopsApp) -> str:
    return region_text(app, "#chat")


async def wait_chat(pilot: Pilot[Any], text: str, timeout: float = WAIT_S) -> None:
    await wait_for(pilot, lambda: text in chat_text(pilot.app), f"{text!r} in the chat", timeout)


async def wait_for(pilot: Pilot[Any], condition: Callable[[], Any], what: str = "condition",
                   timeout: float = WAIT_S) -> Any:
    """Poll `condition` between frames until it is truthy; fail with the screen when it never is."""
    deadline = time.monotonic() + timeout
    while True:
        if pilot.app._exception is not None:  # the app crashed: fail now, with its error
            raise AssertionError(f"the app crashed while waiting for {what}") from pilot.app._exception
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; the screen shows:\n{screen_text(pilot.app)}")
        await pilot.pause(0.02)


async def wait_text(pilot: Pilot[Any], text: str, timeout: float = WAIT_S) -> None:
    await wait_for(pilot, lambda: text in screen_text(pilot.app), f"{text!r} on screen", timeout)


async def wait_gone(pilot: Pilot[Any], text: str, timeout: float = WAIT_S) -> None:
    await wait_for(pilot, lambda: text not in screen_text(pilot.app), f"{text!r} to leave the screen", timeout)


async def ready(pilot: Pilot[Any]) -> AiopsApp:
    """The engine started and the selected session's history is on screen."""
    app: AiopsApp = pilot.app  # type: ignore[assignment]
    await wait_for(pilot, lambda: app.services_ready and app.chat.session_id is not None, "the console")
    return app


async def type_text(pilot: Pilot[Any], text: str) -> None:
    """Type like a user: one key press per character."""
    await pilot.press(*text)


async def send(pilot: Pilot[Any], text: str) -> None:
    await type_text(pilot, text)
    await pilot.press("enter")


class ManualClock:
    """A monotonic clock that moves only when the test says so: the console's pauses (a gate's arm
    delay, the sessions list's hold after a key) without waiting them out."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
