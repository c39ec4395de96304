"""The operator console: a Textual App that owns the engine and the HTTP server.

The App starts the engine (and the server) on mount in a worker and stops both on unmount, which
cancels running turns cleanly. Engine events arrive as messages from `EngineAdapter`; the App's
handlers own the console's state (selected session, live turns, pending gates) and tell the panes
what to draw. Panes post typed messages back (send, answer a gate, load earlier, …).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import on, work
from textual.app import App
from textual.content import Content
from textual.css.query import NoMatches
from textual.widget import Widget

from aiops.engine import events as ev
from aiops.engine import gc_policy
from aiops.logs import log_file_handler
from aiops.tui.adapter import (
    EngineAdapter,
    EngineMessage,
    ErrorRaised,
    GateOpened,
    GateResolved,
    HistoryLoaded,
    ModelProbe,
    ModelsChecked,
    NoticePosted,
    RateChanged,
    ServicesFailed,
    ServicesStarted,
    SessionChanged,
    ThinkingArrived,
    TokenArrived,
    ToolCallFinished,
    ToolCallStarted,
    TurnDone,
    TurnStarted,
    UserPosted,
    merged_delta,
)
from aiops.tui.commands import ConsoleCommands, focused_pane
from aiops.tui.format import gate_outcome, one_line
from aiops.tui.keys import bindings_for, display_keys, first_key, render_help, unknown_ids
from aiops.tui.screens.main import MainScreen
from aiops.tui.screens.modals import GateDetailsScreen, HelpScreen, PromptEditScreen
from aiops.tui.widgets.chat import ChatView
from aiops.tui.widgets.chat_input import ChatInput
from aiops.tui.widgets.gates import GatesInbox
from aiops.tui.widgets.limits import LimitsTable
from aiops.tui.widgets.log import EarlyRecords, LogView
from aiops.tui.widgets.prompt_tree import PromptPane
from aiops.tui.widgets.sessions import SessionsList
from aiops.tui.widgets.status import StatusBar
from aiops.tui.widgets.typeaway import TypedAway
from aiops.watchdog import ExitWatchdog

if TYPE_CHECKING:
    from textual.driver import Driver

    from aiops.config import Config
    from aiops.engine.engine import Engine
    from aiops.engine.lock import DataDirLock
    from aiops.engine.plugins import Plugin

log = logging.getLogger(__name__)

GATE_TOAST_SECONDS = 4  # the header badge stays as long as the gate does

OVERVIEW_HELP = """\
## aiops console

One view of every session and every gate. **Sessions** (left) lists every client's sessions;
**Chat** (centre) shows the selected one live, with the **input** below it; the side pane holds the
**gates inbox**, the **prompt tree**, **rate limits** and the **log**.

Move between panes with tab / shift+tab or {app.next_pane}; {app.toggle_sessions} and
{app.toggle_side} show or hide the sessions and side panes; {app.narrower} / {app.wider} resize
them. On terminals narrower than 100 columns one pane is shown at a time: pick it in the tab bar at
the top or with {app.next_pane}.

A new gate shows in the header and a notification; {app.jump_gate} jumps to it, and answering it
puts you back where you were. {app.focus_input} puts the cursor in the input from any pane.

