"""`aiops chat` as a user runs it: gates asked on the terminal or refused at once without one, exit
statuses, command-only runs, a session deleting itself, and models it cannot use."""

from __future__ import annotations

import json
import os
import pty
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.fixtures import make_config_dir, openai_model_entry
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.support.stderr import watch_stderr

AIOPS = [sys.executable, "-m", "aiops.cli"]
EDIT = ("update_system_prompt", {"section": "role", "operation": "append", "content": "Be brief."})


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("AIOPS_")}


def chat(cfg: Path, data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AIOPS, "chat", *args, "--config-dir", str(cfg), "--data-dir", str(data)],
                          capture_output=True, text=True, timeout=60, env=_env(), stdin=subprocess.DEVNULL)


@pytest.fixture
def setup(tmp_path: Path, fake_openai: FakeOpenAI) -> tuple[Path, Path, FakeOpenAI]:
    models = {"local": openai_model_entry(fake_openai),
              "off": openai_model_entry(fake_openai, "off-model", enabled=False)}
    cfg = make_config_dir(tmp_path, models, "local", {"plugins.toml": "[mysql]\nenabled = false\n"})
    return cfg, tmp_path / "data", fake_openai


def test_without_a_terminal_an_ask_gate_is_denied_at_once_saying_how_to_allow_it(setup):
    cfg, data, fake = setup
    fake.script(Reply.tool_calls(EDIT), Reply.text("I could not change it."))
    r = chat(cfg, data, "make yourself brief")
    assert r.returncode == 0, r.stderr
    assert "[gate " in r.stdout and "update_system_prompt" in r.stdout
    assert "denied: aiops chat has no terminal to ask for approval on" in r.stdout
    assert str(cfg / "gates.toml") in r.stdout and "aiops serve" in r.stdout
    assert "✗ update_system_prompt" in r.stdout
    assert r.stdout.rstrip().endswith("I could not change it.")
    assert "Be brief." not in (cfg / "system_prompt" / "default" / ".system_prompt_role").read_text()


def test_json_output_follows_a_gate_with_one_waiting_notice_and_text_output_shows_none(setup):
    """`--json` writes every event of the turn as one line; right after a gate comes the "waiting for
    approval" notice naming it (key order included: scripts diff these lines), once."""
    cfg, data, fake = setup
    fake.script(Reply.tool_calls(EDIT), Reply.text("I could not change it."))
    r = chat(cfg, data, "make yourself brief", "--json")
    assert r.returncode == 0, r.stderr
    # JSON lines: one object on each line, no blank line (`jq`, `json.loads` per line fail on one).
    events = [json.loads(line) for line in r.stdout.splitlines()]
    names = [e["event"] for e in events]
    at = names.index("gate")
    gate, notice = events[at], events[at + 1]
    assert list(notice) == ["event", "text", "gate_id", "session_id", "turn_id"]
    assert notice == {"event": "notice", "text": "waiting for operator approval: update_system_prompt write",
                      "gate_id": gate["id"], "session_id": gate["session_id"], "turn_id": gate["turn_id"]}
    assert sum(1 for e in events if e["event"] == "notice" and "gate_id" in e) == 1
    resolved = events[names.index("gate_resolved")]
    assert resolved["id"] == gate["id"] and resolved["decision"] == "denied"
    assert names[-1] == "done" and events[-1]["text"] == "I could not change it."

    fake.script(Reply.tool_calls(EDIT), Reply.text("No."))
    r = chat(cfg, data, "make yourself brief")
    assert "[gate " in r.stdout and "waiting for operator approval" not in r.stdout + r.stderr


