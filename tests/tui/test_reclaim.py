"""A chat taken off the screen is freed: switching sessions all day does not grow the console.

Textual's widgets hold one another in cycles, so only a full run of Python's collector frees a
chat once another session is shown, and the console runs the collector the way `aiops` runs it
(a high young threshold, the start-up heap frozen): rarely. aiops/tui/reclaim.py collects once
enough widgets have gone."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from textual.widget import Widget

from aiops.engine import gc_policy
from aiops.tui.reclaim import QUIET
from tests.fakes.openai_server import Reply
from tests.tui.conftest import SIZE, ManualClock, ready, send, wait_for, wait_text

LONG = "\n\n".join(f"## Part {i}\n\nSome text about part {i}, with **bold** and `code`.\n\n- one\n- two\n\n"
                   f"```\nblock {i}\n```" for i in range(40))


@pytest.fixture
def console_collector() -> Iterator[None]:
    """The collector as the console process runs it (running.calm_collector, gc_policy.settle)."""
    before = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(gc_policy.YOUNG_THRESHOLD, before[1], before[2])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


def widgets_alive() -> int:
    """Widgets the collector tracks: those on screen and those waiting for it."""
    return sum(isinstance(o, Widget) for o in gc.get_objects())


async def test_switching_to_a_long_session_and_away_again_and_again_frees_what_it_held(
        make_app, fake_openai, console_collector) -> None:
    fake_openai.script(Reply.text(LONG))
    clock = ManualClock()  # the time since the operator's last key: it moves when the test says
    app = make_app(clock=clock)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        long_sid = app.selected
        await send(pilot, "write a lot")
        await wait_text(pilot, "block 39")
        await pilot.press("ctrl+n")
        await wait_for(pilot, lambda: app.selected != long_sid and app.chat.session_id == app.selected, "a new session")
        short_sid = app.selected
        await send(pilot, "hi")
        await wait_text(pilot, "echo: hi")
        await pilot.pause(1.5)
        held = 0
        base = widgets_alive()

        async def pick(sid: str, shows: str) -> None:  # as the operator does: enter on its row
            app.sessions_list.cursor = sid
            app.sessions_list.focus()
            await pilot.press("enter")
            await wait_text(pilot, shows)

        for _ in range(4):
            await pick(long_sid, "block 39")
            app.chat.focus()
            await pilot.press("home")  # read from the top: the whole answer is drawn
            await wait_text(pilot, "Part 0")
            held = max(held, len(app.chat.walk_children()))
            await pick(short_sid, "echo: hi")
        assert held > 300  # a long chat: what goes when the operator leaves it
        # Not while the operator goes from session to session, or types (the collection holds the
        # loop for a moment): keys a moment ago, seconds ago in real time.
        for key in "typing":
            await pilot.press(key)
            await pilot.pause(0.4)
        assert app.reclaim.collections == 0 and app.chat_input.text.endswith("typing")
        # The keys left alone: four long chats were shown and left, and soon at most one's worth
        # of widgets is still about.
        clock.advance(QUIET)
        await wait_for(pilot, lambda: widgets_alive() - base < held, "the chats left to be freed", timeout=5)
