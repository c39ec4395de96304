"""A terminal that stops reading (an SSH link that stalls, a laptop asleep, a stopped tmux server)
must cost the console a few stale frames, never the service: the engine and the server share the
console's event loop, and before aiops/tui/driver.py the console's output blocked that loop once
the terminal's buffer was full, and blocked the exit too.

The terminal here is a tmux pane whose tmux server is stopped with SIGSTOP (`Tmux.stall`): the
pane's pty is no longer read, exactly as the issue reproduced it. Each test first chats through
the proxy until aiops's log says the terminal is not taking its output, so the stall is real.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from aiops.engine.lock import DataDirLock
from tests.e2e.test_tmux_smoke import pid_alive
from tests.fakes.fixtures import make_config_dir, openai_model_entry
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.support.tmux import AIOPS

BEHIND = "the terminal is not taking the console's output"
HEALTH_BOUND_MS = 100.0


class HealthProbe(threading.Thread):
    """Asks /api/v1/health every 50 ms and keeps how long each answer took."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stopped = threading.Event()
        self.latencies_ms: list[tuple[float, float]] = []  # (when it was asked, ms it took)
        self.failures: list[str] = []

    def run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self.stopped.is_set():
                t0 = time.perf_counter()
                try:
                    r = client.get(f"{self.url}/api/v1/health")
                    r.raise_for_status()
                except httpx.HTTPError as e:
                    self.failures.append(repr(e))
                else:
                    self.latencies_ms.append((t0, (time.perf_counter() - t0) * 1000))
                self.stopped.wait(0.05)

    def stop(self) -> None:
        self.stopped.set()
        self.join(10)


class Chats:
    """Proxy clients (the openai SDK on /v1, streaming), each checking its answer."""

    def __init__(self, url: str) -> None:
        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=10)
        self.answered = 0
        self.behind_at = 0.0
        self.failures: list[str] = []
        self._lock = threading.Lock()

    def chat(self, text: str) -> None:
        try:
            stream = self.client.chat.completions.create(
                model="aiops", stream=True, messages=[{"role": "user", "content": text}])
            answer = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        except openai.OpenAIError as e:
            with self._lock:
                self.failures.append(f"{text}: {e!r}")
            return
        with self._lock:
            if answer == f"echo: {text}":
                self.answered += 1
            else:
                self.failures.append(f"{text}: answered {answer!r}")

    def until_behind(self, log: Path, clients: int = 3, after: int = 10, most: int = 2000,
                     stalled_seconds: float = 1.5) -> int:
        """`clients` chat in parallel until aiops's log says the terminal fell behind, then `after`
        more chats each and for at least `stalled_seconds` (on a fast machine ten chats take less
        time than enough health probes to judge by); returns how many chats were sent.
        `self.behind_at`: when (perf_counter) the log said so."""
        sent = 0
        lock = threading.Lock()
        behind_at: list[int] = []

        def worker(n: int) -> None:
            nonlocal sent
            while True:
                with lock:
                    if (behind_at and sent >= behind_at[0] + after * clients
                            and time.perf_counter() - self.behind_at >= stalled_seconds) or sent >= most:
                        return
                    sent += 1
                    i = sent
                self.chat(f"chat {i} from client {n}")
                if not behind_at and log.exists() and BEHIND in log.read_text():
                    with lock:
                        if not behind_at:
                            behind_at.append(sent)
                            self.behind_at = time.perf_counter()

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert behind_at, f"the terminal never fell behind in {sent} chats; the log:\n{log.read_text()}"
        return sent


def echo_model(tmp_path: Path, fake: FakeOpenAI) -> Path:
    # Several chunks per answer: each one is an event the console draws (for the sessions list).
    fake.responder = lambda body: Reply.echo(chunks=8)
    return make_config_dir(tmp_path, {"local": openai_model_entry(fake)}, "local")


@pytest.mark.tmux
def test_a_stalled_terminal_costs_frames_not_service(tmux, tmp_path):
    with FakeOpenAI() as fake:
        config = echo_model(tmp_path, fake)
        data = tmp_path / "data"
        tmux.start_aiops(config, data, width=200, height=60)
        info = tmux.wait_for_console(data)
        url = info["url"]
        chats = Chats(url)
        probe = HealthProbe(url)
        probe.start()
        tmux.stall()
        try:
            sent = chats.until_behind(data / "aiops.log")
            chats.chat("the last words while stalled")
            sent += 1
        finally:
            probe.stop()
        # Every request was answered, with its own answer, while the terminal read nothing.
        assert chats.failures == [] and chats.answered == sent
        assert probe.failures == []
        # From the moment the console knows its terminal is behind (a quarter of a second into the
        # stall; before that it draws as usual, which costs what drawing costs on this machine)
        # the server answers promptly all along.
        stalled = [ms for t, ms in probe.latencies_ms if t >= chats.behind_at]
        assert len(stalled) >= 10 and max(stalled) < HEALTH_BOUND_MS, (
            f"health took up to {max(stalled):.0f} ms; in order: {[round(x) for x in stalled]}")

        # The terminal reads again: the console catches up with one repaint, and shows what the
        # app shows now (the newest session on top of the list), not a backlog of old frames.
        tmux.resume()
        screen = tmux.wait_for(lambda s: f"proxy ({sent})" in s and "· the last words" in s and "Palette" in s,
                               "the screen to show every chat, the last one on top")
        log = (data / "aiops.log").read_text()
        assert "the terminal takes output again" in log and "repainting the screen" in log
        # Converged: a redraw from scratch (a resize forces one) shows the same state: every chat,
        # the last one on top. (Not byte for byte: sessions touched in the same second may trade
        # places in a list rebuilt from scratch, as they would in any console.)
        tmux("resize-window", "-t", "aiops", "-x", "150")
        tmux.wait_for(lambda s: s != screen, "the narrower screen")
        tmux("resize-window", "-t", "aiops", "-x", "200")
        redrawn = tmux.wait_for(lambda s: f"proxy ({sent})" in s and "· the last words" in s and "Palette" in s,
                                "the screen redrawn at its size to show the same state")
        assert redrawn.splitlines()[:2] == screen.splitlines()[:2]  # the header and the pane titles
        assert "Traceback" not in screen and "Traceback" not in redrawn


