"""A bare aiohttp relay: the floor any Python proxy sits on, measured on the same machine.

It forwards `POST /v1/chat/completions` to the upstream with one pooled aiohttp client and copies
the response back, chunk by chunk for a stream. No parsing, no session, no storage: whatever it
adds over direct is the cost of one more aiohttp hop on this machine, which puts the proxy's
added latency in proportion.

    python -m benchmarks.relay --upstream http://127.0.0.1:PORT --port 0
"""

from __future__ import annotations

import argparse
import asyncio

import aiohttp
from aiohttp import web

UPSTREAM_KEY = web.AppKey("upstream", str)
CLIENT_KEY = web.AppKey("client", aiohttp.ClientSession)


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


async def _serve(upstream: str, host: str, port: int) -> None:
    app = web.Application()
    app[UPSTREAM_KEY] = upstream.rstrip("/")
    app.router.add_post("/v1/chat/completions", relay)

    async def client_ctx(app: web.Application):  # type: ignore[no-untyped-def]
        app[CLIENT_KEY] = aiohttp.ClientSession()
        yield
        await app[CLIENT_KEY].close()

    app.cleanup_ctx.append(client_ctx)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024)
    await site.start()
    print(f"relay on http://{host}:{runner.addresses[0][1]}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--upstream", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    try:
        asyncio.run(_serve(args.upstream, args.host, args.port))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
