"""Sessions as the console follows them: picking one, loading its history, drawing its events live,
and keeping the sessions list in step (new, changed, deleted, unread, last activity).

Every engine event of a session goes through `follow`: kept for the live turn's replay (`LiveTurns`),
drawn in the chat when its session is the one shown, otherwise marking the session unread. A session
picked mid-turn shows its stored history without the running turn, then that turn replayed from the
live buffer, so nothing is drawn twice or lost. History pages load in workers that only post the page
back; the App's handler, here, draws it. Owned by the App, whose `@on` handlers delegate here.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from textual.content import Content

from aiops.engine import events as ev
from aiops.tui.format import one_line

if TYPE_CHECKING:
    from aiops.tui.adapter import HistoryLoaded, SessionChanged
    from aiops.tui.app import AiopsApp


WAITING_END = "for the engine to start"
WAITING = "{n} message{s} waiting " + WAITING_END


class SessionEvents:
    """The selected session, its history and live events, and the sessions list."""

    def __init__(self, app: AiopsApp) -> None:
        self.app = app
        # Sent from the input before the engine had started: sent, in order, once it has (the
        # console takes keys from its first frame; the engine starts after it).
        self.waiting: list[str] = []

    async def select(self, session_id: str) -> None:
        app = self.app
        app.selected = session_id
        app.sessions_list.select(session_id)
        app.chat.session_id = None  # loading: live events wait for the history
        app.chat_input.busy = session_id in app.live.turn
        self.update_labels()
        app.side.refresh_prompt()
        app.side.refresh_limits()
        app.guidance.update()
        self.load_history(session_id, None)

    def update_labels(self) -> None:
        app = self.app
        sid = app.selected
        info = app.sessions_list.sessions.get(sid or "", {})
        short = info.get("short_id", "")
        model = info.get("model") or app.adapter.default_model()
        app.status.session = f"#{short}" if short != "" else ""
        app.status.model = model
        app.status.running = len(app.live.turn)
        chat = app.chat
        chat.border_title = Content(f"Chat · {short} {one_line(info.get('title') or '', 40)}".rstrip())
        chat.border_subtitle = Content(f"{info.get('kind', '')} · {model} · {info.get('state', 'idle')}")

    def load_history(self, session_id: str, before_id: int | None) -> None:
        """A page of history, read in a worker that only posts it back (`history_loaded` draws it)."""
        # A partial of a coroutine function, as Textual's @work passes it (run_worker's annotation
        # wants a zero-argument callable; Textual runs a partial's coroutine all the same).
        self.app.run_worker(partial(self._load_history, session_id, before_id), name="_load_history",  # type: ignore[arg-type]
                            group="history", exit_on_error=False)

    async def _load_history(self, session_id: str, before_id: int | None) -> None:
        app = self.app
        app.post_message(await app.adapter.load_history(session_id, app.history_page, before_id))

    async def history_loaded(self, msg: HistoryLoaded) -> None:
        app = self.app
        if msg.session_id != app.selected or not app._drawing:
            return
        chat = app.chat
        if msg.before_id is None:
            app.reclaim.removed(len(chat.walk_children()))  # what the chat held goes
            # The whole page: the chat leaves out what is stored of the running turn and draws
            # that turn from its events, in the place its prompt has among the page's turns.
            await chat.show(msg.session_id, msg.messages, has_more=msg.has_more,
                            live=list(app.live.events.get(msg.session_id, [])),
                            queued=app.live.queued_notes(msg.session_id))
            app.services.session_shown()
            await self.send_waiting()  # typed while the engine started: sent now, drawn once
        elif chat.session_id == msg.session_id:
            await chat.prepend(msg.messages, has_more=msg.has_more)

    async def picked(self, session_id: str) -> None:
        # A session is picked to talk in it: the cursor goes to the input at once, so the next
        # letters typed are the message, not the sessions list's keys (n: new, x: stop).
        app = self.app
        app.gate_desk.return_to = None
        app.main.return_focus(app.chat_input)
        if session_id != app.selected:
            await self.select(session_id)

    async def submit(self, text: str) -> None:
        """The input's text, sent to the selected session as the operator."""
        app = self.app
        if app.services_failed is not None:
            app.notify(f"not sent: the engine did not start ({app.services_failed})", severity="error", timeout=8)
            app.chat_input.put_back(text)
            return
        if not app.services_ready or app.selected is None or self.waiting:
            self.waiting.append(text)
            n = len(self.waiting)
            app.chat_input.border_subtitle = WAITING.format(n=n, s="s" if n > 1 else "")
            app.notify("sent once the engine has started", timeout=3)
            return
        await self._send(text)

    async def _send(self, text: str) -> None:
        app = self.app
        try:
            sid = app.selected
            assert sid is not None
            app.live.typed(await app.adapter.submit(sid, text), sid, text)
        except Exception as e:  # noqa: BLE001 - EngineError and friends: say it where the user looks
            if app._drawing:
                app.notify(str(e), severity="error", timeout=8)
                app.chat_input.put_back(text)
            return
        if app._drawing and app.chat.session_id == sid:
            # The operator's own message: the view follows the bottom again, wherever they had
            # scrolled to read (Textual's anchor, released by that scroll, holds once more), so
            # the message and its answer are in sight rather than below it.
            app.chat.scroll_end(animate=False)

    async def send_waiting(self) -> None:
        """The engine has started and a session is selected: what was typed meanwhile is sent."""
        app = self.app
        while self.waiting and app.services_ready and app.selected is not None and app._drawing:
            await self._send(self.waiting.pop(0))
        if not app._drawing:
            return  # quitting: the input may be gone already (a history page drawn as the app closed)
        if not self.waiting and str(app.chat_input.border_subtitle or "").endswith(WAITING_END):
            app.chat_input.border_subtitle = ""

    def give_back_waiting(self) -> None:
        """The engine did not start: what waited for it goes back to the input, unsent."""
        app = self.app
        if self.waiting:
            text, self.waiting = "\n".join(self.waiting), []
            app.chat_input.border_subtitle = ""
            app.chat_input.put_back(text)

    def cancel(self) -> None:
        """Esc in the input: stop the selected session's turn."""
        app = self.app
        sid = app.selected
        if sid is None:
            return
        # Only a prompt typed here comes back to the input: a chat UI's or a script's would be one
        # Enter away from being sent again, as the operator, into their conversation.
        typed = app.live.typed_text(sid)
        if app.adapter.stop_turn(sid):
            if typed is not None:
                app.chat_input.put_back(typed)
            app.notify("turn cancelled", timeout=3)

    def _untouched(self, session_id: str) -> bool:
        """This console's session, shown, with nothing in it yet (the chat still says how to
        start) and nothing running or waiting to be sent."""
        app = self.app
        info = app.sessions_list.sessions.get(session_id, {})
        return (info.get("kind") == "console" and info.get("owner") == app.adapter.owner
                and app.chat.session_id == session_id and app.chat.untouched
                and session_id not in app.live.turn and not self.waiting)

    async def new_session(self, *, focus: bool = True) -> None:
        app = self.app
        if not app.services_ready:
            app.notify("the engine is still starting", timeout=3)
            return
        if app.selected is not None and self._untouched(app.selected):
            # A new session from one still empty would be another empty one, stored and listed
            # (a QA pass left a hundred of them): the one shown is the new session.
            if focus:
                app.main.show_pane("input")
            app.notify("this session is new: type to start", timeout=3)
            return
        session = await app.adapter.open_session("console")
        if not app._drawing:
            return
        app.sessions_list.upsert(session)
        await self.select(session["client_id"])
        if focus:
            app.main.show_pane("input")

    async def select_latest_console(self, sessions: list[dict[str, Any]]) -> None:
        """This console's session last active, or a new one when there is none (another operator's
        console session, made from their attached console, is theirs to go on with)."""
        owner = self.app.adapter.owner
        console = [s for s in sessions if s.get("kind") == "console" and s.get("owner") == owner]
        if console:
            await self.select(max(console, key=lambda s: s.get("updated_at") or 0)["client_id"])
        else:
            await self.new_session(focus=False)

    async def changed(self, msg: SessionChanged) -> None:
        app = self.app
        event = msg.event
        sid = event.session_id
        if not app._drawing or sid is None:
            return
        if event.change == "deleted":
            await self.deleted(sid)
            return
        old_model = app.sessions_list.sessions.get(sid, {}).get("model")
        app.sessions_list.upsert({"client_id": sid, **event.session})
        if sid == app.selected:
            self.update_labels()
            if app.sessions_list.sessions.get(sid, {}).get("model") != old_model:
                app.side.refresh_prompt()
                app.guidance.update()

    async def deleted(self, sid: str) -> None:
        app = self.app
        shown = app.sessions_list.sessions.get(sid, {})
        app.sessions_list.drop(sid)
        if sid == app.selected:
            # Said, not just done: the chat the operator was reading changes under them.
            app.notify(f"session {shown.get('short_id') or sid} ({sid}) was deleted", timeout=6)
            await self.select_latest_console(list(app.sessions_list.sessions.values()))

    async def follow(self, event: ev.Event, *, unread: bool = False, moves: bool = True) -> None:
        """An event of a session: kept for the live turn's replay, drawn when its session is shown
        (otherwise `unread` marks the session), and the session's last activity (which, with
        `moves`, places it again among the sessions last active)."""
        app = self.app
        sid = event.session_id
        if sid is None or not app._drawing:
            return
        self._track_live(event)
        if sid == app.selected and app.chat.session_id == sid:
            await app.chat.apply(event)
            if not app._drawing:  # the app began to close while drawing
                return
        elif unread:
            app.sessions_list.mark_unread(sid)
        app.sessions_list.touch(sid, event.ts, move=moves)

    def _track_live(self, event: ev.Event) -> None:
        app = self.app
        app.live.track(event)
        if isinstance(event, ev.TurnStarted | ev.Done):
            sid = event.session_id or ""
            if sid == app.selected:
                app.chat_input.busy = sid in app.live.turn
            app.status.running = len(app.live.turn)
