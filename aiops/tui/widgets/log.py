"""The log viewer: Python logging shown in a pane instead of the terminal the console draws on."""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

from rich.text import Text
from textual.message import Message
from textual.widgets import RichLog

from aiops.tui.keys import bindings_for

MAX_LINES = 2000
_LEVEL_STYLE = {"DEBUG": "dim", "INFO": "", "WARNING": "yellow", "ERROR": "bold red", "CRITICAL": "bold red"}


class LogLine(Message):
    def __init__(self, level: str, name: str, text: str, created: float) -> None:
        super().__init__()
        self.level = level
        self.name = name
        self.text = text
        self.created = created


def _line(record: logging.LogRecord) -> LogLine:
    text = record.getMessage()
    if record.exc_info:
        text += "\n" + logging.Formatter().formatException(record.exc_info)
    return LogLine(record.levelname, record.name, text, record.created)


class ConsoleLogHandler(logging.Handler):
    """Posts records to the log pane; safe from any thread (Textual's post_message is)."""

    def __init__(self, view: LogView, level: int = logging.INFO) -> None:
        super().__init__(level)
        self.view = view

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.view.post_message(_line(record))
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)


class EarlyRecords(logging.Handler):
    """Keeps what is logged before the log pane is mounted: start-up (the engine, the server, a
    token variable that is unset) runs alongside the first paint, and its warnings were lost."""

    def __init__(self) -> None:
        super().__init__(logging.getLogger().getEffectiveLevel() or logging.INFO)
        self.records: deque[logging.LogRecord] = deque(maxlen=MAX_LINES)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def install(self) -> None:
        logging.getLogger().addHandler(self)

    def take(self) -> list[logging.LogRecord]:
        """Stop collecting; what was collected, oldest first."""
        logging.getLogger().removeHandler(self)
        return list(self.records)


class LogView(RichLog):
    PANE = "log"
    BINDINGS = bindings_for("log")
    HELP = f"""\
## Log

What aiops logs while the console runs (level INFO and up; `-v` for DEBUG). Nothing is ever written
to the terminal the console draws on: everything also goes to `aiops.log` in the data directory,
which keeps what this view drops after {MAX_LINES} lines. **c** clears the view.
"""

    def __init__(self, **kw: Any) -> None:
        super().__init__(max_lines=MAX_LINES, min_width=20, wrap=True, markup=False, highlight=False, **kw)

    def on_mount(self) -> None:
        # What start-up logged before this pane existed first, then everything as it comes; no
        # await in between, so nothing logged on the loop falls between the two.
        early: EarlyRecords | None = getattr(self.app, "early_records", None)
        if early is not None:
            for record in early.take():
                self.on_log_line(_line(record))
        self._handler = ConsoleLogHandler(self, logging.getLogger().getEffectiveLevel() or logging.INFO)
        logging.getLogger().addHandler(self._handler)

    def on_unmount(self) -> None:
        logging.getLogger().removeHandler(self._handler)

    def on_log_line(self, msg: LogLine) -> None:
        stamp = time.strftime("%H:%M:%S", time.localtime(msg.created))
        self.write(Text.assemble((f"{stamp} ", "dim"), (f"{msg.level:<7} ", _LEVEL_STYLE.get(msg.level, "")),
                                 (f"{msg.name}: ", "dim"), msg.text))

    def action_clear(self) -> None:
        self.clear()
