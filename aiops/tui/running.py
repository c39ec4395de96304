"""Running the console as a process: its terminal driver, a quiet terminal while it draws, the data-dir
lock, the signals that quit it, and a bounded exit.

Kept apart from the App (aiops/tui/app.py), which tests run headless: only `run_until_quit` (the
console's run, in process or attached) tunes the collector (`calm_collector`), catches
SIGTERM/SIGHUP and arms the exit watchdog, so an app under test leaves the test runner's process
alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from aiops.logs import log_file_handler
from aiops.watchdog import ExitWatchdog

if TYPE_CHECKING:
    from textual.driver import Driver

    from aiops.config import Config
    from aiops.tui.app import AiopsApp

log = logging.getLogger(__name__)


def quit_on_signals(signalled: Callable[[int], None]) -> None:
    """SIGTERM and SIGHUP (a closed terminal, a dropped SSH session) call `signalled` on the running
    loop. Without this, SIGTERM killed the console where it stood: the terminal left in raw mode
    on the alternate screen, client streams cut instead of ended, turns left for the next
    start to record as interrupted."""
    loop = asyncio.get_running_loop()
    for name in ("SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)  # no SIGHUP on Windows
        try:
            if sig is not None:
                loop.add_signal_handler(sig, signalled, sig)
        except NotImplementedError:  # Windows event loops catch no signals
            pass


def console_driver() -> type[Driver] | None:
    """Our terminal driver (aiops/tui/driver.py: output never blocks the loop), where Textual would
    use LinuxDriver; None (Textual's choice) on Windows or when TEXTUAL_DRIVER names another."""
    if sys.platform == "win32" or os.environ.get("TEXTUAL_DRIVER"):
        return None
    from aiops.tui.driver import ConsoleDriver

    return ConsoleDriver


@contextlib.contextmanager
def terminal_quiet(cfg: Config) -> Iterator[None]:
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


def calm_collector() -> None:
    """What the console has imported so far lives as long as it does: frozen (Python's collector
    skips it from now on), and the collector (off while the modules loaded, see aiops/cli/server.py)
    on again with `gc_policy`'s young threshold. Measured on the start with 10,000 stored sessions,
    the collector took ~0.34 s of CPU by the time the console session was shown (full collections
    over every imported object, charged to whatever allocated at the time: the chat's Markdown);
    `gc_policy.settle` then collects and freezes once more when start-up is over."""
    from aiops.engine.gc_policy import YOUNG_THRESHOLD

    gc.freeze()
    young, older, oldest = gc.get_threshold()
    gc.set_threshold(max(YOUNG_THRESHOLD, young), older, oldest)
    gc.enable()


def run_console(cfg: Config, host: str | None = None, port: int | None = None, server: bool = True) -> int:
    """Run the console until quit. Another aiops holding the data dir: attached to it when it serves
    and this is a terminal (aiops/tui/attach.py); otherwise exit status 2, saying who holds it."""
    from aiops.engine.lock import AlreadyRunning, DataDirLock
    from aiops.tui.app import AiopsApp  # the App imports this module for its driver

    lock = DataDirLock(cfg.paths.lock_path)
    try:
        lock.acquire()
    except AlreadyRunning as e:
        # Another aiops holds this data dir: attach to it when it serves (its run file says where).
        from aiops.engine.lock import holder_url

        url = holder_url(cfg.paths.data_dir, cfg.paths.lock_path)
        if url is not None and sys.stdin.isatty() and sys.stdout.isatty():
            from aiops.tui.attach import attach_to_holder

            code = attach_to_holder(cfg, url)
            if code is not None:
                return code
        # No server, no terminal to draw on, or a server that does not answer: say who holds it.
        print(f"aiops: {e}", file=sys.stderr)
        return 2

    def make() -> AiopsApp:
        app = AiopsApp(cfg, host=host, port=port, server=server, lock=lock)
        app.settle_gc = True
        return app

    return run_until_quit(cfg, make, "console", last=lock.release)


def run_until_quit(cfg: Config, make_app: Callable[[], AiopsApp], what: str,
                   last: Callable[[], None] | None = None) -> int:
    """Run the App `make_app` builds until it quits, then exit: the console's tail, in process
    (run_console) or attached (aiops/tui/attach.py). `last` runs at the very end, before an exit
    that does not wait for what is left (the data dir's lock)."""
    from aiops.integrations.runtime import exit_if_left, run_to_exit

    calm_collector()
    started = time.monotonic()
    code, left = 0, [0]
    try:
        with terminal_quiet(cfg):
            app = make_app()
            app.quit_on_signals = True
            app.watchdog = ExitWatchdog()  # armed by the quit; never disarmed: it covers the whole exit
            # On a loop of our own, wound down bounded (as `aiops serve`'s): a tool still running
            # after the close, or a thread blocked in one, must not hold the exit for good.
            code = run_to_exit(lambda loop: app.run(loop=loop) or 0, left) or 0
        log.info("%s closed after %.0f s", what, time.monotonic() - started)
        return code
    finally:
        # Closed already: a second SIGTERM (a service manager repeating itself) or SIGHUP (the
        # terminal going as it closes) during the last of the exit must not make it a killed one.
        for name in ("SIGTERM", "SIGHUP"):
            if (sig := getattr(signal, name, None)) is not None:
                signal.signal(sig, signal.SIG_IGN)
        if last is not None:
            last()
        exit_if_left(left[0], code)