@pytest.mark.tmux
def test_sighup_with_a_stalled_terminal_exits_in_time_and_frees_the_data_dir(tmux, tmp_path):
    """A dropped SSH session while the terminal had stalled, a gate pending and a client streaming:
    the turns end as a stop ends them, the streaming client gets its `done`, the process is gone
    within 5 s and the data dir is free; the next start shows the conversation."""
    with FakeOpenAI() as fake:
        config = echo_model(tmp_path, fake)
        fake.script(
            Reply.tool_calls(("update_system_prompt", {"section": "1", "operation": "append",
                                                       "content": "be terse"})),  # the console's turn
            Reply.hang(),  # the streaming client's turn
        )
        data = tmp_path / "data"
        tmux.start_aiops(config, data, width=200, height=60)
        info = tmux.wait_for_console(data)
        url, pid = info["url"], info["pid"]

        tmux("send-keys", "-t", "aiops", "-l", "please be terse from now on")
        tmux("send-keys", "-t", "aiops", "Enter")
        deadline = time.monotonic() + 20
        while not (gates := httpx.get(f"{url}/api/v1/gates").json()["gates"]):
            assert time.monotonic() < deadline, "the gate never opened"
            time.sleep(0.05)
        assert gates[0]["tool"] == "update_system_prompt"

        streamed: dict[str, Any] = {}

        def stream() -> None:
            with httpx.stream("GET", f"{url}/api/v1/stream/api-hup", timeout=30) as r:
                streamed["body"] = "".join(r.iter_text())

        reader = threading.Thread(target=stream)
        reader.start()
        r = httpx.post(f"{url}/api/v1/submit", json={"text": "this hangs", "client_id": "api-hup"})
        assert r.status_code == 202
        fake.wait_for_requests(2, timeout=10)

        tmux.stall()
        Chats(url).until_behind(data / "aiops.log", after=3)
        os.kill(pid, signal.SIGHUP)
        started = time.monotonic()
        while pid_alive(pid):
            assert time.monotonic() - started < 5.0, "aiops still runs 5 s after SIGHUP"
            time.sleep(0.02)
        reader.join(10)
        body = streamed.get("body", "")
        assert "event: done" in body and '"status": "cancelled"' in body, body[-500:]

        log = (data / "aiops.log").read_text()
        assert "SIGHUP received: quitting" in log and "console closed" in log
        assert "the watchdog ends it" not in log  # the clean path fitted in the time
        lock = DataDirLock(data / "aiops.lock")
        lock.acquire()  # free
        assert lock.died_since is None  # released cleanly: nothing left open for the next start
        lock.release()

        # The next start works on the same data dir, and shows the conversation and how its gate ended.
        tmux.kill()
        tmux.start_aiops(config, data, width=200, height=60)
        tmux.wait_for_console(data)
        screen = tmux.wait_for(lambda s: "please be terse from now on" in s, "the console's history")
        assert "Traceback" not in screen


def test_a_terminal_that_vanishes_ends_the_console_in_time(tmp_path):
    """The terminal is gone (its emulator closed, the pty's other end with it) and no SIGHUP came
    (aiops is not that terminal's controlling process): end of input is a hang-up too. The
    console quits as on SIGHUP, within 5 s, instead of spinning on a dead terminal."""
    import pty

    with FakeOpenAI() as fake:
        config = echo_model(tmp_path, fake)
        data = tmp_path / "data"
        master, slave = pty.openpty()
        os.set_blocking(master, False)
        env = {k: v for k, v in os.environ.items() if k not in ("AIOPS_OPERATOR_TOKEN", "TMUX", "TMUX_PANE")}
        env.update(TERM="xterm-256color", COLUMNS="120", LINES="40")
        proc = subprocess.Popen([str(AIOPS), "--config-dir", str(config), "--data-dir", str(data), "console",
                                 "--port", "0"], stdin=slave, stdout=slave, stderr=slave, env=env,
                                start_new_session=True)  # no controlling terminal: no SIGHUP will come
        os.close(slave)
        try:
            shown = b""
            deadline = time.monotonic() + 60

            def server_url() -> str | None:
                try:
                    return json.loads((data / "aiops.lock").read_text() or "{}").get("url")
                except (OSError, ValueError):  # not written yet, or being written
                    return None

            # Reading, as a terminal does, until the console is up and its server too (the console
            # draws and takes keys before its engine and server start).
            while b"Palette" not in shown or not server_url():
                assert proc.poll() is None and time.monotonic() < deadline, shown[-2000:]
                with contextlib.suppress(BlockingIOError):
                    shown += os.read(master, 65536)
                time.sleep(0.02)
            os.close(master)  # the terminal vanishes
            master = -1
            proc.wait(5)  # raises if it runs on
        finally:
            if master >= 0:
                os.close(master)
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    log = (data / "aiops.log").read_text()
    assert "the terminal went away (end of input): quitting" in log and "console closed" in log
    lock = DataDirLock(data / "aiops.lock")
    lock.acquire()
    assert lock.died_since is None  # a clean exit
    lock.release()
