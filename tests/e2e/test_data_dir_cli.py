"""A data dir that cannot be used, as the operator meets it: one line naming the path, exit status 2,
no traceback (QA: a read-only mount, `--data-dir` naming a file, a database that cannot be opened
each gave a traceback and exit 1), for every command that opens the data dir.

Root ignores file modes, so the unusable dirs are made of what fails for root too: a file where
the dir should be, a file in the middle of the path, a directory where aiops.log or the database
should be. A real read-only mount is tried in a user namespace (`unshare`), skipped where the
machine does not allow one.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from aiops.paths import resolve_paths
from tests.fakes.fixtures import make_config_dir

AIOPS = [sys.executable, "-m", "aiops.cli"]
COMMANDS = {"chat": ["chat", "hi"], "serve": ["serve", "--port", "0"], "console": ["console"],
            "plugins": ["plugins"], "audit": ["audit"]}


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("AIOPS_")}


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    # A model nobody calls: every case ends before a turn.
    return make_config_dir(tmp_path, {"m": {"type": "openai", "model_id": "x", "base_url": "http://127.0.0.1:9/v1"}},
                           "m", {"plugins.toml": "[mysql]\nenabled = false\n"})


def run(cfg: Path, data: Path, command: str, wrap: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = [*AIOPS, "--config-dir", str(cfg), "--data-dir", str(data), *COMMANDS[command]]
    return subprocess.run([*(wrap or []), *argv], capture_output=True, text=True, timeout=60, env=_env(),
                          stdin=subprocess.DEVNULL)


def assert_refused(r: subprocess.CompletedProcess[str], data: Path, reason: str, file: Path | None = None) -> None:
    expected = f"aiops: data dir {data} is not usable: {reason}" + (f" ({file})" if file else "")
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.splitlines() == [expected], r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_data_dir_that_is_a_file_is_refused_in_one_line(cfg, tmp_path, command):
    data = tmp_path / "a-file"
    data.write_text("not a dir")
    assert_refused(run(cfg, data, command), data, "Not a directory")


@pytest.mark.parametrize("command", ["chat", "serve", "audit"])
def test_a_data_dir_under_a_file_is_refused_in_one_line(cfg, tmp_path, command):
    (tmp_path / "a-file").write_text("not a dir")
    data = tmp_path / "a-file" / "sub"
    assert_refused(run(cfg, data, command), data, "Not a directory")


@pytest.mark.parametrize("command", ["chat", "serve", "console", "plugins"])
def test_a_log_file_that_cannot_be_opened_is_refused_in_one_line(cfg, tmp_path, command):
    """What a read-only data dir does to the first file written (aiops.log), as root can make it."""
    data = tmp_path / "data"
    log = resolve_paths(cfg, data).log_path
    log.mkdir(parents=True)
    assert_refused(run(cfg, data, command), data, "Is a directory", log)


@pytest.mark.parametrize("command", ["audit", "chat", "serve"])
def test_a_database_that_cannot_be_opened_is_refused_in_one_line(cfg, tmp_path, command):
    data = tmp_path / "data"
    db = resolve_paths(cfg, data).db_path
    db.mkdir(parents=True)
    assert_refused(run(cfg, data, command), data, "unable to open database file", db)


# ---- a real read-only mount -------------------------------------------------------------------------


def _namespaces() -> bool:
    """Whether this machine lets us mount in a user namespace of our own (the mount is private to
    it and ends with the process)."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "mount", "-t", "tmpfs", "-o", "ro", "tmpfs", tempfile.gettempdir()],
                           capture_output=True, timeout=10)
    return probe.returncode == 0


needs_namespaces = pytest.mark.skipif(not _namespaces(), reason="no user namespaces (unshare -rm) here")


def in_read_only(data: Path, *, populated: bool) -> list[str]:
    """A wrapper: run the command in a user namespace where `data` is mounted read-only (an empty
    tmpfs, or the populated dir bound onto itself)."""
    q = shlex.quote(str(data))
    mount = (f"mount --bind {q} {q} && mount -o remount,bind,ro {q}" if populated
             else f"mount -t tmpfs -o ro tmpfs {q}")
    return ["unshare", "-rm", "sh", "-c", f'{mount} && exec "$@"', "sh"]


@needs_namespaces
@pytest.mark.parametrize("command", ["chat", "serve"])
def test_an_empty_read_only_data_dir_is_refused_in_one_line(cfg, tmp_path, command):
    data = tmp_path / "ro"
    data.mkdir()
    r = run(cfg, data, command, wrap=in_read_only(data, populated=False))
    assert_refused(r, data, "Read-only file system", resolve_paths(cfg, data).log_path)


@needs_namespaces
@pytest.mark.parametrize("command", ["audit", "chat"])
def test_a_populated_data_dir_mounted_read_only_is_refused_in_one_line(cfg, tmp_path, command):
    data = tmp_path / "data"
    r = subprocess.run([*AIOPS, "--config-dir", str(cfg), "--data-dir", str(data), "chat", "!help"],
                       capture_output=True, text=True, timeout=60, env=_env(), stdin=subprocess.DEVNULL)
    assert r.returncode == 0 and resolve_paths(cfg, data).db_path.exists(), r.stderr
    r = run(cfg, data, command, wrap=in_read_only(data, populated=True))
    if command == "audit":  # the log file is not opened by a listing: the database is what fails
        assert_refused(r, data, "unable to open database file", resolve_paths(cfg, data).db_path)
    else:
        assert_refused(r, data, "Read-only file system", resolve_paths(cfg, data).log_path)
