"""`aiops chat` beside a running aiops (issue 22): found through the data dir's run file (or --url),
the message goes through its API; a gate is asked on the terminal and shows in the consoles'
inboxes (`GET /api/v1/gates`) at once, and the first answer wins."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Any

import pytest

from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.support.server import ServeFactory, ServeProcess, Tokens
from tests.support.stderr import watch_stderr

AIOPS = [sys.executable, "-m", "aiops.cli"]
EDIT = ("update_system_prompt", {"section": "role", "operation": "append", "content": "Be brief."})


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("AIOPS_")}


def _cmd(serve: ServeProcess, *args: str) -> list[str]:
    return [*AIOPS, "chat", *args, "--config-dir", str(serve.config_dir), "--data-dir", str(serve.data_dir)]


def _get(serve: ServeProcess, path: str) -> Any:
    with urllib.request.urlopen(serve.url + path, timeout=10) as r:
        return json.loads(r.read())


def _approve(serve: ServeProcess, gate_id: str) -> None:
    req = urllib.request.Request(serve.url + f"/api/v1/gates/{gate_id}", method="POST",
                                 data=json.dumps({"decision": "approve"}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200


def _wait_gate(serve: ServeProcess, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        gates = _get(serve, "/api/v1/gates")["gates"]
        if gates:
            return gates[0]  # type: ignore[no-any-return]
        time.sleep(0.05)
    raise AssertionError("no gate reached the server's inbox")


def test_chat_on_a_data_dir_whose_aiops_runs_goes_through_it(aiops_serve: ServeProcess,
                                                             fake_openai: FakeOpenAI) -> None:
    fake_openai.script(Reply.text("hello from the server"))
    r = subprocess.run(_cmd(aiops_serve, "hi there"), capture_output=True, text=True, timeout=60, env=_env(),
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "hello from the server"
    assert aiops_serve.url in r.stderr  # says where it went
    sessions = _get(aiops_serve, "/api/v1/sessions")["sessions"]
    # A cli session, as an in-process `aiops chat` makes (issue 27: it said `api` before).
    assert [(s["title"], s["kind"]) for s in sessions if s["client_id"].startswith("chat-")] == [("hi there", "cli")]
    assert aiops_serve.proc.poll() is None  # and the server runs on


def test_a_gate_without_a_terminal_waits_for_a_console_to_answer(aiops_serve: ServeProcess,
                                                                 fake_openai: FakeOpenAI) -> None:
    fake_openai.script(Reply.tool_calls(EDIT), Reply.text("Changed it."))
    proc = subprocess.Popen(_cmd(aiops_serve, "make it brief"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=_env(), stdin=subprocess.DEVNULL)
    try:
        gate = _wait_gate(aiops_serve)
        assert gate["tool"] == "update_system_prompt"
        _approve(aiops_serve, gate["id"])
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err.decode()
    assert "waiting for an operator to answer gate" in out.decode()
    assert out.decode().rstrip().endswith("Changed it.")


def test_a_gate_asked_on_the_terminal_is_answered_first_in_a_console(aiops_serve: ServeProcess,
                                                                     fake_openai: FakeOpenAI) -> None:
    fake_openai.script(Reply.tool_calls(EDIT), Reply.text("Changed it."))
    master, slave = pty.openpty()
    proc = subprocess.Popen(_cmd(aiops_serve, "make it brief", "--url", aiops_serve.url), stdin=slave,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    os.close(slave)
    asked, err, reader = watch_stderr(proc, "approve update_system_prompt? [y]es once, [s]ession, [N]o:")
    try:
        assert asked.wait(30), "".join(err)
        gate = _wait_gate(aiops_serve)  # asked here, and in the consoles' inbox at the same time
        _approve(aiops_serve, gate["id"])  # a console answers first
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(master)
    reader.join(10)
    assert proc.returncode == 0, "".join(err)
    assert f"[gate {gate['id']}: approved by loopback:127.0.0.1]" in out.decode()
    assert out.decode().rstrip().endswith("Changed it.")


def test_the_remote_path_imports_no_model_sdk_and_no_engine(aiops_serve: ServeProcess,
                                                            fake_openai: FakeOpenAI) -> None:
    # Issue 27 wants `aiops chat` fast: beside a running aiops it needs the API client only.
    fake_openai.script(Reply.text("ok"))
    probe = ("import sys\n"
             "from aiops.cli import main\n"
             "rc = main(sys.argv[1:])\n"
             "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('openai', 'google', 'textual', 'sqlglot')\n"
             "               or m in ('aiops.engine.engine', 'aiops.engine.store'))\n"
             "print('HEAVY', heavy, 'RC', rc, file=sys.stderr)\n")
    r = subprocess.run([sys.executable, "-c", probe, *_cmd(aiops_serve, "hi")[3:]], capture_output=True, text=True,
                       timeout=60, env=_env(), stdin=subprocess.DEVNULL)
    assert "HEAVY [] RC 0" in r.stderr, r.stderr
    assert r.stdout.strip() == "ok"


def _run(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env or _env(), stdin=subprocess.DEVNULL)


def test_json_lines_commands_and_exit_status_through_the_server(aiops_serve: ServeProcess,
                                                                fake_openai: FakeOpenAI) -> None:
    fake_openai.script(Reply.text("one line"))
    r = _run(_cmd(aiops_serve, "hi", "--json"))
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]  # JSON lines: no blank line, as in-process
    assert lines[-1]["event"] == "done" and lines[-1]["text"] == "one line"
    assert "".join(e["text"] for e in lines if e["event"] == "tok") == "one line"
    session = lines[-1]["session_id"]
    # The same session again, by its id: a `!command` is answered at once, its status the exit's.
    r = _run(_cmd(aiops_serve, "!help", "--session", session))
    assert r.returncode == 0 and "Commands:" in r.stdout, r.stdout + r.stderr
    r = _run(_cmd(aiops_serve, "!no-such-command", "--session", session))
    assert r.returncode == 1, r.stdout + r.stderr
    r = _run(_cmd(aiops_serve, "hi", "--session", "no-such-session"))
    assert r.returncode == 2 and f"no session 'no-such-session' on {aiops_serve.url}" in r.stderr, r.stderr


def test_a_server_that_is_gone_or_refuses_the_token_is_a_usage_error(aiops_serve_factory: ServeFactory,
                                                                     fake_openai: FakeOpenAI) -> None:
    tokens = Tokens.make(ops="operator")
    serve = aiops_serve_factory(tokens=tokens)
    fake_openai.script(Reply.text("with a token"))
    r = _run(_cmd(serve, "hi", "--url", serve.url))
    assert r.returncode == 2 and "--token-env NAME, or AIOPS_TOKEN" in r.stderr, r.stderr
    r = _run(_cmd(serve, "hi", "--url", serve.url, "--token-env", "AIOPS_TEST_UNSET_VARIABLE"))
    assert r.returncode == 2 and "the variable AIOPS_TEST_UNSET_VARIABLE is not set" in r.stderr, r.stderr
    env = {**_env(), **tokens.env()}
    r = _run(_cmd(serve, "hi", "--url", serve.url, "--token-env", tokens.var("ops")), env)
    assert (r.returncode, r.stdout.strip()) == (0, "with a token"), r.stderr
    url = serve.url
    serve.stop()
    r = _run(_cmd(serve, "hi", "--url", url))
    assert r.returncode == 2 and f"cannot reach the aiops at {url}" in r.stderr, r.stderr


def test_the_operator_token_aiops_toml_names_is_used_without_a_second_variable(
        aiops_serve_factory: ServeFactory, fake_openai: FakeOpenAI) -> None:
    """QA as a new user: with tokens set up as API.md says (the operator's in the variable
    aiops.toml names), `aiops chat` on the same machine was refused until AIOPS_TOKEN was set too.
    It presents that operator token itself; refused, it names the variable to set."""
    tokens = Tokens.make(ops="operator", webui="client")
    serve = aiops_serve_factory(tokens=tokens)
    fake_openai.script(Reply.text("as the operator"))
    r = _run(_cmd(serve, "hi"), {**_env(), tokens.var("ops"): tokens.secrets["ops"]})
    assert (r.returncode, r.stdout.strip()) == (0, "as the operator"), r.stderr
    r = _run(_cmd(serve, "hi"))
    assert r.returncode == 2 and f"or {tokens.var('ops')} (the operator token aiops.toml names)" in r.stderr, r.stderr
    assert tokens.var("webui") not in r.stderr  # a client token is not the operator's


def test_a_server_killed_midway_is_said_and_exits_2(aiops_serve: ServeProcess, fake_openai: FakeOpenAI) -> None:
    # The stream cut before its `done` (SIGKILL: no clean end of the body) is not taken for the end.
    fake_openai.script(Reply.tool_calls(EDIT), Reply.text("never sent"))
    proc = subprocess.Popen(_cmd(aiops_serve, "make it brief"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=_env(), stdin=subprocess.DEVNULL)
    try:
        _wait_gate(aiops_serve)  # the chat waits on its stream for a console's answer
        aiops_serve.stop(signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 2, err.decode()
    assert f"aiops: {aiops_serve.url}: the event stream of chat-" in err.decode()
    assert "was cut" in err.decode() and "never sent" not in out.decode()



def _history(serve: ServeProcess, session: str) -> list[dict[str, Any]]:
    return _get(serve, f"/api/v1/sessions/{session}?limit=1000")["messages"]  # type: ignore[no-any-return]


def _audit(serve: ServeProcess, session: str) -> list[dict[str, Any]]:
    r = _run([*AIOPS, "audit", "--session", session, "--json", "--config-dir", str(serve.config_dir),
              "--data-dir", str(serve.data_dir)])
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def _finish(proc: subprocess.Popen[bytes], timeout: float = 30) -> tuple[str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return out.decode(), err.decode()


def _assert_stopped_with_its_gate(serve: ServeProcess, fake: FakeOpenAI, gate: dict[str, Any]) -> None:
    """The turn of `gate` ended as cancelled, the gate with it: out of every inbox, recorded as
    cancelled in the session's history and in the audit log, and the session takes a next turn."""
    assert _get(serve, "/api/v1/gates")["gates"] == []
    history = _history(serve, gate["session_id"])
    [record] = [m for m in history if m["role"] == "gate"]
    assert (record["meta"]["id"], record["meta"]["decision"], record["meta"]["by"]) == (gate["id"], "cancelled", "stop")
    assert history[-1]["role"] == "notice" and history[-1]["meta"] == {"kind": "cancelled"}
    assert history[-1]["content"] == "turn cancelled: stopped update_system_prompt (1 pending gate cancelled)"
    audit = _audit(serve, gate["session_id"])
    assert [(a["event"], a["decision"]) for a in audit if a["event"] != "gate_opened"][-1:] == [
        ("gate_resolved", "cancelled")], audit
    fake.reset()  # (the stopped turn's answer was never asked for)
    fake.script(Reply.text("still here"))
    r = _run(_cmd(serve, "are you there?", "--session", gate["session_id"]))
    assert (r.returncode, r.stdout.strip()) == (0, "still here"), r.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_leaving_before_the_turn_ends_stops_it_and_cancels_its_gate(aiops_serve: ServeProcess,
                                                                     fake_openai: FakeOpenAI,
                                                                     sig: signal.Signals) -> None:
    """Ctrl-C, `timeout`/cron's SIGTERM, a closed terminal: a `cli` gate waits for good (`[wait] cli
    = 0`), so one left behind would stay in every inbox for anyone to approve, unwatched."""
    fake_openai.script(Reply.tool_calls(EDIT), Reply.text("never sent"))
    proc = subprocess.Popen(_cmd(aiops_serve, "make it brief"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=_env(), stdin=subprocess.DEVNULL)
    try:
        gate = _wait_gate(aiops_serve)  # no terminal: it waits for a console
        assert gate["expires_at"] is None
        proc.send_signal(sig)
    finally:
        out, err = _finish(proc)
    assert proc.returncode == 128 + sig, err  # 130 for Ctrl-C, as a shell says it
    [turn] = {m["turn_id"] for m in _history(aiops_serve, gate["session_id"])}
    assert f"[stopped turn {turn} of session {gate['session_id']}: its pending gates are cancelled]" in err
    assert "never sent" not in out
    _assert_stopped_with_its_gate(aiops_serve, fake_openai, gate)


def test_ctrl_c_at_the_terminals_question_stops_the_turn(aiops_serve: ServeProcess,
                                                         fake_openai: FakeOpenAI) -> None:
    fake_openai.script(Reply.tool_calls(EDIT), Reply.text("never sent"))
    master, slave = pty.openpty()
    proc = subprocess.Popen(_cmd(aiops_serve, "make it brief"), stdin=slave, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=_env())
    os.close(slave)
    asked, err, reader = watch_stderr(proc, "approve update_system_prompt? [y]es once, [s]ession, [N]o:")
    try:
        assert asked.wait(30), "".join(err)
        gate = _wait_gate(aiops_serve)
        proc.send_signal(signal.SIGINT)  # what the terminal sends on Ctrl-C
        proc.wait(30)
    finally:
        _finish(proc)
        os.close(master)
    reader.join(10)
    assert proc.returncode == 130, "".join(err)
    _assert_stopped_with_its_gate(aiops_serve, fake_openai, gate)


def test_leaving_a_message_queued_behind_another_turn_stops_that_message_only(aiops_serve: ServeProcess,
                                                                              fake_openai: FakeOpenAI) -> None:
    """`--session` of a session whose turn (another client's) waits at its gate: Ctrl-C takes our
    message out of the queue, so it never runs unwatched later, and leaves the other turn alone."""
    fake_openai.script(Reply.tool_calls(EDIT), Reply.text("Changed it."))
    first = subprocess.Popen(_cmd(aiops_serve, "make it brief"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=_env(), stdin=subprocess.DEVNULL)
    second: subprocess.Popen[bytes] | None = None
    try:
        gate = _wait_gate(aiops_serve)
        session = gate["session_id"]
        second = subprocess.Popen(_cmd(aiops_serve, "and this too", "--session", session), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, env=_env(), stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30  # taken in: the session holds it, queued behind the gate's turn
        while not any(m["content"] == "and this too" for m in _history(aiops_serve, session)):
            assert time.monotonic() < deadline and second.poll() is None, "the second message was not taken in"
            time.sleep(0.05)
        second.send_signal(signal.SIGINT)
        _, err2 = _finish(second)
        assert second.returncode == 130, err2
        assert [g["id"] for g in _get(aiops_serve, "/api/v1/gates")["gates"]] == [gate["id"]]  # theirs waits on
        _approve(aiops_serve, gate["id"])
        out, err = _finish(first)
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(10)
    assert first.returncode == 0, err
    assert out.rstrip().endswith("Changed it.")
    history = _history(aiops_serve, session)
    [queued] = [m["turn_id"] for m in history if m["content"] == "and this too"]
    assert [(m["role"], m["content"]) for m in history if m["turn_id"] == queued] == [
        ("user", "and this too"), ("notice", "turn cancelled before it started: it was stopped")]
    assert f"[stopped turn {queued} of session {session}" in err2
    assert len(fake_openai.requests) == 2  # the first turn's two calls; the stopped message never ran
