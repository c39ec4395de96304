"""The `aiops` command as a user runs it: chat turns in subprocesses, SIGKILL mid-turn, restart."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from aiops.engine.context import CANCELLED_RESULT, NO_REPLY_GIVEN
from tests.fakes.fixtures import make_config_dir, openai_model_entry
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.support.plugins import THREAD_PLUGIN, installed_plugin

AIOPS = [sys.executable, "-m", "aiops.cli"]


def run_aiops(args: list[str], cfg: Path, data: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AIOPS, "--config-dir", str(cfg), "--data-dir", str(data), *args],
                          capture_output=True, text=True, timeout=timeout, env=_env())


def _reap(proc: subprocess.Popen[bytes]) -> None:
    """Kill the process if it still runs, wait for it and close the pipes nobody reads."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("AIOPS_CONFIG_DIR", None)
    env.pop("AIOPS_DATA_DIR", None)
    return env


@pytest.fixture
def setup(tmp_path: Path, fake_openai: FakeOpenAI) -> tuple[Path, Path, FakeOpenAI]:
    cfg = make_config_dir(tmp_path, {"local": openai_model_entry(fake_openai)}, "local",
                          {"plugins.toml": "[mysql]\nenabled = false\n"})
    return cfg, tmp_path / "data", fake_openai


def test_chat_runs_a_turn_with_a_tool_call(setup):
    cfg, data, fake = setup
    fake.script(Reply.tool_calls(("read_system_prompt", {"section": "role"})),
                Reply.text("I am your ops assistant."))
    r = run_aiops(["chat", "who are you?"], cfg, data)
    assert r.returncode == 0, r.stderr
    assert "→ read_system_prompt" in r.stdout
    assert "← read_system_prompt:" in r.stdout
    assert r.stdout.rstrip().endswith("I am your ops assistant.")
    assert "[session 101" in r.stderr
    # the same session continues with --session and its shorthand id
    r2 = run_aiops(["chat", "and again?", "--session", "101"], cfg, data)
    assert r2.returncode == 0, r2.stderr
    assert "who are you?" in json.dumps(fake.requests[-1].json)


def test_chat_dash_sends_what_stdin_holds(setup):
    """`git log -1 | aiops chat -` sends the piped text, not a literal "-"."""
    cfg, data, fake = setup
    fake.script(Reply.text("a fine commit"))
    r = subprocess.run([*AIOPS, "--config-dir", str(cfg), "--data-dir", str(data), "chat", "-"],
                       input="review this commit:\nfix the frobnicator\n", capture_output=True, text=True,
                       timeout=60, env=_env())
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip().endswith("a fine commit")
    sent = fake.requests[-1].json["messages"][-1]["content"]
    assert "review this commit:\nfix the frobnicator" in sent
    empty = subprocess.run([*AIOPS, "--config-dir", str(cfg), "--data-dir", str(data), "chat", "-"],
                           input="  \n", capture_output=True, text=True, timeout=60, env=_env())
    assert empty.returncode == 2 and "stdin was empty" in empty.stderr


def test_chat_exit_status_is_1_when_a_command_cannot_do_what_it_was_asked_0_when_it_holds(setup):
    """The rule `aiops chat --help` states: 1 for what cannot be done (a page past the last, even
    when there is no page at all; a session or a command that does not exist), 0 when what was
    asked holds already (nothing to reset, nothing to stop)."""
    cfg, data, fake = setup
    page = run_aiops(["chat", "!session page 2"], cfg, data)  # no session at all yet
    assert page.returncode == 1 and "no page 2: there are no sessions" in page.stdout
    assert run_aiops(["chat", "!session"], cfg, data).returncode == 0
    fake.script(Reply.text("hello"))
    assert run_aiops(["chat", "hi"], cfg, data).returncode == 0
    page = run_aiops(["chat", "!session page 2"], cfg, data)
    assert page.returncode == 1 and "no page 2: 1 sessions make 1 page(s)" in page.stdout
    for failing in ("!session nosuch delete", "!nosuch", "!model nosuch"):
        assert run_aiops(["chat", failing], cfg, data).returncode == 1, failing
    for holding in ("!reset", "!stop"):  # on a new session: nothing to reset, nothing running
        r = run_aiops(["chat", holding], cfg, data)
        assert r.returncode == 0, (holding, r.stdout, r.stderr)
    assert "nothing to reset" in run_aiops(["chat", "!reset"], cfg, data).stdout
    reset = run_aiops(["chat", "!reset", "--session", "101"], cfg, data)  # one with history
    assert reset.returncode == 0 and "session reset" in reset.stdout
    assert "1  the turn ended in an error, or a !command could not do" in run_aiops(["chat", "--help"], cfg, data).stdout


