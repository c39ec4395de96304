"""The sessions list is virtual (aiops/tui/widgets/sessions.py): a line is found from the kinds'
groups and a row drawn from its session when it comes into sight, and drawings are kept until the
session shows something new. What the operator sees and reaches by key and by mouse must be what a
list drawn from scratch shows, through new sessions, deleted ones, a kind that appears or empties,
and sessions that speak."""

from __future__ import annotations

import random
from typing import Any

from textual.app import App, ComposeResult
from textual.containers import Horizontal
from textual.widgets import Static

from aiops.tui.widgets.sessions import SessionsList
from tests.fakes.openai_server import Reply
from tests.support.terminal import Terminal, full
from tests.tui.conftest import SIZE, ready, send, wait_for

KINDS = ("console", "cli", "api", "proxy", "slack")


def session(n: int, kind: str, at: float) -> dict[str, Any]:
    return {"client_id": f"s{n}", "short_id": n, "kind": kind, "title": f"title {n}", "model": "m",
            "state": "idle", "updated_at": at}


class Pane(App[None]):
    CSS = """
    #sessions { width: 36; height: 1fr; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.picked: list[str] = []
        self.now = 0.0  # the list's clock (its redraw pace, the order's hold after a key)

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield SessionsList(clock=lambda: self.now, id="sessions")
            yield Static("chat", id="chat")

    def on_sessions_list_picked(self, msg: SessionsList.Picked) -> None:
        self.picked.append(msg.session_id)


def expected(sessions: dict[str, dict[str, Any]]) -> list[str]:
    """What a list set from scratch shows: each kind's heading, its sessions newest first."""
    out: list[str] = []
    for kind in KINDS:
        group = sorted((s for s in sessions.values() if s["kind"] == kind), key=lambda s: -s["updated_at"])
        if group:
            out.append(f"{kind} ({len(group)})")
            out.extend(s["client_id"] for s in group)
    return out


def drawn_afresh(app: Pane) -> list[list[Any]]:
    """The screen as a full render draws it with the list's rows drawn again from its data, not
    taken from the list's drawings (a stale one would otherwise compare equal); the list's caches
    are put back as they were, so that the test goes on with what the console would have."""
    sl = app.query_one(SessionsList)
    saved = (sl._drawn, sl._headings)
    lines, dirty = dict(sl._styles_cache._cache), set(sl._styles_cache._dirty_lines)
    sl._drawn, sl._headings = {}, {}
    sl._styles_cache.clear()
    try:
        return full(app)
    finally:
        sl._drawn, sl._headings = saved
        sl._styles_cache._cache, sl._styles_cache._dirty_lines = lines, dirty


def check_state(sl: SessionsList, sessions: dict[str, dict[str, Any]], what: str) -> None:
    assert sl.listing() == expected(sessions), what
    # The scrollbar's extent: a heading's line per kind, two per session.
    assert sl.virtual_size.height == len({s["kind"] for s in sessions.values()}) + 2 * len(sessions), what


