"""A child process's stderr read as it comes, in a thread: for a CLI that asks on its terminal
(`aiops chat`'s gate question) and waits for the answer, where reading after it exits is too late."""

from __future__ import annotations

import subprocess
import threading


def watch_stderr(proc: subprocess.Popen[bytes], question: str) -> tuple[threading.Event, list[str], threading.Thread]:
    """(set once `question` has been written, every chunk read so far, the reading thread)."""
    asked = threading.Event()
    err: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        for chunk in iter(lambda: proc.stderr.read1(4096).decode(), ""):  # type: ignore[union-attr]
            err.append(chunk)
            if question in "".join(err):
                asked.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return asked, err, reader