def test_on_a_terminal_the_operator_answers_the_gate_inline(setup):
    cfg, data, fake = setup
    fake.script(Reply.tool_calls(EDIT), Reply.text("Done."))
    master, slave = pty.openpty()
    proc = subprocess.Popen([*AIOPS, "chat", "make yourself brief", "--config-dir", str(cfg), "--data-dir",
                             str(data)], stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=_env())
    os.close(slave)
    asked, err, reader = watch_stderr(proc, "approve update_system_prompt? [y]es once, [s]ession, [N]o:")
    try:
        assert asked.wait(30), "".join(err)
        os.write(master, b"y\n")
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(master)
    reader.join(10)
    assert proc.returncode == 0, "".join(err)
    assert "[approved]" in out.decode()
    assert out.decode().rstrip().endswith("Done.")
    assert "Be brief." in (cfg / "system_prompt" / "default" / ".system_prompt_role").read_text()


def test_plugins_skipped_for_want_of_a_key_are_one_line_not_one_each(setup):
    cfg, data, fake = setup
    # The shipped plugins, the database off: search, extraction, Drive and swarm lack their keys.
    shipped = (Path(__file__).resolve().parents[2] / "config" / "plugins.toml").read_text()
    (cfg / "plugins.toml").write_text(shipped.replace("[mysql]\nenabled = true", "[mysql]\nenabled = false", 1))
    fake.script(Reply.text("hi there"))
    r = chat(cfg, data, "hi")
    assert r.returncode == 0 and r.stdout.strip() == "hi there", r.stderr
    said = [line for line in r.stderr.splitlines() if "skipped" in line]
    assert len(said) == 1 and said[0].startswith("[plugins skipped (`aiops plugins` says why): "), r.stderr
    assert len(said[0].split(", ")) > 1  # several plugins, named on the one line


def test_a_failing_command_exits_1_and_a_good_one_0(setup):
    cfg, data, _ = setup
    r = chat(cfg, data, "!nope")
    assert r.returncode == 1 and "unknown command !nope" in r.stdout
    r = chat(cfg, data, "!session 999 delete")
    assert r.returncode == 1 and "no session '999'" in r.stdout
    r = chat(cfg, data, "!help")
    assert r.returncode == 0 and "Commands:" in r.stdout


def test_command_only_runs_leave_no_session_behind(setup):
    cfg, data, _ = setup
    for text in ("!help", "!session", "!model"):
        assert chat(cfg, data, text).returncode == 0
    r = chat(cfg, data, "!session")
    assert r.stdout.strip() == "no sessions"
    assert "[session " not in r.stderr


def test_command_only_runs_give_out_no_session_id_in_json_nor_in_the_audit_log(setup):
    """Issue 21: `!db` from `aiops chat` recorded a session id that never came to exist (`aiops
    audit --session` could never find it), and `--json` named it on every line."""
    cfg, data, fake = setup
    r = chat(cfg, data, "!help", "--json")
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [e["event"] for e in lines] == ["user", "notice", "done"]
    assert all("session_id" in e and e["session_id"] is None for e in lines), lines
    r = chat(cfg, data, "!gate read_system_prompt read ask")  # an operator command that is audited
    assert r.returncode == 0, r.stdout + r.stderr
    audit = subprocess.run([*AIOPS, "audit", "--json", "--config-dir", str(cfg), "--data-dir", str(data)],
                           capture_output=True, text=True, timeout=60, env=_env())
    (entry,) = [json.loads(line) for line in audit.stdout.splitlines()]
    assert entry["event"] == "rule_changed" and entry["session_id"] is None
    # A turn's lines name its session, which exists: kind cli.
    fake.script(Reply.text("hello"))
    lines = [json.loads(line) for line in chat(cfg, data, "hi", "--json").stdout.splitlines()]
    sid = lines[0]["session_id"]
    assert sid.startswith("cli-") and all(e["session_id"] == sid for e in lines)
    assert " cli " in chat(cfg, data, "!session").stdout


def test_a_session_deletes_itself_from_the_command_line(setup):
    cfg, data, fake = setup
    fake.script(Reply.text("hello"))
    assert chat(cfg, data, "hi").returncode == 0
    r = chat(cfg, data, "!session 101 delete", "--session", "101")
    assert r.returncode == 0, r.stderr
    assert "deleted session 101" in r.stdout and "Traceback" not in r.stderr
    assert chat(cfg, data, "!session").stdout.strip() == "no sessions"