def test_chat_with_a_failing_model_exits_non_zero_with_the_reason(setup):
    cfg, data, fake = setup
    fake.script(Reply.error(401, "invalid api key"))
    r = run_aiops(["chat", "hi"], cfg, data)
    assert r.returncode == 1
    assert "error: model 'local'" in r.stdout and "401" in r.stdout


def test_bad_config_names_file_and_key_without_traceback(tmp_path):
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "models.toml").write_text('default_model = "a"\n[models.a]\ntype = "openai"\nmodel_id = "x"\n'
                                     'timeout = "soon"\n')
    r = run_aiops(["config", "check"], cfg, tmp_path / "data")
    assert r.returncode == 2
    assert f"{cfg / 'models.toml'}: models.a.timeout:" in r.stderr
    assert "Traceback" not in r.stderr
    (cfg / "models.toml").write_text('default_model = "nope"\n[models.a]\ntype = "openai"\nmodel_id = "x"\n')
    r = run_aiops(["models"], cfg, tmp_path / "data")
    assert r.returncode == 2 and "default_model 'nope'" in r.stderr


def test_config_paths_and_env_override(tmp_path):
    env = _env() | {"AIOPS_CONFIG_DIR": str(tmp_path / "c"), "AIOPS_DATA_DIR": str(tmp_path / "d")}
    r = subprocess.run([*AIOPS, "config", "paths"], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 0
    assert f"config dir       {tmp_path / 'c'}" in r.stdout
    assert f"database       {tmp_path / 'd' / 'aiops.sqlite3'}" in r.stdout
    assert "models.toml" in r.stdout and "(default)" in r.stdout


def test_sigkill_mid_turn_loses_only_the_streaming_answer(setup):
    cfg, data, fake = setup
    fake.script(Reply.text("first answer, committed"))
    assert run_aiops(["chat", "first question"], cfg, data).returncode == 0
    # The second turn streams two chunks and then hangs: kill the process while it streams.
    fake.script(Reply.hang(after_chunks=2))
    proc = subprocess.Popen([*AIOPS, "--config-dir", str(cfg), "--data-dir", str(data), "chat",
                             "second question", "--session", "101"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    try:
        fake.wait_for_requests(2, timeout=30)
        deadline = time.monotonic() + 10
        # the hung request is in flight: the user message was committed before the model was called
        while time.monotonic() < deadline:
            conn = sqlite3.connect(data / "aiops.sqlite3")
            n = conn.execute("SELECT COUNT(*) FROM messages WHERE content='second question'").fetchone()[0]
            conn.close()
            if n:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        _reap(proc)
    assert proc.returncode == -signal.SIGKILL
    conn = sqlite3.connect(data / "aiops.sqlite3")
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    # After a restart every committed message is there.
    fake.script(Reply.text("third answer"))
    r = run_aiops(["chat", "!session", "--session", "101"], cfg, data)
    assert r.returncode == 0 and "101" in r.stdout
    r = run_aiops(["chat", "still there?", "--session", "101"], cfg, data)
    assert r.returncode == 0, r.stderr
    sent = [m["content"] for m in fake.requests[-1].json["messages"] if m["role"] in ("user", "assistant")]
    # The question the kill cut off is there, with a note that it got no reply (not taken for an
    # open question).
    assert sent == ["first question", "first answer, committed", "second question", NO_REPLY_GIVEN,
                    "still there?"]


# ---- SIGKILL at other points of a turn ----------------------------------------------------------

# A third-party plugin as a user installs one: a module and its dist-info (with the entry point) on
# PYTHONPATH. Its tool says it has started (it writes the file it is given) and never finishes.
SLOW_PLUGIN = """
import asyncio
from pathlib import Path

from pydantic import BaseModel

from aiops.engine.plugins import Plugin
from aiops.engine.tools import Tool


class Args(BaseModel):
    marker: str


class SlowPlugin(Plugin):
    name = "slowtool"

    async def setup(self, api):
        async def slow_tool(args, ctx):
            Path(args.marker).write_text("running")
            await asyncio.Event().wait()

        api.register_tool(Tool("slow_tool", "takes forever", Args, "test", slow_tool))
"""


@pytest.fixture
def killable(tmp_path: Path, fake_openai: FakeOpenAI) -> tuple[Path, Path, FakeOpenAI, dict[str, str]]:
    cfg, env = installed_plugin(tmp_path, fake_openai, _env(), "slowtool", "SlowPlugin", SLOW_PLUGIN)
    return cfg, tmp_path / "data", fake_openai, env


def _wait_until(what: str, predicate: Callable[[], bool], proc: subprocess.Popen[bytes],
                timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"aiops exited ({proc.returncode}) before {what}: "
                                 f"{proc.stderr.read().decode() if proc.stderr else ''}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _committed(db: Path) -> list[tuple[object, ...]]:
    """Every stored message, as the rows say (read by a second connection, as WAL allows)."""
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT id, session_id, turn_id, role, content, tool_calls, tool_call_id, status "
                            "FROM messages ORDER BY id").fetchall()
    finally:
        conn.close()


def _kill_mid_turn(cfg: Path, data: Path, env: dict[str, str], question: str,
                   ready: Callable[[subprocess.Popen[bytes]], None],
                   session: list[str] | None = None) -> list[tuple[object, ...]]:
    """Run `aiops chat question` (in a new session unless `session` says which), SIGKILL it once
    `ready` returns; the rows committed just before the kill, checked to be exactly the rows that
    survived it."""
    proc = subprocess.Popen([*AIOPS, "--config-dir", str(cfg), "--data-dir", str(data), "chat", question,
                             *(session or [])], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        ready(proc)
        before = _committed(data / "aiops.sqlite3")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        _reap(proc)
    assert proc.returncode == -signal.SIGKILL
    conn = sqlite3.connect(data / "aiops.sqlite3")
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    assert _committed(data / "aiops.sqlite3") == before
    return before


def _sent_after_restart(cfg: Path, data: Path, env: dict[str, str], fake: FakeOpenAI) -> list[tuple[str, str]]:
    """Restart, run one more turn in session 101: the conversation the model is sent."""
    fake.script(Reply.text("back after the crash"))
    r = subprocess.run([*AIOPS, "--config-dir", str(cfg), "--data-dir", str(data), "chat", "still there?",
                        "--session", "101"], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip().endswith("back after the crash")
    out = []
    for m in fake.requests[-1].json["messages"]:
        if m["role"] == "system":
            continue
        calls = [c["function"]["name"] for c in m.get("tool_calls") or []]
        out.append((m["role"], m["content"] or "", *calls))
    return out


def test_sigkill_during_a_tool_call_keeps_every_committed_message(killable, tmp_path: Path):
    cfg, data, fake, env = killable
    fake.script(Reply.text("first answer, committed"))
    first = subprocess.run([*AIOPS, "--config-dir", str(cfg), "--data-dir", str(data), "chat", "first question"],
                           capture_output=True, text=True, timeout=60, env=env)
    assert first.returncode == 0, first.stderr
    marker = tmp_path / "slow-tool-is-running"
    fake.script(Reply.tool_calls(("slow_tool", {"marker": str(marker)})))

    before = _kill_mid_turn(cfg, data, env, "second question",
                            lambda proc: _wait_until("the tool to start", marker.exists, proc),
                            session=["--session", "101"])
    # The call was committed before its tool ran, so it is there, with everything before it.
    assert [(r[3], r[4]) for r in before] == [
        ("user", "first question"), ("assistant", "first answer, committed"),
        ("user", "second question"), ("assistant", "")]
    assert "slow_tool" in str(before[-1][5])

    sent = _sent_after_restart(cfg, data, env, fake)
    assert sent == [
        ("user", "first question"), ("assistant", "first answer, committed"),
        ("user", "second question"), ("assistant", "", "slow_tool"),
        ("tool", CANCELLED_RESULT),  # the call never finished: the model is told so
        ("user", "still there?")]


def test_sigkill_between_a_tool_result_and_the_next_model_call(killable):
    cfg, data, fake, env = killable
    # The tool answers at once; the model call that would read its result never answers.
    fake.script(Reply.tool_calls(("read_system_prompt", {"section": "role"})), Reply.hang())

    def result_sent(proc: subprocess.Popen[bytes]) -> None:
        _wait_until("the follow-up model call", lambda: len(fake.requests) >= 2, proc)

    before = _kill_mid_turn(cfg, data, env, "who are you?", result_sent)
    result = before[-1]
    assert [(r[3], r[7]) for r in before] == [("user", "complete"), ("assistant", "complete"),
                                             ("tool", "complete")]
    # The request in flight when the process died already carried the committed result.
    in_flight = [m for m in fake.requests[1].json["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in in_flight] == [result[4]]

    sent = _sent_after_restart(cfg, data, env, fake)
    assert sent == [("user", "who are you?"), ("assistant", "", "read_system_prompt"),
                    ("tool", result[4]), ("user", "still there?")]


def test_a_second_aiops_on_the_same_data_dir_is_told_where_the_first_runs(setup):
    cfg, data, fake = setup
    fake.script(Reply.hang())
    first = subprocess.Popen([*AIOPS, "--config-dir", str(cfg), "--data-dir", str(data), "chat", "wait"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    try:
        fake.wait_for_requests(1, timeout=30)  # the first holds the data dir while its turn runs
        for args in (["chat", "hello"], ["serve", "--port", "0"]):
            r = run_aiops(args, cfg, data)
            assert r.returncode == 2, (args, r.stderr)
            assert f"aiops is already running on the data dir {data}" in r.stderr
            assert f"pid {first.pid}" in r.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(10)
        _reap(first)


# ---- a tool that will not stop ----------------------------------------------------------------------

def test_serve_exits_soon_after_a_sigterm_though_a_tool_blocks_a_thread(tmp_path: Path,
                                                                        fake_openai: FakeOpenAI) -> None:
    """It logged "stopped" at once, then sat until the thread woke (minutes; for good with a tool
    that swallows cancellation), ignoring further signals: a service manager ends up killing it."""
    from tests.support.server import start_serve

    cfg, env = installed_plugin(tmp_path, fake_openai, _env(), "blocking", "BlockingPlugin", THREAD_PLUGIN)
    marker = tmp_path / "marker"
    fake_openai.script(Reply.tool_calls(("blocking_tool", {"marker": str(marker)})))
    serve = start_serve(cfg, tmp_path / "data", env=env, fake=fake_openai)
    try:
        req = urllib.request.Request(serve.url + "/api/v1/submit", method="POST",
                                     data=json.dumps({"text": "run it", "client_id": "api-blocked"}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert json.loads(r.read())["status"] == "accepted"
        _wait_until("the tool runs", marker.exists, serve.proc)
        started = time.monotonic()
        serve.proc.send_signal(signal.SIGTERM)
        assert serve.proc.wait(60) == 0
    finally:
        _reap(serve.proc)
    assert time.monotonic() - started < 30  # the turn's 5 s grace, then the exit's 5 s
    assert "Traceback" not in serve.stderr
    assert "still running after the stop" in (tmp_path / "data" / "aiops.log").read_text()
    # What was stored is complete: the call is recorded as cut short, then the turn's end.
    rows = _committed(tmp_path / "data" / "aiops.sqlite3")
    assert [(r[3], r[7]) for r in rows] == [("user", "complete"), ("assistant", "complete"),
                                            ("tool", "cancelled"), ("notice", "complete")]
    assert str(rows[-1][4]).startswith("turn cancelled")


def test_serve_interrupted_while_a_plugin_starts_exits_though_the_plugin_blocks_a_thread(
        tmp_path: Path, fake_openai: FakeOpenAI) -> None:
    """Ctrl-C during start-up (no signal handlers yet: a KeyboardInterrupt) with a plugin's setup
    blocked in a thread: the exit must not wait for that thread either."""
    marker = tmp_path / "marker"
    cfg, env = installed_plugin(tmp_path, fake_openai, _env(), "slowstart", "SlowStart", (
        "import asyncio, time\nfrom pathlib import Path\nfrom aiops.engine.plugins import Plugin\n\n\n"
        "class SlowStart(Plugin):\n    name = 'slowstart'\n\n    async def setup(self, api):\n"
        f"        Path({str(marker)!r}).write_text('starting')\n"
        "        await asyncio.to_thread(time.sleep, 300)  # a synchronous client connecting\n"))
    proc = subprocess.Popen([*AIOPS, "--config-dir", str(cfg), "--data-dir", str(tmp_path / "data"), "serve",
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        _wait_until("the plugin starts", marker.exists, proc)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    finally:
        _reap(proc)
    assert time.monotonic() - started < 20
    assert "still running after the stop" in (tmp_path / "data" / "aiops.log").read_text()
