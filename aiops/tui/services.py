"""Start-up of the engine and the HTTP server behind the console, and what the header says of them.

The App starts them on mount in a worker, which only posts the outcome (`ServicesStarted` or
`ServicesFailed`) back; the App's handlers, delegating here, then fill the panes: the header's server
field, the input's completions, the sessions list, pending gates, the console session to show. A
failed start leaves the console up, saying why. Owned by the App.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from textual.css.query import NoMatches
from textual.worker import Worker

from aiops.engine import gc_policy
from aiops.engine.types import SessionKey
from aiops.tui.adapter import SESSIONS_PAGE, ServicesFailed
from aiops.tui.format import one_line, server_label

if TYPE_CHECKING:
    from aiops.tui.adapter import ServicesStarted
    from aiops.tui.app import AiopsApp
    from aiops.tui.remote_adapter import AttachState

log = logging.getLogger(__name__)

# A page of older sessions that could not be read (an attached aiops unreachable for a while) is
# tried again this many times, 2, 4, 8… seconds apart, before the list settles for what it has.
OLDER_TRIES = 6


# Seconds after the services started by which the rest of start-up (the model SDKs, the collector)
# runs even if no session has been shown.
REST_AFTER_S = 3.0


def _import_shown_later() -> None:
    """What the console shows once its engine is up, imported in a thread while the engine starts:
    the first history page draws Markdown (markdown-it alone is ~0.06 s of CPU on the loop) and
    highlights tool calls. A failure here is left for the widget that needs it to report."""
    try:
        import textual.highlight  # noqa: F401
        from textual.widgets import Markdown  # noqa: F401 - textual.widgets imports it on first use
    except Exception:  # noqa: BLE001
        log.debug("could not pre-import the chat's widgets", exc_info=True)


def after_page(page: list[dict[str, Any]]) -> SessionKey | None:
    """Where the next page of sessions starts: after the last of `page`; None when `page` was the
    last (not a full one)."""
    return SessionKey.of(page[-1]) if len(page) >= SESSIONS_PAGE else None


def _warm_answers() -> None:
    """In a thread: the answers' Markdown (markdown-it, ~60 modules, imported here too, not on the
    loop) and the lexers of the languages their code mostly comes in (widgets/answer.py)."""
    from aiops.tui.widgets.answer import warm

    warm()


class Services:
    """The engine and the server as the console starts and shows them."""

    def __init__(self, app: AiopsApp) -> None:
        self.app = app
        self._rest_started = False
        self._older_from: SessionKey | None = None  # the first page's last session (list_older)

    async def start(self) -> None:
        """In a worker: start the engine and the server, and post how it went."""
        app = self.app
        try:
            await asyncio.to_thread(_import_shown_later)
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
        self._older_from = after_page(sessions)
        app.gate_desk.set_gates(app.adapter.pending_gates())
        app.side.refresh_limits()
        # What was typed while the engine started goes out once the session's history is shown
        # (`history_loaded`): sent before, its turn raced the history page and could be drawn twice.
        await app.sessions.select_latest_console(sessions)
        app.probe_models()
        app.set_timer(REST_AFTER_S, self.session_shown)

    def session_shown(self) -> None:
        """The console session is on screen (or REST_AFTER_S passed): the rest of start-up, out of
        its way. The model SDKs (~0.4 s of CPU), imported in a thread, so that a turn does not
        import its model's on the loop; in a thread all the same they take the loop's time
        through the GIL, which the first frame, the sessions and the chat should not wait for.
        Then, in a thread too, what drawing answers and their code loads (`_warm_answers`). Then the
        collector settles (a full collection, ~0.1 s on a year of history)."""
        app = self.app
        if self._rest_started or not app.services_ready or not app._drawing:
            return
        self._rest_started = True
        app.run_worker(self._rest(), name="rest_of_start", group="services", exit_on_error=False)

    async def _rest(self) -> None:
        app = self.app
        await app.adapter.warm_backends()
        await asyncio.to_thread(_warm_answers)
        if app.settle_gc and app._drawing:
            gc_policy.settle()  # start-up is over: see gc_policy
        # After the collector's settling (a full collection, ~0.1 s on a year of history), not
        # before: it would come a second later, when the operator is typing.
        self.list_older(self._older_from)

    def list_older(self, after: SessionKey | None) -> Worker[None]:
        """The sessions past the first page the list was set with (`after`: its last session, or
        None when that page held them all), a page at a time, put in the list as they come (a year
        of a busy team is ~10,000; each page costs the loop a few ms). A list set again (a
        reconnect) starts this again, and the one running stops."""
        return self.app.run_worker(self._older(after), name="older_sessions", group="older_sessions",
                                   exclusive=True, exit_on_error=False)

    async def _older(self, after: SessionKey | None) -> None:
        app = self.app
        sessions = app.sessions_list
        failures = 0
        # Each page is the sessions after the last one read, in the store's order (most recently
        # active first, then by id): a session deleted or active meanwhile moves no other one past
        # the page, as it moved an offset. One active meanwhile is listed by its event; one deleted
        # after a page that holds it was read is kept out by the list.
        while after is not None and app._drawing:
            try:
                page = await app.adapter.sessions(before=after)
            except Exception as e:  # noqa: BLE001 - tried again a little later; the log says why
                if not app._drawing:
                    return
                failures += 1
                if failures > OLDER_TRIES:
                    log.warning("older sessions not listed (those after %s): %s", after.client_id, e)
                    return
                log.info("older sessions (after %s) not read, trying again: %s", after.client_id, e)
                await asyncio.sleep(min(30.0, 2.0 ** failures))
                continue
            if not app._drawing:
                return
            failures = 0
            sessions.add_older(page)
            after = after_page(page)
        if app._drawing:
            sessions.older_listed()

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
            self._older_from = after_page(sessions)
            self.list_older(self._older_from)
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
