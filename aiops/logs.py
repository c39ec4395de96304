"""aiops.log: where everything aiops logs goes (never the terminal a console draws on)."""

from __future__ import annotations

import logging
from logging.handlers import RotatingFileHandler
from pathlib import Path

LOG_MAX_BYTES = 10 * 1024 * 1024  # aiops.log rotates at this size; aiops.log.1 .. .3 are kept
LOG_BACKUPS = 3
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_file_handler(path: Path | str) -> logging.Handler:
    """aiops.log, rotated: a server that runs for months (or a flood of failures) must not fill
    the disk."""
    handler = RotatingFileHandler(path, maxBytes=LOG_MAX_BYTES, backupCount=LOG_BACKUPS, encoding="utf-8")
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    return handler
