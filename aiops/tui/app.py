"""The operator console: a Textual App that owns the engine and the HTTP server.

The App starts the engine (and the server) on mount in a worker and stops both on unmount, which
cancels running turns cleanly. Engine events arrive as messages from `EngineAdapter`; the App's
handlers own the console's state (selected session, live turns, pending gates) and tell the panes
what to draw. Panes post typed messages back (send, answer a gate, load earlier, …).

The App's handlers are one-line delegations, by concern, to helper objects it owns (Textual collects
`@on` handlers and `on_*` methods per class, so they stay here; the helpers are plain classes):
`session_events.SessionEvents` (the selected session, its history, live drawing, the sessions list),
`live.LiveTurns` (running turns and their replay buffers), `gate_desk.GateDesk` (the gates inbox,
the jump and the answer), `guidance.ModelGuidance` (model reachability), `side_panes.SidePanes`
(rate limits, prompt tree). Running it as a process is `running.py`.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from textual import events, on, work
from textual.app import App

from aiops.tui import crops, cycles, layout_map
from aiops.tui.adapter import (
    DeltasArrived,
    EngineAdapter,
    EngineMessage,
    ErrorRaised,
    GateOpened,
    GateResolved,
    HistoryLoaded,
    ModelsChecked,
    NoticePosted,
    RateChanged,
    ServicesFailed,
    ServicesStarted,
    SessionChanged,
    ToolCallFinished,
    ToolCallStarted,
    TurnDone,
    TurnStarted,
    UserPosted,
)
from aiops.tui.commands import ConsoleCommands, focused_pane
from aiops.tui.gate_desk import GATE_TOAST_SECONDS, GateDesk
from aiops.tui.guidance import ModelGuidance
from aiops.tui.keys import bindings_for, display_keys, first_key, pane_help, render_help, unknown_ids
from aiops.tui.live import LiveTurns
from aiops.tui.pacing import AnswerPacing
from aiops.tui.reclaim import Reclaim
from aiops.tui.running import console_driver, quit_on_signals, run_console
from aiops.tui.running import terminal_quiet as _terminal_quiet
from aiops.tui.screens.main import MainScreen
from aiops.tui.services import Services
from aiops.tui.session_events import SessionEvents
from aiops.tui.side_panes import SidePanes
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
    from aiops.config import Config
    from aiops.engine import events as ev
    from aiops.engine.engine import Engine
    from aiops.engine.lock import DataDirLock
    from aiops.engine.plugins import Plugin
    from aiops.integrations.remote import RemoteEngine
    from aiops.tui.remote_adapter import AttachState

# Imported from here by the CLI and the tests.
__all__ = ["GATE_TOAST_SECONDS", "AiopsApp", "_terminal_quiet", "console_driver", "run_console"]

log = logging.getLogger(__name__)

OVERVIEW_HELP = """\
## aiops console

One view of every session and every gate. **Sessions** (left) lists every client's sessions;
**Chat** (centre) shows the selected one live, with the **input** below it; the side pane holds the
**gates inbox**, the **prompt tree**, **rate limits** and the **log**.

