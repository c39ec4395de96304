"""pytest plugin: `aiops` in a real terminal, a tmux pane on a private tmux server.

tmux gives the console a real pty (termios, alternate screen, key sequences) that Pilot does not,
and a terminal that can stall: `Tmux.stall()` stops the tmux server (SIGSTOP), so the pane's pty
is no longer read, as an SSH link that hangs or a laptop that sleeps.

Fixture `tmux`: a `Tmux`, killed at teardown. Without tmux the test is skipped, except under
CI=true, where it fails: CI must not skip silently. Mark such tests `pytest.mark.tmux`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

AIOPS = Path(sys.executable).parent / "aiops"


class Tmux:
    """A tmux server on a private socket, so nothing of the user's own tmux is touched."""

    def __init__(self) -> None:
        exe = shutil.which("tmux")
        assert exe is not None
        self.exe = exe
        self.socket = f"aiops-test-{uuid.uuid4().hex[:8]}"
        self._stopped_pid: int | None = None

    def __call__(self, *args: str) -> str:
        out = subprocess.run([self.exe, "-L", self.socket, *args], capture_output=True, text=True, timeout=20)
        if out.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(args)}: {out.stderr.strip()}")
        return out.stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "aiops")

    def wait_for(self, check: Callable[[str], bool], what: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            text = self.screen()
            if check(text):
                return text
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; the terminal shows:\n{text}")
            time.sleep(0.1)  # polling a condition with a deadline, not waiting a fixed time

    def start_aiops(self, config: Path, data: Path, *, width: int = 100, height: int = 30,
                    env: dict[str, str] | None = None, args: str = "") -> None:
        """`aiops console --port 0` in session "aiops"; the pane prints AIOPS-EXIT:<status> after."""
        base = {k: v for k, v in os.environ.items() if k not in ("AIOPS_OPERATOR_TOKEN", "TMUX", "TMUX_PANE")}
        base.update(TERM="xterm-256color", COLORTERM="truecolor")
        base.update(env or {})
        command = (f"{AIOPS} --config-dir {config} --data-dir {data} console --port 0 {args}; "
                   f"echo AIOPS-EXIT:$?; sleep 60")
        subprocess.run([self.exe, "-L", self.socket, "new-session", "-d", "-s", "aiops", "-x", str(width),
                        "-y", str(height), "sh", "-c", command], check=True, env=base, timeout=20)

    def wait_for_console(self, data: Path, timeout: float = 30.0) -> dict[str, Any]:
        """Wait for the console with its server, return what its lock file says (pid, url)."""
        self.wait_for(lambda s: "http://127.0.0.1:" in s and "Palette" in s, "the console and its server",
                      timeout)
        deadline = time.monotonic() + timeout
        while True:  # the header may show the URL a moment before the lock file has it
            try:
                info: dict[str, Any] = json.loads((data / "aiops.lock").read_text() or "{}")
            except (OSError, ValueError):
                info = {}
            if info.get("url"):
                return info
            if time.monotonic() > deadline:
                raise AssertionError(f"the console's lock file names no server: {info}")
            time.sleep(0.05)  # polling a condition with a deadline

    @property
    def server_pid(self) -> int:
        return int(self("display", "-p", "#{pid}").strip())

    def stall(self) -> None:
        """Stop the tmux server: the pane's terminal reads nothing more until `resume`."""
        self._stopped_pid = self.server_pid
        os.kill(self._stopped_pid, signal.SIGSTOP)

    def resume(self) -> None:
        pid, self._stopped_pid = self._stopped_pid, None
        if pid is not None:
            os.kill(pid, signal.SIGCONT)

    def kill(self) -> None:
        try:
            pid: int | None = self._stopped_pid or self.server_pid
        except RuntimeError:  # no server on this socket
            pid = None
        self.resume()  # a stopped server cannot act on kill-server
        subprocess.run([self.exe, "-L", self.socket, "kill-server"], capture_output=True, timeout=20)
        # Until the old server is gone: a new session started on its socket while it is still
        # exiting fails with "server exited unexpectedly" (seen in CI after a restart in one test).
        deadline = time.monotonic() + 10
        while pid is not None and time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.02)


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    if shutil.which("tmux") is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("tmux is not installed; the console's terminal tests must run in CI "
                        "(apt-get install tmux)")
        pytest.skip("tmux is not installed (apt-get install tmux); the console's terminal tests need a "
                    "real terminal")
    t = Tmux()
    try:
        yield t
    finally:
        t.kill()
