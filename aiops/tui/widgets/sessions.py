"""The sessions pane: every session of every kind, grouped by kind.

The list is virtual, as toolong draws a log's lines: nothing is kept per session but its place in
`SessionOrder`. A line of the pane is found from the kinds' groups (a heading, then two lines per
session) and the row drawn from the session's data when it comes into sight, so a session that
comes, goes or moves costs the same with ten sessions stored or ten thousand.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, ClassVar

from textual.binding import Binding, BindingType
from textual.content import Content
from textual.geometry import Region, Size, clamp
from textual.message import Message
from textual.reactive import Reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.timer import Timer
from textual.visual import Visual

from aiops.tui.format import STATE_MARK, ago, one_line
from aiops.tui.keys import bindings_for
from aiops.tui.widgets.fitted import Rows
from aiops.tui.widgets.session_order import SessionOrder
from aiops.tui.widgets.typeaway import TypesAway

if TYPE_CHECKING:
    from textual import events
    from textual.style import Style

# Session events redraw the list at most this often (seconds): fifty streaming sessions change
# state and gain unread marks many times a second, and a burst of them makes one redraw.
REDRAW_EVERY = 0.1

# After a key moves the cursor the order holds this long (seconds), rows still redrawn in place:
# while sessions stream the order changes at every redraw, and the row the operator saw below the
# cursor would no longer be the one the next key moves to.
SETTLE = 1.0

# Rows' drawings kept (each session's, per style and width): more are dropped all at once.
DRAWINGS_KEPT = 1024

ROW_HEIGHT = 2  # a session's lines: shorthand id, state and title; model, state and age


class SessionsList(TypesAway, ScrollView, can_focus=True):
    """Sessions grouped by kind: shorthand id, title, model, state, last activity, unread.

    Picking a session hands the operator to the input; text typed here that is none of the list's
    keys goes there too, so that a message cannot open a session (`n`) or stop a turn (`x`).
    """

    PANE = "sessions"
    BINDINGS: ClassVar[list[BindingType]] = [
        # As OptionList's, which this list was: the cursor moves by session, over the headings.
        Binding("down", "cursor_down", "Down", show=False),
        Binding("up", "cursor_up", "Up", show=False),
        Binding("home", "first", "First", show=False),
        Binding("end", "last", "Last", show=False),
        Binding("pagedown", "page_down", "Page Down", show=False),
        Binding("pageup", "page_up", "Page Up", show=False),
        *bindings_for("sessions"),
    ]
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "sessions-list--row", "sessions-list--heading", "sessions-list--row-highlighted",
        "sessions-list--row-hover",
    }
    # OptionList's look (the pane's frame, padding and background are set in app.tcss).
    DEFAULT_CSS = """
    SessionsList {
        height: auto;
        max-height: 100%;
        color: $foreground;
        overflow-x: hidden;
        background: $surface;
        & > .sessions-list--row-highlighted {
            color: $foreground;
            background: $block-cursor-blurred-background;
            text-style: $block-cursor-blurred-text-style;
        }
        &:focus {
            background-tint: $foreground 5%;
            & > .sessions-list--row-highlighted {
                color: $block-cursor-foreground;
                background: $block-cursor-background;
                text-style: $block-cursor-text-style;
            }
        }
        & > .sessions-list--heading { color: $text-disabled; }
        & > .sessions-list--row-hover { background: $block-hover-background; }
    }
    """

    # Widget declares `virtual_size` a layout reactive: every session that came or went would lay
    # the whole screen out again for the list's new height. Only the scrollbars depend on it, and
    # those are set by `_scroll_update` when it changes (as in GatesInbox).
    virtual_size: Reactive[Size] = Reactive(Size(0, 0), layout=False)

    HELP = """\
## Sessions

Every session of every client: the console, `aiops chat` (kind cli), API scripts, chat UIs through the proxy, Slack
threads, swarm peers and MCP clients, grouped by kind. Each shows its shorthand id, title, model,
state (`·` idle, `▶` running, `⚑` waiting on a gate), last activity, and `●` when it has output
you have not seen. Within a kind the session last active is on top; while you move the cursor the
rows hold their places until a second after your last key.