async def test_sessions_coming_and_going_show_as_a_list_set_from_scratch(terminal: Terminal) -> None:
    rng = random.Random(27)
    app = Pane()
    async with app.run_test(size=(90, 30)) as pilot:
        sl = app.query_one(SessionsList)
        clock = [1000.0]

        def tick() -> float:
            clock[0] += 1
            return clock[0]

        # Fewer than the pane shows at first: the scrollbar comes (and goes) as sessions do.
        sessions = {f"s{n}": session(n, rng.choice(KINDS[1:4]), tick()) for n in range(8)}
        sl.set_sessions(list(sessions.values()))
        sl.focus()
        sl.cursor = "s7"
        await pilot.pause()
        terminal.start(app)
        n = 8
        for step in range(120):
            roll = rng.random()
            if roll < 0.35:  # a new session, newest in its kind (a kind of its own now and then)
                n += 1
                s = sessions[f"s{n}"] = session(n, rng.choice(KINDS), tick())
                sl.upsert(dict(s))
                what = f"step {step}: s{n} came ({s['kind']})"
            elif roll < 0.55 and len(sessions) > 5:  # one deleted (the cursor's, sometimes)
                sid = rng.choice(sorted(sessions))
                del sessions[sid]
                sl.drop(sid)
                what = f"step {step}: {sid} deleted"
            elif roll < 0.6:  # a kind empties
                kind = rng.choice(KINDS)
                for sid in [sid for sid, s in sessions.items() if s["kind"] == kind]:
                    del sessions[sid]
                    sl.drop(sid)
                what = f"step {step}: every {kind} session deleted"
            else:  # one speaks: it goes on top of its kind
                sid = rng.choice(sorted(sessions))
                sessions[sid]["updated_at"] = tick()
                sl.upsert({"client_id": sid, "updated_at": sessions[sid]["updated_at"]})
                what = f"step {step}: {sid} spoke"
            if sessions and rng.random() < 0.5:  # in the same redraw, another row shows something new
                sid = rng.choice(sorted(sessions))
                if rng.random() < 0.5:
                    sessions[sid]["state"] = rng.choice(("running", "waiting", "idle"))
                    sl.upsert({"client_id": sid, "state": sessions[sid]["state"]})
                else:
                    sl.mark_unread(sid)
                what += f", {sid} changed"
            before = sl.cursor
            app.now += 1
            if rng.random() < 0.1 and sessions:  # the operator opens one (bold, read, the cursor on it)
                sid = rng.choice(sorted(sessions))
                sl.select(sid)
                before = sid
                what += f", {sid} opened"
            sl.rebuild_now()
            await pilot.pause()
            check_state(sl, sessions, what)
            if before in sessions:
                assert sl.cursor == before, what
            await pilot.pause()
            assert terminal.grid == full(app) == drawn_afresh(app), what


def session_lines(app: Pane) -> list[str]:
    """The list's rows as drawn (inside its frame, without the scrollbar)."""
    region = app.query_one(SessionsList).scrollable_content_region
    strips = app.screen._compositor.render_strips()
    return [strip.crop(region.x, region.right).text for strip in strips[region.y:region.bottom]]


async def test_a_new_session_above_the_rows_in_sight_leaves_them_where_they_are_and_clicks_stay_true() -> None:
    app = Pane()
    async with app.run_test(size=(90, 20)) as pilot:
        sl = app.query_one(SessionsList)
        sessions = [session(n, "api", 1000.0 + n) for n in range(30)]  # s29 on top
        sl.set_sessions(sessions)
        sl.focus()
        await pilot.pause()
        await pilot.press("end")
        for _ in range(3):
            await pilot.press("up")
        assert sl.cursor == "s3"
        seen = session_lines(app)
        assert "api (30)" not in " ".join(seen)  # the heading is out of sight
        app.now += 5  # the operator stopped moving the cursor: the order no longer holds
        sl.upsert(session(99, "api", 2000.0))  # the newest: on top, above what the operator sees
        sl.rebuild_now()
        await pilot.pause()
        assert sl.listing()[:2] == ["api (31)", "s99"]
        assert session_lines(app) == seen
        assert sl.cursor == "s3"
        await pilot.press("down")  # the row shown below the cursor's
        assert sl.cursor == "s2"
        # A click on the row that shows s5 opens s5.
        y = next(i for i, line in enumerate(session_lines(app)) if line.strip().startswith("5 "))
        top = sl.scrollable_content_region.y - sl.region.y  # the frame's top line
        await pilot.click("#sessions", offset=(3, top + y))
        await pilot.pause()
        assert app.picked == ["s5"]
        # Home: the first session is the new one, in sight.
        await pilot.press("home")
        await pilot.pause()
        assert sl.cursor == "s99"
        assert any(line.strip().startswith("99 ") for line in session_lines(app))


async def forty_api_sessions_scrolled_to(pilot: Any, app: Pane, y: int) -> SessionsList:
    """The list set with 40 api sessions (s39 on top), its view scrolled to line `y`."""
    sl = app.query_one(SessionsList)
    sl.set_sessions([session(n, "api", 1000.0 + n) for n in range(40)])
    await pilot.pause()
    sl.scroll_to(y=y, animate=False, immediate=True)
    await pilot.pause()
    return sl


