"""The many-chats case of `make bench` (issue 21): chats from one caller that all open with "hi".

An Open WebUI instance without forwarded headers sends no chat id: aiops names each conversation
by the caller and its first user message, so every "hi" chat is a fork of one root. The case
opens `n` such chats one after another (concurrency 1, non-streaming, as a chat page sends them),
timing each, then times, beside the upstream alone (`direct`, the harness's baseline):

- `new chat`: more chats opening with "hi" (a first message: it continues nothing);
- `continue`: the second message of chats spread over all of them (each must land in its own
  session: the response's `X-Aiops-Session` is checked);
- after a restart of aiops on the same data (`benchmarks.run` does it) and one request of another
  conversation (the process's own first-request cost), the first continuation (the proxy reads
  the root's sessions from the store once) and further ones.

The upstream (benchmarks.upstream) answers each "hi" with a greeting of its own, as a model does,
so each chat is a branch of its own. Latency per request from sending to the last byte; CPU per
request of the aiops process over each phase.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from benchmarks.load import process_cpu_seconds

GREETING = "hi"
FOLLOW_UP = "and what next?"


@dataclass
class Phase:
    name: str
    after: int  # chats that existed when it began
    latencies_ms: list[float] = field(default_factory=list)
    cpu_s: float | None = None
    errors: int = 0
    first_error: str = ""

    def pct(self, p: float) -> float:
        xs = sorted(self.latencies_ms)
        if not xs:
            return float("nan")
        return xs[min(len(xs) - 1, max(0, round(p / 100 * len(xs) + 0.5) - 1))]

    @property
    def cpu_ms(self) -> float | None:
        return None if self.cpu_s is None or not self.latencies_ms else self.cpu_s * 1000 / len(self.latencies_ms)

    def summary(self) -> dict[str, Any]:
        return {"phase": self.name, "after_chats": self.after, "requests": len(self.latencies_ms),
                "errors": self.errors, "first_error": self.first_error or None,
                "p50_ms": round(self.pct(50), 3), "p99_ms": round(self.pct(99), 3),
                "max_ms": round(max(self.latencies_ms), 3) if self.latencies_ms else None,
                "mean_ms": round(statistics.fmean(self.latencies_ms), 3) if self.latencies_ms else None,
                "cpu_ms_per_request": None if (c := self.cpu_ms) is None else round(c, 3)}

    def row(self, tree: str) -> str:
        cpu = "" if (c := self.cpu_ms) is None else f"{c:.2f}"
        return (f"| {tree:<10} | {self.name:<28} | {self.after:>6} | {len(self.latencies_ms):>5} | "
                f"{self.pct(50):8.2f} | {self.pct(99):8.2f} | {cpu:>10} | {self.errors:>3} |")


HEADER = ["| tree       | phase                        | chats  | reqs  | p50 ms   | p99 ms   | cpu ms/req | err |",
          "|------------|------------------------------|-------:|------:|---------:|---------:|-----------:|----:|"]


@dataclass
class Chat:
    sid: str
    messages: list[dict[str, str]]  # as its client holds it

    @classmethod
    def opened(cls, sid: str, answer: str) -> Chat:
        return cls(sid, [*hi(), {"role": "assistant", "content": answer}])


class ChatClient:
    """One caller (no chat id, no `user`): every "hi" chat shares its root."""

    def __init__(self, url: str, model: str, pid: int | None) -> None:
        self.endpoint = url.rstrip("/") + "/v1/chat/completions"
        self.model = model
        self.pid = pid
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))

    async def close(self) -> None:
        await self.http.close()

    async def warm_up(self) -> None:
        """One untimed request in a conversation of its own: a fresh process's first request
        (imports, the model client's first connection) is not counted against what follows."""
        async with self.http.post(self.endpoint, headers={"X-Aiops-Session": "bench-warm-up"},
                                  json={"model": self.model, "messages": [{"role": "user", "content": "warm up"}]}
                                  ) as resp:
            await resp.read()

    async def send(self, phase: Phase, messages: list[dict[str, str]]) -> tuple[str, str] | None:
        """(session id, answer), timed into `phase`; None on an error (counted)."""
        t0 = time.perf_counter()
        try:
            async with self.http.post(self.endpoint, json={"model": self.model, "messages": messages}) as resp:
                raw = await resp.json(content_type=None)
                status, sid = resp.status, resp.headers.get("X-Aiops-Session", "")
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            phase.errors += 1
            phase.first_error = phase.first_error or f"{type(e).__name__}: {e}"
            return None
        elapsed = (time.perf_counter() - t0) * 1000
        try:
            answer = raw["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            answer = None
        if status != 200 or not answer:
            phase.errors += 1
            phase.first_error = phase.first_error or f"HTTP {status}: {str(raw)[:200]}"
            return None
        phase.latencies_ms.append(elapsed)
        return sid, answer

    async def timed(self, phase: Phase, requests: list[list[dict[str, str]]]) -> list[tuple[str, str] | None]:
        """Send `requests` one after another."""
        cpu0 = process_cpu_seconds(self.pid)
        out = [await self.send(phase, messages) for messages in requests]
        cpu1 = process_cpu_seconds(self.pid)
        phase.cpu_s = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
        return out


def hi() -> list[dict[str, str]]:
    return [{"role": "user", "content": GREETING}]


async def continue_chats(client: ChatClient, phase: Phase, chats: list[Chat], text: str) -> None:
    """The next message of each of `chats`: each must go on in its own session."""
    asked = [[*c.messages, {"role": "user", "content": text}] for c in chats]
    for chat, messages, got in zip(chats, asked, await client.timed(phase, asked), strict=True):
        if got is None:
            continue
        if got[0] != chat.sid:
            phase.errors += 1
            phase.first_error = phase.first_error or f"went on in {got[0]!r}, not in its own {chat.sid!r}"
            continue
        chat.messages = [*messages, {"role": "assistant", "content": got[1]}]


async def open_chats(client: ChatClient, n: int, buckets: int = 10) -> tuple[list[Chat], list[Phase]]:
    """Open `n` "hi" chats, timed in `buckets` consecutive groups (how the cost moves as they grow)."""
    chats: list[Chat] = []
    phases = []
    await client.warm_up()
    size = max(1, -(-n // buckets))
    for start in range(0, n, size):
        phase = Phase(f"open chats {start + 1}-{min(n, start + size)}", start)
        for got in await client.timed(phase, [hi() for _ in range(min(size, n - start))]):
            if got is not None:
                chats.append(Chat.opened(*got))
        phases.append(phase)
    return chats, phases


async def after_many(client: ChatClient, chats: list[Chat], sample: int, seed: int = 21) -> list[Phase]:
    """New chats, then continuations of chats spread over all of them (each in its own session)."""
    new = Phase("new chat", len(chats))
    for got in await client.timed(new, [hi() for _ in range(sample)]):
        if got is not None:
            chats.append(Chat.opened(*got))
    cont = Phase("continue", len(chats))
    await continue_chats(client, cont, random.Random(seed).sample(chats, min(sample, len(chats))), FOLLOW_UP)
    return [new, cont]


async def after_restart(client: ChatClient, chats: list[Chat], sample: int, seed: int = 22) -> list[Phase]:
    """The first continuation after a restart (the root's sessions read from the store), then more."""
    picked = random.Random(seed).sample(chats, min(sample + 1, len(chats)))
    await client.warm_up()
    first = Phase("restart: first continuation", len(chats))
    await continue_chats(client, first, picked[:1], "after the restart")
    more = Phase("restart: continue", len(chats))
    await continue_chats(client, more, picked[1:], "after the restart")
    return [first, more]


async def direct(upstream_url: str, model: str, requests: int) -> Phase:
    """The upstream alone, with the same request (the harness's baseline)."""
    client = ChatClient(upstream_url, model, None)
    phase = Phase("direct (upstream alone)", 0)
    try:
        await client.timed(phase, [hi() for _ in range(requests)])
    finally:
        await client.close()
    return phase
