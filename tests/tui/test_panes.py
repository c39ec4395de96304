"""The side panes, the layout, help, palette, keymap, themes, first-run guidance and logging."""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from collections.abc import Callable

import pytest
from textual.color import Color
from textual.command import CommandPalette
from textual.widgets import OptionList, Tab, TextArea

from aiops.integrations.mysql_plugin import MySQLPlugin
from aiops.tui.app import AiopsApp, _terminal_quiet
from aiops.tui.keys import KEYS, display_keys, keys_of
from aiops.tui.screens.main import MAX_WIDTH
from aiops.tui.screens.modals import GateDetailsScreen, HelpScreen, PromptEditScreen
from aiops.tui.widgets.chat_input import ChatInput
from aiops.tui.widgets.footer import ConsoleFooter
from aiops.tui.widgets.gates import GatesInbox
from aiops.tui.widgets.limits import LimitsTable
from aiops.tui.widgets.sessions import REDRAW_EVERY, SETTLE
from tests.fakes.openai_server import Reply, call_tool_when
from tests.support.terminal import full
from tests.tui.conftest import (
    SIZE,
    ManualClock,
    chat_text,
    color_of,
    console_config,
    prompt_copy,
    ready,
    region_lines,
    region_text,
    screen_text,
    send,
    type_text,
    wait_chat,
    wait_for,
    wait_text,
)


def footer_words(app) -> list[str]:
    """The key bar (the screen's last line), word by word."""
    return screen_text(app).splitlines()[-1].split()


async def test_the_prompt_tree_shows_sections_and_errors_and_edits_save_through_the_engine(
        make_app, fake_openai, tmp_path):
    folder = prompt_copy(tmp_path)
    tools = folder / ".system_prompt_tools"
    tools.write_text(tools.read_text() + "ghost: a section nobody wrote\n")
    app = make_app()
    # Tall enough for every section of the shipped tree (and the ghost) to show at once.
    async with app.run_test(size=(SIZE[0], SIZE[1] + 4)) as pilot:
        await ready(pilot)
        await pilot.press("f5")  # gates -> prompt
        await wait_for(pilot, lambda: app.main.side_tab() == "prompt", "the prompt tab")
        await wait_text(pilot, "tools_prompt")
        side = region_text(app, "#side")
        for name in ("1. role", "2. tools", "3. tools_db", "gates", "memory", "1 error"):
            assert name in side
        assert "✗ ghost (missing)" in side
        assert app.focused is app.main.query_one("#prompt-sections")
        await pilot.press("down")  # root -> 1. role
        role_body = app.adapter.engine.prompts.get(folder).find("role").body
        first_words = " ".join(role_body.split()[:4])
        await wait_for(pilot, lambda: first_words in region_text(app, "#prompt-reader"), "the role section")
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, PromptEditScreen), "the editor")
        assert app.screen.query_one(TextArea).text == role_body
        await pilot.press(*"Always answer in haiku. ")
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: "haiku" in region_text(app, "#prompt-reader"), "the saved section")
        saved = (folder / ".system_prompt_role").read_text()
        assert "Always answer in haiku. " + role_body.split("\n")[0] in saved
        audit = await app.adapter.engine.store.audit()
        edit = [a for a in audit if a.event == "prompt_edit"][-1]
        assert edit.data["section"] == "role" and edit.actor == "operator" and "+Always answer in haiku" in \
            edit.data["diff"]
        # The next turn's system prompt carries the edit.
        app.chat_input.focus()
        await send(pilot, "hi")
        await wait_chat(pilot, "echo: hi")
        system = fake_openai.last_request.json["messages"][0]
        assert system["role"] == "system" and "Always answer in haiku." in system["content"]


async def _prompt_section(pilot, app, name: str) -> str:
    """Open the prompt tab, move the cursor to section `name`; the reader's text."""
    await pilot.press("f5")  # gates -> prompt
    await wait_for(pilot, lambda: app.main.side_tab() == "prompt", "the prompt tab")
    await wait_text(pilot, name)
    for _ in range(12):
        if f"{name}:" in region_text(app, "#prompt-reader"):
            break
        await pilot.press("down")
    return await wait_for(pilot, lambda: f"{name}:" in (t := region_text(app, "#prompt-reader")) and t,
                          f"the {name} section in the reader")


async def test_a_section_whose_tool_is_not_registered_is_marked_inactive(make_app, fake_openai):
    # No mysql plugin: db_query is not registered, so tools_db is left out of the prompt.
    app = make_app()
    # Tall enough for every section to show without a scrollbar (which would cut the lines).
    async with app.run_test(size=(SIZE[0], SIZE[1] + 4)) as pilot:
        await ready(pilot)
        reader = await _prompt_section(pilot, app, "tools_db")
        tree = region_text(app, "#prompt-sections")
        # (the data tools', delegation's and agent_call's sections are inactive too: none of their plugins is enabled here)
        assert "3. tools_db ⊘ needs db_query" in tree and "(14 sections, 9 inactive" in tree
        assert "⊘" not in tree.replace("tools_db ⊘", "").split("tools_ddgs_search")[0]  # the others: in the prompt
        assert "inactive: needs db_query (not registered); left out of the prompt" in reader
        # Dimmed: drawn unlike an active section (with the cursor on neither).
        await pilot.press("down")
        await wait_for(pilot, lambda: "tools_prompt:" in region_text(app, "#prompt-reader"), "the next section")
        assert color_of(app, "tools_db", "#prompt-sections") != color_of(app, "memory", "#prompt-sections")
        await send_from_input(pilot, app, "hi")
        assert "tools_db: Querying databases" not in fake_openai.last_request.json["messages"][0]["content"]


async def test_a_section_whose_tool_is_registered_is_active(tmp_path, fake_openai, notes):
    with socket.socket() as s:  # a port nobody listens on: the plugin registers db_query all the same
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    plugins = f'[notes]\nenabled = true\n[mysql]\nenabled = true\nhost = "127.0.0.1"\nport = {port}\n'
    cfg = console_config(tmp_path, fake_openai, extra_files={"plugins.toml": plugins})
    app = AiopsApp(cfg, plugins=[notes, MySQLPlugin()], discover_plugins=False, server=False)
    async with app.run_test(size=(SIZE[0], SIZE[1] + 4)) as pilot:
        await ready(pilot)
        assert app.adapter.engine.tools.get("db_query") is not None, app.adapter.engine.plugin_status
        reader = await _prompt_section(pilot, app, "tools_db")
        tree = region_text(app, "#prompt-sections")
        # Only the data tools', delegation's and agent_call's sections (their plugins are not enabled here) are inactive.
        assert "3. tools_db Querying databases" in tree and "(14 sections, 8 inactive" in tree
        assert "⊘" not in tree.split("tools_ddgs_search")[0]
        assert "requires db_query (registered)" in reader
        await pilot.press("down")
        await wait_for(pilot, lambda: "tools_prompt:" in region_text(app, "#prompt-reader"), "the next section")
        assert color_of(app, "tools_db", "#prompt-sections") == color_of(app, "memory", "#prompt-sections")
        await send_from_input(pilot, app, "hi")
        assert "tools_db: Querying databases" in fake_openai.last_request.json["messages"][0]["content"]


