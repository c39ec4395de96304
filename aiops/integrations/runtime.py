"""The process's event loop, run to its exit: shared by the console and `aiops serve`.

`run_to_exit` runs the main coroutine's loop and winds it down bounded (a tool that ignores its
cancellation, or a thread blocked in one, must not hold the exit for ever); `exit_if_left` then
leaves without waiting for what is still running. Nothing here knows of the server or the console.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)


def exit_if_left(left: int, rc: int) -> None:
    """Everything is stopped and stored; if something is left (a tool that ignores cancellation,
    or a thread blocked in one) Python would wait for it without end at exit, and a service
    manager would SIGKILL the process in the end: leave without it."""
    if left:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)


EXIT_GRACE = 5.0  # seconds the exit waits for tasks and threads still running after the stop


def run_to_exit(main: Callable[[asyncio.AbstractEventLoop], int], left_out: list[int]) -> int:
    """Run `main(loop)` on a new loop (`aiops serve`, the console), then wind the loop down as
    asyncio.run does, but bounded: tasks still running are cancelled and given EXIT_GRACE, the
    default executor's threads as long. Returns main's exit status; `left_out[0]` is how many
    tasks and threads were still running after that (set even when main raises: the caller must
    not wait for them at exit either; see exit_if_left)."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    # Our own default executor (asyncio.to_thread's): its threads are waited for below, bounded.
    # (loop.shutdown_default_executor joins them without a limit, even when cancelled, on 3.11.)
    executor = ThreadPoolExecutor(thread_name_prefix="aiops-worker")
    loop.set_default_executor(executor)
    rc, left = 1, 0
    try:
        rc = main(loop)
    finally:
        try:
            tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for t in tasks:
                t.cancel()
            if tasks:
                _, pending = loop.run_until_complete(asyncio.wait(tasks, timeout=EXIT_GRACE))
                left += len(pending)
            loop.run_until_complete(loop.shutdown_asyncgens())
            executor.shutdown(wait=False, cancel_futures=True)
            deadline = time.monotonic() + EXIT_GRACE
            for thread in threading.enumerate():
                if thread is not threading.current_thread() and not thread.daemon:
                    thread.join(max(0.0, deadline - time.monotonic()))
                    left += thread.is_alive()
            left_out[0] = left
            if left:
                log.warning("exiting with %d task(s) or thread(s) still running after the stop (a tool "
                            "that ignores cancellation, or blocks a thread?); not waiting for them", left)
        finally:
            # Stopped (or failed) already: a second Ctrl-C, or a service manager's repeated
            # SIGTERM, arriving during the last of the exit must not turn it into a killed
            # process. (The loop's own handlers go first, or closing it would restore the
            # defaults after this.)
            for name in ("SIGINT", "SIGTERM", "SIGHUP"):
                if (sig := getattr(signal, name, None)) is not None:
                    loop.remove_signal_handler(sig)
                    signal.signal(sig, signal.SIG_IGN)
            asyncio.set_event_loop(None)
            loop.close()
    return rc
