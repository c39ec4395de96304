"""A streamed answer on screen (aiops/tui/widgets/answer.py, aiops/tui/pacing.py): whatever the
pieces it arrives in, what the operator sees at each step is what Textual draws for the same text
from scratch; while the operator types it is drawn in fewer, larger steps, and nothing is lost."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from textual.app import App, ComposeResult
from textual.containers import VerticalScroll
from textual.geometry import Region
from textual.pilot import Pilot
from textual.widgets import Markdown

from aiops.tui import layout_map
from aiops.tui.pacing import DRAW_GAP, TYPING_GAP, TYPING_WINDOW, AnswerPacing
from aiops.tui.widgets.answer import AnswerMarkdown, AnswerStream
from aiops.tui.widgets.chat import AssistantMessage, EmptyHint
from tests.fakes.openai_server import Reply
from tests.support.terminal import full
from tests.tui.conftest import SIZE, ManualClock, ready, region_lines, send, wait_chat, wait_for

# Every kind of block an answer streams, and the ways a block changes as text comes in: a line
# that wraps, a list that gains items and nested items, numbers that widen (9 → 10), code that
# gains lines and a language, a paragraph that turns into a heading (setext), a quote, a table.
ANSWER = """## Rolling out the change

The deploy goes in three steps, each of them *checked* before the next one starts. Nothing here is
`urgent`, but the window closes at six, so the **order** matters more than the speed.

- drain the first pool and wait for its queue to empty
- apply the migration on the replica, then on the primary
  - nested, with a text long enough to wrap around this narrow chat twice over at least
  - nested two
- bring the pool back and watch the error rate for ten minutes

1. one
2. two
3. three
4. four
5. five
6. six
7. seven
8. eight
9. nine
10. ten
11. eleven

```python
def drain(pool: str, timeout: float = 60.0) -> None:
    for host in hosts(pool):
        host.stop_accepting()
```

Rollback
--------

> a quote
> that goes on

| step | owner |
|------|-------|
| drain | ops |
| migrate | dba |