async def test_rows_in_sight_stay_put_when_sessions_above_below_or_among_them_come_and_go() -> None:
    app = Pane()
    async with app.run_test(size=(90, 20)) as pilot:
        sl = await forty_api_sessions_scrolled_to(pilot, app, 20)  # rows s30 down to s22 in sight

        def rows() -> list[str]:
            """The shorthand ids of the rows in sight, top first."""
            return [line.split()[0] for line in session_lines(app) if line.split() and line.split()[0].isdigit()]

        seen = rows()
        assert len(seen) > 6 and "api (40)" not in " ".join(session_lines(app))

        async def redraw() -> None:
            app.now += 5
            sl.rebuild_now()
            await pilot.pause()

        sl.drop("s5")  # below the view: the heading's count changes, nothing in sight moves
        await redraw()
        assert rows() == seen
        sl.upsert(session(99, "api", 2000.0))  # above, and one below gone, in the same redraw
        sl.drop("s4")
        await redraw()
        assert rows() == seen
        sl.drop(f"s{seen[4]}")  # one in sight: the rows above it stay, those below move up
        await redraw()
        assert rows()[:4] == seen[:4] and rows()[4:len(seen) - 1] == seen[5:]


async def test_sessions_coming_and_going_while_the_list_is_hidden_show_once_it_is_back() -> None:
    app = Pane()
    async with app.run_test(size=(90, 20)) as pilot:
        sl = app.query_one(SessionsList)
        sl.set_sessions([session(n, rng_kind, 1000.0 + n) for n, rng_kind in enumerate(("api", "cli") * 10)])
        await pilot.pause()
        sl.display = False  # a narrow terminal showing the chat, or the pane toggled off
        await pilot.pause()
        app.now += 5
        sl.upsert(session(99, "console", 2000.0))
        sl.drop("s0")
        sl.rebuild_now()
        await pilot.pause()
        sl.display = True
        await pilot.pause()
        await pilot.pause()
        assert session_lines(app)[0].strip() == "console (1)"
        assert session_lines(app)[1].strip().startswith("99 ")
        assert session_lines(app)[3].strip() == "cli (10)"
        assert "api (9)" in sl.listing()  # below, out of sight


async def test_a_new_list_while_rebuilds_are_held_is_drawn_and_reached_only_once_they_go_on() -> None:
    """The terminal behind (rebuilds held), the console reconnects and sets a smaller list: what is
    drawn and what keys reach until the hold ends is the old list, whole, never half of each."""
    app = Pane()
    async with app.run_test(size=(90, 20)) as pilot:
        sl = app.query_one(SessionsList)
        sl.set_sessions([session(n, kind, 1000.0 + n) for n, kind in enumerate(("cli", "api") * 5)])
        sl.focus()
        await pilot.pause()
        sl.hold_rebuilds(True)
        sl.set_sessions([session(n, "api", 1000.0 + n) for n in (1, 3)])
        sl.refresh()
        await pilot.press("end", "up", "pageup")  # keys on the list as drawn: the old one
        await pilot.hover("#sessions", offset=(3, 4))
        await pilot.pause()
        assert sl.listing()[0] == "cli (5)" and len(sl.listing()) == 12
        app.now += 5
        sl.hold_rebuilds(False)
        await pilot.pause()
        await pilot.pause()
        assert sl.listing() == ["api (2)", "s3", "s1"]
        assert [line.strip() for line in session_lines(app)[:1]] == ["api (2)"]