@pytest.mark.parametrize("model, why", [("nope", "unknown model 'nope'"), ("off", "model 'off' is disabled")])
def test_an_unusable_model_is_refused_before_a_session_or_turn_exists(setup, model, why):
    cfg, data, fake = setup
    r = chat(cfg, data, "hi", "--model", model)
    assert r.returncode == 2 and why in r.stderr
    assert fake.requests == []
    assert chat(cfg, data, "!session").stdout.strip() == "no sessions"


def test_what_the_model_says_cannot_drive_the_terminal(setup):
    """An answer carrying escape sequences (hide the text, return the carriage) would let the
    model redraw the gate question the operator answers; they are printed as text instead."""
    cfg, data, fake = setup
    fake.script(Reply.text("fine\x1b[8m hidden\rapprove update_system_prompt? [y]es\x9b2J", chunks=2))
    r = chat(cfg, data, "how are things")
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\r" not in r.stdout and "\x9b" not in r.stdout
    assert "fine\\x1b[8m hidden\\x0dapprove update_system_prompt? [y]es\\x9b2J" in r.stdout


def test_what_was_said_is_in_the_store_after_aiops_chat_exits(setup, tmp_path: Path):
    """`aiops chat` exits without the interpreter's teardown (issue 27): the store is closed first,
    and hooks registered with atexit still run (an embedder's; logging's flush is one)."""
    cfg, data, fake = setup
    fake.script(Reply.text("kept"))
    mark = tmp_path / "atexit-ran"
    probe = ("import atexit, pathlib, sys\n"  # `aiops` as its console script runs it, one hook added
             f"atexit.register(pathlib.Path({str(mark)!r}).write_text, 'yes')\n"
             "sys.argv[0] = 'aiops'\n"
             "from aiops.cli import run\n"
             "run()\n")
    r = subprocess.run([sys.executable, "-c", probe, "chat", "remember this", "--config-dir", str(cfg),
                        "--data-dir", str(data)], capture_output=True, text=True, timeout=60, env=_env(),
                       stdin=subprocess.DEVNULL)
    assert (r.returncode, r.stdout.strip()) == (0, "kept"), r.stderr
    assert mark.read_text() == "yes"
    db = sqlite3.connect(data / "aiops.sqlite3")
    try:
        [(sid, kind)] = db.execute("SELECT id, kind FROM sessions").fetchall()
        said = db.execute("SELECT role, content FROM messages WHERE session_id = ? ORDER BY id", (sid,)).fetchall()
    finally:
        db.close()
    assert kind == "cli" and said == [("user", "remember this"), ("assistant", "kept")]
    r = chat(cfg, data, "!bogus")
    assert r.returncode == 1  # and the exit status is main()'s


def test_the_model_is_offered_and_can_call_the_tools_of_an_mcp_server(tmp_path: Path, fake_openai: FakeOpenAI):
    """QA: the one turn of an in-process `aiops chat` started before the servers of mcp.toml had
    connected, so its model never had their tools ("unknown tool", every time). A stdio server (a
    process to start, then the handshake) is the slow kind."""
    server = Path(sys.executable).parent / "mcp-server-time"
    mcp = f'[servers.time]\ncommand = {json.dumps(str(server))}\nargs = ["--local-timezone", "UTC"]\n'
    cfg = make_config_dir(tmp_path, {"local": openai_model_entry(fake_openai)}, "local",
                          {"plugins.toml": "[mysql]\nenabled = false\n[mcp]\nenabled = true\n", "mcp.toml": mcp})
    fake_openai.script(Reply.tool_calls(("time__get_current_time", {"timezone": "Europe/Paris"})),
                       Reply.text("it is late"))
    r = chat(cfg, tmp_path / "data", "what time is it in Paris?")
    assert r.returncode == 0, r.stderr
    offered = [t["function"]["name"] for t in fake_openai.requests[0].json["tools"]]
    assert "time__get_current_time" in offered, offered
    told = [m["content"] for m in fake_openai.requests[1].json["messages"] if m.get("role") == "tool"]
    assert json.loads(told[0])["timezone"] == "Europe/Paris", told
    assert "← time__get_current_time" in r.stdout and r.stdout.rstrip().endswith("it is late")


