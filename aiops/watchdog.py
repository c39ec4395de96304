"""A bounded exit: once a quit begins, the process is gone within SHUTDOWN_DEADLINE seconds.

The clean path (turns stopped and recorded, streams ended, the lock released) normally takes well
under a second. Whatever might hold it longer (a terminal that takes no output, a thread blocked
in a tool, a library waiting without end) must not keep the process, and with it the data-dir
lock, alive: an operator whose SSH session dropped has to be able to start aiops again. The
watchdog is a daemon thread armed when the quit begins; if the process still runs at the
deadline it logs so and ends it with `os._exit`. The kernel then drops the data-dir lock; the
lock file still names this process, so the next start records what was left open (interrupted
turns, unresolved gates) as it does after a crash.
"""

from __future__ import annotations

import logging
import os
import threading
import time

log = logging.getLogger(__name__)

# The process exits within 5 s of a quit: the watchdog fires half a second before, so that
# ending the process (and the kernel freeing its files) fits in that.
SHUTDOWN_DEADLINE = 4.5
FORCED_EXIT_STATUS = 1


class ExitWatchdog:
    def __init__(self, deadline: float = SHUTDOWN_DEADLINE, status: int = FORCED_EXIT_STATUS) -> None:
        self.deadline = deadline
        self.status = status
        self._armed = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.reason = ""

    @property
    def armed(self) -> bool:
        return self._armed.is_set()

    def arm(self, reason: str) -> None:
        """Start counting (once: the first quit's reason and time count)."""
        with self._lock:
            if self._thread is not None:
                return
            self.reason = reason
            self._armed.set()
            self._thread = threading.Thread(target=self._watch, args=(time.monotonic(),),
                                            name="aiops-exit-watchdog", daemon=True)
            self._thread.start()

    def _watch(self, since: float) -> None:
        time.sleep(max(0.0, since + self.deadline - time.monotonic()))
        threads = ", ".join(sorted(t.name for t in threading.enumerate()
                                   if t is not threading.current_thread())) or "none"
        log.error("aiops did not exit within %.1f s of %s; the watchdog ends it now (threads still "
                  "running: %s). The next start records what was left open.", self.deadline,
                  self.reason, threads)
        for handler in logging.getLogger().handlers:
            try:
                handler.flush()
            except Exception:  # noqa: BLE001 - exiting regardless
                pass
        # Not sys.exit: that would wait for the very things that hold the exit. Not the terminal
        # either (it may be what blocks): the log file says why.
        os._exit(self.status)