Move between panes with {app.next_pane} / {app.previous_pane} (or tab / shift+tab, but tab in an
input holding text completes a command or stays there); {app.toggle_sessions} and
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
    # A maximized pane keeps the key bar (Textual's default names its own Footer).
    ALLOW_IN_MAXIMIZED_VIEW = "ConsoleFooter"
    TITLE = "aiops"
    COMMANDS = {ConsoleCommands}
    BINDINGS = bindings_for("global")
    PANE = "global"
    HELP = OVERVIEW_HELP

    def __init__(self, cfg: Config, *, engine: Engine | None = None, plugins: list[Plugin] | None = None,
                 discover_plugins: bool = True, host: str | None = None, port: int | None = None,
                 server: bool = True, lock: DataDirLock | None = None,
                 clock: Callable[[], float] = time.monotonic, remote: RemoteEngine | None = None) -> None:
        """`clock` (seconds, monotonic) times the console's own pauses (a gate that just moved under
        the cursor ignores the answer keys for a moment); tests pass one they advance by hand.
        `remote`: attach to that running aiops (aiops/tui/remote_adapter.py) instead of owning an engine."""
        # Before the first frame: aiops/tui/cycles.py, crops.py, layout_map.py.
        cycles.install()
        crops.install()
        layout_map.install()
        super().__init__(driver_class=console_driver())
        self.cfg = cfg
        self.clock = clock
        self.adapter: EngineAdapter
        if remote is not None:
            from aiops.tui.remote_adapter import RemoteAdapter

            self.adapter = RemoteAdapter(remote, self, cfg)
        else:
            def make_engine() -> Engine:
                from aiops.engine.engine import Engine

                return Engine(cfg, plugins=plugins, discover_plugins=discover_plugins)

            # Made when the services start, after the first frame (its modules load in a thread).
            self.adapter = EngineAdapter(engine, self, make_engine=make_engine,
                                         preload_plugins=engine is None and discover_plugins)
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
        self.services_failed: str | None = None  # why the engine did not start
        self.server_urls: list[str] = []
        self.selected: str | None = None
        # The console's state by concern; the handlers below delegate to these.
        self.services = Services(self)
        self.live = LiveTurns()
        self.sessions = SessionEvents(self)
        self.gate_desk = GateDesk(self)
        self.guidance = ModelGuidance(self)
        self.side = SidePanes(self)
        # The answer on screen is drawn less often while the operator types (aiops/tui/pacing.py).
        self.pacing = AnswerPacing(clock)
        # A chat taken off the screen, freed while the operator reads (aiops/tui/reclaim.py).
        self.reclaim = Reclaim(self, self.pacing.since_key)
        self.set_keymap(self.keymap_overrides)

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, events.Key):
            self.pacing.key()
        await super().on_event(event)

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

    @property
    def live_turn(self) -> dict[str, str]:
        """Session id -> its running turn id."""
        return self.live.turn

    @property
    def live_events(self) -> dict[str, list[ev.Event]]:
        """Session id -> its running turn's events so far (replayed when the session is shown)."""
        return self.live.events

    @property
    def _drawing(self) -> bool:
        """The main screen is up (not yet, or no longer, during start-up and shutdown)."""
        return (self.is_running and not self._exit and bool(self.screen_stack)
                and isinstance(self.screen_stack[0], MainScreen))

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

    def selected_model(self) -> str:
        info = self.sessions_list.sessions.get(self.selected or "", {})
        return info.get("model") or self.adapter.default_model()

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
        self.set_interval(2, self.services.refresh_clients)
        if self.quit_on_signals:
            quit_on_signals(self._signalled)

    def on_ready(self) -> None:
        # The first frame is on screen and keys are taken: only now start the engine and the
        # server, whose start (imports, the store, 10,000 sessions read) would otherwise come
        # before the console's first paint. What is typed meanwhile waits for them (Services).
        self.run_worker(self.services.start(), name="services", group="services", exit_on_error=False)

    def _signalled(self, sig: int) -> None:
        log.info("%s received: quitting", signal.Signals(sig).name)
        if self.watchdog is not None:
            self.watchdog.arm(signal.Signals(sig).name)
        self.exit()

    def exit(self, result: int | None = None, return_code: int = 0, message: Any = None) -> None:
        if self.watchdog is not None:
            self.watchdog.arm("the quit")  # ctrl+q, a vanished terminal: the exit is bounded too
        super().exit(result, return_code, message)

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
        self.services.failed(msg.error)

    @on(ServicesStarted)
    async def _services_started(self, msg: ServicesStarted) -> None:
        await self.services.started(msg)

    async def on_attach_state(self, msg: AttachState) -> None:
        """Attached (remote_adapter.py): the link dropped, came back, or the state was read again."""
        await self.services.attach_state(msg)

    # ---- sessions (session_events.py) ------------------------------------------------------------------

    async def select_session(self, session_id: str) -> None:
        await self.sessions.select(session_id)

    @on(HistoryLoaded)
    async def _history_loaded(self, msg: HistoryLoaded) -> None:
        await self.sessions.history_loaded(msg)

    @on(ChatView.LoadEarlier)
    def _load_earlier(self, msg: ChatView.LoadEarlier) -> None:
        self.sessions.load_history(msg.session_id, msg.before_id)

    @on(SessionsList.Picked)
    async def _picked(self, msg: SessionsList.Picked) -> None:
        await self.sessions.picked(msg.session_id)

    @on(SessionsList.NewRequested)
    async def _new_requested(self) -> None:
        await self.action_new_session()

    @on(SessionsList.StopRequested)
    def _stop_requested(self, msg: SessionsList.StopRequested) -> None:
        if not self.adapter.stop_turn(msg.session_id):
            self.notify("no turn is running in that session", timeout=3)

    @on(SessionChanged)
    async def _session_changed(self, msg: SessionChanged) -> None:
        await self.sessions.changed(msg)

    # ---- the input -------------------------------------------------------------------------------------

    @on(ChatInput.Submitted)
    async def _submitted(self, msg: ChatInput.Submitted) -> None:
        await self.sessions.submit(msg.text)

    @on(ChatInput.CancelRequested)
    def _cancel_requested(self) -> None:
        self.sessions.cancel()

    # ---- engine events ---------------------------------------------------------------------------------

    # One handler per event message: what the event means to the console's state (gates, limits,
    # sessions, model reachability), then `SessionEvents.follow` draws it in the chat and the
    # sessions list.

    @on(DeltasArrived)
    async def _deltas(self, msg: DeltasArrived) -> None:
        for event in msg.events:
            await self.sessions.follow(event, moves=False)  # (a streaming answer stays in its place)

    @on(ToolCallStarted)
    @on(ToolCallFinished)
    @on(NoticePosted)
    @on(TurnStarted)
    async def _conversation_event(self, msg: EngineMessage) -> None:
        await self.sessions.follow(msg.event)

    @on(UserPosted)
    async def _user_posted(self, msg: UserPosted) -> None:
        await self.sessions.follow(msg.event, unread=True)

    @on(GateOpened)
    async def _gate_opened_event(self, msg: GateOpened) -> None:
        if self._drawing:
            self.gate_desk.opened(msg.event.gate)
            await self.sessions.follow(msg.event, unread=True)

    @on(GateResolved)
    async def _gate_resolved_event(self, msg: GateResolved) -> None:
        if self._drawing:
            self.gate_desk.resolved(msg.event.gate)
            await self.sessions.follow(msg.event)

    @on(RateChanged)
    async def _rate_changed(self, msg: RateChanged) -> None:
        if self._drawing:
            self.side.refresh_limits()
            await self.sessions.follow(msg.event)

    @on(ErrorRaised)
    async def _error_raised(self, msg: ErrorRaised) -> None:
        # The guidance learns of a model error from the turn's `done`, which names the model.
        await self.sessions.follow(msg.event, unread=True)

    @on(TurnDone)
    async def _turn_done(self, msg: TurnDone) -> None:
        if self._drawing:
            self.guidance.answered(msg.event)
        await self.sessions.follow(msg.event, unread=True)

    # ---- gates (gate_desk.py) --------------------------------------------------------------------------

    def bell(self) -> None:
        self.bells += 1
        super().bell()

    @on(GatesInbox.Decision)
    def _gate_decision(self, msg: GatesInbox.Decision) -> None:
        self.gate_desk.decided(msg)

    @on(GatesInbox.DetailsRequested)
    async def _gate_details(self, msg: GatesInbox.DetailsRequested) -> None:
        await self.gate_desk.show_details(msg.gate_id)

    @on(TypedAway)
    def _typed_away(self, msg: TypedAway) -> None:
        """Typing in the inbox or the sessions list: the text belongs in the input, and so does the
        focus."""
        self.gate_desk.return_to = None
        self.main.return_focus(self.chat_input)
        self.chat_input.insert(msg.character)

    # ---- rate limits and prompt tree (side_panes.py) ---------------------------------------------------

    @on(LimitsTable.EnableRequested)
    def _enable_rate(self, msg: LimitsTable.EnableRequested) -> None:
        self.side.enable_rate(msg)

    @on(LimitsTable.RefreshRequested)
    def _limits_refresh(self) -> None:
        self.side.refresh_limits()

    @on(PromptPane.ReloadRequested)
    def _prompt_reload(self) -> None:
        self.side.reload_prompt()

    @on(PromptPane.EditRequested)
    def _prompt_edit(self, msg: PromptPane.EditRequested) -> None:
        self.side.edit_prompt(msg)

    # ---- models (guidance.py) --------------------------------------------------------------------------

    @work(group="probe", exclusive=True, exit_on_error=False)
    async def probe_models(self) -> None:
        self.post_message(await self.adapter.probe_models())

    @on(ModelsChecked)
    def _models_checked(self, msg: ModelsChecked) -> None:
        if self._drawing:
            self.guidance.checked(msg.probes)

    # ---- actions -------------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("quit", "command_palette"):
            return True
        # Layout and pane actions belong to the main screen; a modal keeps its own keys.
        if self.screen_stack and not isinstance(self.screen, MainScreen):
            return False
        return True

    def action_help(self) -> None:
        from aiops.tui.screens.modals import HelpScreen  # (Markdown: imported when first needed)

        help_text = self.guidance.help_markdown() + pane_help(self.screen.focused, OVERVIEW_HELP)
        self.push_screen(HelpScreen(focused_pane(self.screen.focused), render_help(help_text, self.keymap_overrides),
                                    self.keymap_overrides))

    def action_hide_guidance(self) -> None:
        self.guidance.toggle()

    def action_jump_gate(self) -> None:
        self.gate_desk.jump()

    # Moving elsewhere on purpose ends a jump to a gate: answering later does not move the focus.

    async def action_new_session(self) -> None:
        self.gate_desk.return_to = None
        await self.sessions.new_session(focus=True)

    def action_toggle_sessions(self) -> None:
        self.gate_desk.return_to = None
        self.main.toggle("sessions")

    def action_toggle_side(self) -> None:
        self.gate_desk.return_to = None
        self.main.toggle("side")

    def action_next_side_tab(self) -> None:
        self.gate_desk.return_to = None
        self.main.cycle_side_tab()

    def action_next_pane(self) -> None:
        self.gate_desk.return_to = None
        self.main.cycle_pane(1)

    def action_previous_pane(self) -> None:
        self.gate_desk.return_to = None
        self.main.cycle_pane(-1)

    def action_resize(self, delta: int) -> None:
        self.main.resize_pane(int(delta))

    def action_focus_input(self) -> None:
        self.gate_desk.return_to = None
        self.main.show_pane("input")

    def action_show_pane(self, name: str) -> None:
        self.gate_desk.return_to = None
        self.main.show_pane(name)

    def action_check_models(self) -> None:
        self.probe_models()
        self.notify("checking models…", timeout=2)
