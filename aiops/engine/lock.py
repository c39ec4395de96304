"""One aiops per data dir: an exclusive lock file holding the owner's pid and server URL.

The lock is an advisory `fcntl.flock` on `<data dir>/aiops.lock`. The kernel drops it when the
process exits, however it exits, so a crash never leaves a stale lock behind; the file's content
(JSON: pid, url, started_at) only tells a second process who holds it and where to reach it.
A clean release empties the file: content found by the next holder means the last one died
without stopping (SIGKILL, a crash), and since when it had run (`died_since`). The new holder
keeps that time in the file until it has recorded what was left open (`recovered`), so a holder
that dies, or stops, before that passes it on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from aiops.engine import runfile
from aiops.paths import DataDirUnusable

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks, no protection
    fcntl = None  # type: ignore[assignment]


log = logging.getLogger(__name__)

# Data dirs this process holds: only their holder may rotate aiops.log (see aiops.logs).
_held: set[Path] = set()


def held_here(data_dir: Path) -> bool:
    """Whether this process holds the lock of `data_dir` (asked per log record: a resolved path
    is looked up without touching the file system)."""
    path = Path(data_dir)
    return path in _held or path.resolve() in _held


class AlreadyRunning(Exception):
    """Another process holds the data dir. Its message says who (pid, since when, its server),
    whether it still answers, and what to do: attach to it, resume it, or end it."""

    def __init__(self, path: Path, info: dict[str, Any]) -> None:
        super().__init__(path, info)
        self.path = path
        self.info = info
        self._text: str | None = None

    def __str__(self) -> str:
        if self._text is None:  # (probes the holder once: see holder_report)
            self._text = holder_report(self.path, self.info)
        return self._text


PROBE_TIMEOUT = 1.0  # seconds a holder's server has to answer /api/v1/health


def holder_report(path: Path, info: dict[str, Any], *, probe_timeout: float = PROBE_TIMEOUT) -> str:
    """What a second aiops tells the operator about the holder of `path`: a holder that is alive
    but stuck (its terminal gone, its loop blocked, suspended) keeps the lock until it is ended,
    so the message says how, beside how to use it while it still serves."""
    pid = info.get("pid")
    url = info.get("url")
    where = f" (pid {pid}" + (f", server {url}" if url else ", no server") + ")" if pid else ""
    lines = [f"aiops is already running on the data dir {path.parent}{where}"
             + (f", since {_since(info.get('started_at'))}" if info.get("started_at") else "") + "."]
    state = _process_state(pid) if isinstance(pid, int) else None
    if state in ("T", "t"):
        lines.append(f"It is suspended (ctrl+z, or SIGSTOP): `kill -CONT {pid}` resumes it; `kill {pid}` "
                     f"then ends it.")
    elif url and _answers(url, probe_timeout):
        lines.append(f"It serves at {url}: attach a console to it with `aiops attach {url}` (what `aiops` "
                     f"does on a terminal), watch a session with `aiops watch SESSION --url {url}`, or "
                     f"end it (ctrl+q in its terminal, or `kill {pid}`).")
    elif url:
        lines.append(f"Its server at {url} does not answer (within {probe_timeout:g} s): it may be stuck. "
                     f"End it with `kill {pid}`, or `kill -9 {pid}` if it is still there seconds later; "
                     f"the next start records what it left open.")
    elif pid:
        lines.append(f"It has no server (`aiops chat`, or the console with --no-server): end it in its "
                     f"terminal, or with `kill {pid}`.")
    lines.append("Quit it first, or use another --data-dir.")
    return "\n".join(lines)


def _since(started_at: Any) -> str:
    if not isinstance(started_at, int | float):
        return "?"
    ago = max(0, int(time.time() - started_at))
    span = (f"{ago // 86400} d {ago % 86400 // 3600} h" if ago >= 86400 else
            f"{ago // 3600} h {ago % 3600 // 60} min" if ago >= 3600 else
            f"{ago // 60} min" if ago >= 60 else f"{ago} s")
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started_at))} ({span} ago)"


def _process_state(pid: int) -> str | None:
    """The kernel's one-letter state of `pid` (R, S, D, T stopped, Z…), where /proc tells it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _answers(url: str, timeout: float) -> bool:
    """Whether anything answers HTTP at `url` (an error status, a refused token, is an answer)."""
    import urllib.error
    import urllib.request

    # No proxy: the holder is on this machine, and an http_proxy in the environment would answer
    # for it (or not) instead.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url.rstrip("/") + "/api/v1/health", timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False


