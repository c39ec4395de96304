"""The console's terminal writer (aiops/tui/writer.py) on a pipe that the test reads, or not: a
pipe whose reader stops reading blocks its writer as a stalled terminal does."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import pytest

from aiops.tui.writer import TerminalWriter

FRAME = 100_000  # bigger than a pipe's buffer (64 KiB): the first frame alone blocks the writer


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    yield r, w
    for fd in (r, w):
        try:
            os.close(fd)
        except OSError:
            pass


def read_all(fd: int, until: bytes) -> bytes:
    out = b""
    while until not in out:
        chunk = os.read(fd, 1 << 16)
        assert chunk, f"end of pipe before {until!r}"
        out += chunk
    return out


def in_thread(fn: object) -> bool:
    """Run `fn` in a thread; whether it returned (a call that blocks on the terminal never does)."""
    t = threading.Thread(target=fn, daemon=True)  # type: ignore[arg-type]
    t.start()
    t.join(10)
    return not t.is_alive()


def test_frames_wait_while_the_terminal_is_behind_are_dropped_and_one_repaint_follows(pipe):
    r, w = pipe
    behind, drained = threading.Event(), threading.Event()
    writer = TerminalWriter(w, limit=2 * FRAME, after=3600, on_behind=behind.set, on_drained=drained.set)
    writer.start()
    writer.write_control("<modes on>")
    assert read_all(r, b"<modes on>") == b"<modes on>"
    while writer.writing:  # (the thread is done with that write)
        time.sleep(0.01)
    writer.write("A" * FRAME)
    writer.write("<end of frame 1>")
    writer.flush()  # taken by the thread, which blocks: nobody reads the pipe
    while not writer.writing:
        time.sleep(0.01)

    def app_draws() -> None:
        for i in range(2, 40):  # the app goes on drawing: none of this may block
            writer.write(f"<frame {i}>" + "B" * FRAME)
            writer.flush()
            if i == 10:
                writer.write_control("<mouse off>")

    assert in_thread(app_draws), "flush blocked on a terminal that does not read"
    assert behind.is_set() and writer.behind
    assert writer.dropped_frames >= 36  # all but those in flight and the first two waiting
    assert not drained.is_set()

    # The terminal reads again: it gets what was in flight and every control write, no stale frame.
    got = read_all(r, b"<mouse off>")
    assert drained.wait(10) and not writer.behind
    assert got.startswith(b"A" * FRAME + b"<end of frame 1>")
    assert b"<frame 39>" not in got
    assert writer.repaints == 1
    # The app repaints (on_drained): that frame goes through again.
    writer.write("<repaint>")
    writer.flush()
    assert writer.stop(10)
    os.close(w)
    rest = b""
    while chunk := os.read(r, 1 << 16):
        rest += chunk
    assert rest == b"<repaint>"


def test_a_write_stuck_for_long_is_falling_behind_before_much_waits(pipe):
    """A terminal that took nothing for `after` seconds is behind at the next frame, however small
    the frames: the app stops drawing early instead of rendering frames for nobody."""
    r, w = pipe
    behind = threading.Event()
    writer = TerminalWriter(w, after=0.0, on_behind=behind.set)
    writer.start()
    writer.write("A" * FRAME)
    writer.flush()
    while not writer.writing:  # the thread has taken the frame (and blocks in it)
        time.sleep(0.01)
    writer.write("small")
    writer.flush()
    assert behind.is_set()
    read_all(r, b"A" * 1000)
    assert writer.stop(10)


def test_stop_gives_up_on_a_terminal_that_never_reads(pipe):
    _, w = pipe
    writer = TerminalWriter(w)
    writer.start()
    writer.write("A" * FRAME)
    writer.flush()
    assert writer.stop(0.2) is False  # bounded: the exit goes on without the terminal
    assert writer.is_alive() and writer.daemon  # left to die with the process


def test_a_terminal_that_is_gone_makes_writes_no_ops(pipe):
    r, w = pipe
    os.close(r)
    writer = TerminalWriter(w)
    writer.start()
    writer.write("frame")
    writer.flush()
    assert writer.stop(10)
    assert writer.gone
    writer.write("after")  # no error, nothing written
    writer.flush()
    assert writer.dropped_frames == 1


def test_a_frame_is_on_the_terminal_when_flushed_while_the_thread_is_idle(pipe):
    # The thread is not even started: a frame flushed while it has nothing to write is written on
    # the caller's side, so it does not wait for the thread to be scheduled (and to get the GIL).
    r, w = pipe
    writer = TerminalWriter(w)
    writer.write("<row>")
    writer.flush()
    assert os.read(r, 1 << 16) == b"<row>"
    # What the thread holds comes first: a control write waits for it, and so does the next frame.
    writer.write_control("<modes>")
    writer.write("<frame 2>")
    writer.flush()
    writer.start()
    assert read_all(r, b"<frame 2>") == b"<modes><frame 2>"
    assert writer.stop(5)


def test_what_the_terminal_does_not_take_at_once_follows_from_the_thread_in_order(pipe):
    r, w = pipe
    writer = TerminalWriter(w, after=3600)
    frame = "é" * FRAME + "<end of frame 1>"  # two bytes a character: a cut may fall inside one
    writer.write(frame)
    assert in_thread(writer.flush), "flush blocked on a terminal that does not read"
    writer.write("<frame 2>")
    writer.flush()  # behind the rest of frame 1, which the thread has not written yet
    writer.start()
    assert read_all(r, b"<frame 2>") == (frame + "<frame 2>").encode()
    assert writer.stop(5)


def test_a_frame_the_terminal_has_begun_is_never_cut_by_falling_behind(pipe):
    r, w = pipe
    writer = TerminalWriter(w, limit=10, after=3600)
    frame = "\x1b[?2026h" + "é" * FRAME + "\x1b[?2026l"  # synchronized output: opened, then closed
    writer.write(frame)
    writer.flush()  # the terminal took part of it; the rest waits for the thread
    writer.write("<frame 2>")
    writer.flush()  # over the limit: this one is dropped, not the rest of the first
    writer.write("<frame 3>")
    writer.flush()
    writer.start()
    assert read_all(r, b"\x1b[?2026l") == frame.encode()
    assert writer.stop(5)


def test_a_file_is_written_at_its_end_by_the_thread_alone(tmp_path):
    # Reopened, a file would get an offset of its own and the frame would overwrite its start.
    path = tmp_path / "out"
    path.write_bytes(b"EXISTING LINE\n")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        writer = TerminalWriter(fd)
        writer.start()
        writer.write("<frame>")
        writer.flush()
        assert writer.stop(5)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"EXISTING LINE\n<frame>"