async def send_from_input(pilot, app, text: str) -> None:
    app.chat_input.focus()
    await send(pilot, text)
    await wait_chat(pilot, f"echo: {text}")


async def test_rate_limits_pane_flags_a_disabled_type_and_a_key_re_enables_it(make_app, fake_openai):
    limits = "[rate.notes]\ncalls = 1\nwindow_seconds = 600\nauto_disable = true\n"
    fake_openai.responder = call_tool_when("read notes", ("read_note", {}))
    app = make_app(extra_files={"limits.toml": limits})
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "read notes")
        await wait_chat(pilot, "tool said: notes:")
        await send(pilot, "read notes twice")
        await wait_chat(pilot, "rate limit exceeded")
        limiter = app.adapter.engine.gatekeeper.limiter
        assert limiter.is_disabled(app.selected, "notes")
        await pilot.press("f5", "f5")  # gates -> prompt -> limits
        await wait_for(pilot, lambda: isinstance(app.focused, LimitsTable), "the limits table")
        short = str(app.sessions_list.sessions[app.selected]["short_id"])
        side = region_text(app, "#side")
        assert f"{short} notes 1/1 in 600s DISABLED" in side
        await pilot.press("e")
        await wait_for(pilot, lambda: "DISABLED" not in region_text(app, "#side"), "the re-enabled row")
        assert not limiter.is_disabled(app.selected, "notes")
        assert f"{short} notes 0/1 in 600s ok" in region_text(app, "#side")


async def test_narrow_terminals_show_one_pane_at_a_time(make_app, fake_openai):
    fake_openai.responder = call_tool_when("note", ("write_note", {"text": "x"}))
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        text = screen_text(app)
        assert "Chat  Sessions  Gates (0)  Prompt  Limits  Log" in text
        assert "╭─ Sessions" not in text
        await pilot.press("f6")  # chat -> sessions
        await wait_text(pilot, "╭─ Sessions")
        assert "console (1)" in screen_text(app) and "╭─ Chat" not in screen_text(app)
        await pilot.press("f6")
        await wait_text(pilot, "No gate is waiting.")
        await pilot.press("i")  # back to the input from any pane
        await wait_for(pilot, lambda: isinstance(app.focused, ChatInput), "the input")
        await wait_text(pilot, "╭─ Chat")
        await send(pilot, "note it")
        await wait_for(pilot, lambda: app.inbox.gates, "the gate")
        await pilot.press("ctrl+g")
        await wait_text(pilot, "write_note write")
        assert isinstance(app.focused, GatesInbox)
        await pilot.press("a")
        app.main.show_pane("chat")
        await wait_chat(pilot, "tool said: noted: x")
        # Wider again: every pane side by side.
        await pilot.resize_terminal(120, 40)
        await wait_text(pilot, "╭─ Sessions")
        text = screen_text(app)
        assert "╭─ Chat" in text and "Gates" in text and "Chat  Sessions  Gates" not in text


async def test_panes_hide_show_and_resize(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        sessions = app.main.query_one("#sessions-pane")
        width = sessions.size.width
        await pilot.press("alt+right")
        await wait_for(pilot, lambda: sessions.size.width == width + 4, "a wider sessions pane")
        await pilot.press("f2")
        await wait_for(pilot, lambda: "╭─ Sessions" not in screen_text(app), "the sessions pane to hide")
        assert isinstance(app.focused, ChatInput)
        await pilot.press("f3")
        await wait_for(pilot, lambda: "Limits" not in screen_text(app), "the side pane to hide")
        await pilot.press("f2", "f3")
        await wait_text(pilot, "╭─ Sessions")
        await wait_text(pilot, "Limits")


async def test_the_chat_column_is_never_squeezed_to_nothing(make_app):
    # Textual's TextArea (the input) crashed drawing its placeholder in a zero-width column.
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        for _ in range(16):  # the sessions pane as wide as it goes (the keys widen it while typing)
            await pilot.press("alt+right")
        await wait_for(pilot, lambda: app.main.sessions_width == 120 - 16 - 42, "the widest sessions pane")
        await wait_for(pilot, lambda: app.chat_input.content_size.width > 0, "an input with room to draw")
        await pilot.resize_terminal(70, 24)  # under 100 columns: one pane at a time
        await wait_for(pilot, lambda: app.main.narrow and app.chat_input.outer_size.width == 70, "the input alone")
        await wait_text(pilot, "Chat  Sessions  Gates (0)")


def assert_every_pane_on_screen(app) -> None:
    """Every pane shown lies inside the terminal, and the chat column keeps its 16 columns."""
    width = app.size.width
    for selector in ("#sessions-pane", "#center", "#side"):
        pane = app.main.query_one(selector)
        if pane.display and (pane.region or pane.outer_size.width):
            region = pane.region
            assert 0 <= region.x and region.x + pane.outer_size.width <= width, (selector, region, width)
    if app.main.query_one("#center").display:
        assert app.chat_input.outer_size.width >= 16, app.chat_input.outer_size
    # The rightmost pane's frame is drawn whole: its corner is the terminal's last column.
    assert region_lines(app, "#main")[0].endswith("╮"), region_lines(app, "#main")[0]


@pytest.mark.parametrize("size", [(120, 40), (80, 24)], ids=["120x40", "80x24"])
async def test_widening_panes_never_pushes_one_off_screen_nor_squeezes_the_input(make_app, size):
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await ready(pilot)
        for _ in range(24):  # while typing: the sessions pane, far past any limit
            await pilot.press("alt+right")
        await pilot.pause()
        assert_every_pane_on_screen(app)
        await pilot.press("x")  # the input still takes a letter and shows it
        await wait_for(pilot, lambda: app.chat_input.text == "x" and "x" in region_text(app, "#input"),
                       "the letter in the input")
        await pilot.press("ctrl+g")  # the side pane, the same
        await wait_for(pilot, lambda: isinstance(app.focused, GatesInbox), "the inbox")
        for _ in range(24):
            await pilot.press("alt+right")
        await pilot.pause()
        assert_every_pane_on_screen(app)
        await pilot.press("i")  # back to the input
        await wait_for(pilot, lambda: isinstance(app.focused, ChatInput), "the input")
        await pilot.press("y")
        await wait_for(pilot, lambda: app.chat_input.text == "xy" and "xy" in region_text(app, "#input"),
                       "the letters in the input")
        assert_every_pane_on_screen(app)


def toasts(app, text: str) -> int:
    """How many notifications say `text`."""
    return sum(text in n.message for n in app._notifications)


async def test_the_resize_keys_stop_at_the_limit_and_say_so(make_app):
    app = make_app()
    # 120 columns: sessions 28 | chat 50 | side 42
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        sessions, center, side = (app.main.query_one(s) for s in ("#sessions-pane", "#center", "#side"))
        for _ in range(9):  # 28 -> 60 in steps of 4, then the last 2 columns
            await pilot.press("alt+right")
        await wait_for(pilot, lambda: sessions.outer_size.width == 62 and center.outer_size.width == 16,
                       "the sessions pane as wide as the chat lets it")
        assert not toasts(app, "as wide as it goes")
        await pilot.press("alt+right", "alt+right", "alt+right")  # no effect: said so, once
        await wait_for(pilot, lambda: toasts(app, "the sessions pane is as wide as it goes: the chat keeps 16 columns"),
                       "the toast")
        await pilot.pause()
        assert toasts(app, "as wide as it goes") == 1
        assert sessions.outer_size.width == 62 and app.main.sessions_width == 62
        # The side pane is at its limit too now (the chat's 16 columns are all that is left).
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: isinstance(app.focused, GatesInbox), "the inbox")
        await pilot.press("alt+right")
        await wait_for(pilot, lambda: toasts(app, "the side pane is as wide as it goes"), "the toast")
        assert side.outer_size.width == 42 and app.main.side_width == 42
        assert_every_pane_on_screen(app)
        # Narrower down to the least width, and no further.
        for _ in range(6):  # 42 -> 22, then the last 2 columns (its tabs at their narrowest)
            await pilot.press("alt+left")
        await wait_for(pilot, lambda: side.outer_size.width == 20, "the narrowest side pane")
        await pilot.press("alt+left")
        await wait_for(pilot, lambda: toasts(app, "the side pane is as narrow as it goes (20 columns)"), "the toast")
        assert side.outer_size.width == 20 and center.outer_size.width == 120 - 62 - 20
        # One pane at a time on a small terminal: nothing to resize, and the key says so.
        await pilot.resize_terminal(80, 24)
        await wait_for(pilot, lambda: app.main.narrow, "the one-pane layout")
        await pilot.press("alt+right")
        await wait_for(pilot, lambda: toasts(app, "one pane at a time under 100 columns: no pane to resize"),
                       "the toast")


