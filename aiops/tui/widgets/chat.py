"""The chat pane: one session's history and its live turn.

History loads the latest page first with "load earlier" on demand. A live answer streams through
one `AnswerStream` per message, at the console's pace (aiops/tui/pacing.py), into Markdown whose
growing last block updates in place (aiops/tui/widgets/answer.py), and gets one full re-render
when that message is complete.
Thinking and tool calls are collapsible blocks; gate decisions, notices, command output and errors
are lines styled apart. The view follows the bottom only while the reader is there (Textual's
anchor: scrolling up releases it, scrolling back to the end restores it).

The conversation reads turn by turn, live and from history alike: a message sent while a turn runs
is committed (and posted) at once, before that turn's answer, so every widget is kept with its
turn's (`ChatView._turn_of`) and what a turn adds goes after that turn's last widget, above any
prompt queued behind it; history is regrouped the same way (`engine.context.by_turn`). What the
store never keeps is drawn only while it is true: a queued turn's "queued behind the running turn"
note until that turn begins, a gate's wait (on the call it holds) until the gate is answered.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from textual import on
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.geometry import Size
from textual.message import Message
from textual.reactive import Reactive
from textual.widget import Widget
from textual.widgets import Button, Collapsible, Static

from aiops.engine import events as ev
from aiops.engine.client_tools import CLIENT_CALLS
from aiops.engine.context import by_turn
from aiops.gates.broker import waiting_notice
from aiops.tui.format import args_preview, duration, gate_outcome, one_line, pretty_json, sql_of
from aiops.tui.keys import bindings_for, display_keys, first_key, render_help
from aiops.tui.widgets.fitted import HangingText
from aiops.tui.widgets.settled import Settled

if TYPE_CHECKING:
    from textual.widgets import Markdown

    from aiops.engine.events import Event
    from aiops.engine.types import Message as HistoryMessage
    from aiops.tui.widgets.answer import AnswerStream

PREVIEW_LINES = 30
# A client tool's call (see engine.client_tools) until its result comes: it runs in the chat
# client, which sends the result with its next request; aiops does not gate it.
CLIENT_CALL = "client tool call: runs in the chat client"
# A call its gate holds, until the gate is answered (approved, denied, timed out, cancelled).
WAITING = "waiting for operator approval (gates inbox)"


def _esc(text: str) -> Content:
    return Content(text)


class UserMessage(Static):
    """What the user (or a client) sent."""

    def __init__(self, text: str, *, command: bool = False, model: str | None = None,
                 who: str = "you") -> None:
        head = "!" if command else "›"
        label = f"{who} @{model}" if model else who
        super().__init__(Content.assemble((f"{head} {label}\n", "bold"), text),
                         classes="msg user" + (" command" if command else ""))
        self.text = text


class ThinkingBlock(Collapsible):
    def __init__(self, text: str = "") -> None:
        self.body = Static(_esc(text), classes="thinking-text")
        super().__init__(self.body, title=self._title_for(text), collapsed=True, classes="thinking")
        self.text = text

    @staticmethod
    def _title_for(text: str) -> str:
        words = len(text.split())
        return f"thinking ({words} word{'s' if words != 1 else ''})" if words else "thinking…"

    def append(self, text: str) -> None:
        self.text += text
        self.body.update(_esc(self.text))
        self.title = self._title_for(self.text)


class AssistantMessage(Settled, Vertical):
    """One assistant message: optional thinking, then Markdown (streamed while live)."""

    def __init__(self, text: str = "", thinking: str = "", *, status: str = "complete",
                 model: str | None = None, tail_lines: int | None = None) -> None:
        """`tail_lines`: a long answer of the history, drawn from its end, about that many lines of
        its source at first and the rest as the reader scrolls up to it (widgets/answer_tail.py)."""
        super().__init__(classes="msg assistant" + (" cancelled" if status == "cancelled" else ""))
        self.text = text
        # Imported on first use (markdown-it: 60 modules): the console's first frame has none.
        from aiops.tui.widgets.answer import AnswerMarkdown

        if tail_lines is None:
            self.markdown: Markdown = AnswerMarkdown(text, classes="answer")
        else:
            from aiops.tui.widgets.answer_tail import TailFirstMarkdown

            self.markdown = TailFirstMarkdown(text, tail_lines=tail_lines, classes="answer")
        self.thinking_block: ThinkingBlock | None = ThinkingBlock(thinking) if thinking else None
        self._stream: AnswerStream | None = None
        self.status = status
        self.model = model

    def compose(self) -> Iterable[Widget]:
        if self.thinking_block is not None:
            yield self.thinking_block
        yield self.markdown
        if self.status == "cancelled":
            yield Static("(cancelled)", classes="cancelled-mark")

    @property
    def streaming(self) -> bool:
        return self._stream is not None

    async def write(self, text: str) -> None:
        if self._stream is None:
            from aiops.tui.widgets.answer import AnswerStream

            # The console's pace (aiops/tui/pacing.py); an App without one draws each batch.
            pacing = getattr(self.app, "pacing", None)
            self._stream = AnswerStream(self.markdown, pacing.gap if pacing is not None else lambda: 0.0)
        self.text += text
        await self._stream.write(text)

    async def think(self, text: str) -> None:
        if self.thinking_block is None:
            self.thinking_block = ThinkingBlock()
            await self.mount(self.thinking_block, before=self.markdown)
        self.thinking_block.append(text)

    async def finish(self) -> None:
        """End the stream and render the whole message once more, now that it is complete."""
        stream, self._stream = self._stream, None
        if stream is not None:
            await stream.stop()
            await self.markdown.update(self.text)


class ToolArgs(Widget):
    """A tool call's arguments, highlighted when first drawn: a collapsed block (every block of a
    history page, until opened) never is, and highlighting was a third of showing a page."""

    DEFAULT_CSS = "ToolArgs { height: auto; }"

    def __init__(self, arguments: Any) -> None:
        super().__init__(classes="tool-args")
        self.arguments = arguments
        self._content: Content | None = None

    def render(self) -> Content:
        if self._content is None:
            self._content = self.highlighted(self.arguments)
        return self._content

    @staticmethod
    def highlighted(arguments: Any) -> Content:
        # Textual's highlighter styles tokens with theme variables: a theme change recolours them.
        from textual.highlight import highlight  # (pygments: imported on first use)

        sql = sql_of(arguments)
        if sql is not None:
            rest = {k: v for k, v in arguments.items() if v is not sql}
            body = highlight(sql, language="sql")
            if not rest:
                return body
            return Content("\n").join([body, highlight(pretty_json(rest), language="json")])
        return highlight(pretty_json(arguments), language="json")


class ToolCallBlock(Collapsible):
    """A tool call and, once it finished, its result (arguments, preview, duration)."""

    def __init__(self, call_id: str, name: str, arguments: Any) -> None:
        self.call_id = call_id
        self.tool_name = name
        self.arguments = arguments
        self.result: dict[str, Any] | None = None
        # Set while a gate holds the call: the block says so instead of "running…".
        self.waiting: str | None = None
        self.args_view = ToolArgs(arguments)
        self.result_view = Static("", classes="tool-result")
        self.result_view.display = False
        super().__init__(self.args_view, self.result_view, title=self._title_text(), collapsed=True,
                         classes="tool")

    def _title_text(self) -> str:
        from textual.markup import escape

        head = f"⚙ {escape(self.tool_name)}  {escape(args_preview(self.arguments, 48))}"
        r = self.result
        if r is None:
            return f"{head}  · ⏳ {self.waiting}" if self.waiting else f"{head}  · running…"
        status = r.get("status")
        gate = r.get("gate")
        if status == "cancelled":
            # A stop cut the call short: not a tool failure, and not still running.
            mark = "⊘ cancelled" + (" at the gate" if gate == "cancelled" else "")
        elif status == "error":
            mark = "✗ cut short: the turn failed"
        else:
            mark = "✗" if r.get("is_error") else "✓"
        extra = [duration(r.get("duration_ms"))]
        if gate and gate not in ("allow", "cancelled"):
            extra.append(str(gate))
        return f"{head}  · {' · '.join(x for x in [mark, *extra] if x)}"

    def set_waiting(self, text: str | None) -> None:
        """The call waits at a gate (`text` says for what and whom), or no longer does."""
        self.waiting = text
        self.title = self._title_text()
        self._measure_title_again()

    def _measure_title_again(self) -> None:
        # A title that now wraps to more lines must be measured again. Textual keeps a widget's
        # height per width and drops it on update only once the widget has handled its Mount: a
        # title changed in between (a gate right after its call) kept the old height, drawn cut
        # after "(gates" (CI caught it). So: forget the height now and again after the next frame.
        def again() -> None:
            title = self._title
            title.clear_cached_dimensions()
            title.refresh(layout=True)
            self.refresh(layout=True)

        again()
        if self.is_attached:
            self.call_after_refresh(again)

    def set_result(self, content: str, *, is_error: bool, duration_ms: float | None,
                   gate: str | None = None, status: str | None = None) -> None:
        """Show the result. `status` is the engine's: "cancelled" (a stop) or "error" (a failed
        turn) for a call that got no result of its own; None or "complete" otherwise."""
        self.result = {"content": content, "is_error": is_error, "duration_ms": duration_ms, "gate": gate,
                       "status": status}
        lines = content.splitlines()
        preview = "\n".join(lines[:PREVIEW_LINES])
        if len(lines) > PREVIEW_LINES:
            preview += f"\n… {len(lines) - PREVIEW_LINES} more lines"
        self.result_view.update(_esc(preview or "(empty result)"))
        self.result_view.display = True
        cancelled = status == "cancelled"
        self.result_view.set_class(is_error and not cancelled, "error")
        self.set_class(is_error and not cancelled, "failed")
        self.set_class(cancelled, "cancelled")
        self.title = self._title_text()
        self._measure_title_again()


class GateLine(Static):
    """A gate decision, inline where it happened."""

    def __init__(self, gate: ev.GateInfo) -> None:
        super().__init__(Content.assemble(("⚑ ", "bold"), f"{gate_outcome(gate)}: ", gate.summary or gate.tool),
                         classes=f"msg gate-line {gate.decision or ''}")
        self.gate = gate


class NoticeLine(Static):
    def __init__(self, text: str) -> None:
        super().__init__(_esc(text), classes="msg notice")


class CommandOutput(Static):
    """A command's output: column-aligned text that wraps under its columns in a narrow pane."""

    def __init__(self, text: str, command: str | None = None) -> None:
        super().__init__(HangingText(text), classes="msg command-output")
        self.text = text
        self.command = command


