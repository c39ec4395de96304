"""An OpenAI-compatible upstream that stamps what it sends with the time it sends it.

Stamps are `time.monotonic_ns()`: on Linux that is CLOCK_MONOTONIC, one clock for every process on
the machine, so a client in another process can subtract a stamp from its own clock reading and get
the delay from the upstream's send to its receive, through whatever sits between them.

What it answers depends on the last user message (streaming only):
- `tokens N MS`: N text chunks, MS milliseconds apart, each chunk the stamp and a `;`.
- `prose N MS`: N chunks of Markdown (a word or a mark each: a heading, paragraphs, a list, a code
  block, over and over), MS milliseconds apart: an answer worth drawing, for the chat on screen.
- `gate`: a call of `update_system_prompt` whose `content` argument is the stamp (a write: the
  default gates ask); once the conversation holds the tool's result, the text `ok`.
- anything else: the text `ok`.

    python -m benchmarks.timed_upstream     # prints "upstream on http://127.0.0.1:PORT"
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

from aiohttp import web

_n = 0

# The answer `prose` streams, a chunk (about a model's token) at a time, from its start again as needed.
PROSE = """## Rolling out the change

The deploy goes in three steps, each of them *checked* before the next one starts. Nothing here is
`urgent`, but the window closes at six, so the **order** matters more than the speed.

- drain the first pool and wait for its queue to empty
- apply the migration on the replica, then on the primary
- bring the pool back and watch the error rate for ten minutes

```python
def drain(pool: str, timeout: float = 60.0) -> None:
    for host in hosts(pool):
        host.stop_accepting()
    wait_until(lambda: queue_length(pool) == 0, timeout)
```

If the error rate climbs, roll back with the same steps in the other order; the replica first.

"""
PROSE_CHUNKS = re.findall(r"\s*\S+|\s+", PROSE)


def _frame(model: str, delta: dict[str, Any], finish: str | None = None) -> bytes:
    global _n
    _n += 1
    obj = {"id": f"chatcmpl-t{_n}", "object": "chat.completion.chunk", "created": int(time.time()),
           "model": model, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _last_user(body: dict[str, Any]) -> str:
    for m in reversed(body.get("messages") or []):
        if m.get("role") == "user":
            c = m.get("content")
            return c if isinstance(c, str) else " ".join(p.get("text", "") for p in c or [] if isinstance(p, dict))
        if m.get("role") == "tool":
            return ""  # the tool's result is in: answer
    return ""


async def chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    model = body.get("model", "timed")
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    await resp.write(_frame(model, {"role": "assistant", "content": ""}))
    words = _last_user(body).split()
    finish = "stop"
    if words[:1] == ["tokens"] and len(words) == 3:
        n, gap = int(words[1]), float(words[2]) / 1000
        for i in range(n):
            if i:
                await asyncio.sleep(gap)
            await resp.write(_frame(model, {"content": f"{time.monotonic_ns()};"}))
    elif words[:1] == ["prose"] and len(words) == 3:
        n, gap = int(words[1]), float(words[2]) / 1000
        for i in range(n):
            if i:
                await asyncio.sleep(gap)
            await resp.write(_frame(model, {"content": PROSE_CHUNKS[i % len(PROSE_CHUNKS)]}))
    elif words == ["gate"]:
        args = {"section": "role", "operation": "append", "content": str(time.monotonic_ns())}
        await resp.write(_frame(model, {"tool_calls": [{"index": 0, "id": f"call_{_n}", "type": "function",
                                                        "function": {"name": "update_system_prompt",
                                                                     "arguments": json.dumps(args)}}]}))
        finish = "tool_calls"
    else:
        await resp.write(_frame(model, {"content": "ok"}))
    await resp.write(_frame(model, {}, finish))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "timed", "object": "model", "created": 0,
                                                          "owned_by": "bench"}]})


async def _serve() -> None:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
    await site.start()
    print(f"upstream on http://127.0.0.1:{runner.addresses[0][1]}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    try:
        asyncio.run(_serve())
    except KeyboardInterrupt:
        pass