async def test_a_terminal_narrowed_after_widening_keeps_every_pane_on_screen(make_app):
    app = make_app()
    async with app.run_test(size=(160, 40), notifications=True) as pilot:
        await ready(pilot)
        sessions, center, side = (app.main.query_one(s) for s in ("#sessions-pane", "#center", "#side"))
        for _ in range(20):
            await pilot.press("alt+right")
        await wait_for(pilot, lambda: sessions.outer_size.width == MAX_WIDTH, "the widest sessions pane")
        await wait_for(pilot, lambda: toasts(app, f"the sessions pane is as wide as it goes ({MAX_WIDTH} columns)"),
                       "the toast")
        # Narrower terminals: the widened pane gives way; the operator's width is kept.
        for width, shown in ((120, 62), (100, 42)):
            await pilot.resize_terminal(width, 40)
            await wait_for(pilot, lambda w=width: app.main.size.width == w and center.outer_size.width == 16,
                           f"the chat at its least on {width} columns")
            assert sessions.outer_size.width == shown and side.outer_size.width == 42
            assert_every_pane_on_screen(app)
            assert app.main.sessions_width == MAX_WIDTH
        # Under 100 columns one pane at a time; wider again, the chosen width comes back.
        await pilot.resize_terminal(80, 24)
        await wait_for(pilot, lambda: app.main.narrow, "the one-pane layout")
        await pilot.resize_terminal(160, 40)
        await wait_for(pilot, lambda: sessions.outer_size.width == MAX_WIDTH, "the chosen width again")
        assert_every_pane_on_screen(app)
        # A key moves the pane from where it is drawn: narrower at once, the chat gets the room.
        await pilot.resize_terminal(120, 40)
        await wait_for(pilot, lambda: sessions.outer_size.width == 62, "the pane given way")
        await pilot.press("alt+left")
        await wait_for(pilot, lambda: sessions.outer_size.width == 58 and center.outer_size.width == 20,
                       "a narrower sessions pane")
        # The side pane widened while the sessions pane is hidden has to share when it comes back.
        await pilot.press("f2")
        await wait_for(pilot, lambda: not sessions.display, "the sessions pane hidden")
        await pilot.press("alt+right")  # while typing: the sessions pane, hidden
        await wait_for(pilot, lambda: toasts(app, "the sessions pane is hidden"), "the toast")
        assert app.main.sessions_width == 58
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: isinstance(app.focused, GatesInbox), "the inbox")
        for _ in range(20):
            await pilot.press("alt+right")
        await wait_for(pilot, lambda: side.outer_size.width == MAX_WIDTH, "the widest side pane")
        assert_every_pane_on_screen(app)
        await pilot.press("f2")
        await wait_for(pilot, lambda: sessions.display and sessions.region, "the sessions pane back")
        # 58 + 90 columns do not fit beside the chat's 16: the wider gives way first, here to an even split.
        await wait_for(pilot, lambda: center.outer_size.width == 16, "the chat at its least")
        assert sessions.outer_size.width == 52 and side.outer_size.width == 52
        assert (app.main.sessions_width, app.main.side_width) == (58, MAX_WIDTH)
        assert_every_pane_on_screen(app)


async def test_the_console_starts_on_a_terminal_under_80_columns(make_app):
    app = make_app()
    async with app.run_test(size=(72, 24)) as pilot:
        await ready(pilot)
        await wait_text(pilot, "╭─ Chat")
        assert app.main.narrow and app.chat_input.outer_size.width == 72