class DataDirLock:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self.info: dict[str, Any] = {}
        self.died_since: float | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, url: str | None = None) -> None:
        """Take the lock or raise AlreadyRunning with what the holder wrote."""
        if self._fd is not None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise DataDirUnusable(self.path.parent, e) from None
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                info = _read_info(fd)
                os.close(fd)
                raise AlreadyRunning(self.path, info) from None
        self._fd = fd
        left = _read_info(fd)
        since = left.get("recover_since") or left.get("started_at")
        # Without flock a live holder's file would read as a dead one's: no guess is made then.
        self.died_since = float(since) if isinstance(since, int | float) and fcntl is not None else None
        self.info = {"pid": os.getpid(), "url": url, "started_at": time.time()}
        # A run file left by a holder that died is stale from the moment this one holds the lock.
        with contextlib.suppress(OSError):
            runfile.run_path(self.path.parent).unlink(missing_ok=True)
        if url:
            self._write_run_file(url)
        if self.died_since is not None:
            self.info["recover_since"] = self.died_since
        self._write()
        _held.add(self.path.parent.resolve())

    def update(self, **info: Any) -> None:
        """Record more about the holder (the server URL once it listens)."""
        if self._fd is None:
            return
        self.info.update(info)
        self._write()
        if info.get("url"):
            self._write_run_file(str(info["url"]))

    def _write_run_file(self, url: str) -> None:
        """Where this holder serves, for `aiops`, `aiops chat` and `aiops attach` to find it."""
        try:
            runfile.write(self.path.parent, url)
        except OSError as e:  # a read-only data dir: the lock still protects it
            log.warning("cannot write the run file in %s: %s", self.path.parent, e)

    def recovered(self) -> None:
        """What the last holder left open is recorded: a later holder need not look again."""
        if self.info.pop("recover_since", None) is not None and self._fd is not None:
            self._write()

    def left_open(self) -> tuple[float, float] | None:
        """(since, until): the time span whose unfinished work a dead holder left, or None."""
        if self.died_since is None:
            return None
        return self.died_since, float(self.info["started_at"])

    def _write(self) -> None:
        assert self._fd is not None
        data = json.dumps(self.info).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)
        os.fsync(self._fd)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        _held.discard(self.path.parent.resolve())
        with contextlib.suppress(OSError):
            runfile.remove(self.path.parent)
        # A holder that never got to record what a dead one left open (a start refused or
        # interrupted before that) leaves the file as it is: it still says since when to look.
        if "recover_since" not in self.info:
            try:
                os.ftruncate(fd, 0)
            except OSError:
                pass
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def __enter__(self) -> DataDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_info(fd: int) -> dict[str, Any]:
    try:
        raw = os.pread(fd, 4096, 0)
        info = json.loads(raw.decode() or "{}")
        return info if isinstance(info, dict) else {}
    except (OSError, ValueError):
        return {}


def read_holder(path: Path) -> dict[str, Any]:
    """What the current holder wrote (empty when nobody holds it or it wrote nothing)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return {}
    try:
        return _read_info(fd)
    finally:
        os.close(fd)


def holder(path: Path) -> dict[str, Any] | None:
    """Who holds the lock, probed without taking it: what the holder wrote (possibly empty), or
    None when nobody does (the file outlives its holder; the kernel's lock does not)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        if fcntl is None:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return _read_info(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def running(data_dir: Path, lock_path: Path | None = None) -> dict[str, Any] | None:
    """The live aiops serving this data dir (the run file's content), or None: no run file, or a
    stale one (nobody holds the lock, or the holder is another process than the file names)."""
    info = runfile.read(data_dir)
    if info is None or not isinstance(info.get("url"), str):
        return None
    held = holder(lock_path or Path(data_dir) / "aiops.lock")
    if held is None or (held.get("pid") is not None and held.get("pid") != info.get("pid")):
        return None
    return info


def holder_url(data_dir: Path, lock_path: Path | None = None) -> str | None:
    info = running(data_dir, lock_path)
    return str(info["url"]) if info else None