If the error rate climbs, roll back with the same steps in the other order; the replica first.
"""
TOKENS = re.findall(r"\s*\S+|\s+", ANSWER)


class Side(App[None]):
    """One Markdown in a narrow scrolling column, as the chat shows an answer."""

    CSS = "VerticalScroll { width: 64; } Markdown { height: auto; }"

    def __init__(self, markdown: Markdown) -> None:
        super().__init__()
        self.markdown = markdown

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield self.markdown


def _lines(app: App[None]) -> list[str]:
    return [strip.text.rstrip() for strip in app.screen._compositor.render_strips()]


async def _alike(streamed: Pilot[None], whole: Pilot[None], what: str) -> None:
    """Both sides show the same lines, within a few frames: a block mounted by either side reaches
    the screen a frame or two later (seen once in a few runs: the streamed side's new paragraph not
    drawn yet after one pause)."""
    for _ in range(10):
        await streamed.pause()
        await whole.pause()
        if _lines(streamed.app) == _lines(whole.app):
            break
    assert _lines(streamed.app) == _lines(whole.app), what


@pytest.mark.parametrize("piece", [3, 7])  # pieces of 1 pass too (80 s)
async def test_an_answer_streamed_in_any_pieces_looks_at_each_step_as_the_same_text_drawn_whole(piece):
    streamed, whole = Side(AnswerMarkdown()), Side(Markdown())
    async with streamed.run_test(size=(80, 160)) as pilot, whole.run_test(size=(80, 160)) as reference:
        text = ""
        for i in range(0, len(TOKENS), piece):
            fragment = "".join(TOKENS[i:i + piece])
            text += fragment
            await streamed.markdown.append(fragment)
            await whole.markdown.update(text)
            await _alike(pilot, reference, f"after {text[-60:]!r}")
        assert "Rollback" in "\n".join(_lines(streamed))  # the setext heading, drawn as one


class Resizable(Side):
    """As Side, the column as wide as the terminal allows (64 at most), so a resize reflows it."""

    CSS = "VerticalScroll { width: 1fr; max-width: 64; } Markdown { height: auto; }"


async def test_a_streamed_answer_resized_looks_as_the_same_text_drawn_whole_at_that_size():
    """The answer's blocks keep their box models while their container's width holds (its height
    grows with every line: aiops/tui/widgets/settled.py): a new width, or a new viewport, must
    still reflow every one of them."""
    streamed, whole = Resizable(AnswerMarkdown()), Resizable(Markdown())
    async with streamed.run_test(size=(80, 160)) as pilot, whole.run_test(size=(80, 160)) as reference:
        text = ""
        for i in range(0, len(TOKENS), 9):
            fragment = "".join(TOKENS[i:i + 9])
            text += fragment
            await streamed.markdown.append(fragment)
        await whole.markdown.update(text)
        for width, height in ((80, 160), (50, 160), (37, 200), (90, 120), (64, 160)):
            await pilot.resize_terminal(width, height)
            await reference.resize_terminal(width, height)
            await _alike(pilot, reference, f"at {width}x{height}")
            assert "Rollback" in "\n".join(_lines(streamed))


async def test_text_added_without_a_new_line_shows_whole_at_a_width_laid_out_before():
    """A block that takes new text in the same number of lines is only repainted. At another width
    the same text may need another line: laid out again at a width it was measured at before (a
    pane shown again, the terminal resized back), it must not keep its old height. (Found by a
    reviewer: the second line was cut off until the block next grew.)"""
    streamed, whole = Resizable(AnswerMarkdown()), Resizable(Markdown())
    async with streamed.run_test(size=(80, 40)) as pilot, whole.run_test(size=(80, 40)) as reference:
        async def same_at(width: int) -> None:
            await pilot.resize_terminal(width, 40)
            await reference.resize_terminal(width, 40)
            await _alike(pilot, reference, f"at width {width}")

        await streamed.markdown.append("alpha beta gamma delta")
        await whole.markdown.update("alpha beta gamma delta")
        await same_at(30)
        await same_at(80)
        await streamed.markdown.append(" epsilon zeta eta theta")  # still one line at 80
        await whole.markdown.update("alpha beta gamma delta epsilon zeta eta theta")
        await same_at(80)
        await same_at(30)  # two lines here
        assert "theta" in "\n".join(_lines(streamed))


async def test_a_streamed_answer_lays_the_screen_out_about_once_per_draw():
    """Each layout of the screen is a frame of the whole chat (25-110 ms on a 2-core machine with a
    long answer): a paragraph or heading mounted by a draw must not ask for a second one of its own
    afterwards. Lists and tables may still take two; over the answer, no more than one per draw."""
    app = Side(AnswerMarkdown())
    async with app.run_test(size=(80, 160)) as pilot:
        await pilot.pause()
        screen = app.screen
        layouts = 0
        refresh_layout = screen._refresh_layout

        def counted(size: Any = None, scroll: bool = False) -> None:
            nonlocal layouts
            layouts += screen._layout_required
            refresh_layout(size, scroll)

        screen._refresh_layout = counted  # type: ignore[method-assign]  # observed, not changed
        per_draw = []
        for i in range(0, len(TOKENS), 7):
            before = layouts
            await app.markdown.append("".join(TOKENS[i:i + 7]))
            for _ in range(5):  # a late request would come within these
                await pilot.pause()
            per_draw.append(layouts - before)
        assert sum(per_draw) <= len(per_draw), per_draw
        assert "Rollback" in "\n".join(_lines(app))


async def test_a_streamed_answers_layout_arranges_the_screen_once():
    """A layout arranges every widget of the screen, off-screen blocks included, and that map is
    what later lookups use (aiops/tui/layout_map.py): the blocks whose size it changed ask for
    their region as they are marked to repaint, and with Textual's own flag left stale by the
    block just mounted, that arranged the whole screen again in most of the answer's layouts. The
    regions it gives are the ones a fresh arrangement gives."""
    layout_map.install()  # as the console does
    app = Side(AnswerMarkdown())
    async with app.run_test(size=(80, 30)) as pilot:  # most of the answer off screen
        await pilot.pause()
        screen = app.screen
        compositor = screen._compositor
        layouts = arranged = 0  # arrangements within a layout
        in_layout = False
        refresh_layout, arrange_root = screen._refresh_layout, compositor._arrange_root

        def counted_layout(size: Any = None, scroll: bool = False) -> None:
            nonlocal layouts, in_layout
            layouts += 1
            in_layout = True
            try:
                refresh_layout(size, scroll)
            finally:
                in_layout = False

        def counted_arrange(*args: Any, **kw: Any) -> Any:
            nonlocal arranged
            arranged += in_layout
            return arrange_root(*args, **kw)

        screen._refresh_layout = counted_layout  # type: ignore[method-assign]  # observed, not changed
        compositor._arrange_root = counted_arrange  # type: ignore[method-assign]
        for i in range(0, len(TOKENS), 7):
            await app.markdown.append("".join(TOKENS[i:i + 7]))
            for _ in range(3):
                await pilot.pause()
            fresh, _ = arrange_root(screen, compositor.size, visible_only=False)
            assert {w: fresh[w].region for w in app.markdown.walk_children()} == {
                w: w.region for w in app.markdown.walk_children()}, f"after {i} tokens"
        assert layouts >= 20
        assert arranged == layouts, (arranged, layouts)  # it was ~1.5 a layout

        def same_as_fresh(what: str) -> None:
            fresh, _ = arrange_root(screen, compositor.size, visible_only=False)
            assert {w: fresh[w].region for w in fresh} == {w: w.region for w in fresh}, what

        column = app.query_one(VerticalScroll)
        column.scroll_end(animate=False)  # a scroll's layout arranges only what is in sight
        await pilot.pause()
        await pilot.pause()
        same_as_fresh("scrolled to the end")
        await app.markdown.children[0].remove()  # the blocks below it move up
        await pilot.pause()
        await pilot.pause()
        same_as_fresh("a block removed")


def test_the_answer_is_drawn_less_often_while_the_operator_types():
    clock = ManualClock()
    pacing = AnswerPacing(clock)
    assert pacing.gap() == DRAW_GAP
    pacing.key()
    clock.advance(TYPING_WINDOW / 2)
    assert pacing.gap() == TYPING_GAP
    clock.advance(TYPING_WINDOW)
    assert pacing.gap() == DRAW_GAP


class Recorded:
    """Stands in for the answer's Markdown: what was appended, and when (each append taking
    `delay` seconds; the first `fail` of them failing)."""

    is_attached = True

    def __init__(self, delay: float = 0.0, fail: int = 0) -> None:
        self.appends: list[tuple[float, float, str]] = []  # start, end, text
        self.delay, self.fail = delay, fail

    async def append(self, text: str) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        await asyncio.sleep(self.delay)
        if self.fail:
            self.fail -= 1
            raise RuntimeError("a block that could not be drawn")
        self.appends.append((start, loop.time(), text))

    @property
    def text(self) -> str:
        return "".join(text for _, _, text in self.appends)


async def test_text_that_comes_in_between_two_draws_goes_in_whole_with_the_next():
    markdown = Recorded()
    stream = AnswerStream(markdown, lambda: 0.2)  # type: ignore[arg-type]
    words = [f"w{i} " for i in range(30)]
    for word in words:  # 30 deltas over ~0.3 s
        await stream.write(word)
        await asyncio.sleep(0.01)
    await stream.stop()
    assert markdown.text == "".join(words)
    assert markdown.appends[0][2] == "w0 "  # the first text is drawn at once
    assert 2 <= len(markdown.appends) <= 4  # then at most one draw per 0.2 s, and what stop() had
    starts = [start for start, _, _ in markdown.appends]
    assert all(b - a >= 0.19 for a, b in zip(starts[:-2], starts[1:-1], strict=True))


async def test_the_turn_ending_mid_draw_waits_for_it_and_draws_the_rest_after():
    markdown = Recorded(delay=0.05)
    stream = AnswerStream(markdown, lambda: 0.0)  # type: ignore[arg-type]
    await stream.write("first ")
    await asyncio.sleep(0.01)  # its draw under way
    await stream.write("second")
    await stream.stop()
    assert markdown.text == "first second"
    assert all(end <= next_start for (_, end, _), (next_start, _, _)
               in zip(markdown.appends, markdown.appends[1:], strict=False)), markdown.appends


async def test_a_draw_that_fails_leaves_the_stream_going():
    markdown = Recorded(fail=1)
    stream = AnswerStream(markdown, lambda: 0.0)  # type: ignore[arg-type]
    await stream.write("lost on screen until the end ")
    await asyncio.sleep(0.01)
    await stream.write("and then")
    await asyncio.sleep(0.01)
    await stream.stop()  # no error: the turn's end draws the whole text again
    assert markdown.text == "and then"


async def test_an_answer_streaming_while_the_operator_types_is_whole_when_it_ends_and_the_draft_is_kept(
        make_app, fake_openai):
    # Text comes in while the keys are typed; the last chunks wait until they are.
    chunks = len(TOKENS) // 2
    fake_openai.script(Reply.text(ANSWER, chunks=chunks, chunk_delay=0.005, hold_after=chunks - 2))
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "how do we roll out?")
        answer = await wait_for(pilot, lambda: app.chat.query(AssistantMessage).first(None), "the answer")
        for letter in "next question":  # typed while the answer comes in
            await pilot.press(letter if letter != " " else "space")
        assert answer.streaming
        fake_openai.release()
        await wait_for(pilot, lambda: not answer.streaming, "the answer's end")
        await wait_chat(pilot, "the replica first.")
        assert [m.text for m in app.chat.query(AssistantMessage)] == [ANSWER]
        assert app.chat_input.text == "next question"
        app.chat.scroll_home(animate=False)
        await wait_chat(pilot, "Rolling out the change")


async def test_a_key_drawn_at_once_leaves_other_changes_waiting_for_the_next_frame_drawn(make_app):
    # A typed letter is drawn in a frame of the input alone (MainScreen.draw_now); a repaint-only
    # change queued just before it (a word added to the answer on screen, here the fresh
    # session's hint) must still go to the terminal with the next frame. What a frame sends is
    # the compositor's dirty regions when it renders (screen_text would render the widgets
    # afresh and show the new text either way).
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.pause(0.5)  # the screen settled
        compositor = app.main._compositor
        sent: list[Region] = []
        render_update = compositor.render_update

        def spy(*args: Any, **kw: Any) -> Any:
            sent.extend(compositor._dirty_regions)
            return render_update(*args, **kw)

        compositor.render_update = spy  # type: ignore[method-assign]
        hint = app.chat.query_one(EmptyHint)
        hint.update("a word added meanwhile", layout=False)
        for _ in range(5000):  # the hint's repaint reaches the screen's queue, not yet a frame
            if hint in app.main._dirty_widgets:
                break
            await asyncio.sleep(0)
        assert hint in app.main._dirty_widgets
        sent.clear()
        app.chat_input.insert("x")
        assert app.main.draw_now(app.chat_input)
        await pilot.pause(0.3)
        assert any(region.overlaps(hint.region) for region in sent), "the hint's new text never went out"


async def test_an_answer_growing_in_the_chat_leaves_the_chats_own_lines_as_they_were(make_app, terminal):
    """What the chat holds growing is a new virtual size for it; its own lines (its frame, its
    padding) are the same, and are not rendered again at every draw of the answer (they were,
    ~30 a layout). The terminal still shows what a full render shows: the frame, the scrollbar
    following the answer, the answer's last line in sight."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.pause(0.3)
        message = AssistantMessage(status="streaming")
        await app.chat.mount(message)
        for _ in range(3):
            await pilot.pause()
        terminal.start(app)
        chat = app.chat
        own_lines = 0
        render_line = chat.render_line

        def counting(y: int) -> Any:
            nonlocal own_lines
            own_lines += 1
            return render_line(y)

        chat.render_line = counting  # type: ignore[method-assign]  # observed, not changed
        tokens = TOKENS * 2
        for i in range(0, len(tokens), 9):
            await message.markdown.append("".join(tokens[i:i + 9]))
            await pilot.pause()
            await pilot.pause()
        await pilot.pause(0.2)
        drawn, own_lines = own_lines, 0
        assert chat.max_scroll_y > 0 and chat.scroll_y == chat.max_scroll_y  # it scrolled, following
        assert terminal.grid == full(app)
        assert any("first." in line for line in region_lines(app, "#chat")[-4:])  # the answer's end
        assert drawn <= 2 * chat.size.height, drawn  # a first draw of them at most; it was ~30 a layout
        # And when what it holds shrinks back under its height, the scrollbar goes.
        await message.remove()
        for _ in range(3):
            await pilot.pause()
        assert chat.max_scroll_y == 0 and not chat.show_vertical_scrollbar
        assert terminal.grid == full(app)