class EmptyHint(Static):
    """What a fresh session shows until something happens in it."""

    def __init__(self, keymap: Mapping[str, str]) -> None:
        send = display_keys(first_key("input.send", keymap))
        lines = [
            Content.assemble(("New session.", "bold"), f" Type a message below and press {send} to send it."),
            Content.assemble(("!help", "bold $accent"), " lists the commands · ",
                             ("@model", "bold $accent"), " text asks another model for one turn"),
            Content.assemble((render_help("{app.help}", keymap), "bold $accent"),
                             " explains the focused pane · ",
                             (render_help("{app.palette}", keymap), "bold $accent"), " every action"),
        ]
        super().__init__(Content("\n").join(lines), classes="msg hint")


class ErrorLine(Static):
    def __init__(self, text: str, code: str | None = None) -> None:
        label = f"error ({code}): " if code else "error: "
        super().__init__(Content.assemble((label, "bold"), text), classes="msg error-line")


class EarlierButton(Button):
    def __init__(self) -> None:
        super().__init__("↑ load earlier messages", id="load-earlier", compact=True, flat=True)
        self.can_focus = False


def source_lines(text: str) -> int:
    """The lines of a message's text that draw something: it takes at least as many on screen (a
    blank line of Markdown is a block's margin at most)."""
    return sum(1 for line in text.splitlines() if line.strip())