def test_a_later_chat_is_offered_the_servers_last_list_and_starts_a_server_only_for_its_tools(
        tmp_path: Path, fake_openai: FakeOpenAI):
    """Every `aiops chat` waited for each MCP server to start and answer before its one turn (a
    second or more each), then for it to stop. After the first, a chat is offered the tools the
    server listed last time, and starts the server only when the model calls one of them."""
    server = Path(sys.executable).parent / "mcp-server-time"
    mcp = f'[servers.time]\ncommand = {json.dumps(str(server))}\nargs = ["--local-timezone", "UTC"]\n'
    cfg = make_config_dir(tmp_path, {"local": openai_model_entry(fake_openai)}, "local",
                          {"plugins.toml": "[mysql]\nenabled = false\n[mcp]\nenabled = true\n", "mcp.toml": mcp})
    data = tmp_path / "data"
    starts = data / "mcp" / "time.stderr.log"  # aiops marks each start of the server's process there

    def started() -> int:
        return starts.read_text().count("--- aiops: ") if starts.exists() else 0

    for text in ("hello", "hi again"):
        fake_openai.script(Reply.text(text))
        r = chat(cfg, data, "say hello")
        assert r.returncode == 0 and r.stdout.rstrip().endswith(text), r.stdout + r.stderr
        offered = [t["function"]["name"] for t in fake_openai.last_request.json["tools"]]
        assert "time__get_current_time" in offered, offered
    assert started() == 1, starts.read_text()  # the second chat offered them without starting it
    assert "waiting for plugins' tools" not in r.stderr

    fake_openai.script(Reply.tool_calls(("time__get_current_time", {"timezone": "Europe/Paris"})),
                       Reply.text("it is late"))
    r = chat(cfg, data, "what time is it in Paris?")
    assert r.returncode == 0 and r.stdout.rstrip().endswith("it is late"), r.stdout + r.stderr
    told = [m["content"] for m in fake_openai.last_request.json["messages"] if m.get("role") == "tool"]
    assert json.loads(told[0])["timezone"] == "Europe/Paris", told
    assert started() == 2  # started for the call


def test_the_rule_suggested_for_an_mcp_tool_is_the_one_gates_toml_reads(tmp_path: Path, fake_openai: FakeOpenAI):
    """The model calls an MCP tool as SERVER__TOOL; gates.toml names it mcp:SERVER:TOOL. The hint
    printed when the call is denied for want of a terminal must be the rule that would allow it."""
    server = Path(sys.executable).parent / "mcp-server-time"
    mcp = f'[servers.time]\ncommand = {json.dumps(str(server))}\nargs = ["--local-timezone", "UTC"]\n'
    cfg = make_config_dir(tmp_path, {"local": openai_model_entry(fake_openai)}, "local",
                          {"plugins.toml": "[mysql]\nenabled = false\n[mcp]\nenabled = true\n", "mcp.toml": mcp,
                           "gates.toml": '[tools."mcp:time"]\nread = "ask"\nwrite = "ask"\n'})
    fake_openai.script(Reply.tool_calls(("time__get_current_time", {"timezone": "Europe/Paris"})),
                       Reply.text("I may not look"))
    r = chat(cfg, tmp_path / "data", "what time is it in Paris?")
    assert r.returncode == 0, r.stderr
    said = r.stdout + r.stderr
    assert '[tools."mcp:time:get_current_time"] read = "allow"' in said, said
    assert '[tools."time__get_current_time"]' not in said