async def test_a_narrowed_side_pane_keeps_every_tab_whole_in_sight_and_clickable(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+g")  # the focus in the side pane: alt+left narrows it
        await wait_for(pilot, lambda: isinstance(app.focused, GatesInbox), "the inbox")
        side = app.main.query_one("#side")
        await pilot.press("alt+left", "alt+left")  # 42 -> 34 columns, frame included
        for width in (33, 32, 31, 30):  # the widths where "Gates (0)" pushed "Log" out of sight
            app.main.resize_pane(-1)
            await wait_for(pilot, lambda w=width: side.outer_size.width == w, f"a side pane {width} wide")
            await pilot.pause()
            row = region_lines(app, "#side")[1]  # the tab bar, inside the frame
            inside = side.content_region
            for tab in side.query(Tab):
                assert inside.contains_region(tab.region), (width, tab.label_text, row)
                assert tab.label_text in row, (width, tab.label_text, row)
            # The labels whole, as on a wide pane (only the space between them narrows).
            assert row.strip("│ ").split() == ["Gates", "(0)", "Prompt", "Limits", "Log"], (width, row)
        # "Log" is where it is drawn, and clicking it shows the log.
        x = side.region.x + row.index("Log")
        await pilot.click(offset=(x + 1, side.region.y + 1))
        await wait_for(pilot, lambda: app.main.side_tab() == "log", "the log tab")
        await wait_for(pilot, lambda: app.main.query_one("#log").display and app.main.query_one("#log").region,
                       "the log on screen")
        # The keys work as before: F5 cycles on to the gates, alt+right widens the pane again, and
        # the tabs are as they were.
        await pilot.press("f5")
        await wait_for(pilot, lambda: app.main.side_tab() == "gates", "the gates tab")
        await pilot.press("alt+right", "alt+right", "alt+right")
        await wait_for(pilot, lambda: side.outer_size.width == 42, "the side pane as it opened")
        await wait_for(pilot, lambda: "│ Gates (0)  Prompt  Limits  Log " in region_lines(app, "#side")[1],
                       "the wide tab bar")


async def test_the_side_pane_at_its_narrowest_still_shows_and_clicks_every_tab(make_app):
    """alt+left stops the side pane where its tabs are at their narrowest and still whole: each
    one on screen inside the frame and clickable, the count kept."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: isinstance(app.focused, GatesInbox), "the inbox")
        side = app.main.query_one("#side")
        for _ in range(10):
            app.main.resize_pane(-4)
        await wait_for(pilot, lambda: side.outer_size.width == 20, "the side pane at its least width")
        await pilot.pause()
        for view in ("log", "gates"):  # whichever tab is active, every one in sight
            row = region_lines(app, "#side")[1]
            for tab in side.query(Tab):
                assert side.content_region.contains_region(tab.region), (tab.label_text, row)
            assert row.strip("│ ").split() == ["Ga…", "0", "Pr…", "Li…", "Log"], row
            x = side.region.x + row.index("Log" if view == "log" else "Ga…")
            await pilot.click(offset=(x + 1, side.region.y + 1))
            await wait_for(pilot, lambda v=view: app.main.side_tab() == v, f"the {view} tab")
            await pilot.pause()


async def test_a_terminal_narrower_than_its_tab_bar_keeps_every_view_in_sight(make_app):
    app = make_app()
    async with app.run_test(size=(40, 24)) as pilot:
        await ready(pilot)
        bar = screen_text(app).splitlines()[1]
        assert bar.split() == ["Chat", "Sessions", "Gates", "0", "Prompt", "Limits", "Log"]
        await pilot.click(offset=(bar.index("Log") + 1, 1))
        await wait_for(pilot, lambda: app.main.view == "log", "the log view")
        await pilot.click(offset=(bar.index("Gates") + 1, 1))
        # The pane's frame names it in full.
        await wait_for(pilot, lambda: region_lines(app, "#side")[0].startswith("╭─ Gates (0) "), "the inbox")


async def test_f1_explains_the_focused_pane(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("f1")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "help")
        text = screen_text(app)
        assert "Help · Input" in text and "ctrl+j" in text
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen), "help to close")
        await pilot.press("ctrl+g", "f1")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "help")
        text = screen_text(app)
        assert "Help · Gates inbox" in text and "approve for the session" in text


async def test_the_palette_offers_the_focused_panes_actions_first(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+g", "ctrl+p")
        await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette), "the palette")
        results = app.screen.query_one(OptionList)
        await wait_for(pilot, lambda: results.option_count > 10, "the commands")
        first = [str(results.get_option_at_index(i).prompt) for i in range(5)]
        assert all("Gates inbox:" in p for p in first), first
        await pilot.press(*"show log")
        await wait_for(pilot, lambda: results.option_count and "Show log" in str(
            results.get_option_at_index(0).prompt), "the match")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.main.side_tab() == "log", "the log tab")


async def test_every_palette_entry_with_a_key_shows_it_the_same_way(make_app):
    # The keys in effect (a rebound one too), after the entry's tooltip, for every binding the
    # palette offers: single-letter and function keys as well as ctrl+ ones.
    keymap = '[console.keymap]\n"chat.earlier" = "ctrl+e"\n"gates.approve" = "y"\n'
    app = make_app(extra_files={"aiops.toml": keymap})
    async with app.run_test(size=(220, 200)) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+p")
        await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette), "the palette")
        results = app.screen.query_one(OptionList)
        await wait_for(pilot, lambda: results.option_count > 30, "the commands")
        await pilot.pause()
        lines = [line.strip() for line in screen_text(app).splitlines()]
        offered = [k for k in KEYS if k.palette]
        assert len(offered) > 25
        missing = [f"{k.tooltip}  [{display_keys(keys_of(k, app.keymap_overrides))}]" for k in offered]
        missing = [want for want in missing if want not in lines]
        assert not missing, missing
        assert "Load earlier messages of this session  [ctrl+e]" in lines
        assert "Approve the highlighted gate once  [y]" in lines


async def test_the_keymap_in_aiops_toml_rebinds_keys_by_id(make_app, fake_openai):
    keymap = '[console.keymap]\n"gates.approve" = "y"\n"no.such.binding" = "z"\n'
    fake_openai.responder = call_tool_when("note", ("write_note", {"text": "k"}))
    app = make_app(extra_files={"aiops.toml": keymap})
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        assert any("no.such.binding" in n.message for n in app._notifications)
        await send(pilot, "note it")
        await wait_for(pilot, lambda: app.inbox.gates, "the gate")
        await pilot.press("ctrl+g", "a")
        await pilot.pause()
        assert app.inbox.gates  # `a` is no longer approve: typed in the inbox, it went to the input
        assert app.chat_input.text == "a" and isinstance(app.focused, ChatInput)
        await pilot.press("ctrl+g", "y")
        await wait_chat(pilot, "tool said: noted: k")


async def test_the_theme_comes_from_the_config_and_a_change_redraws_everything(make_app, fake_openai):
    fake_openai.responder = call_tool_when("clean up", ("run_sql", {"sql": "DELETE FROM users WHERE id = 3"}))
    app = make_app(extra_files={"aiops.toml": '[console]\ntheme = "nord"\n'})
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app.theme == "nord"
        await send(pilot, "clean up user 3")
        await wait_for(pilot, lambda: app.inbox.gates, "the gate")
        app.chat.focus()
        await pilot.press("t")  # the tool call's arguments open: SQL highlighted in the chat too
        await wait_chat(pilot, "DELETE FROM users WHERE id = 3")
        app.chat_input.focus()
        await type_text(pilot, "typed draft")  # the input renders at each key: it must follow too
        words = [("DELETE", "#gates"), ("DELETE", "#chat"), ("Sessions", None), ("console (1)", "#sessions"),
                 ("typed draft", "#input")]
        before = {w: color_of(app, *w) for w in words}
        app.theme = "textual-light"
        await wait_for(pilot, lambda: all(color_of(app, *w) != before[w] for w in words),
                       "every pane in the new theme's colours")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_first_run_without_a_reachable_model_says_why_and_how(make_app, monkeypatch):
    monkeypatch.delenv("AIOPS_TEST_UNSET_KEY", raising=False)
    models = {
        "gpt": {"type": "openai", "model_id": "gpt-x", "api_key_env": "AIOPS_TEST_UNSET_KEY"},
        "local": {"type": "openai", "model_id": "m", "base_url": f"http://127.0.0.1:{_closed_port()}/v1"},
    }
    app = make_app(models=models, default="gpt")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await wait_text(pilot, "no model reachable")
        await wait_for(pilot, lambda: "no usable API key" in region_text(app, "#guidance"), "the guidance")
        guidance = region_text(app, "#guidance")
        assert "Model gpt has no usable API key: AIOPS_TEST_UNSET_KEY is not set" in guidance
        assert "(openai gpt-x at https://api.openai.com/v1)" in guidance
        assert "Set AIOPS_TEST_UNSET_KEY in the environment or" in guidance
        assert "models.toml" in guidance and "aiops config init" in guidance
        # Commands still work, and a turn says what failed where the user looks.
        await send(pilot, "!help")
        await wait_chat(pilot, "one turn on another model")
        await send(pilot, "!model local")
        await wait_chat(pilot, "this session now uses local")
        await wait_for(pilot, lambda: "cannot connect to http://127.0.0.1" in region_text(app, "#guidance"),
                       "the local model's reason")
        await send(pilot, "hello?")
        await wait_for(pilot, lambda: "error (model_error)" in chat_text(app), "the model error")


async def test_log_records_go_to_the_log_pane(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        logging.getLogger("aiops.test").warning("a record for the viewer")
        app.main.show_pane("log")
        await wait_for(pilot, lambda: "a record for the viewer" in region_text(app, "#side"), "the record")


async def test_the_log_pane_shows_what_was_logged_before_it_was_there(make_app, monkeypatch):
    """Start-up runs alongside the first paint: its warnings (a keymap entry that names nothing,
    a token variable left unset beside one that is set) came before the pane and were lost."""
    monkeypatch.delenv("AIOPS_TEST_UNSET_TOKEN", raising=False)
    monkeypatch.setenv("SET_TOKEN_FOR_AIOPS_TEST", "s" * 32)
    app = make_app(server=True, extra_files={"aiops.toml": (
        '[console.keymap]\n"no.such.binding" = "z"\n'
        '[auth.tokens.ops]\ntoken_env = "AIOPS_TEST_UNSET_TOKEN"\nrole = "operator"\n'
        '[auth.tokens.bot]\ntoken_env = "SET_TOKEN_FOR_AIOPS_TEST"\nrole = "client"\n')})
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        app.main.show_pane("log")
        await wait_for(pilot, lambda: "no.such.binding" in region_text(app, "#side")
                       and "AIOPS_TEST_UNSET_TOKEN" in region_text(app, "#side"), "the start-up warnings")
        shown = region_text(app, "#side")
        assert shown.count("no.such.binding") == 1  # once: not from both the buffer and the pane


def test_nothing_logs_to_the_terminal_while_the_console_draws(tmp_path, fake_openai, capsys):
    from tests.tui.conftest import console_config

    cfg = console_config(tmp_path, fake_openai)
    root = logging.getLogger()
    terminal = logging.StreamHandler(sys.stderr)
    root.addHandler(terminal)
    try:
        with _terminal_quiet(cfg):
            assert terminal not in root.handlers
            logging.getLogger("aiops.test").error("only in the file")
        assert terminal in root.handlers
    finally:
        root.removeHandler(terminal)
    assert "only in the file" not in capsys.readouterr().err
    assert "only in the file" in cfg.paths.log_path.read_text()


async def test_the_footer_fits_80_columns_with_whole_labels_and_one_palette_key(make_app, fake_openai):
    fake_openai.responder = call_tool_when("note", ("write_note", {"text": "f"}))
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        footer = await wait_for(pilot, lambda: "Send" in screen_text(app).splitlines()[-1]
                                and screen_text(app).splitlines()[-1], "the footer")
        assert footer.split() == ["⏎", "Send", "^g", "Gate", "f1", "Help", "^n", "New", "^q", "Quit",
                                  "▏^p", "Palette"]
        await send(pilot, "note it")
        await wait_for(pilot, lambda: app.inbox.gates, "the gate")
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: "Approve" in screen_text(app).splitlines()[-1], "the inbox's keys")
        footer = screen_text(app).splitlines()[-1]
        # The inbox's own keys first, then as many global ones as fit, whole; the palette once.
        assert footer.split()[:10] == ["⏎", "Open", "a", "Approve", "s", "Session", "d", "Deny", "x", "Deny+stop"]
        assert footer.count("Palette") == 1 and footer.rstrip().endswith("▏^p Palette")
        labels = {"Open", "Approve", "Session", "Deny", "Deny+stop", "Type", "Gate", "Help", "New", "Quit"}
        assert all(word in labels or len(word) <= 3 for word in footer.replace("▏^p Palette", "").split())


async def test_a_maximized_pane_keeps_the_key_bar_and_a_still_mouse_follows_new_keys(make_app, fake_openai):
    help_tip = "Explain the focused pane and list its keys"
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await wait_for(pilot, lambda: footer_words(app)[:2] == ["⏎", "Send"], "the input's keys")
        bar = app.screen.query_one(ConsoleFooter)
        line = screen_text(app).splitlines()[-1]
        x = line.index("Help")
        await pilot.hover(offset=(x, 23))
        assert bar.tooltip == help_tip
        app.screen.maximize(app.chat_input)  # the palette's "Maximize"
        await wait_for(pilot, lambda: app.screen.maximized is app.chat_input, "the maximized input")
        await pilot.pause()
        assert footer_words(app)[:2] == ["⏎", "Send"] and footer_words(app)[-1] == "Palette"
        app.screen.minimize()
        # The keys change under a mouse that does not move: its tooltip is the key's drawn there now.
        app.sessions_list.focus()
        await wait_for(pilot, lambda: footer_words(app)[:2] != ["⏎", "Send"], "the list's keys")
        now = screen_text(app).splitlines()[-1]
        assert now.index("Help") != x and now[x] != " "
        assert bar.tooltip is not None and bar.tooltip != help_tip


async def test_the_key_bar_follows_the_focus_between_panes_on_the_same_keys_and_they_click(
        make_app, fake_openai):
    fake_openai.responder = call_tool_when("note", ("write_note", {"text": "f"}))
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await send(pilot, "note it")
        await wait_for(pilot, lambda: app.inbox.gates, "the gate")
        bar = app.screen.query_one(ConsoleFooter)

        def inbox_keys() -> bool:
            return footer_words(app)[:4] == ["⏎", "Open", "a", "Approve"]

        await pilot.press("ctrl+g")
        await wait_for(pilot, inbox_keys, "the inbox's keys")
        await pilot.press("i")
        await wait_for(pilot, lambda: footer_words(app)[:2] == ["⏎", "Send"], "the input's keys")
        assert "Approve" not in footer_words(app) and footer_words(app)[-2:] == ["▏^p", "Palette"]
        await pilot.press("ctrl+g")
        await wait_for(pilot, inbox_keys, "the inbox's keys again")
        line = screen_text(app).splitlines()[-1]
        # The bar is one line drawn by one widget: the mouse over a key gives that key's tooltip.
        await pilot.hover(offset=(line.index("Approve"), 23))
        assert bar.tooltip == "Approve the highlighted gate once"
        await pilot.hover(offset=(line.index("Palette"), 23))
        assert bar.tooltip and "palette" in str(bar.tooltip).lower()
        await pilot.click(offset=(line.index("Approve"), 23))  # the key on the bar runs what it names
        await wait_chat(pilot, "noted: f")
        await wait_for(pilot, lambda: not app.inbox.gates, "the gate answered")


async def test_the_mouse_pointer_is_a_hand_over_a_key_of_the_key_bar(make_app, monkeypatch):
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await wait_for(pilot, lambda: footer_words(app)[:2] == ["⏎", "Send"], "the input's keys")
        # What the terminal is told: Textual sends each change of shape (kitty's OSC 22) through this.
        shapes: list[str] = []
        monkeypatch.setattr(app, "_set_pointer_shape", shapes.append)
        line = screen_text(app).splitlines()[-1]
        help_at = line.index("Help")
        await pilot.hover(offset=(help_at, 23))
        await wait_for(pilot, lambda: shapes[-1:] == ["pointer"], "a hand over Help")
        await pilot.hover(offset=(help_at + len("Help"), 23))  # the cell between two keys
        await wait_for(pilot, lambda: shapes[-1:] == ["default"], "the arrow between keys")
        await pilot.hover(offset=(line.index("Palette"), 23))
        await wait_for(pilot, lambda: shapes[-1:] == ["pointer"], "a hand over the palette's key")
        await pilot.hover(offset=(10, 10))  # off the bar, over the chat
        await wait_for(pilot, lambda: shapes[-1:] == ["default"], "the arrow off the bar")


async def test_a_dialog_shows_its_own_keys_in_the_footer(make_app, fake_openai):
    fake_openai.responder = call_tool_when("note", ("write_note", {"text": "f"}))
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)

        def footer() -> list[str]:
            return footer_words(app)

        await pilot.press("f1")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "the help")
        # The dialog's keys and the ones that still work (quit, palette); none of the main screen's.
        await wait_for(pilot, lambda: footer() == ["esc", "Close", "^q", "Quit", "▏^p", "Palette"], "help's keys")
        await pilot.press("escape")
        await wait_for(pilot, lambda: "Send" in footer(), "the main screen's keys again")
        await send(pilot, "note it")
        await wait_for(pilot, lambda: app.inbox.gates, "the gate")
        await pilot.press("ctrl+g", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, GateDetailsScreen), "the gate details")
        await wait_for(pilot, lambda: footer()[:8] == ["a", "Approve", "s", "Approve", "session", "d", "Deny",
                                                        "x"], "the details' keys")
        assert "Open" not in footer() and "Gate" not in footer() and "Close" in footer()
        await pilot.press("a")
        await wait_chat(pilot, "noted: f")
        await wait_for(pilot, lambda: "Send" in footer(), "the main screen's keys again")


async def test_a_dialog_names_the_keys_the_keymap_gives_quit_and_the_palette(make_app):
    keymap = '[console.keymap]\n"app.quit" = "ctrl+x"\n"app.palette" = "ctrl+o"\n'
    app = make_app(extra_files={"aiops.toml": keymap})
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)

        def footer() -> list[str]:
            return footer_words(app)

        await pilot.press("f1")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "the help")
        await wait_for(pilot, lambda: footer() == ["esc", "Close", "^x", "Quit", "▏^o", "Palette"], "help's keys")
        await pilot.press("ctrl+o")  # the key the bar names works from the dialog
        await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette), "the palette")


async def test_every_pane_is_framed_and_the_side_pane_names_itself_when_alone(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        top = region_lines(app, "#main")[0]
        assert top.startswith("╭─ Sessions") and top.count("╭") == 3 and top.endswith("╮")
        await pilot.resize_terminal(80, 24)
        await pilot.press("f5")  # the side pane's prompt tab, alone on a narrow terminal
        await wait_for(pilot, lambda: region_lines(app, "#side")[0].startswith("╭─ Prompt"), "the framed tab")


async def test_the_frame_of_the_pane_holding_the_focus_is_drawn_in_the_accent_colour(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)

        def accented() -> set[str]:
            accent = Color.parse(app.theme_variables["accent"]).rgb
            lit = {pane for pane in ("#sessions-pane", "#chat", "#side")
                   if tuple(color_of(app, "╭", pane).triplet) == accent}
            # The titles with their frames (the side pane's tab bar names it on a wide terminal).
            titled = {pane for pane, title in (("#sessions-pane", "Sessions"), ("#chat", "Chat"))
                      if tuple(color_of(app, title, pane).triplet) == accent}
            assert titled == lit - {"#side"}, (titled, lit)
            return lit

        assert accented() == set()  # the input (below the chat's frame) has the focus
        await pilot.press("ctrl+g")  # to the gates inbox, in the side pane
        await wait_for(pilot, lambda: accented() == {"#side"}, "the side pane's frame lit")
        app.chat.focus()
        await wait_for(pilot, lambda: accented() == {"#chat"}, "only the chat's frame lit")
        app.sessions_list.focus()
        await wait_for(pilot, lambda: accented() == {"#sessions-pane"}, "only the sessions pane's frame lit")
        before = color_of(app, "╭", "#sessions-pane")
        app.theme = "nord"  # the lit frame follows the theme (its accent is not textual-dark's)
        await wait_for(pilot, lambda: color_of(app, "╭", "#sessions-pane") != before
                       and accented() == {"#sessions-pane"}, "the new theme's accent")
        app.chat_input.focus()
        await wait_for(pilot, lambda: accented() == set(), "no frame lit")


async def test_a_focus_move_repaints_the_frames_alone_and_the_terminal_shows_them_right(make_app, terminal):
    """Only the frames' cells are sent for a focus move (MainScreen's `_light_frame`), and the
    terminal shows what a whole redraw would: lit frame, titles, the panes' insides unchanged."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        terminal.start(app)

        def lit() -> set[str]:
            """The panes whose frame's every edge the terminal draws in the accent colour."""
            accent = Color.parse(app.theme_variables["accent"]).rgb
            out = set()
            for pane in ("#sessions-pane", "#chat", "#side"):
                r = app.screen.query_one(pane).region
                mid = r.y + r.height // 2
                edges = [terminal.grid[y][x] for x, y in ((r.x, r.y), (r.right - 1, r.y), (r.x, mid),
                                                         (r.right - 1, mid), (r.x + 2, r.bottom - 1))]
                assert "".join(ch for ch, _ in edges) == "╭╮││─", (pane, edges)
                colours = {tuple(style.color.triplet) if style and style.color else None for _, style in edges}
                assert len(colours) == 1, (pane, edges)  # the frame in one colour, edge to edge
                if colours == {accent}:
                    out.add(pane)
            return out

        async def moved(what: str, move: Callable[[], object], expected: set[str]) -> None:
            move()
            await pilot.pause()
            await pilot.pause()
            assert terminal.grid == full(app), what
            assert lit() == expected, what

        await moved("to the gates inbox", lambda: app.inbox.focus(), {"#side"})
        await moved("to the chat", lambda: app.chat.focus(), {"#chat"})
        await moved("to the sessions list", lambda: app.sessions_list.focus(), {"#sessions-pane"})
        await moved("another theme", lambda: setattr(app, "theme", "nord"), {"#sessions-pane"})
        await moved("back to the input", lambda: app.chat_input.focus(), set())
        await moved("to the gates inbox again", lambda: app.inbox.focus(), {"#side"})