def _tails(messages: list[HistoryMessage], lines: int) -> list[int | None]:
    """For each message, the lines of source an answer longer than `lines` draws first (None: it
    is drawn whole): what is left of `lines` below it, counted from the end."""
    tails: list[int | None] = [None] * len(messages)
    left = lines
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        # A tool's result is in its call's block, collapsed: a line or two.
        size = 2 if m.role == "tool" else source_lines(m.content) + 1
        if m.role == "assistant" and size > lines:
            tails[i] = max(left, 0)
        left -= size
    return tails


def widgets_for_history(messages: Iterable[HistoryMessage], turn_of: dict[Widget, str | None] | None = None, *,
                        tail_lines: int | None = None) -> list[Widget]:
    """Turn stored messages into chat widgets (tool results attach to their calls), turn by turn:
    a message queued behind a running turn is stored before that turn's answer, and is shown
    after it. `turn_of`, when given, gets each widget's turn id. With `tail_lines`, an answer
    longer than that is drawn from its end, as far as what is below it leaves of `tail_lines`
    (the view opens at the bottom), and the rest as the reader scrolls up."""
    ordered = by_turn(list(messages), None)
    tails = _tails(ordered, tail_lines) if tail_lines is not None else [None] * len(ordered)
    out: list[Widget] = []
    tools: dict[str, ToolCallBlock] = {}
    turns: dict[Widget, str | None] = {} if turn_of is None else turn_of

    def add(widget: Widget, m: HistoryMessage) -> None:
        out.append(widget)
        turns[widget] = m.turn_id

    for m, tail in zip(ordered, tails, strict=True):
        if m.role == "user":
            add(UserMessage(m.content, command=bool(m.meta.get("command")), model=m.meta.get("model")), m)
        elif m.role == "assistant":
            if m.content.strip() or m.thinking:
                add(AssistantMessage(m.content, m.thinking, status=m.status, model=m.meta.get("model"),
                                     tail_lines=tail), m)
            client_calls = m.meta.get(CLIENT_CALLS) or {}
            for tc in m.tool_calls:
                block = ToolCallBlock(tc.id, tc.name, tc.arguments)
                if tc.id in client_calls:
                    block.set_waiting(CLIENT_CALL)
                tools[tc.id] = block
                add(block, m)
        elif m.role == "tool":
            found = tools.get(m.tool_call_id or "")
            if found is None:
                found = ToolCallBlock(m.tool_call_id or "", m.name or "tool", {})
                add(found, m)
            found.set_result(m.content, is_error=bool(m.meta.get("is_error")),
                             duration_ms=m.meta.get("duration_ms"), gate=m.meta.get("gate"), status=m.status)
        elif m.role == "gate":
            # The stored record is the resolved gate object (its summary, else the record's text).
            add(GateLine(ev.GateInfo.from_dict({"summary": m.content, **m.meta})), m)
        elif m.role == "notice":
            if m.meta.get("kind") == "command":
                add(CommandOutput(m.content, m.meta.get("command")), m)
            else:
                add(NoticeLine(m.content), m)
        elif m.role == "error":
            add(ErrorLine(m.content, m.meta.get("code")), m)
    return out


