"""The run file: where the aiops holding a data dir serves, for other terminals to find it.

`<data dir>/aiops.run` (JSON: pid, url, address, port, started) is written by the holder of the
data-dir lock (`aiops serve`, the console) once its server listens, and removed when it exits. The
lock (engine/lock.py) is the truth about liveness: a run file found while nobody holds the lock, or
whose pid is not the holder's, is stale (a SIGKILL, a power cut) and is ignored, then replaced by the
next holder. Readers (`aiops`, `aiops chat`, `aiops attach`) use `lock.running()`, which asks the
lock too.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

RUN_FILE = "aiops.run"


def run_path(data_dir: Path) -> Path:
    return Path(data_dir) / RUN_FILE


def write(data_dir: Path, url: str, *, pid: int | None = None) -> dict[str, Any]:
    """Write (atomically: temp file + rename) the run file for a server at `url`."""
    parts = urlsplit(url)
    info: dict[str, Any] = {"pid": os.getpid() if pid is None else pid, "url": url,
                            "address": parts.hostname or "", "port": parts.port or 0,
                            "started": time.time()}
    path = run_path(data_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{RUN_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps(info))
    os.replace(tmp, path)
    return info


def remove(data_dir: Path, *, pid: int | None = None) -> None:
    """Remove the run file if it is this process's (`pid`): never another holder's."""
    path = run_path(data_dir)
    info = read(data_dir)
    if info is not None and info.get("pid") != (os.getpid() if pid is None else pid):
        return
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def read(data_dir: Path) -> dict[str, Any] | None:
    """The run file's content as written (stale or not), or None."""
    try:
        info = json.loads(run_path(data_dir).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None
