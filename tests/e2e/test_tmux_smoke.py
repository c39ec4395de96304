"""`aiops` in a real terminal: start it under tmux, read the screen, type, quit cleanly.

tmux gives the console a real pty (termios, alternate screen, key sequences) that Pilot does not.
Without tmux the test is skipped, except under CI=true, where it fails: CI must not skip silently.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time

import httpx
import pytest

from aiops.engine.lock import DataDirLock
from tests.fakes.fixtures import make_config_dir, openai_model_entry
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.support.tmux import AIOPS

pytestmark = pytest.mark.tmux


def test_aiops_runs_in_a_real_terminal_and_quits_cleanly(tmux, tmp_path):
    with FakeOpenAI() as fake:
        config = make_config_dir(tmp_path, {"local": openai_model_entry(fake)}, "local")
        data = tmp_path / "data"
        env = {k: v for k, v in os.environ.items() if k not in ("AIOPS_OPERATOR_TOKEN", "TMUX", "TMUX_PANE")}
        env.update(TERM="xterm-256color", COLORTERM="truecolor")
        command = (f"{AIOPS} --config-dir {config} --data-dir {data} console --port 0; "
                   f"echo AIOPS-EXIT:$?; sleep 60")
        subprocess.run([tmux.exe, "-L", tmux.socket, "new-session", "-d", "-s", "aiops", "-x", "100",
                        "-y", "30", "sh", "-c", command], check=True, env=env, timeout=20)

        # The key bar is drawn last: on a slow machine a capture can come before it.
        screen = tmux.wait_for(lambda s: "http://127.0.0.1:" in s and "console (1)" in s and "Palette" in s,
                               "the console with its server address and key bar")
        assert "Sessions" in screen and "Chat" in screen and "Gates" in screen
        assert "Traceback" not in screen
        # The key bar: whole labels, the palette key once, at the right edge.
        footer = [line for line in screen.splitlines() if line.strip()][-1]
        assert footer.split()[:2] == ["⏎", "Send"] and footer.rstrip().endswith("▏^p Palette"), footer
        assert footer.count("Palette") == 1, footer

        tmux("send-keys", "-t", "aiops", "-l", "hello from tmux")
        tmux("send-keys", "-t", "aiops", "Enter")
        screen = tmux.wait_for(lambda s: "echo: hello from tmux" in s, "the echo answer")
        assert fake.last_request.json["messages"][-1]["content"] == "hello from tmux"

        tmux("send-keys", "-t", "aiops", "C-q")
        screen = tmux.wait_for(lambda s: "AIOPS-EXIT:" in s, "aiops to exit")
        assert "AIOPS-EXIT:0" in screen, screen
        # Nothing was printed over the terminal: the log went to the file in the data dir.
        lines = [line for line in screen.splitlines() if line.strip()]
        assert lines == ["AIOPS-EXIT:0"], screen
    log = (data / "aiops.log").read_text()
    assert "console closed" in log
    lock = DataDirLock(data / "aiops.lock")
    lock.acquire()  # released on exit
    lock.release()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_quits_the_console_as_ctrl_q_does(tmux, tmp_path, sig):
    """`kill`, a service manager stopping it, a closed terminal or a dropped SSH session: the
    terminal is restored, a client's stream gets its turn's end, and nothing is left for the next
    start to find interrupted."""
    with FakeOpenAI() as fake:
        fake.script(Reply.hang())
        config = make_config_dir(tmp_path, {"local": openai_model_entry(fake)}, "local")
        data = tmp_path / "data"
        env = {k: v for k, v in os.environ.items() if k not in ("AIOPS_OPERATOR_TOKEN", "TMUX", "TMUX_PANE")}
        env.update(TERM="xterm-256color")
        command = (f"{AIOPS} --config-dir {config} --data-dir {data} console --port 0; "
                   f"echo AIOPS-EXIT:$?; sleep 60")
        subprocess.run([tmux.exe, "-L", tmux.socket, "new-session", "-d", "-s", "aiops", "-x", "100",
                        "-y", "30", "sh", "-c", command], check=True, env=env, timeout=20)
        tmux.wait_for(lambda s: "http://127.0.0.1:" in s and "Palette" in s, "the console and its server")
        info = json.loads((data / "aiops.lock").read_text())
        url = info["url"]
        with httpx.stream("GET", f"{url}/api/v1/stream/api-sig", timeout=30) as stream:
            r = httpx.post(f"{url}/api/v1/submit", json={"text": "this hangs", "client_id": "api-sig"})
            assert r.status_code == 202
            fake.wait_for_requests(1, timeout=10)
            os.kill(info["pid"], sig)
            body = "".join(stream.iter_text())  # ends when the server ends it: no exception
        # The same signal again as the console closes (a service manager repeating itself): the
        # exit stays clean.
        for _ in range(20):
            time.sleep(0.01)
            with contextlib.suppress(ProcessLookupError):
                os.kill(info["pid"], sig)
        assert "event: done" in body and '"status": "cancelled"' in body
        screen = tmux.wait_for(lambda s: "AIOPS-EXIT:" in s, "aiops to exit")
        lines = [line for line in screen.splitlines() if line.strip()]
        assert lines == ["AIOPS-EXIT:0"], screen  # back on the normal screen, nothing printed over it
        assert tmux("display", "-p", "-t", "aiops", "#{alternate_on}").strip() == "0"
    log = (data / "aiops.log").read_text()
    assert f"{sig.name} received: quitting" in log and "console closed" in log
    assert "did not stop cleanly" not in log


def test_the_console_exits_soon_though_a_tool_blocks_a_thread(tmux, tmp_path):
    """Ctrl+Q while a tool sits in a blocked thread (which ignores its cancellation for 300 s): the
    process is gone within 5 s all the same. The turn's cleanup grace (5 s) does not fit in that, so
    the exit watchdog ends the process, says so in the log, and the data dir is free at once."""
    from tests.support.plugins import THREAD_PLUGIN, installed_plugin

    with FakeOpenAI() as fake:
        env = {k: v for k, v in os.environ.items() if k not in ("AIOPS_OPERATOR_TOKEN", "TMUX", "TMUX_PANE")}
        config, env = installed_plugin(tmp_path, fake, env, "blocking", "BlockingPlugin", THREAD_PLUGIN)
        marker = tmp_path / "marker"
        fake.script(Reply.tool_calls(("blocking_tool", {"marker": str(marker)})))
        data = tmp_path / "data"
        tmux.start_aiops(config, data, env=env)
        info = tmux.wait_for_console(data)
        r = httpx.post(f"{info['url']}/api/v1/submit", json={"text": "run it", "client_id": "api-blocked"})
        assert r.status_code == 202
        deadline = time.monotonic() + 20
        while not marker.exists():  # the tool has started (its thread now sleeps for 300 s)
            assert time.monotonic() < deadline, "the tool never started"
            time.sleep(0.05)
        tmux("send-keys", "-t", "aiops", "C-q")
        started = time.monotonic()
        while pid_alive(info["pid"]):
            assert time.monotonic() - started < 5.0, "aiops still runs 5 s after ctrl+q"
            time.sleep(0.02)
        screen = tmux.wait_for(lambda s: "AIOPS-EXIT:" in s, "aiops to exit")
        assert "AIOPS-EXIT:1" in screen, screen  # not a clean exit: the status says so
    log = (data / "aiops.log").read_text()
    assert "did not exit within 4.5 s of the quit; the watchdog ends it now" in log, log
    lock = DataDirLock(data / "aiops.lock")
    lock.acquire()
    assert lock.died_since is not None  # the next start records what the forced exit left open
    lock.release()


def pid_alive(pid: int) -> bool:
    """Whether `pid` still runs (gone once its parent, the pane's shell, has reaped it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