async def test_session_rows_use_the_width_they_get(make_app, fake_openai):
    title = "please check the replication lag on every replica"
    models = {"local": {"type": "openai", "model_id": "fake-model", "base_url": fake_openai.url,
                        "system_prompt_folder": "noprompt-with-a-long-name"}}
    app = make_app(models=models)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, title)
        await wait_chat(pilot, "echo: " + title)
        # 120 columns: the title is cut to the pane, and the last activity keeps its place.
        rows = region_lines(app, "#sessions")
        assert rows[1].rstrip().endswith("…") and rows[2].rstrip().endswith("now")
        # 80 columns: the sessions tab is the full width, and the whole title shows.
        await pilot.resize_terminal(80, 24)
        app.main.show_pane("sessions")
        await wait_for(pilot, lambda: title in region_text(app, "#sessions"), "the whole title")
        assert region_lines(app, "#sessions")[2].rstrip().endswith("now")


async def test_the_key_bar_offers_cancel_while_a_turn_runs_and_keeps_it_while_typing(make_app, fake_openai):
    fake_openai.script(Reply.hang(after_chunks=1))
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await wait_for(pilot, lambda: "Send" in footer_words(app), "the input's keys")
        assert "Cancel" not in footer_words(app)
        await send(pilot, "a long job")
        await wait_for(pilot, lambda: "Cancel" in footer_words(app), "the cancel key")
        # Each keypress asks the bar again; the same keys stay, in the same order.
        keys = footer_words(app)
        await type_text(pilot, "more")
        await pilot.pause()
        assert footer_words(app) == keys and app.chat_input.text == "more"
        await pilot.press("escape")
        await wait_for(pilot, lambda: "Cancel" not in footer_words(app), "the cancel key to go")
        assert "Send" in footer_words(app)


