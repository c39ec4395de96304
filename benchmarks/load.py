"""A closed-loop load generator: `concurrency` workers, each sending its next request as soon as the
previous one is fully read, until `requests` have completed.

Latency is measured per request from just before sending to the last byte of the body (for a
stream: through `data: [DONE]`). Every answer is checked, so a fast wrong answer cannot pass as a
fast one.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import statistics
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

EXPECTED = "Hello! This is the benchmark upstream's short, fixed completion."


@dataclass
class Result:
    target: str  # direct | aiops
    stream: bool
    concurrency: int
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str = ""
    wall_s: float = 0.0
    cpu_s: float | None = None  # CPU time of the serving process over the measured requests
    # ... of its main thread alone: the event loop's, which bounds throughput (work moved to another
    # thread, such as the store's, leaves it but still counts in cpu_s)
    loop_cpu_s: float | None = None

    @property
    def cpu_ms_per_request(self) -> float | None:
        """CPU per request of the process that served them: comparable across machines of different
        speed and load where req/s is not (an upstream, relay or aiops process on a slower core
        costs more of it, and the ratio shows by how much)."""
        if self.cpu_s is None or not self.count:
            return None
        return self.cpu_s * 1000 / self.count

    @property
    def loop_cpu_ms_per_request(self) -> float | None:
        if self.loop_cpu_s is None or not self.count:
            return None
        return self.loop_cpu_s * 1000 / self.count

    @property
    def count(self) -> int:
        return len(self.latencies_ms)

    def pct(self, p: float) -> float:
        xs = sorted(self.latencies_ms)
        if not xs:
            return float("nan")
        k = min(len(xs) - 1, max(0, round(p / 100 * len(xs) + 0.5) - 1))
        return xs[k]

    @property
    def rps(self) -> float:
        return self.count / self.wall_s if self.wall_s else 0.0

    def summary(self) -> dict[str, Any]:
        return {"target": self.target, "stream": self.stream, "concurrency": self.concurrency,
                "requests": self.count, "errors": self.errors, "p50_ms": round(self.pct(50), 3),
                "p99_ms": round(self.pct(99), 3), "mean_ms": round(statistics.fmean(self.latencies_ms), 3)
                if self.latencies_ms else None, "rps": round(self.rps, 1), "wall_s": round(self.wall_s, 3),
                "cpu_ms_per_request": None if (c := self.cpu_ms_per_request) is None else round(c, 3),
                "loop_cpu_ms_per_request": None if (c := self.loop_cpu_ms_per_request) is None else round(c, 3)}


def process_cpu_seconds(pid: int | None, *, main_thread: bool = False) -> float | None:
    """User + system CPU seconds of process `pid` so far (Linux /proc; None elsewhere); with
    `main_thread`, of its main thread only (whose thread id is the process id)."""
    if pid is None:
        return None
    try:
        stat = f"/proc/{pid}/task/{pid}/stat" if main_thread else f"/proc/{pid}/stat"
        fields = Path(stat).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def _check(stream: bool, body: bytes) -> str | None:
    """Why the answer is wrong, or None."""
    if not stream:
        try:
            text = json.loads(body)["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            return f"not a chat.completion: {body[:200]!r}"
        return None if text == EXPECTED else f"unexpected answer {text!r}"
    if not body.rstrip().endswith(b"data: [DONE]"):
        return f"stream did not end with [DONE]: {body[-200:]!r}"
    text = ""
    for frame in body.split(b"\n\n"):
        if frame.startswith(b"data: {"):
            obj = json.loads(frame[6:])
            if obj.get("choices"):
                text += obj["choices"][0]["delta"].get("content") or ""
    return None if text == EXPECTED else f"unexpected streamed answer {text!r}"


async def run_load(url: str, model: str, *, target: str, stream: bool, concurrency: int, requests: int,
                   warmup: int, session_header: bool, timeout: float = 30.0,
                   deadline_s: float = 300.0, server_pid: int | None = None) -> Result:
    """Send `warmup` unmeasured requests, then `requests` measured ones, `concurrency` at a time.
    With `server_pid`, also the CPU that process spent on the measured ones."""
    result = Result(target, stream, concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency, force_close=False)
    client_timeout = aiohttp.ClientTimeout(total=timeout)
    endpoint = url.rstrip("/") + "/v1/chat/completions"
    prefix = uuid.uuid4().hex[:8]

    def body(i: int) -> bytes:
        return json.dumps({"model": model, "stream": stream,
                           "messages": [{"role": "user", "content": f"Say hello (request {i})."}]}).encode()

    async with aiohttp.ClientSession(connector=connector, timeout=client_timeout) as session:

        async def one(i: int, record: bool) -> None:
            headers = {"Content-Type": "application/json"}
            if session_header:
                headers["X-Aiops-Session"] = f"bench-{prefix}-{i}"  # a new conversation per request
            data = body(i)
            t0 = time.perf_counter()
            try:
                async with session.post(endpoint, data=data, headers=headers) as resp:
                    raw = await resp.read()
                    status = resp.status
            except (aiohttp.ClientError, TimeoutError) as e:
                result.errors += 1
                result.first_error = result.first_error or f"{type(e).__name__}: {e}"
                return
            elapsed = (time.perf_counter() - t0) * 1000
            why = _check(stream, raw) if status == 200 else f"HTTP {status}: {raw[:200]!r}"
            if why:
                result.errors += 1
                result.first_error = result.first_error or why
            elif record:
                result.latencies_ms.append(elapsed)

        async def phase(n: int, record: bool, counter: itertools.count[int]) -> None:
            async def worker() -> None:
                while (i := next(counter)) < n:
                    await one(i, record)

            await asyncio.gather(*(worker() for _ in range(concurrency)))

        ids = itertools.count()
        await asyncio.wait_for(phase(warmup, False, ids), deadline_s)
        cpu0 = process_cpu_seconds(server_pid)
        loop0 = process_cpu_seconds(server_pid, main_thread=True)
        start = time.perf_counter()
        measured = itertools.count(warmup)
        await asyncio.wait_for(phase(warmup + requests, True, measured), deadline_s)
        result.wall_s = time.perf_counter() - start
        cpu1 = process_cpu_seconds(server_pid)
        loop1 = process_cpu_seconds(server_pid, main_thread=True)
        if cpu0 is not None and cpu1 is not None:
            result.cpu_s = cpu1 - cpu0
        if loop0 is not None and loop1 is not None:
            result.loop_cpu_s = loop1 - loop0
    return result