Focus a pane and press {app.help} again for its own help. {app.palette} opens the command palette.
"""

PANE_WIDGETS: dict[str, type[Any]] = {
    "input": ChatInput, "chat": ChatView, "sessions": SessionsList, "gates": GatesInbox,
    "prompt": PromptPane, "limits": LimitsTable, "log": LogView,
}


class AiopsApp(App[int]):
    """The aiops operator console."""

    CSS_PATH = "app.tcss"
    TITLE = "aiops"
    COMMANDS = {ConsoleCommands}
    BINDINGS = bindings_for("global")
    PANE = "global"
    HELP = OVERVIEW_HELP

    def __init__(self, cfg: Config, *, engine: Engine | None = None, plugins: list[Plugin] | None = None,
                 discover_plugins: bool = True, host: str | None = None, port: int | None = None,
                 server: bool = True, lock: DataDirLock | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`clock` (seconds, monotonic) times the console's own pauses (a gate that just moved under
        the cursor ignores the answer keys for a moment); tests pass one they advance by hand."""
        super().__init__(driver_class=console_driver())
        self.cfg = cfg
        self.clock = clock
        if engine is None:
            from aiops.engine.engine import Engine

            engine = Engine(cfg, plugins=plugins, discover_plugins=discover_plugins)
        self.adapter = EngineAdapter(engine, self)
        self.host = host
        self.port = port
        self.want_server = server
        self.lock = lock
        # Only the console process tunes the collector (run_console): never a test's process.
        self.settle_gc = False
        # SIGTERM and SIGHUP (a closed terminal, a dropped SSH session) quit as ctrl+q does; set by
        # run_console only, so an app under test leaves the test runner's signals alone.
        self.quit_on_signals = False
        # Ends the process if a quit has not finished in time (run_console only: aiops/watchdog.py).
        self.watchdog: ExitWatchdog | None = None
        self.early_records = EarlyRecords()
        console = cfg.app.console
        self.keymap_overrides: dict[str, str] = dict(console.keymap)
        self.ring_bell = console.bell
        self.history_page = console.history_page
        self.bells = 0  # how often the console rang (a new gate)
        self.services_ready = False
        self.server_urls: list[str] = []
        self.selected: str | None = None
        self.probes: dict[str, ModelProbe] = {}
        # The running turn of each session and its events so far (replayed when a session is shown).
        self.live_turn: dict[str, str] = {}
        self.live_events: dict[str, list[ev.Event]] = {}
        self._user_events: dict[str, ev.UserPosted] = {}
        # Turns this console's input submitted, until they end: turn id -> (session id, text typed).
        self._typed_here: dict[str, tuple[str, str]] = {}
        self._details: GateDetailsScreen | None = None
        # Where the operator was when they jumped to a gate: answering it brings them back there,
        # so that what they type next cannot land in the inbox and answer the next gate.
        self._gate_return: Widget | None = None
        self.set_keymap(self.keymap_overrides)

    # ---- widgets ---------------------------------------------------------------------------------------

    def get_default_screen(self) -> MainScreen:
        return MainScreen(clock=self.clock)

    @property
    def main(self) -> MainScreen:
        screen = self.screen_stack[0] if self.screen_stack else None
        assert isinstance(screen, MainScreen)
        return screen

    @property
    def chat(self) -> ChatView:
        return self.main.query_one(ChatView)

    @property
    def chat_input(self) -> ChatInput:
        return self.main.query_one(ChatInput)

    @property
    def sessions_list(self) -> SessionsList:
        return self.main.query_one(SessionsList)

    @property
    def inbox(self) -> GatesInbox:
        return self.main.query_one(GatesInbox)

    @property
    def status(self) -> StatusBar:
        return self.main.query_one(StatusBar)

    def pane_target(self, pane: str) -> Any:
        """The object a pane's actions run on (for the command palette)."""
        if pane == "global":
            return self
        cls = PANE_WIDGETS.get(pane)
        if cls is None:
            return None
        try:
            return self.main.query_one(cls)
        except Exception:  # noqa: BLE001 - not composed (yet)
            return None

    def run_palette_action(self, action: str, target: Any) -> None:
        self.call_later(self.run_action, action, target)

    def key_name(self, binding_id: str) -> str:
        """The key in effect for a binding, as prose names it ("ctrl+g"), after the user's keymap."""
        return display_keys(first_key(binding_id, self.keymap_overrides))

    # ---- lifecycle -------------------------------------------------------------------------------------

    def on_load(self) -> None:
        # Before anything starts: the log pane shows what start-up logged even if it mounts later.
        self.early_records.install()

    def on_mount(self) -> None:
        bad = unknown_ids(self.keymap_overrides)
        if bad:
            msg = f"keymap: unknown binding id(s) {', '.join(bad)} (see docs/CONSOLE.md)"
            log.warning(msg)
            self.notify(msg, severity="warning", timeout=10)
        theme = self.cfg.app.console.theme
        if theme in self.available_themes:
            self.theme = theme
        else:
            self.notify(f"unknown theme {theme!r}; themes: {', '.join(sorted(self.available_themes))}",
                        severity="warning", timeout=10)
        self.set_interval(2, self._refresh_clients)
        if self.quit_on_signals:
            self._quit_on_signals()
        self.run_worker(self._start_services(), name="services", group="services", exit_on_error=False)

    def _quit_on_signals(self) -> None:
        """Without this, SIGTERM killed the console where it stood: the terminal left in raw mode
        on the alternate screen, client streams cut instead of ended, turns left for the next
        start to record as interrupted."""
        loop = asyncio.get_running_loop()
        for name in ("SIGTERM", "SIGHUP"):
            sig = getattr(signal, name, None)  # no SIGHUP on Windows
            try:
                if sig is not None:
                    loop.add_signal_handler(sig, self._signalled, sig)
            except NotImplementedError:  # Windows event loops catch no signals
                pass

    def _signalled(self, sig: int) -> None:
        log.info("%s received: quitting", signal.Signals(sig).name)
        if self.watchdog is not None:
            self.watchdog.arm(signal.Signals(sig).name)
        self.exit()

    def exit(self, result: int | None = None, return_code: int = 0, message: Any = None) -> None:
        if self.watchdog is not None:
            self.watchdog.arm("the quit")  # ctrl+q, a vanished terminal: the exit is bounded too
        super().exit(result, return_code, message)

    async def _start_services(self) -> None:
        try:
            started = await self.adapter.start(server=self.want_server, host=self.host, port=self.port,
                                               lock=self.lock)
        except Exception as e:  # noqa: BLE001 - shown in the console, which stays up
            log.exception("the engine did not start")
            self.post_message(ServicesFailed(f"{type(e).__name__}: {e}"))
            return
        self.post_message(started)

    async def on_unmount(self) -> None:
        self.early_records.take()  # (already taken when the log pane mounted)
        self.adapter.disconnect()
        try:
            await self.adapter.stop()
        except Exception:  # noqa: BLE001
            log.exception("stopping the engine failed")

    # Posted by the terminal driver (aiops/tui/driver.py) when the terminal falls behind and when
    # it catches up: the sessions list's rebuilds (per session event, over every session) only
    # feed the screen, so they wait meanwhile.
    def on_terminal_behind(self) -> None:
        if self._drawing:
            self.sessions_list.hold_rebuilds(True)

    def on_terminal_caught_up(self) -> None:
        if self._drawing:
            self.sessions_list.hold_rebuilds(False)

    @on(ServicesFailed)
    def _services_failed(self, msg: ServicesFailed) -> None:
        self.status.server = "engine failed"
        self.status.warning = one_line(msg.error, 60)
        self.notify(f"the engine did not start: {msg.error}", severity="error", timeout=30)

    @on(ServicesStarted)
    async def _services_started(self, msg: ServicesStarted) -> None:
        self.services_ready = True
        if self.settle_gc:
            gc_policy.settle()  # start-up is over: see gc_policy
        self.server_urls = msg.server_urls
        if msg.server_urls:
            extra = [u.rsplit(":", 1)[-1] for u in msg.server_urls[1:]]
            self.status.server = msg.server_urls[0] + "".join(f" +{p}" for p in extra)
        elif not self.want_server:
            self.status.server = "server off"
        else:
            self.status.server = "server failed"
        if msg.server_error:
            self.notify(f"server: {msg.server_error}", severity="error", timeout=15)
        if self.lock is not None:
            with contextlib.suppress(OSError):
                self.lock.update(url=msg.server_urls[0] if msg.server_urls else None)
        self.chat_input.set_completions(self.adapter.command_names(), self.adapter.model_keys())
        sessions = await self.adapter.sessions()
        if not self._drawing:
            return
        self.sessions_list.set_sessions(sessions)
        self._set_gates(self.adapter.pending_gates())
        self._refresh_limits()
        console = [s for s in sessions if s.get("kind") == "console"]
        if console:
            await self.select_session(max(console, key=lambda s: s.get("updated_at") or 0)["client_id"])
        else:
            await self._new_session(focus=False)
        self._probe_models()

    # ---- sessions ---------------------------------------------------------------------------------------

    async def select_session(self, session_id: str) -> None:
        self.selected = session_id
        self.sessions_list.select(session_id)
        self.chat.session_id = None  # loading: live events wait for the history
        self.chat_input.busy = session_id in self.live_turn
        self._update_session_labels()
        self._refresh_prompt()
        self._refresh_limits()
        self._update_guidance()
        self._load_history(session_id, None)

    def _update_session_labels(self) -> None:
        sid = self.selected
        info = self.sessions_list.sessions.get(sid or "", {})
        short = info.get("short_id", "")
        model = info.get("model") or self.adapter.default_model()
        self.status.session = f"#{short}" if short != "" else ""
        self.status.model = model
        self.status.running = len(self.live_turn)
        chat = self.chat
        chat.border_title = Content(f"Chat · {short} {one_line(info.get('title') or '', 40)}".rstrip())
        chat.border_subtitle = Content(f"{info.get('kind', '')} · {model} · {info.get('state', 'idle')}")

    @work(group="history", exit_on_error=False)
    async def _load_history(self, session_id: str, before_id: int | None) -> None:
        self.post_message(await self.adapter.load_history(session_id, self.history_page, before_id))

    @on(HistoryLoaded)
    async def _history_loaded(self, msg: HistoryLoaded) -> None:
        if msg.session_id != self.selected or not self._drawing:
            return
        chat = self.chat
        if msg.before_id is None:
            live = self.live_turn.get(msg.session_id)
            messages = [m for m in msg.messages if live is None or m.turn_id != live]
            await chat.show(msg.session_id, messages, has_more=msg.has_more,
                            live=list(self.live_events.get(msg.session_id, [])))
        elif chat.session_id == msg.session_id:
            await chat.prepend(msg.messages, has_more=msg.has_more)

    @on(ChatView.LoadEarlier)
    def _load_earlier(self, msg: ChatView.LoadEarlier) -> None:
        self._load_history(msg.session_id, msg.before_id)

    @on(SessionsList.Picked)
    async def _picked(self, msg: SessionsList.Picked) -> None:
        # A session is picked to talk in it: the cursor goes to the input at once, so the next
        # letters typed are the message, not the sessions list's keys (n: new, x: stop).
        self._gate_return = None
        self.main.return_focus(self.chat_input)
        if msg.session_id != self.selected:
            await self.select_session(msg.session_id)

    @on(SessionsList.NewRequested)
    async def _new_requested(self) -> None:
        await self.action_new_session()

    @on(SessionsList.StopRequested)
    def _stop_requested(self, msg: SessionsList.StopRequested) -> None:
        if not self.adapter.stop_turn(msg.session_id):
            self.notify("no turn is running in that session", timeout=3)

    async def _new_session(self, *, focus: bool = True) -> None:
        if not self.services_ready:
            self.notify("the engine is still starting", timeout=3)
            return
        session = await self.adapter.open_session("console")
        if not self._drawing:
            return
        self.sessions_list.upsert(session)
        await self.select_session(session["client_id"])
        if focus:
            self.main.show_pane("input")

    # ---- the input --------------------------------------------------------------------------------------

    @on(ChatInput.Submitted)
    async def _submitted(self, msg: ChatInput.Submitted) -> None:
        if not self.services_ready or self.selected is None:
            self.notify("the engine is still starting; try again in a moment", severity="warning", timeout=4)
            self.chat_input.put_back(msg.text)
            return
        try:
            turn_id = await self.adapter.submit(self.selected, msg.text)
            self._typed_here[turn_id] = (self.selected, msg.text)
            while len(self._typed_here) > 500:
                self._typed_here.pop(next(iter(self._typed_here)))
        except Exception as e:  # noqa: BLE001 - EngineError and friends: say it where the user looks
            if self._drawing:
                self.notify(str(e), severity="error", timeout=8)
                self.chat_input.put_back(msg.text)

    @on(ChatInput.CancelRequested)
    def _cancel_requested(self) -> None:
        sid = self.selected
        if sid is None:
            return
        turn = self.live_turn.get(sid)
        if turn is None:  # Esc right after Enter, before the turn began: the one typed here last
            turn = next((t for t, (s, _) in reversed(self._typed_here.items()) if s == sid), None)
        # Only a prompt typed here comes back to the input: a chat UI's or a script's would be one
        # Enter away from being sent again, as the operator, into their conversation.
        typed = self._typed_here.get(turn or "")
        if self.adapter.stop_turn(sid):
            if typed is not None:
                self.chat_input.put_back(typed[1])
            self.notify("turn cancelled", timeout=3)

    # ---- engine events ---------------------------------------------------------------------------------

    @property
    def _drawing(self) -> bool:
        """The main screen is up (not yet, or no longer, during start-up and shutdown)."""
        return (self.is_running and not self._exit and bool(self.screen_stack)
                and isinstance(self.screen_stack[0], MainScreen))

    # One handler per event message: what the event means to the console's state (gates, limits,
    # sessions, model reachability), then `_follow` draws it in the chat and the sessions list.

    @on(TokenArrived)
    @on(ThinkingArrived)
    @on(ToolCallStarted)
    @on(ToolCallFinished)
    @on(NoticePosted)
    @on(TurnStarted)
    async def _conversation_event(self, msg: EngineMessage) -> None:
        await self._follow(msg.event)

    @on(UserPosted)
    async def _user_posted(self, msg: UserPosted) -> None:
        await self._follow(msg.event, unread=True)

    @on(GateOpened)
    async def _gate_opened_event(self, msg: GateOpened) -> None:
        if self._drawing:
            self._gate_opened(msg.event.gate)
            await self._follow(msg.event, unread=True)

    @on(GateResolved)
    async def _gate_resolved_event(self, msg: GateResolved) -> None:
        if self._drawing:
            self._gate_resolved(msg.event.gate)
            await self._follow(msg.event)

    @on(RateChanged)
    async def _rate_changed(self, msg: RateChanged) -> None:
        if self._drawing:
            self._refresh_limits()
            await self._follow(msg.event)

    @on(ErrorRaised)
    async def _error_raised(self, msg: ErrorRaised) -> None:
        if self._drawing and msg.event.code == "model_error":
            self._model_failed(msg.event)
        await self._follow(msg.event, unread=True)

    @on(TurnDone)
    async def _turn_done(self, msg: TurnDone) -> None:
        if self._drawing:
            self._model_answered(msg.event)
        await self._follow(msg.event, unread=True)

    @on(SessionChanged)
    async def _session_changed(self, msg: SessionChanged) -> None:
        event = msg.event
        sid = event.session_id
        if not self._drawing or sid is None:
            return
        if event.change == "deleted":
            await self._session_deleted(sid)
            return
        old_model = self.sessions_list.sessions.get(sid, {}).get("model")
        self.sessions_list.upsert({"client_id": sid, **event.session})
        if sid == self.selected:
            self._update_session_labels()
            if self.sessions_list.sessions.get(sid, {}).get("model") != old_model:
                self._refresh_prompt()
                self._update_guidance()

    async def _follow(self, event: ev.Event, *, unread: bool = False) -> None:
        """An event of a session: kept for the live turn's replay, drawn when its session is shown
        (otherwise `unread` marks the session), and the session's last activity."""
        sid = event.session_id
        if sid is None or not self._drawing:
            return
        self._track_live(event)
        if sid == self.selected and self.chat.session_id == sid:
            await self.chat.apply(event)
            if not self._drawing:  # the app began to close while drawing
                return
        elif unread:
            self.sessions_list.mark_unread(sid)
        self.sessions_list.touch(sid, event.ts)

    def _track_live(self, event: ev.Event) -> None:
        sid, tid = event.session_id or "", event.turn_id
        if isinstance(event, ev.UserPosted) and tid:
            self._user_events[tid] = event
            while len(self._user_events) > 500:
                self._user_events.pop(next(iter(self._user_events)))
        if isinstance(event, ev.TurnStarted) and tid:
            self.live_turn[sid] = tid
            first = self._user_events.get(tid)
            self.live_events[sid] = [first, event] if first is not None else [event]
        elif tid and self.live_turn.get(sid) == tid:
            buf = self.live_events.setdefault(sid, [])
            merged = merged_delta(buf[-1], event) if buf else None
            if merged is not None:
                buf[-1] = merged
            else:
                buf.append(event)
            if isinstance(event, ev.Done):
                self.live_turn.pop(sid, None)
                self.live_events.pop(sid, None)
                self._user_events.pop(tid, None)
        if isinstance(event, ev.Done) and tid:
            self._typed_here.pop(tid, None)
        if isinstance(event, ev.TurnStarted | ev.Done):
            if sid == self.selected:
                self.chat_input.busy = sid in self.live_turn
            self.status.running = len(self.live_turn)

    async def _session_deleted(self, sid: str) -> None:
        shown = self.sessions_list.sessions.get(sid, {})
        self.sessions_list.drop(sid)
        if sid == self.selected:
            # Said, not just done: the chat the operator was reading changes under them.
            self.notify(f"session {shown.get('short_id') or sid} ({sid}) was deleted", timeout=6)
            console = [s for s in self.sessions_list.sessions.values() if s.get("kind") == "console"]
            if console:
                await self.select_session(max(console, key=lambda s: s.get("updated_at") or 0)["client_id"])
            else:
                await self._new_session(focus=False)

    # ---- gates -------------------------------------------------------------------------------------------

    def _set_gates(self, gates: list[ev.GateInfo]) -> None:
        self.inbox.set_gates(gates)
        self.main.set_gate_count(len(self.inbox.gates))

    def _gate_opened(self, gate: ev.GateInfo) -> None:
        self.inbox.add(gate)
        self.main.set_gate_count(len(self.inbox.gates))
        # Short and brief: the header badge and the inbox carry the details; this only says that
        # something waits and which key answers it.
        who = f"{gate.client_kind} {self.sessions_list.short_id(gate.session_id)}"
        what = f"{gate.tool} {gate.operation}".rstrip()
        self.notify(f"{who} · {one_line(what, 30)}", title=f"⚑ approval needed · {self.key_name('app.jump_gate')}",
                    severity="warning", timeout=GATE_TOAST_SECONDS, markup=False)
        if self.ring_bell:
            self.bell()

    def _gate_resolved(self, gate: ev.GateInfo) -> None:
        self.inbox.drop(gate.id)
        self.main.set_gate_count(len(self.inbox.gates))
        if not self.inbox.gates and self.main.focused is self.inbox:
            self._return_from_gates()  # nothing left to answer where the jump led
        details = self._details
        if details is not None and details.gate_id == gate.id and details.is_attached:
            self._details = None
            details.dismiss(None)
            self.notify(f"gate {gate_outcome(gate)}", timeout=4)

    def bell(self) -> None:
        self.bells += 1
        super().bell()

    @on(GatesInbox.Decision)
    def _gate_decision(self, msg: GatesInbox.Decision) -> None:
        self._answer(msg.gate_id, msg.decision, msg.scope, msg.stop_turn)
        self._return_from_gates()

    def _return_from_gates(self) -> None:
        """After answering the gate a jump led to, the focus goes back where the operator was."""
        target, self._gate_return = self._gate_return, None
        if target is None or not target.is_attached or not self._drawing:
            return
        if self.main.focused is self.inbox:
            self.main.return_focus(target)

    @on(TypedAway)
    def _typed_away(self, msg: TypedAway) -> None:
        """Typing in the inbox or the sessions list: the text belongs in the input, and so does the
        focus."""
        self._gate_return = None
        self.main.return_focus(self.chat_input)
        self.chat_input.insert(msg.character)

    def _answer(self, gate_id: str, decision: str, scope: str, stop: bool) -> None:
        gate = self.inbox.gates.get(gate_id)
        error = self.adapter.resolve_gate(gate_id, decision, scope)
        if error:
            self.inbox.drop(gate_id)
            self.main.set_gate_count(len(self.inbox.gates))
            self.notify(error, severity="warning", timeout=5)
            return
        if stop and gate is not None and gate.session_id:
            self.adapter.stop_turn(gate.session_id)

    @on(GatesInbox.DetailsRequested)
    async def _gate_details(self, msg: GatesInbox.DetailsRequested) -> None:
        gate = self.inbox.gates.get(msg.gate_id)
        if gate is None:
            return
        sid = gate.session_id
        context = ""
        with contextlib.suppress(Exception):
            page = await self.adapter.load_history(sid, 8)
            lines = []
            for m in page.messages:
                if m.meta.get("command") or m.meta.get("kind") == "command":
                    continue  # the operator's own commands say nothing about what the model does
                if m.role in ("user", "assistant", "notice", "error") and m.content.strip():
                    lines.append(f"{m.role}: {one_line(m.content, 300)}")
                for tc in m.tool_calls:
                    lines.append(f"tool call: {tc.name}")
            context = "\n".join(lines[-8:])
        live = self.live_events.get(sid, [])
        partial = "".join(e.text for e in live if isinstance(e, ev.Tok))
        if partial.strip():
            context += f"\n(streaming) {one_line(partial, 300)}"
        if not self._drawing or msg.gate_id not in self.inbox.gates:
            return  # closing, or answered elsewhere while the context was read
        screen = GateDetailsScreen(gate, self.sessions_list.short_id(sid), context)
        self._details = screen

        def answered(result: tuple[str, str, bool] | None) -> None:
            if self._details is screen:
                self._details = None
            if result is not None:
                self._answer(msg.gate_id, *result)
                self._return_from_gates()

        await self.push_screen(screen, answered)

    # ---- rate limits and prompt tree -----------------------------------------------------------------

    def _refresh_limits(self) -> None:
        if self.services_ready:
            self.main.query_one(LimitsTable).show_usage(self.adapter.rate_usage(self.selected))

    @on(LimitsTable.EnableRequested)
    def _enable_rate(self, msg: LimitsTable.EnableRequested) -> None:
        if self.adapter.enable_rate(msg.session_id, msg.tool_type):
            self.notify(f"{msg.tool_type} re-enabled for session "
                        f"{self.sessions_list.short_id(msg.session_id)}", timeout=4)
        self._refresh_limits()

    @on(LimitsTable.RefreshRequested)
    def _limits_refresh(self) -> None:
        self._refresh_limits()

    def _selected_model(self) -> str:
        info = self.sessions_list.sessions.get(self.selected or "", {})
        return info.get("model") or self.adapter.default_model()

    def _refresh_prompt(self) -> None:
        if not self.services_ready:
            return
        model = self._selected_model()
        folder, tree = self.adapter.prompt_tree(model)
        self.main.query_one(PromptPane).show(model, folder, tree, self.adapter.tool_names())

    @on(PromptPane.ReloadRequested)
    def _prompt_reload(self) -> None:
        folder = self.adapter.prompt_folder(self._selected_model())
        if folder is not None:
            self.adapter.reload_prompt(folder)
        self._refresh_prompt()
        self.notify("prompt tree re-read", timeout=2)

    @on(PromptPane.EditRequested)
    def _prompt_edit(self, msg: PromptPane.EditRequested) -> None:
        def saved(text: str | None) -> None:
            if text is not None:
                self._save_section(msg.folder, msg.section, text)

        self.push_screen(PromptEditScreen(msg.section, msg.body), saved)

    @work(group="prompt", exit_on_error=False)
    async def _save_section(self, folder: Path, section: str, text: str) -> None:
        try:
            summary = await self.adapter.save_prompt_section(folder, self.selected, section, text)
        except Exception as e:  # noqa: BLE001 - PromptEditError and I/O errors, said plainly
            self.notify(f"not saved: {e}", severity="error", timeout=10)
            return
        self.notify(summary, timeout=5)
        self._refresh_prompt()

    # ---- models ---------------------------------------------------------------------------------------

    @work(group="probe", exclusive=True, exit_on_error=False)
    async def _probe_models(self) -> None:
        self.post_message(await self.adapter.probe_models())

    @on(ModelsChecked)
    def _models_checked(self, msg: ModelsChecked) -> None:
        if not self._drawing:
            return
        self.probes = dict(msg.probes)
        self._update_guidance()

    def _model_answered(self, done: ev.Done) -> None:
        """A whole answer: its model is reachable, whatever the last probe said."""
        model = done.model
        if model and done.status == "complete" and not done.command:
            self.probes[model] = ModelProbe(model, True, "", self.adapter.describe_model(model))
            self._update_guidance()

    def _model_failed(self, error: ev.ErrorEvent) -> None:
        info = self.sessions_list.sessions.get(error.session_id or "", {})
        key = info.get("model") or self.adapter.default_model()
        self.probes[key] = ModelProbe(key, False, one_line(error.message, 200), self.adapter.describe_model(key))
        self._update_guidance()

    def _update_guidance(self) -> None:
        guidance = self.main.query_one("#guidance")
        if not self.probes:
            guidance.remove_class("-shown")
            return
        reachable = sorted(k for k, p in self.probes.items() if p.ok)
        model = self._selected_model()
        probe = self.probes.get(model)
        if not reachable:
            self.status.warning = "no model reachable"
        elif probe is not None and not probe.ok:
            self.status.warning = f"model {model} unreachable"
        else:
            self.status.warning = ""
        if probe is None or probe.ok:
            guidance.remove_class("-shown")
            return
        cfg_dir = self.cfg.paths.config_dir
        text = (f"⚠ Model {model} ({probe.description}) is not reachable: {probe.reason}.\n"
                f"Set its key in the environment or {cfg_dir}/.env, or run `aiops config init` and edit "
                f"models.toml there (default_model, base_url for llama.cpp/Ollama/vLLM); `aiops models` "
                f"lists them, !model KEY switches this session. ")
        text += f"Reachable now: {', '.join(reachable)}." if reachable else "No configured model answers."
        text += " Commands, sessions and gates work without a model."
        guidance.update(Content(text))  # type: ignore[attr-defined]
        guidance.add_class("-shown")

    def _refresh_clients(self) -> None:
        # An app timer outlives the screen: on shutdown Textual removes the screen's widgets
        # before it stops the app's timers, so a tick can land on an empty screen.
        if not self.services_ready or not self._drawing:
            return
        with contextlib.suppress(NoMatches):
            self.status.clients = self.adapter.connected_clients()

    # ---- actions -------------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("quit", "command_palette"):
            return True
        # Layout and pane actions belong to the main screen; a modal keeps its own keys.
        if self.screen_stack and not isinstance(self.screen, MainScreen):
            return False
        return True

    def action_help(self) -> None:
        pane = focused_pane(self.screen.focused)
        node: Any = self.screen.focused
        help_text = OVERVIEW_HELP
        while node is not None:
            if isinstance(getattr(node, "PANE", None), str) and getattr(node, "HELP", None):
                help_text = node.HELP
                break
            node = node.parent
        self.push_screen(HelpScreen(pane, render_help(help_text, self.keymap_overrides), self.keymap_overrides))

    def action_jump_gate(self) -> None:
        focused = self.main.focused
        if focused is not None and not isinstance(focused, GatesInbox):
            self._gate_return = focused
        self.main.show_pane("gates")
        self.inbox.highlight_oldest()
        if not self.inbox.gates:
            self.notify("no gate is pending", timeout=2)

    # Moving elsewhere on purpose ends a jump to a gate: answering later does not move the focus.

    async def action_new_session(self) -> None:
        self._gate_return = None
        await self._new_session(focus=True)

    def action_toggle_sessions(self) -> None:
        self._gate_return = None
        self.main.toggle("sessions")

    def action_toggle_side(self) -> None:
        self._gate_return = None
        self.main.toggle("side")

    def action_next_side_tab(self) -> None:
        self._gate_return = None
        self.main.cycle_side_tab()

    def action_next_pane(self) -> None:
        self._gate_return = None
        self.main.cycle_pane(1)

    def action_previous_pane(self) -> None:
        self._gate_return = None
        self.main.cycle_pane(-1)

    def action_resize(self, delta: int) -> None:
        self.main.resize_pane(int(delta))

    def action_focus_input(self) -> None:
        self._gate_return = None
        self.main.show_pane("input")

    def action_show_pane(self, name: str) -> None:
        self._gate_return = None
        self.main.show_pane(name)

    def action_check_models(self) -> None:
        self._probe_models()
        self.notify("checking models…", timeout=2)