def session_rows(app) -> list[str]:
    """The sessions pane's first lines (kind headings and each session's title line), stripped."""
    return [line.strip("│ ") for line in region_lines(app, "#sessions")]


async def test_the_sessions_list_keeps_newest_first_and_the_cursor_while_sessions_change(make_app, fake_openai):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        engine = app.adapter.engine
        await engine.run("script-a", "alpha from a script", kind="api", timeout=10)
        await engine.run("script-b", "beta from a script", kind="api", timeout=10)
        await wait_text(pilot, "api (2)")
        sessions = app.sessions_list

        def order() -> list[str]:
            """The two api sessions as the pane lists them, top first ([] while one is not shown)."""
            rows = session_rows(app)
            at = {sid: i for sid in ("script-a", "script-b") for i, row in enumerate(rows)
                  if row.startswith(f"{sessions.sessions[sid]['short_id']} ")}
            return sorted(at, key=at.__getitem__) if len(at) == 2 else []

        await wait_for(pilot, lambda: order() == ["script-b", "script-a"], "the newest first")
        sessions.focus()
        sessions.cursor = "script-a"
        # The older session speaks again: it moves to the top, and the cursor stays on it.
        await engine.run("script-a", "alpha again", kind="api", timeout=10)
        await wait_for(pilot, lambda: order() == ["script-a", "script-b"], "the session that spoke on top")
        assert sessions.cursor == "script-a"
        # The other one speaks: the order changes back, and the cursor still follows its session.
        await engine.run("script-b", "beta again", kind="api", timeout=10)
        await wait_for(pilot, lambda: order() == ["script-b", "script-a"], "the newest first again")
        assert sessions.cursor == "script-a"
        assert "api (2)" in screen_text(app) and "●" in region_text(app, "#sessions")


