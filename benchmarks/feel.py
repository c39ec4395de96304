"""What the operator feels once aiops runs: a token's added delay, a gate's, and memory.

    python -m benchmarks.feel [--quick] [--sessions N --messages M] [--json FILE]

Processes: benchmarks.timed_upstream (stamps every chunk and tool call with its send time on the
machine-wide monotonic clock), `aiops serve` on it, and this client. Run once with an empty data dir
and once with the stored history of benchmarks.history (10,000 sessions of 100 messages).

- **Tokens**: streams of `--tokens` chunks 5 ms apart, one stream at a time; each received stamp
  gives upstream send → client receive. Directly from the upstream (the baseline: the same client,
  the same sockets, no aiops), through aiops `/v1/chat/completions`, and through the aiops API
  (`/api/v1/stream/{id}` while `/api/v1/submit` runs the turn). Added delay = through aiops − direct.
- **Gates**: the model calls `update_system_prompt` (a write: the shipped gates ask), stamped;
  model's send → the `gate` event on the API stream; then the operator's approval (`POST
  /api/v1/gates/{id}`) → `gate_resolved` and → `tool_result` on the stream (the tool has run).
  Issue 27's target for gates (≤ 20 ms p99 to the row in the console's inbox) is judged by
  benchmarks.busy_console, which times the row on screen; these are the engine's part of it.
- **Memory** (RSS of `aiops serve`, Linux): after start; after `--live` sessions with one finished
  turn each (per session); after `--streams` concurrent streams through `/v1` at ~50 tokens/s. Beside
  the RSS of `python -c "import aiohttp"` (the floor for any aiohttp server).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks import history
from benchmarks.run import _aiops_config, child
from benchmarks.startup import _env

TARGET_ADDED_TOKEN_P50_MS = 0.5  # issue 27
STAMP = re.compile(rb"(\d{12,});")


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def _summary(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50_ms": round(_pct(values, 50), 3), "p99_ms": round(_pct(values, 99), 3),
            "max_ms": round(max(values), 3) if values else float("nan"),
            "mean_ms": round(statistics.fmean(values), 3) if values else float("nan")}


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _now_ms_since(stamp_ns: int) -> float:
    return (time.monotonic_ns() - stamp_ns) / 1e6


# ---- tokens ------------------------------------------------------------------------------------------------


async def _read_stamps(resp: aiohttp.ClientResponse, out: list[float]) -> None:
    async for line in resp.content:
        for m in STAMP.finditer(line):
            out.append(_now_ms_since(int(m.group(1))))


async def tokens_openai(http: aiohttp.ClientSession, url: str, model: str, n: int, out: list[float],
                        session_header: bool) -> None:
    headers = {"X-Aiops-Session": f"feel-{uuid.uuid4().hex[:10]}"} if session_header else {}
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": f"tokens {n} 5"}]}
    async with http.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
        resp.raise_for_status()
        await _read_stamps(resp, out)


async def _events(resp: aiohttp.ClientResponse) -> Any:
    """(event name, data, receive time) from an SSE response."""
    name = ""
    async for raw in resp.content:
        line = raw.decode().rstrip("\r\n")
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            yield name, json.loads(line[5:]), time.monotonic_ns()


async def tokens_api(http: aiohttp.ClientSession, url: str, n: int, out: list[float]) -> None:
    sid = f"feel-{uuid.uuid4().hex[:10]}"
    async with http.get(f"{url}/api/v1/stream/{sid}") as stream:
        stream.raise_for_status()
        async with http.post(url + "/api/v1/submit", json={"text": f"tokens {n} 5", "client_id": sid}) as r:
            r.raise_for_status()
        async for name, data, at in _events(stream):
            if name == "tok":
                for m in STAMP.finditer(data.get("text", "").encode()):
                    out.append((at - int(m.group(1))) / 1e6)
            elif name == "done":
                return


# ---- gates -------------------------------------------------------------------------------------------------


async def gate_round(http: aiohttp.ClientSession, url: str, out: dict[str, list[float]]) -> None:
    sid = f"feel-{uuid.uuid4().hex[:10]}"
    async with http.get(f"{url}/api/v1/stream/{sid}") as stream:
        stream.raise_for_status()
        async with http.post(url + "/api/v1/submit", json={"text": "gate", "client_id": sid}) as r:
            r.raise_for_status()
        approved_at = 0
        async for name, data, at in _events(stream):
            if name == "gate":
                out["model call → gate on the API stream"].append((at - int(data["args"]["content"])) / 1e6)
                approved_at = time.monotonic_ns()
                async with http.post(f"{url}/api/v1/gates/{data['id']}", json={"decision": "approve"}) as r:
                    r.raise_for_status()
            elif name == "gate_resolved":
                out["approval → gate_resolved on the stream"].append((at - approved_at) / 1e6)
            elif name == "tool_result":
                out["approval → tool_result on the stream"].append((at - approved_at) / 1e6)
            elif name == "done":
                return


# ---- memory ------------------------------------------------------------------------------------------------


async def live_sessions(http: aiohttp.ClientSession, url: str, count: int) -> None:
    async def one() -> None:
        async with http.post(url + "/api/v1/submit", json={"text": "hello", "wait": True}) as r:
            r.raise_for_status()
            await r.read()

    for start in range(0, count, 20):  # 20 at a time: a burst, not a flood of connections
        await asyncio.gather(*(one() for _ in range(min(20, count - start))))


async def stream_load(http: aiohttp.ClientSession, url: str, streams: int, tokens: int) -> float:
    """`streams` concurrent streams through /v1 at ~50 tokens/s each; seconds it took."""
    t0 = time.perf_counter()
    sink: list[float] = []
    body_tokens = f"tokens {tokens} 20"

    async def one() -> None:
        body = {"model": "aiops", "stream": True, "messages": [{"role": "user", "content": body_tokens}]}
        async with http.post(url + "/v1/chat/completions", json=body,
                             headers={"X-Aiops-Session": f"load-{uuid.uuid4().hex[:10]}"}) as resp:
            resp.raise_for_status()
            await _read_stamps(resp, sink)

    await asyncio.gather(*(one() for _ in range(streams)))
    return time.perf_counter() - t0


def floor_rss_kb() -> int:
    code = ("import aiohttp\nfor l in open('/proc/self/status'):\n"
            "    if l.startswith('VmRSS:'): print(l.split()[1])")
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


# ---- one data dir ------------------------------------------------------------------------------------------


async def _measure(upstream_url: str, aiops_url: str, aiops_pid: int, args: argparse.Namespace) -> dict[str, Any]:
    res: dict[str, Any] = {"rss_kb": {"after start": rss_kb(aiops_pid)}}
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as http:
        # warm-up: the first turn imports the SDK's lazy parts, opens pools
        await tokens_openai(http, aiops_url, "aiops", 5, [], True)
        await tokens_api(http, aiops_url, 5, [])
        tok: dict[str, list[float]] = {"direct (baseline)": [], "aiops /v1": [], "aiops API stream": []}
        for _ in range(args.streams_measured):  # interleaved, so a slow minute hits all three
            await tokens_openai(http, upstream_url, "timed", args.tokens, tok["direct (baseline)"], False)
            await tokens_openai(http, aiops_url, "aiops", args.tokens, tok["aiops /v1"], True)
            await tokens_api(http, aiops_url, args.tokens, tok["aiops API stream"])
        res["tokens"] = {k: _summary(v) for k, v in tok.items()}
        base = res["tokens"]["direct (baseline)"]
        res["tokens_added"] = {k: {"added_p50_ms": round(v["p50_ms"] - base["p50_ms"], 3),
                                   "added_p99_ms": round(v["p99_ms"] - base["p99_ms"], 3)}
                               for k, v in res["tokens"].items() if k != "direct (baseline)"}
        gates: dict[str, list[float]] = {"model call → gate on the API stream": [],
                                         "approval → gate_resolved on the stream": [],
                                         "approval → tool_result on the stream": []}
        for _ in range(args.gates):
            await gate_round(http, aiops_url, gates)
        res["gates"] = {k: _summary(v) for k, v in gates.items()}
        before = res["rss_kb"]["after the token and gate rounds"] = rss_kb(aiops_pid)
        await live_sessions(http, aiops_url, args.live)
        after = rss_kb(aiops_pid)
        res["rss_kb"][f"after {args.live} sessions with a finished turn"] = after
        res["rss_kb_per_live_session"] = round((after - before) / max(args.live, 1), 1)
        took = await stream_load(http, aiops_url, args.streams, args.load_tokens)
        res["rss_kb"][f"after {args.streams} concurrent streams of {args.load_tokens} tokens at 50/s"] = \
            rss_kb(aiops_pid)
        res["stream_load_s"] = round(took, 2)
    return res


def _print(stored: int, r: dict[str, Any]) -> None:
    print(f"\n  {stored:,} stored sessions")
    for k, v in r["tokens"].items():
        added = r["tokens_added"].get(k)
        extra = f"  (added p50 {added['added_p50_ms']:.2f}, p99 {added['added_p99_ms']:.2f})" if added else ""
        print(f"    token {k:<28} p50 {v['p50_ms']:7.2f} ms  p99 {v['p99_ms']:7.2f} ms  n={v['n']}{extra}")
    for k, v in r["gates"].items():
        print(f"    gate {k:<40} p50 {v['p50_ms']:7.2f} ms  p99 {v['p99_ms']:7.2f} ms  n={v['n']}")
    for k, v in r["rss_kb"].items():
        print(f"    RSS {k:<58} {v / 1024:7.1f} MB")
    print(f"    RSS per live session (one finished turn each)              {r['rss_kb_per_live_session']:7.1f} kB")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"floor_rss_kb_import_aiohttp": floor_rss_kb(), "runs": []}
    print(f"  RSS floor: python -c 'import aiohttp'                          "
          f"{out['floor_rss_kb_import_aiohttp'] / 1024:7.1f} MB")
    root = Path(tempfile.mkdtemp(prefix="aiops-bench-feel-"))
    env = _env()
    try:
        with child([sys.executable, "-m", "benchmarks.timed_upstream"], r"upstream on (http://\S+)",
                   "the timed upstream", env=env) as upstream:
            cfg = _aiops_config(root, upstream.url)
            for stored in (0, args.sessions):
                data = history.data_dir(root / f"data-{stored}", stored, args.messages)
                cmd = [sys.executable, "-m", "aiops.cli", "--config-dir", str(cfg), "--data-dir", str(data),
                       "serve"]
                with child(cmd, r"aiops serving on (http://\S+)", "aiops serve", env=env, cwd=root) as aiops:
                    r = asyncio.run(_measure(upstream.url, aiops.url, aiops.pid, args))
                r["stored_sessions"] = stored
                _print(stored, r)
                out["runs"].append(r)
                shutil.rmtree(data, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out["targets"] = []
    for r in out["runs"]:
        added = r["tokens_added"]["aiops /v1"]["added_p50_ms"]
        out["targets"].append(
            {"what": "added delay per token, /v1, p50", "stored_sessions": r["stored_sessions"],
             "target_ms": TARGET_ADDED_TOKEN_P50_MS, "value_ms": added, "met": added <= TARGET_ADDED_TOKEN_P50_MS})
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokens", type=int, default=50, help="chunks per measured stream (default 50)")
    p.add_argument("--streams-measured", type=int, default=10, help="streams per path (default 10)")
    p.add_argument("--gates", type=int, default=50, help="gate rounds (default 50)")
    p.add_argument("--live", type=int, default=200, help="sessions for RSS per session (default 200)")
    p.add_argument("--streams", type=int, default=200, help="concurrent streams of the load (default 200)")
    p.add_argument("--load-tokens", type=int, default=50, help="tokens per load stream, 50/s (default 50)")


def quick(args: argparse.Namespace) -> None:
    args.streams_measured = min(args.streams_measured, 3)
    args.gates = min(args.gates, 10)
    args.live = min(args.live, 40)
    args.streams = min(args.streams, 50)
    args.load_tokens = min(args.load_tokens, 20)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.feel", description=__doc__.splitlines()[0])
    add_arguments(p)
    p.add_argument("--sessions", type=int, default=10_000, help="stored sessions (default 10,000)")
    p.add_argument("--messages", type=int, default=100, help="messages per stored session (default 100)")
    p.add_argument("--quick", action="store_true", help="fewer rounds; 1,000 stored sessions of 20 messages")
    p.add_argument("--json", type=Path, help="also write the numbers to this file")
    args = p.parse_args(argv)
    if args.quick:
        quick(args)
        args.sessions, args.messages = min(args.sessions, 1000), min(args.messages, 20)
    out = measure(args)
    for t in out["targets"]:
        print(f"  target {t['what']} ({t['stored_sessions']} stored) ≤ {t['target_ms']} ms: "
              f"{'met' if t['met'] else 'MISSED'} ({t['value_ms']:.2f} ms)")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
