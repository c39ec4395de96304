"""The operator's side of `make bench` keeps working (benchmarks.history, benchmarks.feel, and
benchmarks.sessions_list beside it): the stored history is one aiops reads as its own, and tiny runs
go through every path. No number is judged here: speed is `make bench`'s business."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from aiops.engine.store import Store
from benchmarks import history

ROOT = Path(__file__).resolve().parents[2]


async def test_the_generated_history_is_read_by_the_store_as_sessions_with_their_messages(tmp_path: Path) -> None:
    db = tmp_path / "aiops.sqlite3"
    history.build(db, sessions=30, messages=20)
    store = Store(db)
    await store.open()
    try:
        assert await store.count_sessions() == 30
        newest = (await store.list_sessions(limit=1))[0]
        assert newest.short_id == 130 and newest.title  # shorthand ids from 101, in order
        messages = await store.history(newest.id)
        assert len(messages) == 20
        assert [m.role for m in messages[:10]] == ["user", "assistant"] * 3 + ["user", "assistant", "tool",
                                                                              "assistant"]
        call, result = messages[7], messages[8]
        assert call.tool_calls and result.tool_call_id == call.tool_calls[0].id
        # A new session after them gets the next shorthand id, as in a real data dir.
        row = await store.create_session("api-new", "api", None)
        assert row.short_id == 131
    finally:
        await store.close()


def test_a_tiny_feel_run_measures_every_path(tmp_path: Path) -> None:
    out = tmp_path / "feel.json"
    env = {"TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"}  # the history cache lands in tmp_path
    proc = subprocess.run([sys.executable, "-m", "benchmarks.feel", "--sessions", "20", "--messages", "10",
                           "--tokens", "3", "--streams-measured", "1", "--gates", "2", "--live", "2",
                           "--streams", "3", "--load-tokens", "2", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert [r["stored_sessions"] for r in doc["runs"]] == [0, 20]
    for run in doc["runs"]:
        assert {k: v["n"] for k, v in run["tokens"].items()} == {
            "direct (baseline)": 3, "aiops /v1": 3, "aiops API stream": 3}  # every stamp came through
        assert {v["n"] for v in run["gates"].values()} == {2}  # each gate opened, resolved, ran
        assert all(kb > 0 for kb in run["rss_kb"].values())
    # The added delay per token, per data dir; the gate's target is judged in the console (busy_console).
    assert len(doc["targets"]) == 2


@pytest.mark.tmux
def test_a_tiny_busy_console_run_measures_every_path(tmp_path: Path, tmux: object) -> None:
    # `tmux`: the fixture's check alone (skipped without tmux, failed under CI=true); the case runs its own.
    out = tmp_path / "busy.json"
    env = {"TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.busy_console", "--sessions", "30", "--messages", "6",
                           "--console-streams", "2", "--presses", "2", "--list-presses", "2", "--console-gates", "1",
                           "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    for phase in ("idle", "busy"):
        r = doc[phase]
        assert r["keypress_to_screen_ms"]["n"] == 2 and r["sessions_list_key_to_screen_ms"]["n"] == 2
        assert {v["n"] for v in r["gates_ms"].values()} == {1}  # the row seen, approved, the tool ran, gone
        assert all(ms >= 0 for ms in r["console_cpu_ms"].values())
    assert doc["busy"]["streams_running_at_end"] == 2
    assert len(doc["rss_kb"]) == 4 and all(kb > 0 for kb in doc["rss_kb"].values())
    assert doc["watched"]["keypress_to_screen_ms"]["n"] == 2 and doc["watched"]["answer_streaming_at_end"]
    assert all(ms >= 0 for ms in doc["watched"]["console_cpu_ms"].values())
    assert [t["target_ms"] for t in doc["targets"]] == [50.0, 50.0, 50.0, 20.0, 20.0]


def test_a_tiny_sessions_list_run_times_each_change() -> None:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.sessions_list", "--sessions", "300", "--rounds", "3"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "sessions list, 300 listed, 3 of each:"
    assert [line.split()[0] for line in lines[1:]] == ["new", "one", "repaint", "cursor"]
    assert all(" ms, max " in line for line in lines[1:])