def row_is_bold(app, short_id: str) -> bool:
    """Whether the sessions pane draws the row of the session `short_id` with its id in bold."""
    strips = app.screen._compositor.render_strips()
    region = app.screen.query_one("#sessions").region
    for strip in strips[region.y:region.bottom]:
        line = strip.crop(region.x, region.right)
        if line.text.strip("│ ").startswith(f"{short_id} "):
            x = line.text.find(short_id)
            return any(bool(seg.style and seg.style.bold) for seg in line.crop(x, x + 1))
    raise AssertionError(f"session {short_id} is not in the sessions pane:\n{screen_text(app)}")


async def test_a_session_that_changes_in_place_is_redrawn_and_the_rows_around_it_stay_true(make_app, fake_openai):
    # Redraws that keep the order draw again only the rows whose sessions changed; each change a
    # row can show must still reach the screen: state, unread mark, the selected session's bold.
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        engine = app.adapter.engine
        await engine.run("script-a", "alpha from a script", kind="api", timeout=10)
        await engine.run("script-b", "beta from a script", kind="api", timeout=10)
        await wait_text(pilot, "api (2)")
        sessions = app.sessions_list
        short = {sid: str(sessions.sessions[sid]["short_id"]) for sid in ("script-a", "script-b")}
        console = str(sessions.sessions[app.selected]["short_id"])

        def row(sid: str) -> str:
            """The session's title line on screen ("" while it is not shown)."""
            return next((r for r in session_rows(app) if r.startswith(f"{short[sid]} ")), "")

        await wait_for(pilot, lambda: row("script-a") and row("script-b"), "both rows")
        await wait_for(pilot, lambda: "●" in row("script-b") and "●" in row("script-a"), "both unread")
        # The newest session runs again (the order stays): its row says so, the other's is as it was.
        fake_openai.script(Reply.hang(after_chunks=1))
        await engine.submit("script-b", "a long job", kind="api")
        await wait_for(pilot, lambda: row("script-b").startswith(f"{short['script-b']} ▶"), "b running")
        assert row("script-a").startswith(f"{short['script-a']} ·") and "●" in row("script-a")
        # Picked, it is shown in the chat: bold, and no longer unread; the console session loses its bold.
        assert row_is_bold(app, console) and not row_is_bold(app, short["script-b"])
        sessions.cursor = "script-a"  # the cursor away from both
        await app.select_session("script-b")
        await wait_for(pilot, lambda: "●" not in row("script-b"), "b read")
        await wait_for(pilot, lambda: row_is_bold(app, short["script-b"]) and not row_is_bold(app, console),
                       "the bold moved to b")
        # Stopped, it is idle again, in place.
        assert engine.stop_turn("script-b")
        await wait_for(pilot, lambda: row("script-b").startswith(f"{short['script-b']} ·"), "b idle")
        assert row("script-a").startswith(f"{short['script-a']} ·") and "●" in row("script-a")


