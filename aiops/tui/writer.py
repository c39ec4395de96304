"""The console's terminal writer: output the terminal cannot take now is dropped, never waited for.

Textual's own `WriterThread` (textual/drivers/_writer_thread.py) feeds the terminal from a queue of
30 writes; when the terminal stops reading (a stalled SSH link, a sleeping laptop, a stopped tmux
server) its thread blocks in `write`, the queue fills, and the next `put` blocks the event loop the
engine and the HTTP server share with the console: every client stops being answered. Stopping it
blocks the same way (`WriterThread.stop` puts into the full queue), so the process could not exit.

This writer keeps the same shape (one thread does the blocking writes) with three differences:

- `write`/`flush` never block. Writes between two flushes are one frame (Textual's `_display`
  writes a frame, synchronized-output brackets included, then flushes), handed to the thread whole.
- While the thread is busy, frames wait; when more than `limit` characters of frames wait, or a
  frame comes while one write has taken more than `after` seconds, the terminal is behind: every
  waiting frame is dropped, and frames are discarded as they come until the thread has written
  what it holds. `on_behind` tells the app, which stops drawing (a frame that will be dropped
  is CPU taken from the engine and the server). Then `on_drained` is called (on the thread) so
  that the app repaints the whole screen once: the terminal converges on what the app shows
  now, not on a backlog of stale frames. Memory stays bounded by `limit` plus the write in flight.
- Control writes (`write_control`: terminal modes, alternate screen, mouse, cursor) are never
  dropped: a repaint does not repeat them. They are a few dozen bytes per start or stop.

A frame handed over while the thread is idle is first written from the app's side, on a
non-blocking opening of the same terminal: as much as the terminal takes at once (a whole frame,
normally) is there at once; the rest, if any, goes to the thread as before. Handed to the thread,
a frame waited for the thread to get the GIL, which the event loop holds while it runs: a gate's
row drawn at once reached the terminal 5-17 ms later in one round in five with fifty sessions
streaming (docs/PERFORMANCE.md). Such a write never blocks, so the loop still never waits on the
terminal.

The thread writes with `os.write` on its own duplicate of the file descriptor: no Python file
object's lock is held while a write blocks, so interpreter shutdown never waits on one, and `stop`
gives up after its timeout (the thread is a daemon: a write blocked for good dies with the process).
A terminal that is gone (EIO, EPIPE) makes every later write a no-op.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

# Characters of frames that may wait while a write is blocked: about two full repaints of a
# 250x70 truecolor screen. More waiting means the terminal reads slower than the app draws.
BEHIND_LIMIT = 256 * 1024
# Seconds one write may take before a new frame counts as falling behind: a terminal that reads
# at all takes a frame in milliseconds; one that has not in this time is stalled or very slow,
# and drawing frames for it only costs the loop (see `on_behind`).
BEHIND_AFTER = 0.25


class TerminalWriter(threading.Thread):
    """Writes to a terminal from its own thread; see the module's docstring."""

    def __init__(self, fd: int, *, encoding: str = "utf-8", limit: int = BEHIND_LIMIT,
                 after: float = BEHIND_AFTER, on_behind: Callable[[], None] | None = None,
                 on_drained: Callable[[], None] | None = None) -> None:
        """`on_behind` is called (on the caller of `flush`) when frames start being dropped, so the
        app may stop drawing them; `on_drained` (on the writer's thread) once the terminal has
        taken everything again, so it repaints the whole screen."""
        super().__init__(daemon=True, name="aiops-terminal-writer")
        self._fd = os.dup(fd)
        self._direct_fd = _nonblocking_opening(fd)  # None: every write goes through the thread
        self._encoding = encoding
        self.limit = limit
        self.after = after
        self.on_behind = on_behind
        self.on_drained = on_drained
        self._write_started: float | None = None  # when the write in flight began
        self._cond = threading.Condition()
        self._open: list[str] = []  # the frame being written (between two flushes)
        self._pending: list[tuple[bool, str | bytes]] = []  # (is a frame, text), in order
        self._pending_frames = 0  # characters of frames in _pending
        self._stale = False  # frames were dropped: discard until drained, then repaint
        self._stopping = False
        self.gone = False  # the terminal went away (EIO, EPIPE): nothing more is written
        self.dropped_frames = 0
        self.repaints = 0  # how often the terminal caught up after frames were dropped
        self._behind_since: float | None = None

    # -- the app's side (never blocks) --

    def write(self, text: str) -> None:
        """Part of the current frame; it goes to the terminal at `flush`."""
        if text:
            with self._cond:
                self._open.append(text)

    def flush(self) -> None:
        """End the current frame: hand it to the thread, or drop it if the terminal is behind."""
        with self._cond:
            if not self._open:
                return
            frame = "".join(self._open)
            self._open.clear()
            if self.gone or self._stale:
                self.dropped_frames += 1
                return
            if not self._pending and self._write_started is None:
                rest = self._write_now(frame)
                if rest:
                    # The rest of a frame the terminal has begun: never dropped (a frame cut short
                    # would leave it mid escape sequence), so not counted as a frame that waits.
                    self._pending.append((False, rest))
                    self._cond.notify()
                return
            self._pending.append((True, frame))
            self._pending_frames += len(frame)
            started = self._write_started
            fell = self._pending_frames > self.limit or (
                started is not None and time.monotonic() - started > self.after)
            if fell:
                self._fall_behind()
            self._cond.notify()
        if fell and self.on_behind is not None:
            self.on_behind()

    def _write_now(self, frame: str) -> bytes:
        """Write what the terminal takes now without blocking (the thread being idle, with the lock
        held, so nothing is written between); what is left for the thread."""
        data = frame.encode(self._encoding, "replace")
        if self._direct_fd is None:
            return data
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self._direct_fd, view):]
            except InterruptedError:
                continue
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                    # Gone (EIO, EPIPE) or refused: the thread's own write says which, and acts on it.
                    fd, self._direct_fd = self._direct_fd, None
                    try:
                        os.close(fd)
                    except OSError:
                        pass
                break
        return bytes(view)

    def write_control(self, text: str) -> None:
        """A terminal mode change: written in order, never dropped."""
        if not text:
            return
        with self._cond:
            if self._open:  # whatever the app wrote before it stays before it
                self._pending.append((True, "".join(self._open)))
                self._open.clear()
            self._pending.append((False, text))
            self._cond.notify()

    def _fall_behind(self) -> None:
        dropped = sum(1 for is_frame, _ in self._pending if is_frame)
        self._pending = [item for item in self._pending if not item[0]]
        self._pending_frames = 0
        self.dropped_frames += dropped
        self._stale = True
        if self._behind_since is None:
            self._behind_since = time.monotonic()
            log.warning("the terminal is not taking the console's output; dropping frames until it "
                        "does (the engine and the server go on)")

    @property
    def writing(self) -> bool:
        """A write is in flight (the thread may be blocked in it)."""
        return self._write_started is not None

    @property
    def behind(self) -> bool:
        """Frames are being dropped: the terminal has not caught up yet."""
        return self._stale

    # -- the thread --

    def run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stopping:
                    self._cond.wait()
                if not self._pending:  # stopping, everything written
                    break
                batch, self._pending, self._pending_frames = self._pending, [], 0
                self._write_started = time.monotonic()
            if not self.gone:
                self._write_all(b"".join(text if isinstance(text, bytes) else text.encode(self._encoding, "replace")
                                         for _, text in batch))
            drained = False
            with self._cond:
                self._write_started = None
                if self._stale and not self._pending:
                    self._stale, drained = False, True
                    since, self._behind_since = self._behind_since, None
            if drained and not self.gone:
                self.repaints += 1
                log.info("the terminal takes output again after %.1f s; %d frame(s) were dropped, "
                         "repainting the screen", time.monotonic() - (since or time.monotonic()),
                         self.dropped_frames)
                if self.on_drained is not None:
                    try:
                        self.on_drained()
                    except Exception:  # noqa: BLE001 - a repaint request must not end the writer
                        log.exception("requesting a repaint failed")
        self._close()

    def _close(self) -> None:
        """Close both descriptors; a flush after this writes nothing itself."""
        with self._cond:
            direct, self._direct_fd = self._direct_fd, None
        for fd in (self._fd, direct):
            try:
                if fd is not None:
                    os.close(fd)
            except OSError:
                pass

    def _write_all(self, text: bytes) -> None:
        data = memoryview(text)
        while data:
            try:
                written = os.write(self._fd, data)
            except InterruptedError:
                continue
            except OSError as e:
                if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK):  # a non-blocking terminal: wait a bit
                    time.sleep(0.01)
                    continue
                self.gone = True
                log.warning("the terminal is gone (%s); the console writes nothing more", e.strerror or e)
                return
            data = data[written:]

    def stop(self, timeout: float) -> bool:
        """Write what is left and end the thread, waiting at most `timeout` seconds. False when the
        terminal did not take it in that time (the thread is then left to die with the process)."""
        with self._cond:
            if self._open:
                self._pending.append((True, "".join(self._open)))
                self._open.clear()
            self._stopping = True
            self._cond.notify()
        if not self.is_alive():
            if self.ident is None:  # never started: its descriptors are still ours to close
                self._close()
            return True
        self.join(timeout)
        if self.is_alive():
            log.warning("the terminal took no output for %.1f s at exit; leaving it as it is (run "
                        "`reset` in it if it comes back garbled)", timeout)
            return False
        return True


def _nonblocking_opening(fd: int) -> int | None:
    """A second opening of the terminal behind `fd`, non-blocking: its own open file description,
    so the flag does not reach the thread's blocking writes (a `dup` shares it). Linux's
    /proc/self/fd reopens a terminal or a pipe as the same one; None for anything else (a file
    would get an offset of its own, a pty's master side a new pty) or where it cannot."""
    try:
        mode = os.fstat(fd)
        if stat.S_ISCHR(mode.st_mode):
            if not os.isatty(fd) or (os.major(mode.st_rdev), os.minor(mode.st_rdev)) == (5, 2):  # /dev/ptmx
                return None
        elif not stat.S_ISFIFO(mode.st_mode):
            return None
        return os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None
