"""The sessions pane: every session of every kind, grouped by kind."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from textual.content import Content
from textual.message import Message
from textual.timer import Timer
from textual.visual import Visual
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from aiops.tui.format import STATE_MARK, ago, one_line
from aiops.tui.keys import bindings_for
from aiops.tui.widgets.fitted import Rows
from aiops.tui.widgets.session_order import SessionOrder
from aiops.tui.widgets.spliced import SplicedOptionList
from aiops.tui.widgets.typeaway import TypesAway

if TYPE_CHECKING:
    from textual.css.styles import RulesMap
    from textual.strip import Strip
    from textual.style import Style
    from textual.visual import RenderOptions

# Session events redraw the list at most this often (seconds): fifty streaming sessions change
# state and gain unread marks many times a second, and a burst of them makes one redraw.
REDRAW_EVERY = 0.1

# After a key moves the cursor the order holds this long (seconds), rows still redrawn in place:
# while sessions stream the order changes at every redraw, and the row the operator saw below the
# cursor would no longer be the one the next key moves to.
SETTLE = 1.0


class SessionRow(Visual):
    """A session's two lines, built from the list's data when drawn (a row scrolled out of sight
    costs nothing), so a changed session needs no new option: the next draw shows it as it is."""

    def __init__(self, owner: SessionsList, session_id: str) -> None:
        self.owner = owner
        self.session_id = session_id

    def _rows(self) -> Rows:
        s = self.owner.sessions.get(self.session_id)
        return self.owner._prompt(s) if s is not None else Rows([Content("")])

    def render_strips(self, width: int, height: int | None, style: Style, options: RenderOptions) -> list[Strip]:
        return self._rows().render_strips(width, height, style, options)

    def get_optimal_width(self, rules: RulesMap, container_width: int) -> int:
        return self._rows().get_optimal_width(rules, container_width)

    def get_height(self, rules: RulesMap, width: int) -> int:
        return 2

    @property
    def plain(self) -> str:
        return self._rows().plain


class SessionsList(TypesAway, SplicedOptionList):
    """Sessions grouped by kind: shorthand id, title, model, state, last activity, unread.

    Picking a session hands the operator to the input; text typed here that is none of the list's
    keys goes there too, so that a message cannot open a session (`n`) or stop a turn (`x`).
    """

    PANE = "sessions"
    BINDINGS = bindings_for("sessions")

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
        self.hold = False  # rebuilds wait (the terminal is behind: nothing is drawn)
        self._held = False  # one waited
        self._rows: dict[str, Option] = {}  # a session's option, kept across redraws
        self._order = SessionOrder()  # the order the next redraw shows
        self._shown: dict[str, list[str]] = {}  # the order on screen: each kind's session ids
        self._headings: dict[str, tuple[int, Option]] = {}  # each kind's heading, for its count
        # Sessions whose place in the order may have changed since the last redraw (new, gone,
        # last activity, kind).
        self._moved: set[str] = set()
        self._reset = False  # the next redraw sets every option again (a new list of sessions)
        self._moving_until = 0.0  # the cursor moved: the order holds until then (monotonic)
        self._settled: Timer | None = None  # the held order is shown then
        self._pending: Timer | bool = False  # a redraw is scheduled
        self._last = 0.0  # when the list was last redrawn (monotonic)
        # Sessions whose rows show something new since the last redraw: a redraw in the same order
        # draws only these again (the other rows' drawings are kept).
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
        self._rows = {sid: row for sid, row in self._rows.items() if sid in self.sessions}
        self._changed.update(self.sessions)  # every one may show something new
        self._order.reset(self.sessions)
        self._moved.clear()
        self._reset = True
        self.rebuild_now()

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

    def drop(self, session_id: str) -> None:
        """Take a deleted session off the list. (Not `remove`: that is every widget's own removal
        from the DOM.)"""
        self.sessions.pop(session_id, None)
        self._rows.pop(session_id, None)
        self.unread.discard(session_id)
        self._moved.add(session_id)
        self.rebuild()

    def touch(self, session_id: str, ts: float | None = None) -> None:
        s = self.sessions.get(session_id)
        if s is not None:
            s["updated_at"] = ts or time.time()
            self._changed.add(session_id)  # its age, drawn at the next redraw
            self._moved.add(session_id)  # and its place, when the list is next redrawn

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
        """Redraw now; the cursor stays on its session (or moves to `highlight`). Rows are drawn
        when shown (`SessionRow`), so a change that keeps the order only redraws what is on screen;
        sessions that changed places swap options in place (`_move_rows`), and only a new or gone
        session (or kind) sets the options again. While the terminal is behind (nothing is drawn)
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
        kinds = self._order.update(self.sessions, moved)
        reset, self._reset = self._reset, False
        if reset or not (self._move_rows(kinds, changed) or self._splice_rows(changed)):
            self._set_order(highlight)
        current = self.highlighted_option
        if highlight is not None and (current is None or current.id != highlight):
            self._highlight(highlight)

    def _move_rows(self, kinds: set[str], changed: set[str]) -> bool:
        """Put the rows of `kinds` in their new order by swapping options in place, and draw the
        `changed` rows again; False (nothing done) when a group gained or lost a session.

        Setting all the options again, as a new order did, measured the height of every one of them
        and scrolled to the top and back (1,050 listed: 2-7 ms a redraw, 10,050: 14-60 ms; ten
        redraws a second while sessions stream, and the view jumped at each). Within a group
        every row is two lines, so OptionList's lines stay as they are: only the options between the
        first and the last row that moved change places, and their drawings (which carry their
        index, for the mouse) are dropped. OptionList's private lists, checked against Textual 8.2.8."""
        if self._order.kinds() != list(self._shown):
            return False
        spans: list[tuple[int, list[str]]] = []
        for kind in kinds:
            old, new = self._shown[kind], self._order.group(kind)
            if len(old) != len(new):
                return False
            lo = next((i for i, (a, b) in enumerate(zip(old, new, strict=True)) if a != b), None)
            if lo is None:
                continue
            hi = len(new) - next(i for i, (a, b) in enumerate(zip(reversed(old), reversed(new), strict=True))
                                 if a != b)
            ids = new[lo:hi]
            if set(old[lo:hi]) != set(ids) or any(sid not in self._rows for sid in ids):
                return False  # one session left the group and another came in (or came back)
            spans.append((self.get_option_index(f"kind:{kind}") + 1 + lo, ids))
        highlighted = self.highlighted_option
        redraw = set(changed)
        for at, ids in spans:
            for i, sid in enumerate(ids, at):
                option = self._rows[sid]
                self._options[i] = option
                self._option_to_index[option] = i
            redraw.update(ids)
        for kind in kinds:
            self._shown[kind] = list(self._order.group(kind))
        if highlighted is not None:
            self.highlighted = self._option_to_index[highlighted]
        self._redraw_rows(redraw)
        return True

    def _splice_rows(self, changed: set[str]) -> bool:
        """Put the new order in place when sessions came or went (or a kind did), the `changed`
        rows drawn again (`SplicedOptionList.splice_options`); False (nothing done) where it
        cannot (a hidden list, one not measured yet).

        Setting all the options again (10,050 listed) took 13-33 ms in the handler, measured every
        option's height again, dropped every row's drawing, scrolled to the top and back, and the
        list's new height then laid the whole screen out again: 17-40 ms more in the next frame. A
        new session came in that way at every gate round of the bench, just before the model's
        tool call, which then waited for both (docs/PERFORMANCE.md, "11:20-12:50 UTC")."""
        if not self.splice_options(self._options_in_order(), changed):
            return False
        self._shown = {kind: list(self._order.group(kind)) for kind in self._order.kinds()}
        if self.highlighted is None and self.selected in self._id_to_option:  # its session is gone
            self.highlighted = self._option_to_index[self._id_to_option[self.selected]]
        return True

    def _redraw_rows(self, session_ids: set[str] | None = None) -> None:
        """Draw the rows of `session_ids` (None: every row, for the ages) again from the data (new
        states, unread marks, ages) where they are on screen.

        The order is unchanged, so every row keeps its place and height: only those rows' drawings
        are dropped from OptionList's cache of rendered options, keyed by (option, style, padding).
        Dropping them all (`_clear_caches`, as the public `replace_option_prompt` does) redrew every
        row on screen and measured every option's height again: with fifty sessions changing state
        it was most of each frame, and a gate's row in the inbox waited for it.

        Only the lines of those rows that are in sight are painted again: the whole list's lines
        were, at every redraw (ten a second while sessions stream), most often for sessions
        scrolled out of sight."""
        # OptionList's private cache and index, checked against Textual 8.2.8.
        cache = self._option_render_cache
        if session_ids is None:
            cache.clear()
            self.refresh()
            return
        if not session_ids:
            return
        for key in [k for k in cache.keys() if k[0].id in session_ids]:
            cache.discard(key)
        top, height = self.scroll_offset.y, self.scrollable_content_region.height
        lines = self._index_to_line
        for sid in session_ids:
            option = self._rows.get(sid)
            index = self._option_to_index.get(option) if option is not None else None
            y = lines.get(index) if index is not None else None
            if y is not None and top - 2 < y < top + height:
                self.refresh_lines(y, 2)

    def _options_in_order(self) -> list[Option]:
        """Every kind's heading and its sessions' rows, in the order to show (the options of rows
        and headings that did not change are the same objects)."""
        options: list[Option] = []
        for kind in self._order.kinds():
            group = self._order.group(kind)
            heading = self._headings.get(kind)
            if heading is None or heading[0] != len(group):
                option = Option(Content.assemble((f"{kind} ({len(group)})", "bold underline")),
                                id=f"kind:{kind}", disabled=True)
                heading = self._headings[kind] = (len(group), option)
            options.append(heading[1])
            for sid in group:
                row = self._rows.get(sid)
                if row is None:
                    row = self._rows[sid] = Option(SessionRow(self, sid), id=sid)
                options.append(row)
        return options

    def _set_order(self, highlight: str | None) -> None:
        highlighted = highlight or (self.highlighted_option.id if self.highlighted_option is not None
                                    else self.selected)
        options = self._options_in_order()
        self._shown = {kind: list(self._order.group(kind)) for kind in self._order.kinds()}
        with self.app.batch_update():
            self.set_options(options)
            if highlighted is not None:
                self._highlight(highlighted)

    def _highlight(self, session_id: str) -> None:
        try:
            self.highlighted = self.get_option_index(session_id)
        except Exception:  # noqa: BLE001 - the session is gone
            pass

    # -- actions --

    def _moving(self) -> None:
        self._moving_until = self._clock() + SETTLE

    def action_cursor_up(self) -> None:
        self._moving()
        super().action_cursor_up()

    def action_cursor_down(self) -> None:
        self._moving()
        super().action_cursor_down()

    def action_page_up(self) -> None:
        self._moving()
        super().action_page_up()

    def action_page_down(self) -> None:
        self._moving()
        super().action_page_down()

    def action_first(self) -> None:
        self._moving()
        super().action_first()

    def action_last(self) -> None:
        self._moving()
        super().action_last()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id and not event.option.id.startswith("kind:"):
            # The App moves the focus to the input; keys typed before it gets there are text for
            # the input too, letters of this list's bindings included.
            self.typing_away = True
            self.post_message(self.Picked(event.option.id))

    def action_new(self) -> None:
        self.post_message(self.NewRequested())

    def action_stop(self) -> None:
        opt = self.highlighted_option
        if opt is not None and opt.id and not opt.id.startswith("kind:"):
            self.post_message(self.StopRequested(opt.id))
