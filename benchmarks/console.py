"""What the in-process console costs the engine and the proxy: the same proxy load against `aiops
serve` and against the console (in a tmux pane: a real terminal), with the terminal reading and
with it stalled (the tmux server stopped with SIGSTOP), while a prober asks `/api/v1/health`.

    python -m benchmarks.console [--requests N] [--concurrency C] [--json FILE]

Per mode: proxy latency p50/p99 (streaming, a new conversation per request, so every request also
adds a session to the console's list), the CPU the aiops process spent per request (comparable
across machine load where latency is not), and health latency p50/p99/max over the same time.
docs/ARCHITECTURE.md ("Does the engine leave the console's loop?") quotes a run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.load import Result, run_load
from benchmarks.run import _aiops_config, child, machine


async def _probe_health(url: str, stop: asyncio.Event, every: float = 0.05) -> list[float]:
    out: list[float] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        while not stop.is_set():
            t0 = time.perf_counter()
            async with session.get(url + "/api/v1/health") as resp:
                await resp.read()
            out.append((time.perf_counter() - t0) * 1000)
            try:
                await asyncio.wait_for(stop.wait(), every)
            except TimeoutError:
                pass
    return out


async def _measure(url: str, pid: int, args: argparse.Namespace, label: str) -> dict[str, Any]:
    stop = asyncio.Event()
    prober = asyncio.ensure_future(_probe_health(url, stop))
    try:
        r: Result = await run_load(url, "aiops", target=label, stream=True, concurrency=args.concurrency,
                                   requests=args.requests, warmup=args.warmup, session_header=True,
                                   server_pid=pid)
    finally:
        stop.set()
        health = sorted(await prober)

    def pct(xs: list[float], p: float) -> float:
        return xs[min(len(xs) - 1, max(0, round(p / 100 * len(xs) + 0.5) - 1))] if xs else float("nan")

    return {"mode": label, **r.summary(), "health_n": len(health), "health_p50_ms": round(pct(health, 50), 2),
            "health_p99_ms": round(pct(health, 99), 2), "health_max_ms": round(health[-1], 2) if health else None,
            "first_error": r.first_error}


class _Tmux:
    def __init__(self) -> None:
        self.socket = f"aiops-bench-{uuid.uuid4().hex[:8]}"

    def __call__(self, *a: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *a], capture_output=True, text=True, timeout=20,
                              check=True).stdout

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=20)


def _console(root: Path, cfg: Path, tmux: _Tmux, env: dict[str, str]) -> tuple[str, int]:
    data = root / "data"
    cmd = (f"{sys.executable} -m aiops.cli --config-dir {cfg} --data-dir {data} console --port 0; "
           f"sleep 600")
    subprocess.run(["tmux", "-L", tmux.socket, "new-session", "-d", "-s", "aiops", "-x", "160", "-y", "45",
                    "sh", "-c", cmd], check=True, env={**env, "TERM": "xterm-256color"}, timeout=20)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            info = json.loads((data / "aiops.lock").read_text() or "{}")
        except (OSError, ValueError):
            info = {}
        if info.get("url"):
            return info["url"], int(info["pid"])
        time.sleep(0.1)
    raise SystemExit("benchmark: the console did not start:\n" + tmux("capture-pane", "-p", "-t", "aiops"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.console", description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=400, help="measured requests per mode (default 400)")
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if shutil.which("tmux") is None:
        raise SystemExit("benchmark: tmux is needed for the console modes")
    root = Path(tempfile.mkdtemp(prefix="aiops-bench-console-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOPS_") and k not in ("TMUX", "TMUX_PANE")}
    rows: list[dict[str, Any]] = []
    try:
        with child([sys.executable, "-m", "benchmarks.upstream"], r"upstream on (http://\S+)",
                   "the upstream", env=env) as upstream:
            cfg = _aiops_config(root, upstream.url)
            cmd = [sys.executable, "-m", "aiops.cli", "--config-dir", str(cfg), "--data-dir",
                   str(root / "data-serve"), "serve"]
            with child(cmd, r"aiops serving on (http://\S+)", "aiops serve", env=env, cwd=root) as serve:
                rows.append(asyncio.run(_measure(serve.url, serve.pid, args, "serve")))
                print(rows[-1], flush=True)
            for stalled in (False, True):
                # A fresh console each time: its session list starts empty in both modes.
                tmux = _Tmux()
                try:
                    url, pid = _console(root / ("stalled" if stalled else "reading"), cfg, tmux, env)
                    server_pid = int(tmux("display", "-p", "#{pid}").strip())
                    if stalled:
                        os.kill(server_pid, signal.SIGSTOP)  # the terminal stops reading
                    try:
                        label = "console, terminal stalled" if stalled else "console"
                        rows.append(asyncio.run(_measure(url, pid, args, label)))
                        print(rows[-1], flush=True)
                    finally:
                        if stalled:
                            os.kill(server_pid, signal.SIGCONT)
                    os.kill(pid, signal.SIGTERM)
                finally:
                    tmux.kill()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print()
    print("| mode | reqs | err | p50 ms | p99 ms | req/s | cpu ms/req | health p50 | health p99 | health max |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['mode']} | {r['requests']} | {r['errors']} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
              f"{r['rps']:.0f} | {r['cpu_ms_per_request']} | {r['health_p50_ms']:.1f} | "
              f"{r['health_p99_ms']:.1f} | {r['health_max_ms']:.1f} |")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "args": vars(args) | {"json": str(args.json)},
                                         "rows": rows}, indent=2) + "\n")
    return 0 if all(r["errors"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
