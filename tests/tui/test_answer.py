"""A streamed answer on screen (aiops/tui/widgets/answer.py, aiops/tui/pacing.py): whatever the
pieces it arrives in, what the operator sees at each step is what Textual draws for the same text
from scratch; while the operator types it is drawn in fewer, larger steps, and nothing is lost."""

from __future__ import annotations

import asyncio
import re

import pytest
from textual.app import App, ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Markdown

from aiops.tui.pacing import DRAW_GAP, TYPING_GAP, TYPING_WINDOW, AnswerPacing
from aiops.tui.widgets.answer import AnswerMarkdown, AnswerStream
from aiops.tui.widgets.chat import AssistantMessage
from tests.fakes.openai_server import Reply
from tests.tui.conftest import SIZE, ManualClock, ready, send, wait_chat, wait_for

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
            await pilot.pause()
            await reference.pause()
            assert _lines(streamed) == _lines(whole), f"after {text[-60:]!r}"
        assert "Rollback" in "\n".join(_lines(streamed))  # the setext heading, drawn as one


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
    """Stands in for the answer's Markdown: what was appended, and when."""

    is_attached = True

    def __init__(self) -> None:
        self.appends: list[tuple[float, str]] = []

    async def append(self, text: str) -> None:
        self.appends.append((asyncio.get_running_loop().time(), text))


async def test_text_that_comes_in_between_two_draws_goes_in_whole_with_the_next():
    markdown = Recorded()
    stream = AnswerStream(markdown, lambda: 0.2)  # type: ignore[arg-type]
    words = [f"w{i} " for i in range(30)]
    for word in words:  # 30 deltas over ~0.3 s
        await stream.write(word)
        await asyncio.sleep(0.01)
    await stream.stop()
    assert "".join(text for _, text in markdown.appends) == "".join(words)
    assert markdown.appends[0][1] == "w0 "  # the first text is drawn at once
    assert 2 <= len(markdown.appends) <= 4  # then at most one draw per 0.2 s, and what stop() had
    times = [t for t, _ in markdown.appends]
    assert all(b - a >= 0.19 for a, b in zip(times[:-2], times[1:-1], strict=True))


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
