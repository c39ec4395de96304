"""Start-up of the engine and the HTTP server behind the console, and what the header says of them.

The App starts them on mount in a worker, which only posts the outcome (`ServicesStarted` or
`ServicesFailed`) back; the App's handlers, delegating here, then fill the panes: the header's server
field, the input's completions, the sessions list, pending gates, the console session to show. A
failed start leaves the console up, saying why. Owned by the App.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

from textual.css.query import NoMatches

from aiops.engine import gc_policy
from aiops.tui.adapter import ServicesFailed
from aiops.tui.format import one_line, server_label

if TYPE_CHECKING:
    from aiops.tui.adapter import ServicesStarted
    from aiops.tui.app import AiopsApp
    from aiops.tui.remote_adapter import AttachState

log = logging.getLogger(__name__)

# Seconds after the services started (the sessions listed, the console session being read) before
# the collector settles (gc_policy.settle).
SETTLE_AFTER_S = 1.0


class Services:
    """The engine and the server as the console starts and shows them."""

    def __init__(self, app: AiopsApp) -> None:
        self.app = app

    async def start(self) -> None:
        """In a worker: start the engine and the server, and post how it went."""
        app = self.app
        try:
            started = await app.adapter.start(server=app.want_server, host=app.host, port=app.port,
                                              lock=app.lock)
        except Exception as e:  # noqa: BLE001 - shown in the console, which stays up
            log.exception("the engine did not start")
            app.post_message(ServicesFailed(f"{type(e).__name__}: {e}"))
            return
        app.post_message(started)

    def failed(self, error: str) -> None:
        app = self.app
        app.services_failed = error
        if not app._drawing:  # quit while the engine was starting (it starts after the first frame)
            return
        app.status.server = "engine failed"
        app.status.warning = one_line(error, 60)
        app.notify(f"the engine did not start: {error}", severity="error", timeout=30)
        app.sessions.give_back_waiting()

    async def started(self, msg: ServicesStarted) -> None:
        app = self.app
        app.services_ready = True
        app.server_urls = msg.server_urls
        if not app._drawing:  # quit while the engine was starting (it starts after the first frame)
            return
        # Attached to another aiops: where, and as whom (remote_adapter.py).
        app.status.server = getattr(app.adapter, "label", None) or server_label(msg.server_urls, app.want_server)
        if msg.server_error:
            app.notify(f"server: {msg.server_error}", severity="error", timeout=15)
        if app.lock is not None:
            with contextlib.suppress(OSError):
                app.lock.update(url=msg.server_urls[0] if msg.server_urls else None)
        app.chat_input.set_completions(app.adapter.command_names(), app.adapter.model_keys())
        sessions = await app.adapter.sessions()
        if not app._drawing:
            return
        app.sessions_list.set_sessions(sessions)
        app.gate_desk.set_gates(app.adapter.pending_gates())
        app.side.refresh_limits()
        await app.sessions.select_latest_console(sessions)
        # The model SDKs, in a thread: imported now, not by the first turn on the loop. (Not
        # earlier: imported while the console drew its first frame, they took the loop's time
        # all the same, through the GIL.)
        app.run_worker(app.adapter.warm_backends(), name="warm_backends", group="services", exit_on_error=False)
        await app.sessions.send_waiting()
        app.probe_models()
        if app.settle_gc:
            # A full collection (~0.1 s of CPU on a year of history): once the console has drawn
            # its session, not while it does.
            app.set_timer(SETTLE_AFTER_S, self._settle)

    def _settle(self) -> None:
        if self.app._drawing:
            gc_policy.settle()  # start-up is over: see gc_policy

    async def attach_state(self, msg: AttachState) -> None:
        """The link to the attached aiops: said in the header while it is down, and everything read
        again when the events missed cannot be replayed (it restarted, or the console was away long)."""
        app = self.app
        if not app.services_ready or not app._drawing:
            return
        label = str(getattr(app.adapter, "label", ""))
        if msg.state == "disconnected":
            first = not app.status.server.startswith("DISCONNECTED")
            app.status.server = "DISCONNECTED · " + label.removeprefix("attached ")
            app.status.warning = one_line(msg.reason, 60)
            if first:
                app.notify(f"lost the attached aiops: {msg.reason}", severity="error", timeout=8)
        elif msg.state == "connected":
            if app.status.server.startswith("DISCONNECTED"):
                app.notify("reconnected", timeout=4)
            app.status.server = label
            app.status.warning = ""
        elif msg.state == "reset":
            sessions = await app.adapter.sessions()
            if not app._drawing:
                return
            app.sessions_list.set_sessions(sessions)
            app.gate_desk.set_gates(app.adapter.pending_gates())
            app.side.refresh_limits()
            if app.selected is not None:
                await app.sessions.select(app.selected)

    def refresh_clients(self) -> None:
        """The header's count of connected clients (an app timer, every 2 s)."""
        app = self.app
        # An app timer outlives the screen: on shutdown Textual removes the screen's widgets
        # before it stops the app's timers, so a tick can land on an empty screen.
        if not app.services_ready or not app._drawing:
            return
        with contextlib.suppress(NoMatches):
            app.status.clients = app.adapter.connected_clients()