async def test_the_session_at_the_top_of_the_view_speaking_leaves_the_view_where_it_is() -> None:
    app = Pane()
    async with app.run_test(size=(90, 20)) as pilot:
        sl = await forty_api_sessions_scrolled_to(pilot, app, 21)  # s29's row at the top of the view
        seen = session_lines(app)
        assert seen[0].split()[0] == "29"
        app.now += 5
        sl.upsert({"client_id": "s29", "updated_at": 3000.0})  # it speaks: to the top of its kind
        sl.rebuild_now()
        await pilot.pause()
        assert sl.listing()[1] == "s29"
        # The rows below it stay where they were; the row above them moved down into its place.
        shown = session_lines(app)
        assert shown[2:] == seen[2:] and shown[0].split()[0] == "30"


async def test_the_cursor_stays_in_view_when_its_session_moves_and_page_keys_start_at_the_ends() -> None:
    app = Pane()
    async with app.run_test(size=(90, 20)) as pilot:
        sl = app.query_one(SessionsList)
        sl.set_sessions([session(n, "api", 1000.0 + n) for n in range(40)])
        sl.focus()
        await pilot.pause()
        await pilot.press("pagedown")  # no cursor yet: as OptionList, page down goes to the last
        assert sl.cursor == "s0"
        await pilot.press("pageup")
        sl.cursor = None
        await pilot.press("pageup")  # and page up to the first
        assert sl.cursor == "s39"
        sl.cursor = "s20"
        await pilot.pause()
        assert any(line.split()[:1] == ["20"] for line in session_lines(app))
        app.now += 5
        sl.upsert({"client_id": "s20", "updated_at": 3000.0})  # it speaks: to the top, far above
        sl.rebuild_now()
        await pilot.pause()
        assert sl.cursor == "s20"
        assert any(line.split()[:1] == ["20"] for line in session_lines(app))


async def test_older_sessions_come_in_below_without_moving_the_view_and_a_deleted_one_stays_gone() -> None:
    app = Pane()
    async with app.run_test(size=(90, 20)) as pilot:
        sl = app.query_one(SessionsList)
        sl.set_sessions([session(n, "api", 1000.0 + n) for n in range(10, 20)])
        sl.focus()
        sl.cursor = "s15"
        await pilot.pause()
        seen = session_lines(app)
        sl.drop("s12")  # deleted while a page of older sessions was on its way
        older = [session(12, "api", 1012.0), *(session(n, "api", 900.0 + n) for n in range(10))]
        app.now += 5
        assert sl.add_older(older) == 10
        sl.add_older([session(15, "api", 1.0)])  # one the list has: as the list has it
        sl.rebuild_now()
        await pilot.pause()
        assert sl.listing() == ["api (19)", *(f"s{n}" for n in (19, 18, 17, 16, 15, 14, 13, 11, 10)),
                                *(f"s{n}" for n in range(9, -1, -1))]
        assert sl.cursor == "s15" and session_lines(app)[1:9] == seen[1:9]  # s19 to s16, unmoved


async def test_a_streaming_answer_keeps_its_session_in_place_until_the_turn_ends(make_app, fake_openai) -> None:
    """Fifty sessions streaming would swap places ten times a second if every delta counted as
    activity: the list moves a session when its turn starts or ends, not while its answer streams."""
    fake_openai.script(Reply.text("a long answer, " * 12, chunks=12, chunk_delay=0.05, hold_after=2),
                       Reply.text("quick"))
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        streaming = app.chat.session_id
        assert streaming is not None
        await send(pilot, "tell me at length")
        await wait_for(pilot, lambda: fake_openai.held >= 1, "the answer under way, held halfway")

        def console_top() -> list[str]:
            listing = app.sessions_list.listing()
            return listing[listing.index(next(x for x in listing if x.startswith("console ("))) + 1:][:2]

        # Meanwhile another session's turn starts and ends: it goes above the one streaming.
        other = await app.adapter.engine.submit("console-other", "and you?", kind="console")
        await other.wait(10)
        await wait_for(pilot, lambda: console_top() == ["console-other", streaming], "the other session on top")
        fake_openai.release()  # the rest of the answer streams in, over half a second
        await pilot.pause(0.3)  # three of the list's redraws meanwhile
        assert streaming in app.live.turn  # (still streaming)
        assert console_top() == ["console-other", streaming]
        await wait_for(pilot, lambda: streaming not in app.live.turn, "the answer's end")
        await wait_for(pilot, lambda: console_top() == [streaming, "console-other"],
                       "the session whose turn ended on top")


