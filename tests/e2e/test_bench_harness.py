"""`make bench` keeps working: a tiny run of the benchmark harness end to end (its processes, every
scenario, the report and the JSON). It measures nothing here: the numbers of so short a run are
noise, and speed targets are judged by `make bench` itself, not by tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_a_short_benchmark_run_reports_every_scenario(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.run", "--requests", "40", "--warmup", "5",
                           "--concurrency", "1,3", "--chats", "30", "--chats-sample", "5", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr  # 1: a target missed, as expected here
    doc = json.loads(out.read_text())

    rows = {(r["target"], r["stream"], r["concurrency"]): r for r in doc["results"]}
    assert set(rows) == {(t, s, c) for t in ("direct", "relay", "sdk", "sdk+db", "aiops") for s in (False, True) for c in (1, 3)}
    for key, r in rows.items():
        assert (r["requests"], r["errors"]) == (40, 0), key  # every answer was checked and right
        assert r["p99_ms"] >= r["p50_ms"] > 0, key
        if sys.platform == "linux":
            assert r["cpu_ms_per_request"] is not None and r["cpu_ms_per_request"] >= 0, key

    judged = [o for o in doc["overhead"] if o["met"] is not None]
    assert {(o["stream"], o["concurrency"]) for o in judged} == {(False, 1), (True, 1)}  # c=32 not run
    assert proc.returncode == (0 if all(o["met"] for o in judged) else 1)
    assert "| aiops  | yes    |   3 |" in proc.stdout and "cpu ms/req" in proc.stdout
    # Issue 27's multiple beside its floor: the SDK relay (openai.AsyncOpenAI, no aiops) against
    # the bare relay, for each streamed concurrency.
    sdk_x = {o["concurrency"]: o["cpu_vs_relay"] for o in doc["overhead"] if o["via"] == "sdk" and o["stream"]}
    assert set(sdk_x) == {1, 3} and all(x is None or x > 0 for x in sdk_x.values()), sdk_x
    for conc in (1, 3):
        assert f"streamed, c={conc}: aiops " in proc.stdout and "the SDK relay alone" in proc.stdout
    assert proc.stdout.count("three durable writes (aiops's Store) the floor is") == 2

    # The many-chats case: every phase ran, every chat went on in its own session.
    chats = {c["phase"]: c for c in doc["chats"]}
    assert {"direct (upstream alone)", "open chats 1-3", "open chats 28-30", "new chat", "continue",
            "restart: first continuation", "restart: continue"} <= set(chats)
    assert all(c["errors"] == 0 and c["requests"] > 0 for c in chats.values()), chats
    assert chats["new chat"]["requests"] == chats["continue"]["requests"] == 5


@pytest.mark.parametrize("bad", [["--concurrency", "x"], ["--requests", "many"]])
def test_bad_arguments_are_refused_with_usage(bad: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.run", *bad], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "usage:" in proc.stderr


def test_the_sdk_relay_with_a_store_writes_what_a_new_conversation_costs_aiops(tmp_path: Path) -> None:
    """The `sdk+db` floor is only a floor if it does aiops's durable work: a session, the question
    and the answer, committed through aiops's own Store, per conversation."""
    import asyncio
    import sqlite3

    from benchmarks.load import run_load
    from benchmarks.run import child

    with child([sys.executable, "-m", "benchmarks.upstream"], r"upstream on (http://\S+)", "the upstream",
               cwd=ROOT) as upstream, \
            child([sys.executable, "-m", "benchmarks.relay", "--upstream", upstream.url, "--sdk", "--store",
                   str(tmp_path / "store")], r"relay on (\S+)", "the SDK relay with a store", cwd=ROOT) as relay:
        for stream in (True, False):
            r = asyncio.run(run_load(relay.url, "bench-model", target="sdk+db", stream=stream, concurrency=2,
                                     requests=3, warmup=0, session_header=True))
            assert r.errors == 0, r.first_error
    db = sqlite3.connect(tmp_path / "store" / "aiops.db")
    sessions = db.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]
    roles = db.execute("SELECT role, COUNT(*) FROM messages GROUP BY role ORDER BY role").fetchall()
    assert sessions == 6 and roles == [("assistant", 6), ("user", 6)], (sessions, roles)
    streamed = db.execute("SELECT content FROM messages WHERE role='assistant' AND content LIKE 'data:%'").fetchall()
    assert len(streamed) == 3  # a streamed answer is stored as the stream it was