# ---- running it ----------------------------------------------------------------------------------------


def console_driver() -> type[Driver] | None:
    """Our terminal driver (aiops/tui/driver.py: output never blocks the loop), where Textual would
    use LinuxDriver; None (Textual's choice) on Windows or when TEXTUAL_DRIVER names another."""
    if sys.platform == "win32" or os.environ.get("TEXTUAL_DRIVER"):
        return None
    from aiops.tui.driver import ConsoleDriver

    return ConsoleDriver


@contextlib.contextmanager
def _terminal_quiet(cfg: Config) -> Iterator[None]:
    """While the console draws, no log record or warning may reach the terminal."""
    root = logging.getLogger()
    removed = [h for h in root.handlers if isinstance(h, logging.StreamHandler)
               and not isinstance(h, logging.FileHandler)
               and getattr(h, "stream", None) in (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__)]
    for h in removed:
        root.removeHandler(h)
    added: logging.Handler | None = None
    level = root.level
    log_path = str(cfg.paths.log_path)
    if not any(isinstance(h, logging.FileHandler) and h.baseFilename == log_path for h in root.handlers):
        cfg.paths.data_dir.mkdir(parents=True, exist_ok=True)
        added = log_file_handler(cfg.paths.log_path)
        root.addHandler(added)
        if root.level == logging.NOTSET or root.level > logging.INFO:
            root.setLevel(logging.INFO)
    logging.captureWarnings(True)
    try:
        yield
    finally:
        logging.captureWarnings(False)
        if added is not None:
            root.removeHandler(added)
            added.close()
            root.setLevel(level)
        for h in removed:
            root.addHandler(h)


