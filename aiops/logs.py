"""aiops.log: where everything aiops logs goes (never the terminal a console draws on).

Every line is one record: text that came from a model or a client (an SQL statement, a tool's
error, a header) can hold newlines and terminal escapes, and written as is it could forge log
lines or rewrite the operator's terminal when the file is read. `SafeFormatter` escapes control
characters in the message, indents the lines of a traceback under the record they belong to, and
masks credentials in SQL (`IDENTIFIED BY '***'`).
"""

from __future__ import annotations

import logging
import re
from logging.handlers import RotatingFileHandler
from pathlib import Path

from aiops.engine.lock import held_here
from aiops.gates.redact import mask_sql_secrets

LOG_MAX_BYTES = 10 * 1024 * 1024  # aiops.log rotates at this size; aiops.log.1 .. .3 are kept
LOG_BACKUPS = 3
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class DataDirLogHandler(RotatingFileHandler):
    """aiops.log, rotated by the process that holds its data dir. Others write to it too (`aiops
    plugins` while a server runs, a second aiops told the dir is taken); were they to rotate it,
    the holder would go on writing to the renamed file and rotate again at once, losing a backup
    each time."""

    def __init__(self, path: Path | str) -> None:
        super().__init__(path, maxBytes=LOG_MAX_BYTES, backupCount=LOG_BACKUPS, encoding="utf-8")
        self.data_dir = Path(path).parent.resolve()

    def shouldRollover(self, record: logging.LogRecord) -> int:  # noqa: N802 - the stdlib's name
        return int(held_here(self.data_dir) and super().shouldRollover(record))


# C0 and C1 controls, DEL and the Unicode line separators.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_CONTINUATION = "    | "


def _escape_char(m: re.Match[str]) -> str:
    c = m.group()
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(c, f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def escape_log_text(text: str) -> str:
    """One line: every control character written as an escape (`\\n`, `\\x1b`)."""
    return _CONTROL.sub(_escape_char, text)


class SafeFormatter(logging.Formatter):
    """Log records that cannot forge other records nor carry secrets (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        record.message = escape_log_text(mask_sql_secrets(record.getMessage()))
        if self.usesTime():
            record.asctime = self.formatTime(record, self.datefmt)
        line = self.formatMessage(record)
        extra = []
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            extra.append(record.exc_text)
        if record.stack_info:
            extra.append(self.formatStack(record.stack_info))
        for block in extra:
            # A traceback's own lines stay lines, each marked as part of this record; what an
            # exception's message holds cannot start a line of its own.
            for part in mask_sql_secrets(block).splitlines():
                line += "\n" + _CONTINUATION + _CONTROL.sub(_escape_char, part.replace("\t", "    "))
        return line


def log_file_handler(path: Path | str) -> logging.Handler:
    """aiops.log, rotated: a server that runs for months (or a flood of failures) must not fill
    the disk."""
    handler = DataDirLogHandler(path)
    handler.setFormatter(SafeFormatter(LOG_FORMAT))
    return handler