async def api_sessions(pilot, app, count: int) -> tuple[list[str], Callable[[], list[str]]]:
    """`count` api sessions ("script-0" oldest), each with one answered message; their ids and a
    function giving them as the sessions pane shows them, top first (once shown newest first)."""
    engine = app.adapter.engine
    ids = [f"script-{i}" for i in range(count)]
    for sid in ids:
        await engine.run(sid, f"hello from {sid}", kind="api", timeout=10)
    await wait_text(pilot, f"api ({count})")
    by_short = {str(app.sessions_list.sessions[sid]["short_id"]): sid for sid in ids}

    def order() -> list[str]:
        return [by_short[r.split()[0]] for r in session_rows(app) if r.split() and r.split()[0] in by_short]

    await wait_for(pilot, lambda: order() == ids[::-1], "the newest first")
    return ids, order


async def test_rows_that_trade_places_open_the_session_they_show_by_key_and_by_click(make_app, fake_openai):
    # Sessions that speak rise within their kind without the list being set again (the rows between
    # trade places): the cursor stays on its session, down goes to the row shown below it, and a
    # click opens the session drawn where the mouse is.
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        engine = app.adapter.engine
        ids, order = await api_sessions(pilot, app, 5)
        sessions = app.sessions_list
        short = {sid: str(sessions.sessions[sid]["short_id"]) for sid in ids}
        sessions.focus()
        sessions.cursor = "script-2"
        for sid in ("script-0", "script-1"):  # the two oldest speak, in turn: each rises to the top
            await engine.run(sid, f"again from {sid}", kind="api", timeout=10)
        want = ["script-1", "script-0", "script-4", "script-3", "script-2"]
        await wait_for(pilot, lambda: order() == want, "the two that spoke on top")
        assert sessions.cursor == "script-2"
        await pilot.press("up")  # the row shown above the cursor's
        assert sessions.cursor == "script-3"
        await pilot.press("enter")
        await wait_chat(pilot, "hello from script-3")
        assert app.selected == "script-3"
        # A click on the row that shows script-0 (it moved from the bottom to the second place).
        rows = region_lines(app, "#sessions")
        y = next(i for i, r in enumerate(rows) if r.strip("│ ").startswith(f"{short['script-0']} "))
        await pilot.click("#sessions", offset=(3, y))
        await wait_chat(pilot, "again from script-0")
        assert app.selected == "script-0"


async def test_a_session_out_of_sight_that_speaks_leaves_the_rows_in_sight_where_they_are(make_app, fake_openai):
    # The operator has scrolled down the list; a session above what they see speaks and rises to
    # the top of its kind: the rows they are looking at stay put, the cursor on its session.
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        engine = app.adapter.engine
        ids = [f"script-{i:02d}" for i in range(30)]  # more rows than the pane shows
        for sid in ids:
            await engine.run(sid, f"hello from {sid}", kind="api", timeout=10)
        await wait_text(pilot, "api (30)")
        sessions = app.sessions_list
        sessions.focus()
        await pilot.press("end")  # the oldest, at the bottom
        for _ in range(4):
            await pilot.press("up")  # the cursor a few rows above the bottom: nothing scrolls
        assert sessions.cursor == "script-04"
        seen = session_rows(app)
        assert "api (30)" not in " ".join(seen)  # the group's heading is scrolled out of sight
        await engine.run("script-28", "again", kind="api", timeout=10)  # second from the top
        await wait_for(pilot, lambda: sessions.listing().index("script-28") < sessions.listing().index("script-29"),
                       "the session that spoke on top")
        await pilot.pause()
        assert session_rows(app) == seen
        assert sessions.cursor == "script-04"


async def test_the_order_holds_while_the_operator_moves_the_cursor_and_follows_once_they_stop(make_app, fake_openai):
    # Sessions streaming reorder the list; while the operator is moving the cursor the rows keep
    # their places (the row seen below the cursor is the one the next key reaches), and the new
    # order is shown once they have stopped for a moment (SETTLE).
    clock = ManualClock()
    app = make_app(clock=clock)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        engine = app.adapter.engine
        ids, order = await api_sessions(pilot, app, 4)
        sessions = app.sessions_list
        sessions.focus()
        sessions.cursor = "script-3"
        await pilot.press("down")  # the operator is moving through the list
        assert sessions.cursor == "script-2"
        before = sessions.sessions["script-0"].get("updated_at")
        await engine.run("script-0", "again from script-0", kind="api", timeout=10)  # the oldest speaks
        await wait_for(pilot, lambda: sessions.sessions["script-0"].get("updated_at") != before, "its activity")
        for _ in range(3):  # redraws come and go (REDRAW_EVERY); the clock has not moved
            await asyncio.sleep(REDRAW_EVERY)
            await pilot.pause()
        assert order() == ids[::-1], "the rows moved under a moving cursor"
        await pilot.press("down")  # the row shown below the cursor's
        assert sessions.cursor == "script-1"
        clock.advance(SETTLE + 0.1)  # the operator stopped
        await wait_for(pilot, lambda: order() == ["script-0", "script-3", "script-2", "script-1"],
                       "the new order once the cursor rests")
        assert sessions.cursor == "script-1"