def run_console(cfg: Config, host: str | None = None, port: int | None = None, server: bool = True) -> int:
    """Run the console until quit. Exit status 2 when another aiops holds the data dir."""
    from aiops.engine.lock import AlreadyRunning, DataDirLock

    lock = DataDirLock(cfg.paths.lock_path)
    try:
        lock.acquire()
    except AlreadyRunning as e:
        print(f"aiops: {e}", file=sys.stderr)
        return 2
    from aiops.integrations.runtime import exit_if_left, run_to_exit

    started = time.monotonic()
    code, left = 0, [0]
    try:
        with _terminal_quiet(cfg):
            app = AiopsApp(cfg, host=host, port=port, server=server, lock=lock)
            app.settle_gc = True
            app.quit_on_signals = True
            app.watchdog = ExitWatchdog()  # armed by the quit; never disarmed: it covers the whole exit
            # On a loop of our own, wound down bounded (as `aiops serve`'s): a tool still running
            # after the close, or a thread blocked in one, must not hold the exit for good.
            code = run_to_exit(lambda loop: app.run(loop=loop) or 0, left) or 0
        log.info("console closed after %.0f s", time.monotonic() - started)
        return code
    finally:
        # Closed already: a second SIGTERM (a service manager repeating itself) or SIGHUP (the
        # terminal going as it closes) during the last of the exit must not make it a killed one.
        for name in ("SIGTERM", "SIGHUP"):
            if (sig := getattr(signal, name, None)) is not None:
                signal.signal(sig, signal.SIG_IGN)
        lock.release()
        exit_if_left(left[0], code)