**{sessions.open}** shows a session in the chat pane, live, and puts the cursor in the input.
**{sessions.new}** (or **{app.new_session}** anywhere) opens a new console session;
**{sessions.stop}** cancels the highlighted session's running turn. Typing anything else here goes
to the message input.
"""

    class Picked(Message):
        def __init__(self, session_id: str) -> None:
            super().__init__()
            self.session_id = session_id

    class NewRequested(Message):
        pass

    class StopRequested(Message):
        def __init__(self, session_id: str) -> None:
            super().__init__()
            self.session_id = session_id

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, **kw: Any) -> None:
        """`clock` (seconds, monotonic) times the redraws and the order's hold after a key (`SETTLE`);
        a test passes one it advances."""
        super().__init__(**kw)
        self._clock = clock
        self.sessions: dict[str, dict[str, Any]] = {}
        self.unread: set[str] = set()
        self.selected: str | None = None
        self._gone: set[str] = set()  # sessions deleted since the list was set
        self._cursor: str | None = None  # the highlighted session
        self.hold = False  # rebuilds wait (the terminal is behind: nothing is drawn)
        self._held = False  # one waited
        self._order = SessionOrder()  # the order shown (changed only when the list is redrawn)
        # The order's layout: each kind and its heading's line; the headings' lines (to bisect).
        self._blocks: list[tuple[str, int]] = []
        self._starts: list[int] = []
        self._lines = 0
        self._hover: str | None = None  # the session under the mouse
        self._drawn: dict[str, dict[tuple[Style, int], list[Strip]]] = {}  # rows' drawings
        self._headings: dict[str, tuple[tuple[int, Style, int], list[Strip]]] = {}
        # Sessions whose place in the order may have changed since the last redraw (new, gone,
        # last activity, kind).
        self._moved: set[str] = set()
        self._reset = False  # the next redraw places every session again (a new list of sessions)
        self._moving_until = 0.0  # the cursor moved: the order holds until then (monotonic)
        self._settled: Timer | None = None  # the held order is shown then
        self._pending: Timer | bool = False  # a redraw is scheduled
        self._last = 0.0  # when the list was last redrawn (monotonic)
        # Sessions whose rows show something new since the last redraw: only these are drawn
        # again (the other rows' drawings are kept).
        self._changed: set[str] = set()

    def hold_rebuilds(self, hold: bool) -> None:
        """Put rebuilds off while `hold`; letting go does the one that waited."""
        self.hold = hold
        if not hold and self._held:
            self._held = False
            self.rebuild()

    def on_mount(self) -> None:
        self.set_interval(15, self._redraw_rows)  # the ages
        if self.sessions:
            self.rebuild_now()

    # -- data --

    def set_sessions(self, sessions: list[dict[str, Any]]) -> None:
        self.sessions = {s["client_id"]: dict(s) for s in sessions}
        self._gone.clear()
        self._drawn.clear()  # every row may show something new
        self.refresh()
        self._moved.clear()
        self._reset = True  # the order is set anew at the redraw, with its layout (not before: held
        self.rebuild_now()  # while the terminal is behind, the lines shown are the old order's)

    def upsert(self, session: dict[str, Any]) -> None:
        sid = session.get("client_id")
        if not sid:
            return
        merged = {**self.sessions.get(sid, {}), **session}
        merged.pop("change", None)
        self.sessions[sid] = merged
        self._changed.add(sid)
        self._moved.add(sid)
        self.rebuild()

    def add_older(self, sessions: list[dict[str, Any]]) -> int:
        """Sessions past those listed at start (the store's next page, most recently active
        first), put in their places (at the bottom of their kinds, as a rule): those the list
        already has (their events came first) or saw deleted are left as they are. How many came."""
        came = 0
        for s in sessions:
            sid = s.get("client_id")
            if sid and sid not in self.sessions and sid not in self._gone:
                self.sessions[sid] = dict(s)
                self._moved.add(sid)
                came += 1
        if came:
            self.rebuild()
        return came

    def older_listed(self) -> None:
        """Every older session is in: no page is on its way that could bring a deleted one back."""
        self._gone.clear()

    def drop(self, session_id: str) -> None:
        """Take a deleted session off the list. (Not `remove`: that is every widget's own removal
        from the DOM.)"""
        self._gone.add(session_id)  # a page of older sessions read before it went may still hold it
        self._refresh_rows({session_id})  # its place is blank until the order is placed again
        self.sessions.pop(session_id, None)
        self._drawn.pop(session_id, None)
        self.unread.discard(session_id)
        self._moved.add(session_id)
        self.rebuild()

    def touch(self, session_id: str, ts: float | None = None, *, move: bool = True) -> None:
        """The session was active at `ts`: its age, and (with `move`) its place among the last
        active. Deltas of an answer streaming do not move it: fifty sessions streaming would swap
        places ten times a second, each time a redraw of every row in sight, and the row the
        operator reaches for would not stay put; the turn's start and end move it."""
        s = self.sessions.get(session_id)
        if s is None:
            return
        was = s.get("updated_at")
        s["updated_at"] = ts or time.time()
        if move:
            self._changed.add(session_id)  # its age, drawn at the next redraw
            self._moved.add(session_id)  # and its place, when the list is next redrawn
        elif ago(was) != ago(s["updated_at"]):
            self._changed.add(session_id)  # only when the age it shows changed

    def mark_unread(self, session_id: str) -> None:
        if session_id != self.selected and session_id not in self.unread:
            self.unread.add(session_id)
            self._changed.add(session_id)
            self.rebuild()

    def select(self, session_id: str) -> None:
        """Mark the session shown in the chat; the cursor moves to it (a new session, a jump), so
        the list opens where the operator is."""
        if self.selected is not None:
            self._changed.add(self.selected)  # no longer bold
        self._changed.add(session_id)
        self.selected = session_id
        self.unread.discard(session_id)
        self.rebuild_now(highlight=session_id)

    def short_id(self, session_id: str | None) -> str:
        s = self.sessions.get(session_id or "")
        return str(s["short_id"]) if s and s.get("short_id") is not None else (session_id or "?")

    # -- drawing --

    def _prompt(self, s: dict[str, Any]) -> Rows:
        sid = s["client_id"]
        state = s.get("state") or "idle"
        title = one_line(s.get("title") or "(new)", 200)
        head = f"{s.get('short_id', '?'):>4} {STATE_MARK.get(state, '·')} "
        unread = Content.styled("●", "bold $accent") if sid in self.unread else Content("")
        line1 = Content.assemble((head, "bold" if sid == self.selected else ""), title)
        meta = " · ".join(x for x in (s.get("model") or "", state) if x)
        line2 = Content.styled("     " + meta, "dim")
        # The title takes the width the pane has; the unread mark and the age keep their place.
        return Rows([(line1, unread), (line2, Content.styled(ago(s.get("updated_at")), "dim"))])

    def rebuild(self) -> None:
        """Redraw the list soon: at once when it was not redrawn in the last `REDRAW_EVERY`, else
        when that has passed, so a burst of session events makes one redraw, not one each."""
        if not self.is_mounted or self._pending:
            return
        wait = self._last + REDRAW_EVERY - self._clock()
        if wait > 0:
            self._pending = self.set_timer(wait, self._scheduled)
        else:
            self._pending = True
            self.call_later(self._scheduled)

    def _scheduled(self) -> None:
        self._pending = False
        self.rebuild_now()

    def _settle(self) -> None:
        self._settled = None
        self.rebuild()  # holds again (a new timer) when a key came meanwhile

    def rebuild_now(self, highlight: str | None = None) -> None:
        """Redraw now; the cursor stays on its session (or moves to `highlight`). Only the rows
        that changed are drawn again, and only where they are in sight; sessions that came, went
        or moved are placed again in the order. While the terminal is behind (nothing is drawn)
        this waits for it."""
        if not self.is_mounted:
            return
        if self.hold:
            self._held = True
            return
        self._last = self._clock()
        if isinstance(self._pending, Timer):
            self._pending.stop()
        self._pending = False
        changed, self._changed = self._changed, set()
        wait = self._moving_until - self._last
        if wait > 0 and highlight is None and not self._reset:
            # The operator is moving the cursor: the rows keep their places until they stop.
            if self._moved and self._settled is None:
                self._settled = self.set_timer(wait, self._settle)
            self._redraw_rows(changed)
            return
        moved, self._moved = self._moved, set()
        reset, self._reset = self._reset, False
        if not moved and not reset:
            self._redraw_rows(changed)
        else:
            for sid in changed:
                self._drawn.pop(sid, None)
            self._place(moved, reset)
        if highlight is not None:
            self._move_to(highlight)
        elif reset and self.cursor is not None:
            self._scroll_to_row(self.cursor)

    def _place(self, moved: set[str], reset: bool) -> None:
        """Put the `moved` sessions in their new places (`reset`: every session placed anew).
        Scrolled down, the first line in view that did not move itself stays where it is:
        sessions coming, going or moving above or below do not move what the operator is looking
        at. At the top, the list stays at its top, where new sessions come in. The cursor stays on
        its session, kept in view as it moves (as OptionList kept its highlight)."""
        top = round(self.scroll_offset.y)
        anchor = None if reset or top == 0 else self._anchor(top, moved)
        cursor_at = self._line_of(self._cursor) if self._cursor is not None else None
        if reset:
            self._order.reset(self.sessions)
        else:
            self._order.update(self.sessions, moved)
        self._layout()
        self._hover = None  # another row is under the mouse now: shown at its next move
        if self._cursor is not None and self._order.kind_of(self._cursor) is None:  # its session went
            self._cursor = self.selected if self.selected is not None and self._order.kind_of(
                self.selected) is not None else None
            cursor_at = None
        if anchor is not None:
            (kind, sid, offset), below = anchor
            y = self._heading_line(kind) if sid is None else self._line_of(sid)
            if y is not None and y + offset - below != top:
                self.scroll_to(y=max(0, y + offset - below), animate=False, immediate=True)
        if self._cursor is not None and self._line_of(self._cursor) != cursor_at:
            self._scroll_to_row(self._cursor)
        self.refresh()

    def _anchor(self, top: int, moved: set[str]) -> tuple[tuple[str, str | None, int], int] | None:
        """The first line in view that is a heading or a session not among `moved`, and how far
        below the top it is."""
        for line in range(top, top + self.scrollable_content_region.height):
            at = self._at(line)
            if at is None:
                return None
            if at[1] is None or at[1] not in moved:
                return at, line - top
        return None

    def _redraw_rows(self, session_ids: set[str] | None = None) -> None:
        """Draw the rows of `session_ids` (None: every row, for the ages) again from the data (new
        states, unread marks, ages): their drawings are dropped, and their lines painted again
        where they are in sight (most often they are not: sessions scrolled out of sight)."""
        if session_ids is None:
            self._drawn.clear()
            self.refresh()
            return
        for sid in session_ids:
            self._drawn.pop(sid, None)
        self._refresh_rows(session_ids)

    # -- the layout: a heading's line, then two per session, kind after kind --

    def _layout(self) -> None:
        blocks: list[tuple[str, int]] = []
        line = 0
        for kind in self._order.kinds():
            blocks.append((kind, line))
            line += 1 + ROW_HEIGHT * len(self._order.group(kind))
        self._blocks, self._starts, self._lines = blocks, [start for _, start in blocks], line
        self._size_virtual()

    def _size_virtual(self) -> None:
        size = Size(self.scrollable_content_region.width, self._lines)
        if size != self.virtual_size:
            self.virtual_size = size
            self._scroll_update(size)

    def _at(self, line: int) -> tuple[str, str | None, int] | None:
        """What the list shows at `line`: (kind, session id or None for the kind's heading, the
        line within the row); None past the end."""
        if not 0 <= line < self._lines:
            return None
        kind, start = self._blocks[bisect_right(self._starts, line) - 1]
        if line == start:
            return kind, None, 0
        row, offset = divmod(line - start - 1, ROW_HEIGHT)
        return kind, self._order.group(kind)[row], offset

    def _heading_line(self, kind: str) -> int | None:
        return next((start for k, start in self._blocks if k == kind), None)

    def _line_of(self, sid: str) -> int | None:
        """The first line of the session's row (None: not listed)."""
        kind = self._order.kind_of(sid)
        start = self._heading_line(kind) if kind is not None else None
        if kind is None or start is None:
            return None
        return start + 1 + ROW_HEIGHT * self._order.group(kind).index(sid)

    def _refresh_rows(self, session_ids: Collection[str | None]) -> None:
        """Paint again the lines of those rows that are in sight."""
        top, height = round(self.scroll_offset.y), self.scrollable_content_region.height
        for line in range(top, top + height):
            at = self._at(line)
            if at is None:
                break
            if at[1] in session_ids and (at[2] == 0 or line == top):
                self.refresh_lines(line, ROW_HEIGHT - at[2])

    def listing(self) -> list[str]:
        """What the list shows, in order: "kind (count)" for each heading, the sessions' ids."""
        out: list[str] = []
        for kind, _ in self._blocks:
            group = self._order.group(kind)
            out.append(f"{kind} ({len(group)})")
            out.extend(group)
        return out

    # -- drawing --

    def on_resize(self) -> None:
        self._size_virtual()
        self.refresh()

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        # ScrollView marks every line of the list dirty on a scroll, and the frame renders all of
        # them again (~36 lines, most of a list key's frame when the cursor leaves the view). The
        # lines in sight before and after are the same lines moved: kept, moved by the scroll, so
        # only the lines it brings in (and any already dirty) are rendered. The list still goes to
        # the terminal whole, as ScrollView asks. (The list has no padding, border or outline of
        # its own, so its line y is the content's line `scroll_y + y`; were one given it, a frame
        # line would be moved into the list: Textual's way is kept then.)
        delta = round(new_value) - round(old_value)
        styles = self.styles
        shift = bool(delta) and not (styles.gutter.top or styles.gutter.bottom) and all(
            edge[0] in ("", "none") for edge in (styles.outline_top, styles.outline_bottom))
        cache = self._styles_cache
        moved = {y - delta: strip for y, strip in cache._cache.items()
                 if y not in cache._dirty_lines} if shift else {}
        super().watch_scroll_y(old_value, new_value)
        if shift:
            height = self.size.height
            # What is not kept (brought in, or dirty before) is not in the cache: it is rendered.
            cache._cache = {y: strip for y, strip in moved.items() if 0 <= y < height}
            cache._dirty_lines = set()

    def notify_style_update(self) -> None:
        # Focus and blur restyle the rows (the highlighted row's colours): drawn again.
        self.refresh()
        super().notify_style_update()

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        at = self._at(round(self.scroll_offset.y) + y)
        if at is None:
            return Strip.blank(width, self.get_visual_style("sessions-list--row").rich_style)
        kind, sid, offset = at
        strips = self._heading(kind, width) if sid is None else self._row(sid, width)
        if offset < len(strips):
            return strips[offset]
        return Strip.blank(width, self.get_visual_style("sessions-list--row").rich_style)

    def _heading(self, kind: str, width: int) -> list[Strip]:
        count = len(self._order.group(kind))
        style = self.get_visual_style("sessions-list--row", "sessions-list--heading")
        key = (count, style, width)
        kept = self._headings.get(kind)
        if kept is not None and kept[0] == key:
            return kept[1]
        strips = self._draw(Content.assemble((f"{kind} ({count})", "bold underline")), style, width)
        self._headings[kind] = (key, strips)
        return strips

    def _row(self, sid: str, width: int) -> list[Strip]:
        if sid == self.cursor:
            style = self.get_visual_style("sessions-list--row", "sessions-list--row-highlighted")
        elif sid == self._hover:
            style = self.get_visual_style("sessions-list--row", "sessions-list--row-hover")
        else:
            style = self.get_visual_style("sessions-list--row")
        drawings = self._drawn.get(sid)
        if drawings is None:
            if len(self._drawn) >= DRAWINGS_KEPT:
                self._drawn.clear()
            drawings = self._drawn[sid] = {}
        strips = drawings.get((style, width))
        if strips is None:
            s = self.sessions.get(sid)
            strips = drawings[(style, width)] = self._draw(
                self._prompt(s) if s is not None else Rows([Content("")]), style, width)
        return strips

    def _draw(self, visual: Visual, style: Style, width: int) -> list[Strip]:
        return [strip.extend_cell_length(width, style.rich_style)
                for strip in Visual.to_strips(self, visual, width, None, style)]

    # -- the cursor and the mouse --

    @property
    def cursor(self) -> str | None:
        """The highlighted session (what enter opens and `x` stops)."""
        return self._cursor

    @cursor.setter
    def cursor(self, sid: str | None) -> None:
        self._move_to(sid)

    def _move_to(self, sid: str | None) -> None:
        old, self._cursor = self._cursor, sid
        if old != sid:
            self._refresh_rows({old, sid})
        if sid is not None:
            self._scroll_to_row(sid)

    def _scroll_to_row(self, sid: str) -> None:
        y = self._line_of(sid)
        if y is not None and self.is_mounted:
            self.scroll_to_region(Region(0, y, self.scrollable_content_region.width, ROW_HEIGHT),
                                  force=True, animate=False, immediate=True)

    def on_show(self) -> None:
        if self.cursor is not None:
            self._scroll_to_row(self.cursor)

    def _first(self, direction: int) -> str | None:
        """The first session (direction 1) or the last (-1)."""
        if not self._blocks:
            return None
        group = self._order.group(self._blocks[0 if direction > 0 else -1][0])
        return group[0] if direction > 0 else group[-1]

    def _next(self, sid: str | None, direction: int) -> str | None:
        """The session after `sid` (direction 1) or before it (-1), over the headings, round from
        the last to the first."""
        kind = self._order.kind_of(sid) if sid is not None else None
        if sid is None or kind is None:
            return self._first(direction)
        group = self._order.group(kind)
        at = group.index(sid) + direction
        if 0 <= at < len(group):
            return group[at]
        kinds = [k for k, _ in self._blocks]
        other = self._order.group(kinds[(kinds.index(kind) + direction) % len(kinds)])
        return other[0] if direction > 0 else other[-1]

    def _page(self, direction: int) -> None:
        """The cursor a page down (1) or up (-1): to the session shown there, or the one past it
        when that is a heading."""
        y = self._line_of(self.cursor) if self.cursor is not None else None
        if y is None:  # as OptionList: page down to the last session, page up to the first
            self._move_to(self._first(-direction))
            return
        height = self.scrollable_content_region.height
        at = self._at(clamp(y + direction * height, 0, self._lines - 1))
        if at is None:
            return
        kind, sid, _ = at
        if sid is None:  # a heading: its first session going down, the one above it going up
            first = self._order.group(kind)[0]
            sid = first if direction > 0 else (self._next(first, -1) if kind != self._blocks[0][0] else first)
        self._move_to(sid)

    def _row_under(self, event: events.MouseEvent) -> str | None:
        offset = event.get_content_offset(self)
        at = self._at(round(self.scroll_offset.y) + offset.y) if offset is not None else None
        return at[1] if at is not None else None

    def on_mouse_move(self, event: events.MouseMove) -> None:
        self._set_hover(self._row_under(event))

    def on_leave(self) -> None:
        self._set_hover(None)

    def _set_hover(self, sid: str | None) -> None:
        if sid != self._hover:
            old, self._hover = self._hover, sid
            self._refresh_rows({old, sid})

    def on_click(self, event: events.Click) -> None:
        sid = self._row_under(event)
        if sid is not None:
            self._move_to(sid)
            self.action_select()

    # -- actions --

    def _moving(self) -> None:
        self._moving_until = self._clock() + SETTLE

    def action_cursor_up(self) -> None:
        self._moving()
        self._move_to(self._next(self.cursor, -1))

    def action_cursor_down(self) -> None:
        self._moving()
        self._move_to(self._next(self.cursor, 1))

    def action_page_up(self) -> None:
        self._moving()
        self._page(-1)

    def action_page_down(self) -> None:
        self._moving()
        self._page(1)

    def action_first(self) -> None:
        self._moving()
        self._move_to(self._first(1))

    def action_last(self) -> None:
        self._moving()
        self._move_to(self._first(-1))

    def action_select(self) -> None:
        if self.cursor is not None and self.cursor in self.sessions:
            # The App moves the focus to the input; keys typed before it gets there are text for
            # the input too, letters of this list's bindings included.
            self.typing_away = True
            self.post_message(self.Picked(self.cursor))

    def action_new(self) -> None:
        self.post_message(self.NewRequested())

    def action_stop(self) -> None:
        if self.cursor is not None and self.cursor in self.sessions:
            self.post_message(self.StopRequested(self.cursor))
