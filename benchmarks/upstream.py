"""A fast, minimal OpenAI-compatible upstream for the proxy benchmark.

It answers every `POST /v1/chat/completions` with the same short completion, streamed (8 chunks,
each its own write, plus a usage chunk when `stream_options.include_usage` asks) or not. Frames are
built once per request from pre-encoded pieces, so the upstream costs as little as possible and
the benchmark measures the proxy, not the fake. One exception, for the many-chats case
(benchmarks.chats): a conversation that is only the greeting `hi` gets a greeting of its own each
time, as a real model's differ, so that each such chat is a branch of its own.

    python -m benchmarks.upstream --port 0      # prints "upstream on http://127.0.0.1:PORT"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from aiohttp import web

TEXT = "Hello! This is the benchmark upstream's short, fixed completion."
GREETING = "hi"  # a conversation of only this: a varied answer (see the module doc)
PIECES = 8
USAGE = {"prompt_tokens": 12, "completion_tokens": 14, "total_tokens": 26}


def _pieces(text: str, n: int) -> list[str]:
    size = -(-len(text) // n)
    return [text[i:i + size] for i in range(0, len(text), size)]


_counter = 0


def _head() -> tuple[str, int]:
    global _counter
    _counter += 1
    return f"chatcmpl-bench{_counter:010d}", int(time.time())


def _chunk(cid: str, created: int, model: str, delta: dict, finish: str | None, usage: bool) -> bytes:
    obj: dict = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                 "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
    if usage:
        obj["usage"] = None
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    model = body.get("model", "bench")
    cid, created = _head()
    said = [m.get("content") for m in body.get("messages", ()) if m.get("role") in ("user", "assistant")]
    text = f"Hello! How can I help? ({_counter})" if said == [GREETING] else TEXT
    if not body.get("stream"):
        return web.json_response({
            "id": cid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "logprobs": None, "finish_reason": "stop"}],
            "usage": USAGE})
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    await resp.write(_chunk(cid, created, model, {"role": "assistant", "content": ""}, None, include_usage))
    for piece in _pieces(text, PIECES):
        await resp.write(_chunk(cid, created, model, {"content": piece}, None, include_usage))
    await resp.write(_chunk(cid, created, model, {}, "stop", include_usage))
    if include_usage:
        await resp.write(b"data: " + json.dumps({"id": cid, "object": "chat.completion.chunk",
                                                 "created": created, "model": model, "choices": [],
                                                 "usage": USAGE}).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "bench-model", "object": "model",
                                                          "created": 0, "owned_by": "bench"}]})


async def _serve(host: str, port: int) -> None:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024)
    await site.start()
    print(f"upstream on http://{host}:{runner.addresses[0][1]}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    try:
        asyncio.run(_serve(args.host, args.port))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
