"""aiops.log: where everything aiops logs goes (never the terminal a console draws on)."""

from __future__ import annotations

import logging
from logging.handlers import RotatingFileHandler
from pathlib import Path

from aiops.engine.lock import held_here

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


def log_file_handler(path: Path | str) -> logging.Handler:
    """aiops.log, rotated: a server that runs for months (or a flood of failures) must not fill
    the disk."""
    handler = DataDirLogHandler(path)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    return handler
