"""One aiops per data dir: a second one is told who holds it and where, and exits with status 2."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from aiops.engine.lock import AlreadyRunning, DataDirLock, read_holder
from aiops.tui.app import run_console
from tests.tui.conftest import console_config

AIOPS = Path(sys.executable).parent / "aiops"


def test_a_second_lock_on_the_same_data_dir_says_who_holds_it(tmp_path):
    path = tmp_path / "data" / "aiops.lock"
    first = DataDirLock(path)
    first.acquire()
    first.update(url="http://127.0.0.1:8765")
    second = DataDirLock(path)
    with pytest.raises(AlreadyRunning) as e:
        second.acquire()
    message = str(e.value)
    assert f"pid {first.info['pid']}" in message and "http://127.0.0.1:8765" in message
    assert str(path.parent) in message
    assert read_holder(path)["url"] == "http://127.0.0.1:8765"
    first.release()
    second.acquire()  # free again once released
    second.release()
    assert read_holder(path) == {}


def test_the_next_holder_learns_whether_the_last_one_died_without_stopping(tmp_path):
    """The kernel drops a dead process's lock, but not what it wrote: a clean release empties the
    file, so what a new holder finds there says the last aiops was killed, and since when it ran."""
    path = tmp_path / "data" / "aiops.lock"
    with DataDirLock(path) as clean:
        assert clean.died_since is None
    with DataDirLock(path) as after_clean:
        assert after_clean.died_since is None
    def killed_while_holding() -> float:
        run = subprocess.run([sys.executable, "-c", (
            "import os, signal; from aiops.engine.lock import DataDirLock\n"
            f"lock = DataDirLock({str(path)!r}); lock.acquire(); print(lock.info['started_at'], flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)")], capture_output=True, text=True, timeout=30)
        assert run.returncode == -9
        return float(run.stdout)

    first_run = killed_while_holding()
    with DataDirLock(path) as after_kill:
        assert after_kill.died_since == first_run
        assert after_kill.left_open() == (first_run, after_kill.info["started_at"])
        after_kill.recovered()
    with DataDirLock(path) as next_one:
        assert next_one.died_since is None and next_one.left_open() is None

    # A holder that dies before it has recorded what was left open passes the older time on.
    first_run = killed_while_holding()
    killed_while_holding()
    with DataDirLock(path) as after_two:
        assert after_two.died_since == first_run
    # So does one that stops cleanly before that (a start refused: a bad bind, a Ctrl-C).
    with DataDirLock(path) as refused:
        assert refused.died_since == first_run
    with DataDirLock(path) as after_refused:
        assert after_refused.died_since == first_run
        after_refused.recovered()
    with DataDirLock(path) as recovered:
        assert recovered.died_since is None


def test_only_the_holder_of_the_data_dir_rotates_its_log(tmp_path):
    """`aiops plugins` while a server runs writes to the same aiops.log: had it rotated the file,
    the server would have gone on writing to the renamed one."""
    import logging

    from aiops.logs import log_file_handler

    data = tmp_path / "data"
    data.mkdir()
    handler = log_file_handler(data / "aiops.log")
    handler.maxBytes = 2000  # the size it rotates at (10 MB as shipped)
    record = logging.LogRecord("t", logging.INFO, __file__, 1, "x" * 500, None, None)
    try:
        for _ in range(10):
            handler.emit(record)
        assert not (data / "aiops.log.1").exists() and (data / "aiops.log").stat().st_size > 2000
        with DataDirLock(data / "aiops.lock"):
            handler.emit(record)
            assert (data / "aiops.log.1").exists() and (data / "aiops.log").stat().st_size < 2000
    finally:
        handler.close()


def test_run_console_refuses_a_held_data_dir(tmp_path, fake_openai, capsys):
    cfg = console_config(tmp_path, fake_openai)
    with DataDirLock(cfg.paths.lock_path) as held:
        held.update(url="http://127.0.0.1:9999")
        assert run_console(cfg, server=False) == 2
    err = capsys.readouterr().err
    assert "aiops is already running on the data dir" in err and "http://127.0.0.1:9999" in err


def test_a_second_aiops_process_exits_with_status_2(tmp_path, fake_openai):
    cfg = console_config(tmp_path, fake_openai)
    with DataDirLock(cfg.paths.lock_path) as held:
        held.update(url="http://127.0.0.1:4242")
        proc = subprocess.run([str(AIOPS), "--config-dir", str(cfg.paths.config_dir), "--data-dir",
                               str(cfg.paths.data_dir)], capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr
    assert f"pid {held.info['pid']}" in proc.stderr and "http://127.0.0.1:4242" in proc.stderr


def test_the_console_launch_form_with_a_port_reaches_the_console(tmp_path, fake_openai):
    # `aiops --config-dir X --data-dir Y --port N` is the console with its options given before
    # (implicitly) naming it; it gets as far as the data-dir lock, not an argparse error.
    cfg = console_config(tmp_path, fake_openai)
    with DataDirLock(cfg.paths.lock_path) as held:
        held.update(url="http://127.0.0.1:4343")
        proc = subprocess.run([str(AIOPS), "--config-dir", str(cfg.paths.config_dir), "--data-dir",
                               str(cfg.paths.data_dir), "--port", "18999"], capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr
    assert "invalid choice" not in proc.stderr
    assert "aiops is already running on the data dir" in proc.stderr and "http://127.0.0.1:4343" in proc.stderr


# ---- a holder that is alive: serving, suspended, or stuck ------------------------------------------------


def second_start(cfg) -> subprocess.CompletedProcess[str]:
    """What an operator sees starting `aiops` on a data dir another process holds."""
    return subprocess.run([str(AIOPS), "--config-dir", str(cfg.paths.config_dir), "--data-dir",
                           str(cfg.paths.data_dir)], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def test_a_holder_that_serves_is_offered_for_attach(tmp_path, fake_openai):
    from tests.support.server import start_serve

    cfg = console_config(tmp_path, fake_openai)
    serve = start_serve(cfg.paths.config_dir, cfg.paths.data_dir, fake=fake_openai)
    try:
        proc = second_start(cfg)
        assert proc.returncode == 2, proc.stderr
        err = proc.stderr
        assert f"pid {serve.proc.pid}, server {serve.url}), since 20" in err, err
        # Without a terminal (stdin and stdout are not one here) there is nothing to attach a console to:
        # the second start says where the first serves and how to attach.
        assert f"It serves at {serve.url}: attach a console to it with `aiops attach {serve.url}`" in err
        assert f"watch a session with `aiops watch SESSION --url {serve.url}`" in err
        assert f"`kill {serve.proc.pid}`" in err
        # Suspended (ctrl+z, SIGSTOP), it holds the lock and answers nothing: the operator is told
        # why, and how to resume or end it.
        os.kill(serve.proc.pid, signal.SIGSTOP)
        try:
            proc = second_start(cfg)
        finally:
            os.kill(serve.proc.pid, signal.SIGCONT)
        assert proc.returncode == 2
        assert f"It is suspended (ctrl+z, or SIGSTOP): `kill -CONT {serve.proc.pid}` resumes it" in proc.stderr
    finally:
        assert serve.stop() == 0


def test_a_holder_alive_but_stuck_is_reported_with_how_to_end_it(tmp_path, fake_openai):
    """A process that holds the lock and whose server accepts connections but never answers (a
    loop blocked for good): the second start says so, and how to end it."""
    cfg = console_config(tmp_path, fake_openai)
    stuck = subprocess.Popen([sys.executable, "-c", (
        "import socket, sys, time\n"
        "from aiops.engine.lock import DataDirLock\n"
        f"lock = DataDirLock({str(cfg.paths.lock_path)!r}); lock.acquire()\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(8)  # never accepted, never answered\n"
        "lock.update(url=f'http://127.0.0.1:{s.getsockname()[1]}')\n"
        "print('ready', flush=True); time.sleep(120)")], stdout=subprocess.PIPE, text=True)
    try:
        assert stuck.stdout is not None and stuck.stdout.readline().strip() == "ready"
        url = read_holder(cfg.paths.lock_path)["url"]
        proc = second_start(cfg)
        assert proc.returncode == 2, proc.stderr
        assert f"pid {stuck.pid}, server {url})" in proc.stderr
        assert f"Its server at {url} does not answer (within 1 s): it may be stuck. End it with " \
               f"`kill {stuck.pid}`, or `kill -9 {stuck.pid}`" in proc.stderr, proc.stderr
    finally:
        stuck.kill()
        stuck.wait(10)