class ChatView(Settled, VerticalScroll, can_focus=True):
    """The selected session's conversation."""

    PANE = "chat"
    BINDINGS = bindings_for("chat")
    # What it holds grew (an answer streaming) is a new virtual size; the chat's own lines (its
    # frame, its padding) do not depend on it, and its scrollbars are widgets of their own that
    # `_scroll_update` repaints. Settled's reactive repaints: every line of the chat rendered
    # again at each draw of a streamed answer, ~30 of them.
    virtual_size: Reactive[Size] = Reactive(Size(0, 0), layout=False, repaint=False)
    HELP = """\
## Chat

The selected session's conversation, live. Answers stream in as Markdown; **thinking** and
**tool calls** are collapsible blocks (arguments, result preview, duration); gate decisions,
notices, command output and errors are lines of their own.

Only the latest messages are loaded: **load earlier** (or **{chat.earlier}**) pages back.
**{chat.details}** opens or closes every block. The view follows new output only while you are at
the bottom; scroll up to read in peace, **{chat.bottom}** (or a message of your own) to follow again.
"""

    class LoadEarlier(Message):
        def __init__(self, session_id: str, before_id: int) -> None:
            super().__init__()
            self.session_id = session_id
            self.before_id = before_id

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.session_id: str | None = None
        self.oldest_id: int | None = None
        self.has_more = False
        self._current: AssistantMessage | None = None
        self._current_turn: str | None = None  # the turn whose answer `_current` streams
        # Each widget's turn: what a turn adds later goes after its last widget (see the module).
        self._turn_of: dict[Widget, str | None] = {}
        # While `show` replays the running turn: where a turn not drawn yet goes (the first widget
        # of the turns queued behind it), instead of the end.
        self._slot: Widget | None = None
        # The turn `show` drew from its events: an earlier page's stored part of it is drawn already.
        self._replayed: str | None = None
        self._tools: dict[str, ToolCallBlock] = {}
        # "waiting for approval" lines of gates that hold no call of the chat's, by gate id
        self._waiting: dict[str, NoticeLine] = {}
        self._held: dict[str, ToolCallBlock] = {}  # tool calls waiting at a gate, by gate id
        # Turns whose prompt is drawn and which have not started (queued behind the running one),
        # and the notes said of them meanwhile ("queued behind the running turn"): a note goes
        # when its turn starts or ends unstarted, as the store, which never keeps it, shows it.
        self._unstarted: set[str] = set()
        self._queued_notes: dict[str | None, list[NoticeLine]] = {}
        self._details_open = False

    def on_mount(self) -> None:
        self.anchor()

    # -- long answers drawn from their end (widgets/answer_tail.py) --

    # (child, its height then): a part of that child is being mounted above the lines in sight.
    _kept_place: tuple[Widget, int] | None = None

    def history_tail_lines(self) -> int:
        """The lines of a history page drawn first: two screens."""
        return 2 * max(self.app.size.height, 24)

    def keep_place_above(self, child: Widget) -> None:
        """`child` (a message in the view) is about to grow above the lines the reader sees: the
        arrangement that finds it grown moves the view down by as much, in the same layout (as
        Textual's anchor does), so no frame shows those lines moved."""
        self._kept_place = (child, child.outer_size.height)

    def arrange(self, size: Size, optimal: bool = False) -> Any:
        result = super().arrange(size, optimal)
        if self._kept_place is not None:
            child, height = self._kept_place
            placement = next((p for p in result.placements if p.widget is child), None)
            if placement is None:
                self._kept_place = None
            elif placement.region.height != height:
                self._kept_place = None
                self._move_by(placement.region.height - height)
        return result

    def _move_by(self, lines: int) -> None:
        """The view `lines` further down, the scroll under way (a page key's) included."""
        from textual._animator import SimpleAnimation

        y = self.scroll_y + lines
        self.set_reactive(ChatView.scroll_y, y)
        self.set_reactive(ChatView.scroll_target_y, self.scroll_target_y + lines)
        self.vertical_scrollbar._reactive_position = y  # type: ignore[attr-defined]  # as the anchor sets it (_compositor.py)
        animation = self.app.animator._animations.get((id(self), "scroll_y"))
        if isinstance(animation, SimpleAnimation) and isinstance(animation.start_value, float | int) \
                and isinstance(animation.end_value, float | int):
            animation.start_value += lines
            animation.end_value += lines
            if isinstance(animation.final_value, float | int):
                animation.final_value += lines

    # -- building the view --

    async def show(self, session_id: str, messages: list[HistoryMessage], *, has_more: bool,
                   live: Iterable[Event] = (), queued: Iterable[ev.Notice] = ()) -> None:
        """Replace the view: a page of history (in commit order, as read) turn by turn, and the
        running turn drawn from its events (`live`, if any) in its place: after the turns before
        it, above the prompts queued behind it. What the store holds of that turn so far is left
        out: its events say all of it. `queued`: the notes of turns still queued (not stored),
        each after its turn's prompt, as they were drawn live."""
        live = list(live)
        await self._finish_current()
        self.session_id = session_id
        self._tools.clear()
        self._waiting.clear()
        self._held.clear()
        self._turn_of.clear()
        self._unstarted.clear()
        self._queued_notes.clear()
        self._current = None
        running = self._replayed = next((e.turn_id for e in live if e.turn_id), None)
        ordered = by_turn(messages, None)
        # The running turn's place is where its first stored message (its prompt) is; none in this
        # page: after everything, as before it was known.
        at = next((i for i, m in enumerate(ordered) if running is not None and m.turn_id == running),
                  len(ordered))
        with self.app.batch_update():
            await self.remove_children()
            tail = self.history_tail_lines()
            widgets = widgets_for_history(ordered[:at], self._turn_of, tail_lines=tail)
            later = widgets_for_history([m for m in ordered[at:] if m.turn_id != running], self._turn_of,
                                        tail_lines=tail)
            self._register_tools(widgets + later)
            self.has_more = has_more
            self.oldest_id = min((m.id for m in messages if m.id is not None), default=None)
            if has_more and self.oldest_id is not None:
                widgets.insert(0, EarlierButton())
            if not widgets and not later and not live:
                widgets.append(EmptyHint(getattr(self.app, "keymap_overrides", {})))
            if widgets or later:
                await self.mount_all(widgets + later)
        self._slot = later[0] if later else None
        try:
            for event in live:
                await self.apply(event)
        finally:
            self._slot = None
        for note in queued:
            if note.turn_id is not None and (last := self._last_of(note.turn_id)) is not None:
                self._unstarted.add(note.turn_id)  # (its prompt is on this page)
                await self._queued_note(note, after=last)
        self.scroll_end(animate=False, immediate=True)

    async def prepend(self, messages: list[HistoryMessage], *, has_more: bool) -> None:
        """Older messages above what is shown, each with its turn; the reader's place stays put.
        A page boundary can fall inside a turn, and a prompt queued behind a turn is stored before
        that turn's answer: a turn the view already shows gets its older part right above its own
        widgets, and a turn it does not goes above the first turn that began after it."""
        old_max = self.max_scroll_y
        old_y = self.scroll_y
        for button in self.query(EarlierButton):
            await button.remove()
        turn_of: dict[Widget, str | None] = {}
        widgets = widgets_for_history([m for m in messages if m.turn_id is None or m.turn_id != self._replayed],
                                      turn_of, tail_lines=self.history_tail_lines())
        self._register_tools(widgets)
        self._turn_of.update(turn_of)
        ids = [m.id for m in messages if m.id is not None]
        if ids:
            self.oldest_id = min(ids)
        self.has_more = has_more and bool(ids)
        groups: list[tuple[str | None, list[Widget]]] = []
        for w in widgets:
            if groups and groups[-1][0] == turn_of[w]:
                groups[-1][1].append(w)
            else:
                groups.append((turn_of[w], [w]))
        if self.has_more:
            groups.insert(0, (None, [EarlierButton()]))
        # Each group's place, worked out on the view as it is (the page's turns are in turn order,
        # so the places follow each other down the view and each group lands below the one before).
        order = {t: i for i, (t, _) in enumerate(groups) if t is not None}
        shown = [(child, self._turn_of.get(child)) for child in self.children]
        places: list[Widget | None] = []
        for i, (turn, _) in enumerate(groups):
            places.append(next((child for child, t in shown
                                if t is None or t not in order or order[t] > i or t == turn), None))
        for (_, group), place in zip(groups, places, strict=True):
            if place is not None:
                await self.mount_all(group, before=place)
            else:
                await self.mount_all(group)

        def keep_place() -> None:
            self.scroll_to(y=old_y + (self.max_scroll_y - old_max), animate=False, immediate=True)

        self.call_after_refresh(keep_place)

    def _register_tools(self, widgets: list[Widget]) -> None:
        for w in widgets:
            if isinstance(w, ToolCallBlock):
                self._tools[w.call_id] = w

    async def _place(self, widget: Widget, turn: str | None) -> None:
        """Mount a live event's widget with its turn: after that turn's last widget (above the
        prompts queued behind it), or, for a turn not drawn yet, at the end."""
        for hint in self.query(EmptyHint):
            await hint.remove()
        last = self._last_of(turn)
        self._turn_of[widget] = turn
        if last is not None:
            await self.mount(widget, after=last)
        elif self._slot is not None:
            await self.mount(widget, before=self._slot)
        else:
            await self.mount(widget)

    def _last_of(self, turn: str | None) -> Widget | None:
        # From the end: the turn adding to the view is almost always the last one in it.
        if turn is not None:
            for child in reversed(self.children):
                if self._turn_of.get(child) == turn:
                    return child
        return None

    async def _finish_current(self) -> None:
        current, self._current = self._current, None
        if current is not None:
            await current.finish()

    async def _text_ends(self, turn: str | None) -> None:
        """An event of the turn whose answer streams, other than its text: that text ends here
        (its text after this event is a new message). Another turn's event (a prompt queued
        behind it, a command run meanwhile, a queued turn cancelled) leaves it streaming."""
        if self._current is not None and self._current_turn == turn:
            await self._finish_current()

    async def _assistant(self, turn: str | None) -> AssistantMessage:
        if self._current is None or self._current_turn != turn:
            await self._finish_current()
            self._current = AssistantMessage()
            self._current_turn = turn
            await self._place(self._current, turn)
        return self._current

    async def _queued_note(self, notice: ev.Notice, *, after: Widget | None = None) -> None:
        line = NoticeLine(notice.text)
        self._queued_notes.setdefault(notice.turn_id, []).append(line)
        if after is not None:
            self._turn_of[line] = notice.turn_id
            await self.mount(line, after=after)
        else:
            await self._place(line, notice.turn_id)

    async def _turn_began_or_ended(self, turn: str | None) -> None:
        """A queued turn is no longer queued: the notes saying it was go."""
        if turn is not None:
            self._unstarted.discard(turn)
        for line in self._queued_notes.pop(turn, []):
            self._turn_of.pop(line, None)
            await line.remove()

    # -- live events --

    def _gated_call(self, gate: ev.GateInfo) -> ToolCallBlock | None:
        """The call a gate holds: the one it names (`call_id`); from a server that does not name
        it, the latest call of that tool still without a result and not already held, else the
        latest open call."""
        if gate.call_id is not None and (named := self._tools.get(gate.call_id)) is not None:
            return named if named.result is None else None
        held = set(map(id, self._held.values()))
        open_calls = [b for b in self._tools.values() if b.result is None and id(b) not in held]
        same_tool = [b for b in open_calls if b.tool_name == gate.tool]
        candidates = same_tool or open_calls
        return candidates[-1] if candidates else None

    async def apply(self, event: Event) -> None:
        """Draw one live event of this session, with the rest of its turn."""
        turn = event.turn_id
        match event:
            case ev.Tok(text=text):
                # The streaming path: one comparison before the text goes to its message.
                current = self._current
                if current is not None and self._current_turn == turn:
                    await current.write(text)
                elif text.strip():
                    await (await self._assistant(turn)).write(text)
            case ev.Thinking(text=text):
                await (await self._assistant(turn)).think(text)
            case ev.UserPosted():
                await self._text_ends(turn)
                if not event.command and turn is not None:
                    self._unstarted.add(turn)
                await self._place(UserMessage(event.text, command=event.command, model=event.model), turn)
            case ev.TurnStarted():
                await self._turn_began_or_ended(turn)
            case ev.ToolCalled():
                await self._text_ends(turn)
                block = ToolCallBlock(event.call_id, event.tool, event.arguments)
                if event.client:
                    block.set_waiting(CLIENT_CALL)
                if self._details_open:
                    block.collapsed = False
                self._tools[block.call_id] = block
                await self._place(block, turn)
            case ev.ToolReturned():
                await self._tool_returned(event)
            case ev.GateOpened(gate=gate):
                # Said once, while the gate waits, and gone when it is answered (the history
                # keeps only the decision): derived from the gate's own events. The call it holds
                # says so in its block, not "running…", and for whom: an operator (the inbox, or
                # an operator token over the API or MCP). A gate with no call of its own in the
                # chat has a line of its own instead.
                await self._text_ends(turn)
                if (held_call := self._gated_call(gate)) is not None:
                    held_call.set_waiting(WAITING if held_call.tool_name == gate.tool
                                          else f"{waiting_notice(gate)} (gates inbox)")
                    self._held[gate.id] = held_call
                else:
                    line = NoticeLine(waiting_notice(gate))
                    self._waiting[gate.id] = line
                    await self._place(line, turn)
            case ev.GateResolved(gate=gate):
                await self._text_ends(turn)
                if (waiting := self._waiting.pop(gate.id, None)) is not None:
                    self._turn_of.pop(waiting, None)
                    await waiting.remove()
                if (held := self._held.pop(gate.id, None)) is not None:
                    held.set_waiting(None)
                await self._place(GateLine(gate), turn)
            case ev.Notice(command=str(command)) if command:
                await self._text_ends(turn)
                await self._place(CommandOutput(event.text, command), turn)
            case ev.Notice() if turn in self._unstarted:
                # Said of a turn before it began (queued behind the running turn): not stored.
                await self._queued_note(event)
            case ev.Notice():
                await self._text_ends(turn)
                await self._place(NoticeLine(event.text), turn)
            case ev.ErrorEvent():
                await self._text_ends(turn)
                await self._place(ErrorLine(event.message, event.code), turn)
            case ev.Done():
                await self._text_ends(turn)
                await self._turn_began_or_ended(turn)

    async def _tool_returned(self, event: ev.ToolReturned) -> None:
        block = self._tools.get(event.call_id)
        if block is None:
            block = ToolCallBlock(event.call_id, event.tool, {})
            self._tools[block.call_id] = block
            await self._place(block, event.turn_id)
        content = event.content
        if event.truncated:
            content += "\n… (preview; the full result is in the session history)"
        block.set_result(content, is_error=event.is_error, duration_ms=event.duration_ms, gate=event.gate,
                         status=event.status)

    # -- actions --

    @on(Button.Pressed, "#load-earlier")
    def _earlier_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_load_earlier()

    def action_load_earlier(self) -> None:
        if self.session_id and self.has_more and self.oldest_id is not None:
            self.post_message(self.LoadEarlier(self.session_id, self.oldest_id))
        else:
            self.notify("this is the beginning of the session", timeout=2)

    def action_toggle_details(self) -> None:
        blocks = list(self.query(Collapsible))
        # From what is on screen, not from the last press: a session switched to draws its blocks
        # closed, and a toggle of the remembered "open" closed them again (QA: `t` twice).
        self._details_open = any(b.collapsed for b in blocks) if blocks else not self._details_open
        for block in blocks:
            block.collapsed = not self._details_open

    def action_bottom(self) -> None:
        self.scroll_end(animate=False)

    @property
    def untouched(self) -> bool:
        """Nothing has happened in the session shown: the chat still says how to start."""
        return bool(self.query(EmptyHint))

    def text_preview(self) -> str:
        """The conversation as plain text (for the details view of a gate)."""
        parts = []
        for w in self.children:
            if isinstance(w, UserMessage):
                parts.append("› " + one_line(w.text, 200))
            elif isinstance(w, AssistantMessage):
                parts.append(one_line(w.text, 200))
        return "\n".join(parts)
