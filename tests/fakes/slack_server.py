"""A fake Slack: the Web API methods the plugin uses and a Socket Mode websocket, on one port.

Unlike the fake model servers it runs on the test's own event loop (the plugin under test shares
it), so tests `await` its conditions directly:

    async with FakeSlack() as slack:          # or the `fake_slack` fixture
        ...                                    # point the plugin's api_url at slack.api_url
        await slack.wait_connected()
        env = await slack.send_event(slack.mention("U1", "hello"))
        await slack.wait_acked(env)
        reply = await slack.wait_for(lambda: slack.thread_texts("C1", ts)[-1:] == [...])

Web API (POST {api_url}METHOD, a bearer token as real Slack takes it): `auth.test`,
`apps.connections.open` (the app token; returns the ws:// URL of the socket below),
`chat.postMessage`, `chat.update`, `chat.postEphemeral`. A wrong token gets `invalid_auth`, as from
Slack. `rate_limit("chat.postMessage", 1, retry_after=1)` answers the next call 429.

Socket Mode (GET /socket): says `hello`, then sends what the test sends (`events_api` and
`interactive` envelopes) and records each acknowledgement (`{"envelope_id": ...}`) the app sends.
`drop()` closes the socket as Slack does when it refreshes a connection.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Self, TypeVar

from aiohttp import WSMsgType, web

BOT_TOKEN = "xoxb-fake-bot-token-123456"
APP_TOKEN = "xapp-fake-app-token-654321"
BOT_USER = "UBOT"
BOT_ID = "BBOT"
TEAM = "T0FAKE"

T = TypeVar("T")


@dataclass
class Posted:
    """A message the app posted (its current text and blocks, and every earlier version)."""

    channel: str
    ts: str
    thread_ts: str | None
    text: str
    blocks: list[dict[str, Any]]
    versions: list[str] = field(default_factory=list)  # texts before each chat.update
    block_versions: list[list[dict[str, Any]]] = field(default_factory=list)  # blocks before each
    ephemeral_to: str | None = None


@dataclass
class Call:
    method: str
    args: dict[str, Any]
    at: float  # time.monotonic()
    status: int


class FakeSlack:
    def __init__(self, *, bot_token: str = BOT_TOKEN, app_token: str = APP_TOKEN) -> None:
        self.bot_token = bot_token
        self.app_token = app_token
        self.calls: list[Call] = []
        self.messages: list[Posted] = []
        self.acks: dict[str, dict[str, Any]] = {}
        self.log: list[str] = []  # "ack ENV", "chat.postMessage TS", ... in arrival order
        self.connections = 0
        self._limits: dict[str, list[int]] = {}  # method -> [count left, retry_after]
        self._failures: dict[str, list[int]] = {}  # method -> [count left, status]
        self._ts = itertools.count(1)
        self._sockets: list[web.WebSocketResponse] = []
        self._changed = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self.port = 0

    # -- lifecycle --

    async def start(self) -> Self:
        app = web.Application()
        app.router.add_post("/api/{method}", self._api)
        app.router.add_get("/socket", self._socket)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        for ws in list(self._sockets):
            await ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/"

    # -- scripting --

    def rate_limit(self, method: str, times: int = 1, retry_after: int = 1) -> None:
        """Answer the next `times` calls of `method` with HTTP 429 and `Retry-After`."""
        self._limits[method] = [times, retry_after]

    def fail(self, method: str, times: int = 1, status: int = 503) -> None:
        """Answer the next `times` calls of `method` with an HTTP error (Slack having a bad moment)."""
        self._failures[method] = [times, status]

    def new_ts(self) -> str:
        return f"1700000000.{next(self._ts):06d}"

    def mention(self, user: str, text: str, *, channel: str = "C1", ts: str | None = None,
                thread_ts: str | None = None, kind: str = "app_mention") -> dict[str, Any]:
        """The event of a user's message that mentions the bot (`kind` "message" for its twin)."""
        ev: dict[str, Any] = {"type": kind, "user": user, "text": f"<@{BOT_USER}> {text}",
                              "channel": channel, "ts": ts or self.new_ts(), "channel_type": "channel"}
        if thread_ts:
            ev["thread_ts"] = thread_ts
        return ev

    def message(self, user: str, text: str, *, channel: str = "C1", ts: str | None = None,
                thread_ts: str | None = None, **extra: Any) -> dict[str, Any]:
        ev: dict[str, Any] = {"type": "message", "user": user, "text": text, "channel": channel,
                              "ts": ts or self.new_ts(),
                              "channel_type": "im" if channel.startswith("D") else "channel", **extra}
        if thread_ts:
            ev["thread_ts"] = thread_ts
        return ev

    async def send_event(self, event: dict[str, Any], *, event_id: str | None = None,
                         retry_attempt: int = 0) -> str:
        """Send an `events_api` envelope; its envelope id."""
        payload = {"token": "verification", "team_id": TEAM, "api_app_id": "A1", "type": "event_callback",
                   "event": event, "event_id": event_id or f"Ev{uuid.uuid4().hex[:10]}",
                   "event_time": int(time.time())}
        return await self._send({"type": "events_api", "payload": payload, "accepts_response_payload": False,
                                 "retry_attempt": retry_attempt, "retry_reason": "timeout" if retry_attempt else ""})

    async def press(self, user: str, message: Posted, action_id: str) -> str:
        """A user presses the button `action_id` of `message` (an `interactive` envelope). A button
        an update has since removed may still be pressed: a client that had not seen the update."""
        value = next(e["value"] for blocks in (message.blocks, *reversed(message.block_versions))
                     for b in blocks if b.get("type") == "actions"
                     for e in b["elements"] if e["action_id"] == action_id)
        payload = {"type": "block_actions", "user": {"id": user, "username": user.lower()},
                   "team": {"id": TEAM}, "channel": {"id": message.channel},
                   "container": {"type": "message", "message_ts": message.ts, "channel_id": message.channel,
                                 "thread_ts": message.thread_ts},
                   "message": {"ts": message.ts, "thread_ts": message.thread_ts, "text": message.text},
                   "actions": [{"action_id": action_id, "value": value, "type": "button",
                                "block_id": "b", "action_ts": str(time.time())}]}
        return await self._send({"type": "interactive", "payload": payload, "accepts_response_payload": False})

    async def _send(self, envelope: dict[str, Any]) -> str:
        envelope["envelope_id"] = envelope_id = uuid.uuid4().hex
        ws = await self.wait_for(lambda: next((s for s in reversed(self._sockets) if not s.closed), None),
                                 "an open socket")
        await ws.send_str(json.dumps(envelope))
        return envelope_id

    async def drop(self, *, announce: bool = True) -> None:
        """Close the open sockets: after a `disconnect` message, as Slack does before it refreshes a
        connection, or (`announce=False`) with a bare close frame, as when a server goes away."""
        for ws in list(self._sockets):
            if not ws.closed:
                if announce:
                    await ws.send_str(json.dumps({"type": "disconnect", "reason": "refresh_requested"}))
                await ws.close()

    # -- observing --

    async def wait_for(self, condition: Callable[[], T | None], what: str = "condition",
                       timeout: float = 10.0) -> T:
        """Wait until `condition()` is truthy (checked whenever the fake sees something); its value."""
        async def check() -> T:
            async with self._changed:
                while not (value := condition()):
                    await self._changed.wait()
                return value

        try:
            return await asyncio.wait_for(check(), timeout)
        except TimeoutError:
            raise AssertionError(f"timed out waiting for {what}; Slack saw: {self.log}") from None

    async def wait_connected(self, n: int = 1) -> None:
        await self.wait_for(lambda: self.connections >= n and any(not s.closed for s in self._sockets),
                            f"{n} socket connection(s)")

    async def wait_acked(self, envelope_id: str) -> dict[str, Any]:
        return await self.wait_for(lambda: self.acks.get(envelope_id), f"the ack of {envelope_id}")

    def thread(self, channel: str, thread_ts: str) -> list[Posted]:
        """The app's messages in a thread, in posting order (ephemeral ones left out)."""
        return [m for m in self.messages if m.channel == channel and m.thread_ts == thread_ts
                and m.ephemeral_to is None]

    def thread_texts(self, channel: str, thread_ts: str) -> list[str]:
        return [m.text for m in self.thread(channel, thread_ts)]

    def ephemerals(self, user: str) -> list[str]:
        return [m.text for m in self.messages if m.ephemeral_to == user]

    def calls_of(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # -- the Web API --

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        args: dict[str, Any] = dict(request.query)
        if request.content_type == "application/json":
            args.update(await request.json())
        else:
            args.update(await request.post())
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else str(args.pop("token", ""))
        status, body, headers = self._answer(method, token, args)
        self.calls.append(Call(method, args, time.monotonic(), status))
        if status == 200 and body.get("ok") and "ts" in body:
            self.log.append(f"{method} {body['ts']}")
        await self._notify()
        return web.json_response(body, status=status, headers=headers)

    def _answer(self, method: str, token: str, args: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        if (limit := self._limits.get(method)) and limit[0] > 0:
            limit[0] -= 1
            return 429, {"ok": False, "error": "ratelimited"}, {"Retry-After": str(limit[1])}
        if (failure := self._failures.get(method)) and failure[0] > 0:
            failure[0] -= 1
            return failure[1], {"ok": False, "error": "service_unavailable"}, {}
        wanted = self.app_token if method == "apps.connections.open" else self.bot_token
        if token != wanted:
            return 200, {"ok": False, "error": "invalid_auth"}, {}
        match method:
            case "auth.test":
                return 200, {"ok": True, "url": "https://fake.slack.com/", "team": "Fake Team", "user": "aiops",
                             "team_id": TEAM, "user_id": BOT_USER, "bot_id": BOT_ID}, {}
            case "apps.connections.open":
                return 200, {"ok": True, "url": f"ws://127.0.0.1:{self.port}/socket?ticket={uuid.uuid4().hex}"}, {}
            case "chat.postMessage" | "chat.postEphemeral":
                blocks = _blocks(args.get("blocks"))
                posted = Posted(str(args["channel"]), self.new_ts(), args.get("thread_ts"), str(args.get("text", "")),
                                blocks, ephemeral_to=args.get("user") if method == "chat.postEphemeral" else None)
                self.messages.append(posted)
                if method == "chat.postEphemeral":
                    return 200, {"ok": True, "message_ts": posted.ts}, {}
                return 200, {"ok": True, "channel": posted.channel, "ts": posted.ts,
                             "message": {"text": posted.text, "ts": posted.ts}}, {}
            case "chat.update":
                found = next((m for m in self.messages if m.ts == args.get("ts")
                              and m.channel == args.get("channel")), None)
                if found is None:
                    return 200, {"ok": False, "error": "message_not_found"}, {}
                found.versions.append(found.text)
                found.block_versions.append(found.blocks)
                found.text = str(args.get("text", ""))
                if "blocks" in args:
                    found.blocks = _blocks(args["blocks"])
                return 200, {"ok": True, "channel": found.channel, "ts": found.ts, "text": found.text}, {}
        return 200, {"ok": False, "error": "unknown_method"}, {}

    # -- Socket Mode --

    async def _socket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        self.connections += 1
        self._sockets.append(ws)
        self.log.append(f"connected {self.connections}")
        await ws.send_str(json.dumps({"type": "hello", "num_connections": 1,
                                      "connection_info": {"app_id": "A1"}}))
        await self._notify()
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                continue
            data = json.loads(msg.data)
            if "envelope_id" in data:
                self.acks[data["envelope_id"]] = data
                self.log.append(f"ack {data['envelope_id']}")
                await self._notify()
        await self._notify()
        return ws


def _blocks(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        value = json.loads(value) if value else []
    return list(value or [])
