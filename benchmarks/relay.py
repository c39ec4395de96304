"""A bare aiohttp relay: the floor any Python proxy sits on, measured on the same machine.

It forwards `POST /v1/chat/completions` to the upstream with one pooled aiohttp client and copies
the response back, chunk by chunk for a stream. No parsing, no session, no storage: whatever it
adds over direct is the cost of one more aiohttp hop on this machine, which puts the proxy's
added latency in proportion.

With `--sdk` it forwards through `openai.AsyncOpenAI` instead, made and called as aiops's backend
makes and calls it (its aiohttp transport, no retries, the client's own POST of the parsed body,
the raw streamed response read with `iter_bytes()`): the floor of any proxy that must use the SDK
(issue 2), measured beside the bare relay so the SDK's own share of aiops's CPU is a figure of the
same run rather than a profile's estimate (issue 27).

With `--store DIR` as well, it also makes the three durable writes a new conversation costs aiops,
through aiops's own `Store` in DIR: the session, the user's message before the model is asked, the
answer after it (its raw stream as the text: no parsing). No engine, no turn, no events: the floor
of a proxy that must use the SDK *and* lose nothing on a restart.

    python -m benchmarks.relay --upstream http://127.0.0.1:PORT --port 0 [--sdk [--store DIR]]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import aiohttp
from aiohttp import web

UPSTREAM_KEY = web.AppKey("upstream", str)
CLIENT_KEY = web.AppKey("client", aiohttp.ClientSession)
SDK_KEY = web.AppKey("sdk", Any)
STORE_KEY = web.AppKey("store", Any)


async def relay(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    client = request.app[CLIENT_KEY]
    async with client.post(request.app[UPSTREAM_KEY] + "/v1/chat/completions", data=body,
                           headers={"Content-Type": "application/json"}) as up:
        if up.headers.get("Content-Type", "").startswith("text/event-stream"):
            resp = web.StreamResponse(status=up.status, headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            async for piece in up.content.iter_any():
                await resp.write(piece)
            await resp.write_eof()
            return resp
        return web.Response(body=await up.read(), status=up.status, content_type="application/json")


async def sdk_relay(request: web.Request) -> web.StreamResponse:
    import openai
    from openai._response import AsyncAPIResponse

    from aiops.engine.backends.openai_backend import _RAW_STREAM

    body = json.loads(await request.read())
    store = request.app.get(STORE_KEY)
    sid = ""
    if store is not None:
        from aiops.engine.types import Message

        # aiops's writes for a new conversation, in its order: the session and the question are
        # committed before the model is asked.
        sid = request.headers.get("X-Aiops-Session") or f"relay-{id(request):x}"
        await store.get_or_create_session(sid, "proxy", body.get("model"))
        await store.add_message(sid, Message(role="user", content=str(body["messages"][-1].get("content"))))
    try:
        # The backend's call (OpenAIBackend._open), to the letter.
        up = await request.app[SDK_KEY].post(
            "/chat/completions", cast_to=AsyncAPIResponse[bytes], body=body, stream=bool(body.get("stream")),
            stream_cls=openai.AsyncStream[Any], options={"headers": {_RAW_STREAM[0]: _RAW_STREAM[1]}})
    except openai.APIStatusError as e:
        return web.Response(body=e.response.content, status=e.status_code, content_type="application/json")
    if not body.get("stream"):
        data = await up.read()
        if store is not None:
            await _answer(store, sid, data)
        return web.Response(body=data, status=up.status_code, content_type="application/json")
    resp = web.StreamResponse(status=up.status_code, headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    pieces = []
    async for piece in up.iter_bytes():
        pieces.append(piece)
        await resp.write(piece)
    if store is not None:
        await _answer(store, sid, b"".join(pieces))
    await resp.write_eof()
    return resp


async def _answer(store: Any, sid: str, data: bytes) -> None:
    from aiops.engine.types import Message

    await store.add_message(sid, Message(role="assistant", content=data.decode(errors="replace")))


async def _serve(upstream: str, host: str, port: int, *, sdk: bool = False, store: str | None = None) -> None:
    app = web.Application()
    app[UPSTREAM_KEY] = upstream.rstrip("/")
    app.router.add_post("/v1/chat/completions", sdk_relay if sdk else relay)

    async def client_ctx(app: web.Application):  # type: ignore[no-untyped-def]
        app[CLIENT_KEY] = aiohttp.ClientSession()
        if sdk:
            import openai

            from aiops.engine.backends.openai_backend import http_client
            base = app[UPSTREAM_KEY] + "/v1"
            app[SDK_KEY] = openai.AsyncOpenAI(base_url=base, api_key="sk-bench", timeout=30, max_retries=0,
                                              http_client=http_client(base))
        if store is not None:
            from pathlib import Path

            from aiops.engine.store import Store

            Path(store).mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - once, before serving
            app[STORE_KEY] = Store(Path(store) / "aiops.db")
            await app[STORE_KEY].open()
        yield
        if store is not None:
            await app[STORE_KEY].close()
        await app[CLIENT_KEY].close()
        if sdk:
            await app[SDK_KEY].close()

    app.cleanup_ctx.append(client_ctx)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024)
    await site.start()
    print(f"{'sdk relay' if sdk else 'relay'} on http://{host}:{runner.addresses[0][1]}"
          f"{' with a store' if store else ''}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--upstream", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--sdk", action="store_true", help="forward through openai.AsyncOpenAI, as aiops's backend does")
    p.add_argument("--store", metavar="DIR",
                   help="with --sdk: also make a new conversation's three durable writes with aiops's Store in DIR")
    args = p.parse_args()
    if args.store and not args.sdk:
        p.error("--store needs --sdk")
    try:
        asyncio.run(_serve(args.upstream, args.host, args.port, sdk=args.sdk, store=args.store))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
