"""The terminal `aiops chat` runs in, shared by its two paths (in-process and through a running
aiops): gates asked about on it, and what is printed to it made safe."""

from __future__ import annotations

import asyncio
import sys
from typing import Literal


class TerminalAsker:
    """Asks the operator about gates on the terminal `aiops chat` runs in.

    One daemon thread reads stdin lines into a queue: a prompt whose gate resolves elsewhere (it
    timed out) can be abandoned without leaving a reader blocked, and the process can still exit.
    """

    def __init__(self) -> None:
        self._lines: asyncio.Queue[str] | None = None
        self._lock = asyncio.Lock()  # one prompt at a time (parallel calls may open several gates)

    def _start(self) -> asyncio.Queue[str]:
        if self._lines is None:
            import threading

            loop = asyncio.get_running_loop()
            lines: asyncio.Queue[str] = asyncio.Queue()

            def read() -> None:
                while True:
                    line = sys.stdin.readline()
                    try:
                        loop.call_soon_threadsafe(lines.put_nowait, line)
                    except RuntimeError:  # the loop has closed: aiops chat is exiting
                        return
                    if not line:  # EOF
                        return

            threading.Thread(target=read, name="aiops-chat-stdin", daemon=True).start()
            self._lines = lines
        return self._lines

    async def ask(self, tool: str) -> tuple[Literal["approved", "denied"], Literal["once", "session"]]:
        """(decision, scope) from the operator about a gate of `tool`; EOF or anything but y/s is a
        denial. (A tool name, not the gate: the remote path has the gate as JSON, not as GateInfo.)"""
        async with self._lock:
            lines = self._start()
            while not lines.empty():  # typed ahead, before this question was shown
                lines.get_nowait()
            print(f"approve {tool}? [y]es once, [s]ession, [N]o: ", end="", file=sys.stderr,
                  flush=True)
            answer = (await lines.get()).strip().lower()
        if answer in ("y", "yes"):
            return "approved", "once"
        if answer in ("s", "session"):
            return "approved", "session"
        return "denied", "once"


# C0 and C1 controls but tab and newline, and DEL: what the model, a tool or a database sends
# must not drive the operator's terminal (hide text, move the cursor, redraw a gate's question).
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0))}


def shown(text: str) -> str:
    """`text` as `aiops chat` prints it: control characters written out as `\\xNN`."""
    return text.translate(_CONTROLS)
