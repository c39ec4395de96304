"""The console's terminal driver: Textual's `LinuxDriver` over our `TerminalWriter`.

Why a driver of our own rather than a fix upstream: Textual's `LinuxDriver` builds its
`WriterThread` inside `start_application_mode` and stops it in `close`, with no hook to pass
another writer, and its writer's contract (a bounded queue whose `put` blocks) is what blocks the
loop. The change we need (frames dropped while the terminal is behind, then one full repaint)
needs the app's cooperation (the repaint) and a policy (what may be dropped), which is an app's
decision more than a library's; textual issue #6692 tracks the blocking queue upstream. So this
subclass keeps everything of `LinuxDriver` (termios, input parsing, resize, suspend) and replaces
only the output path:

- `write`/`flush` go to `TerminalWriter` (see aiops/tui/writer.py), which never blocks. What the
  driver writes itself (modes on start and stop, input-thread replies) is a control write and is
  never dropped; what the app writes (frames, the bell) may be, and is repainted when the terminal
  catches up.
- While the terminal is behind, the app draws nothing (`App.batch_update` held open): composing
  frames that would be dropped cost the loop as much as the console's whole normal drawing.
- `close` waits at most `CLOSE_WAIT` seconds for the terminal to take the last output (restoring
  modes and the main screen), then leaves: a stalled terminal cannot hold the exit.
- The input thread treats end of input (the terminal went away: read returns nothing, or fails)
  as a hang-up, and asks the app to exit as SIGHUP does, instead of spinning on a dead fd or
  raising into `App.panic`.

Textual's own writer thread is still created by `LinuxDriver.start_application_mode`; it is stopped
at once, idle (its queue is empty, so stopping it cannot block), and never used.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import selectors
import sys
import threading
from codecs import getincrementaldecoder
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from textual._xterm_parser import XTermParser
from textual.drivers.linux_driver import LinuxDriver
from textual.message import Message

from aiops.tui.writer import TerminalWriter

if TYPE_CHECKING:
    from textual.app import App

log = logging.getLogger(__name__)


class TerminalBehind(Message):
    """Posted to the app: the terminal stopped taking output, nothing is drawn until it catches up."""


class TerminalCaughtUp(Message):
    """Posted to the app: the terminal takes output again; the screen is being repainted."""


class ConsoleDriver(LinuxDriver):
    """LinuxDriver whose output never blocks the event loop; see the module's docstring."""

    CLOSE_WAIT = 1.0  # seconds `close` waits for the terminal to take the last output

    def __init__(self, app: App[Any], **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._writer: TerminalWriter | None = None
        # (Driver declares it non-optional; ours is set in start_application_mode.)
        self._loop: asyncio.AbstractEventLoop | None = None  # type: ignore[assignment]
        self._local = threading.local()  # .control: the driver itself is writing (never dropped)
        self._paused: contextlib.ExitStack | None = None  # drawing paused while the terminal is behind

    @contextlib.contextmanager
    def _control(self) -> Iterator[None]:
        previous = getattr(self._local, "control", False)
        self._local.control = True
        try:
            yield
        finally:
            self._local.control = previous

    @property
    def writer(self) -> TerminalWriter | None:
        return self._writer

    # -- output --

    def write(self, data: str) -> None:
        writer = self._writer
        if writer is None:
            return  # not in application mode (or closed): nothing may reach the terminal
        if getattr(self._local, "control", False):
            writer.write_control(data)
        else:
            writer.write(data)

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def _pause_drawing(self) -> None:
        """The terminal fell behind (on the loop: `flush` runs there): frames drawn now would be
        dropped, so none are drawn until it catches up. Textual's own `batch_update` does this:
        widgets go on changing, the screen is composed once the batch ends. `TerminalBehind`
        tells the app, whose widgets may put off work that only feeds the screen."""
        if self._paused is None:
            self._paused = contextlib.ExitStack()
            self._paused.enter_context(self._app.batch_update())
            self._app.post_message(TerminalBehind())

    def _repaint(self) -> None:
        """Runs on the loop once the terminal has caught up: draw the whole screen again."""
        paused, self._paused = self._paused, None
        if paused is not None:
            paused.close()
            self._app.post_message(TerminalCaughtUp())
        app = self._app
        if app.is_running and app.screen_stack:
            app.refresh()

    def _drained(self) -> None:
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nothing to repaint
                loop.call_soon_threadsafe(self._repaint)

    # -- modes --

    def start_application_mode(self) -> None:
        self._loop = asyncio.get_running_loop()
        stream = sys.__stderr__
        assert stream is not None
        self._writer = TerminalWriter(stream.fileno(), encoding=stream.encoding or "utf-8",
                                      on_behind=self._pause_drawing, on_drained=self._drained)
        self._writer.start()
        with self._control():
            super().start_application_mode()
        # LinuxDriver made and started its own writer; nothing was written to it (see write).
        textual_writer, self._writer_thread = self._writer_thread, None
        if textual_writer is not None:
            textual_writer.stop()
        if self._paused is not None:  # resumed (after ctrl+z) while it was behind: draw again
            self._loop.call_soon(self._repaint)

    def stop_application_mode(self) -> None:
        with self._control():
            super().stop_application_mode()

    def disable_input(self) -> None:
        with self._control():
            super().disable_input()

    def process_message(self, message: Any) -> None:
        with self._control():  # in-band resize and mouse-pixel replies, from the input thread
            super().process_message(message)

    def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.stop(self.CLOSE_WAIT)

    # -- input --

    def run_input_thread(self) -> None:
        """LinuxDriver's input loop, except at end of input: the terminal went away, which is a
        hang-up, not a reason to spin (read returns nothing at once, forever) or to panic."""
        selector = selectors.SelectSelector()
        selector.register(self.fileno, selectors.EVENT_READ)
        parser = XTermParser(self._debug)
        decode = getincrementaldecoder("utf-8")().decode
        try:
            while not self.exit_event.is_set():
                for _key, mask in selector.select(0.1):
                    if not mask & selectors.EVENT_READ:
                        continue
                    try:
                        data = os.read(self.fileno, 4096)
                    except OSError as e:
                        data, reason = b"", e.strerror or str(e)
                    else:
                        reason = "end of input"
                    if not data:
                        self._hung_up(reason)
                        return
                    for event in parser.feed(decode(data)):
                        self.process_message(event)
                for event in parser.tick():
                    self.process_message(event)
        finally:
            selector.close()
            with contextlib.suppress(Exception):
                for _ in parser.feed(""):
                    pass

    def _hung_up(self, reason: str) -> None:
        log.info("the terminal went away (%s): quitting", reason)
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._app.exit)

