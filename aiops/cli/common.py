"""What every `aiops` sub-command shares: its error, loading the configuration, the log file."""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path
from typing import Any


class CliError(Exception):
    """Printed as one line on stderr; exit status 2."""


def load(args: argparse.Namespace) -> Any:
    from aiops.config import load_config, resolve_paths

    paths = resolve_paths(args.config_dir, args.data_dir)
    return load_config(paths)


def setup_file_logging(cfg: Any, verbose: bool) -> None:
    """Logs go to a file in the data dir, never to the terminal a console draws on."""
    from aiops.logs import log_file_handler
    from aiops.paths import DataDirUnusable

    # The first thing a command that runs the engine writes to the data dir: where a dir that is a
    # file, read-only or full is found, and said in one line (exit 2) rather than a traceback.
    try:
        cfg.paths.data_dir.mkdir(parents=True, exist_ok=True)
        handler = log_file_handler(cfg.paths.log_path)
    except OSError as e:
        raise DataDirUnusable(cfg.paths.data_dir, e) from None
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    for noisy in ("httpx", "httpcore", "openai", "google_genai", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def check_data_dir(path: Path) -> None:
    """For a command that only reads the data dir: a dir not made yet is fine (nothing stored), a
    path that is not a directory is not (`--data-dir` naming a file would read as an empty dir)."""
    import errno
    import os
    import stat

    from aiops.paths import DataDirUnusable

    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return
    except OSError as e:  # a file in the path's middle (ENOTDIR), no permission
        raise DataDirUnusable(path, e) from None
    if not stat.S_ISDIR(mode):
        raise DataDirUnusable(path, NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR)))


def parse_since(text: str) -> float:
    from datetime import datetime

    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    digits = text[:-1].replace(".", "", 1)
    if text and text[-1] in units and digits.isascii() and digits.isdigit():  # not "³m": float() refuses it
        return time.time() - float(text[:-1]) * units[text[-1]]
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise CliError(f"--since {text!r}: expected an ISO time (2026-01-31T12:00) or an age (10m, 2h, 1d)") from None
    return dt.timestamp()