async def test_keys_that_scroll_the_list_draw_what_a_list_drawn_afresh_shows(terminal: Terminal) -> None:
    """A scroll moves the lines the list had drawn instead of drawing them all again (a list key
    that takes the cursor out of sight rendered every line in sight): what the terminal shows
    after each key, with sessions changing meanwhile, is still the list drawn from scratch, and a
    key that scrolls by a row renders only the lines it brings in and those that changed."""
    rng = random.Random(29)
    app = Pane()
    async with app.run_test(size=(90, 24)) as pilot:
        sl = app.query_one(SessionsList)
        sessions = {f"s{n}": session(n, rng.choice(KINDS), 1000.0 + n) for n in range(60)}
        sl.set_sessions(list(sessions.values()))
        sl.focus()
        for timer in list(sl._timers):  # the ages' redraw every 15 s would land in a step's count
            timer.pause()
        await pilot.pause()
        terminal.start(app)
        rendered: list[int] = []
        render_line = sl.render_line

        def counting(y: int) -> Any:
            rendered.append(y)
            return render_line(y)

        sl.render_line = counting  # type: ignore[method-assign]  # observed, not changed
        one_row_scrolls: list[int] = []
        n = 60
        for step in range(150):
            key = rng.choice(["down"] * 6 + ["up"] * 4 + ["pagedown", "pageup", "home", "end"])
            top = round(sl.scroll_offset.y)
            rendered.clear()
            await pilot.press(key)
            await pilot.pause()
            if abs(round(sl.scroll_offset.y) - top) == 2 and key in ("up", "down"):
                one_row_scrolls.append(len(rendered))
            what = f"step {step}: {key}"
            if rng.random() < 0.2:  # meanwhile a session speaks or comes
                app.now += 5  # past the hold after a key: the list reorders
                if rng.random() < 0.5:
                    n += 1
                    s = sessions[f"s{n}"] = session(n, rng.choice(KINDS), 2000.0 + step)
                    sl.upsert(dict(s))
                else:
                    sid = rng.choice(sorted(sessions))
                    sessions[sid]["updated_at"] = 2000.0 + step
                    sl.upsert({"client_id": sid, "updated_at": sessions[sid]["updated_at"]})
                sl.rebuild_now()
                await pilot.pause()
                what += ", a session changed"
            await pilot.pause()
            assert terminal.grid == full(app) == drawn_afresh(app), what
        assert len(one_row_scrolls) >= 10, one_row_scrolls
        # The two lines brought in, and the rows the cursor left and reached (it rendered every
        # line in sight: ~20 here).
        assert max(one_row_scrolls) <= 8, one_row_scrolls


async def test_a_session_deleted_while_the_order_holds_leaves_its_place_blank_through_scrolls(
        terminal: Terminal) -> None:
    """While the operator moves the cursor the rows hold their places; a session deleted then
    leaves its place blank until they move (as a list drawn afresh shows it), also after a key
    that scrolls the lines it had drawn. (Found by a reviewer: its old row stayed, moved along.)"""
    app = Pane()
    async with app.run_test(size=(90, 20)) as pilot:
        sl = await forty_api_sessions_scrolled_to(pilot, app, 0)
        sl.focus()
        await pilot.pause()
        terminal.start(app)
        sl.cursor = "s31"  # near the bottom of the view
        await pilot.pause()
        await pilot.press("down")  # the order holds for a second (the list's clock stands still)
        await pilot.pause()
        sl.drop("s35")  # in sight, not the cursor's
        sl.rebuild_now()  # held: nothing placed
        await pilot.pause()
        assert terminal.grid == full(app) == drawn_afresh(app)
        top = sl.scroll_offset.y
        await pilot.press("down")
        await pilot.pause()
        assert sl.scroll_offset.y != top  # it scrolled
        assert terminal.grid == full(app) == drawn_afresh(app)
