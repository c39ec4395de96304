"""`aiops` started twice on one data dir, each in a real terminal (tmux): the second attaches to the
first's engine instead of refusing (issue 22), and both draw the same sessions.

Without tmux the test is skipped, except under CI=true, where it fails (tests/support/tmux.py).
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.fakes.fixtures import make_config_dir, openai_model_entry
from tests.fakes.openai_server import FakeOpenAI
from tests.support.tmux import AIOPS

pytestmark = pytest.mark.tmux


def test_a_second_aiops_on_the_same_data_dir_attaches_to_the_first(tmux, tmp_path):
    with FakeOpenAI() as fake:
        config = make_config_dir(tmp_path, {"local": openai_model_entry(fake)}, "local")
        data = tmp_path / "data"
        tmux.start_aiops(config, data, width=140, height=32)
        first = tmux.wait_for_console(data)

        env = {k: v for k, v in os.environ.items() if k not in ("AIOPS_OPERATOR_TOKEN", "TMUX", "TMUX_PANE")}
        env.update(TERM="xterm-256color", COLORTERM="truecolor")
        command = f"{AIOPS} --config-dir {config} --data-dir {data}; echo SECOND-EXIT:$?; sleep 60"
        subprocess.run([tmux.exe, "-L", tmux.socket, "new-session", "-d", "-s", "second", "-x", "140", "-y", "32",
                        "sh", "-c", command], check=True, env=env, timeout=20)

        def second() -> str:
            return tmux("capture-pane", "-p", "-t", "second")

        def wait_second(check, what):
            import time

            deadline = time.monotonic() + 30
            while not check(text := second()):
                if time.monotonic() > deadline:
                    raise AssertionError(f"timed out waiting for {what}; the second terminal shows:\n{text}")
                time.sleep(0.1)  # polling a condition with a deadline
            return text

        screen = wait_second(lambda s: f"attached {first['url']} as loopback:" in s and "Palette" in s,
                             "the second console, attached")
        assert "already running" not in screen and "Traceback" not in screen

        tmux("send-keys", "-t", "second", "-l", "hello from the second")
        tmux("send-keys", "-t", "second", "Enter")
        wait_second(lambda s: "echo: hello from the second" in s, "the answer, in the second console")
        # The message went to the first aiops's engine: its console lists the session (a console session,
        # the operator's own, its title cut to the list's width).
        tmux.wait_for(lambda s: "console (2)" in s and "hello from the s" in s,
                      "the second's session in the first console")

        tmux("send-keys", "-t", "second", "C-q")
        screen = wait_second(lambda s: "SECOND-EXIT:" in s, "the second console to exit")
        assert "SECOND-EXIT:0" in screen, screen
        # Quitting the attached console leaves the engine running.
        assert "http://127.0.0.1:" in tmux.screen()
        tmux("send-keys", "-t", "aiops", "C-q")
        screen = tmux.wait_for(lambda s: "AIOPS-EXIT:" in s, "the first aiops to exit")
        assert "AIOPS-EXIT:0" in screen, screen
    assert not (data / "aiops.run").exists()
