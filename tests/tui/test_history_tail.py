"""A session whose history holds a long Markdown answer opens at the answer's end without building
the rest, and scrolling up draws the rest in order (aiops/tui/widgets/answer_tail.py)."""

from __future__ import annotations

import re

from textual.widgets._markdown import MarkdownBlock

from aiops.engine.types import Message
from aiops.tui.widgets.answer_tail import HeldBlocks, TailFirstMarkdown
from aiops.tui.widgets.chat import AssistantMessage, widgets_for_history
from tests.tui.conftest import SIZE, chat_text, ready, wait_chat, wait_for

SECTIONS = 30


def section(n: int) -> str:
    return f"""## Section {n}

The deploy goes in three steps, each of them *checked* before the next one starts, in part {n}.

- drain pool {n} and wait for its queue to empty
- apply the migration on the replica, then on the primary

```python
def drain(pool: str = "p{n}") -> None:
    wait_until(lambda: queue_length(pool) == 0)
```

Roll back part {n} in the other order if the error rate climbs.
"""


ANSWER = "\n".join(section(n) for n in range(1, SECTIONS + 1)) + "\nThat is the whole runbook.\n"
QUESTION = "write the runbook for the migration"


async def _open_long(pilot, app) -> None:
    store = app.adapter.engine.store
    await store.create_session("long-1", "api", None)
    await store.add_message("long-1", Message("user", QUESTION))
    await store.add_message("long-1", Message("assistant", ANSWER))
    await app.select_session("long-1")
    await wait_chat(pilot, "That is the whole runbook.")


def _sections_in_sight(app) -> list[int]:
    return [int(n) for n in re.findall(r"Section (\d+)", chat_text(app))]


async def test_a_long_answer_opens_at_its_end_with_a_screenful_built_and_scrolling_up_draws_the_rest_in_order(
        make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await _open_long(pilot, app)
        chat = app.chat
        await pilot.pause()
        assert chat.scroll_y == chat.max_scroll_y  # at the end, following
        # The blocks built are about two screens of the answer's end, not all of them.
        message = chat.query(AssistantMessage).last()
        blocks = len(message.markdown._build_from_source(ANSWER))  # top-level: 151 (211 mounted)
        built = len(chat.query(MarkdownBlock))  # nested ones too
        assert built < blocks / 3, (built, blocks)
        assert _sections_in_sight(app)[-1] == SECTIONS
        # Page by page up to the top: every section shows, in order, none skipped, and the lines in
        # sight never jump back down the answer when the part above them is built.
        chat.focus()
        seen: list[int] = _sections_in_sight(app)
        for _ in range(200):
            if chat.scroll_y == 0 and not chat.query(HeldBlocks):
                break
            before = _sections_in_sight(app)
            await pilot.press("pageup")
            await wait_for(pilot, lambda: chat.scroll_y == chat.scroll_target_y, "the page scrolled")
            await pilot.pause()
            now = _sections_in_sight(app)
            if before and now:
                assert now[0] <= before[0], (before, now)
            seen = sorted(set(seen) | set(now))
        assert seen == list(range(1, SECTIONS + 1))
        text = chat_text(app)
        assert QUESTION in text and "Section 1 " in text + " "
        # The whole answer is built now, as Textual's Markdown builds it: the same blocks, in order.
        assert [(type(b).__name__, b.source_range) for b in message.markdown.children] == [
            (type(b).__name__, b.source_range) for b in message.markdown._build_from_source(ANSWER)]
        # And back to the end.
        await pilot.press("end")
        await wait_for(pilot, lambda: chat.scroll_y == chat.max_scroll_y, "the end")
        await wait_chat(pilot, "That is the whole runbook.")


async def test_home_in_a_long_answer_shows_its_beginning(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await _open_long(pilot, app)
        chat = app.chat
        assert chat.query(HeldBlocks)
        chat.focus()
        await pilot.press("home")
        await wait_for(pilot, lambda: chat.scroll_y == 0, "the top")
        await wait_chat(pilot, QUESTION)
        await wait_for(pilot, lambda: _sections_in_sight(app)[:1] == [1], "the answer's beginning")


def test_only_answers_longer_than_the_first_lines_are_drawn_from_their_end():
    short = [Message("user", "hi", id=1), Message("assistant", "hello\n\nthere", id=2)]
    widgets = widgets_for_history(short, tail_lines=80)
    assert not any(isinstance(w, AssistantMessage) and isinstance(w.markdown, TailFirstMarkdown) for w in widgets)
    # Below a long answer, a later exchange takes its share of the lines drawn first.
    history = [Message("user", QUESTION, id=1), Message("assistant", ANSWER, id=2),
               Message("user", "thanks", id=3), Message("assistant", "\n".join(["ok"] * 30), id=4)]
    long = widgets_for_history(history, tail_lines=80)[1]
    assert isinstance(long, AssistantMessage) and isinstance(long.markdown, TailFirstMarkdown)
    assert long.markdown._tail_lines == 80 - 2 - 31
