"""The `slack` plugin: Socket Mode in, the Web API out, the engine's facade in between.

Start-up does not wait for Slack: `start` connects in the background and `report`s what it found
("connected as @bot", or the error auth.test gave for a bad token), so a Slack outage or a wrong
token never holds up the console or the server. The socket's reconnection (a dropped connection,
Slack's `disconnect` refresh, a stale ping) is slack-sdk's own.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from aiops.engine.commands import command_name, parse_input
from aiops.engine.engine import EngineError
from aiops.engine.plugins import Plugin, PluginAPI
from aiops.gates.broker import GateAlreadyResolved, GateError
from aiops.integrations.slack.gate_blocks import ACTIONS, who
from aiops.integrations.slack.intake import Seen, UserMessage, read_message
from aiops.integrations.slack.redact import sdk_logger
from aiops.integrations.slack.settings import SlackSettings

if TYPE_CHECKING:
    from slack_sdk.socket_mode.aiohttp import SocketModeClient
    from slack_sdk.socket_mode.async_client import AsyncBaseSocketModeClient
    from slack_sdk.socket_mode.request import SocketModeRequest

    from aiops.engine.facade import EngineFacade
    from aiops.integrations.slack.poster import Poster

# slack-sdk, the Web API poster and the Markdown parser are imported when the plugin starts: this
# module is loaded whenever plugins are discovered (every aiops start), Slack enabled or not.

log = logging.getLogger(__name__)

# The only commands a Slack user may run: the rest act beyond the thread (models, sessions, SQL).
SLACK_COMMANDS = ("help", "reset", "stop")
HELP = ("Mention me (or write to me directly) and I answer in the thread; each thread is one "
        "conversation. Commands here:\n"
        "• `!help`: this text\n"
        "• `!reset`: start this thread's conversation afresh\n"
        "• `!stop`: stop the answer being written\n"
        "Tool calls that need approval wait for an operator; the thread says what waits and who "
        "decided.")
NOT_PERMITTED = "not permitted here: from Slack only `!help`, `!reset` and `!stop` work"
USER_REFUSED = "Sorry, you are not on this agent's list of Slack users."
CHANNEL_REFUSED = "Sorry, this agent does not answer in this channel."
# How long `ready` (`aiops plugins`) waits for the first connection before it reports.
READY_SECONDS = 10.0
# Seconds between connection attempts while Slack cannot be reached.
CONNECT_BACKOFF = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
# How long a stop lets replies in flight finish (their turns are already stopped).
STOP_GRACE_SECONDS = 3.0


def _import_runtime() -> None:
    import importlib

    for module in ("slack_sdk.socket_mode.aiohttp", "aiops.integrations.slack.poster",
                   "aiops.integrations.slack.threads", "markdown_it", "markdown_it.tree"):
        importlib.import_module(module)


class SlackPlugin(Plugin):
    name = "slack"
    description = "the agent in Slack threads (Socket Mode); its gates answered from the console"
    settings_model: ClassVar[Any] = SlackSettings
    requires = ("slack_sdk", "aiohttp")

    def __init__(self) -> None:
        super().__init__()
        self.engine: EngineFacade | None = None
        self.poster: Poster | None = None
        self.socket: SocketModeClient | None = None
        self.bot_user_id = ""
        self._tokens: tuple[str, str] = ("", "")
        self._connected_note = ""
        self._connecting: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._events = Seen()  # event ids: Slack's redeliveries
        self._messages = Seen()  # channel:ts: one message as `message` and `app_mention`
        self._threads = Seen()  # sessions answered in lately (older ones: looked up in the store)

    @property
    def cfg(self) -> SlackSettings:
        return self.settings  # type: ignore[no-any-return]

    # ---- lifecycle ----

    async def setup(self, api: PluginAPI) -> None:
        self._tokens = self.cfg.tokens(api.env)  # PluginUnavailable names a missing one
        self.engine = api.engine

    async def start(self) -> None:
        self._report("connecting to Slack…")
        self._connecting = asyncio.get_running_loop().create_task(self._connect(), name="aiops-slack-connect")

    async def ready(self) -> None:
        if self._connecting is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._connecting), READY_SECONDS)
            except TimeoutError:
                pass  # still connecting: the note says so

    async def stop(self) -> None:
        if self._connecting is not None and not self._connecting.done():
            self._connecting.cancel()
            await asyncio.gather(self._connecting, return_exceptions=True)
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=STOP_GRACE_SECONDS)
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.socket is not None:
            await self.socket.close()
            self.socket = None

    def _report(self, note: str) -> None:
        if self.api is not None:
            self.api.report(note)

    def _delivery_failed(self, note: str) -> None:
        self._report(f"{self._connected_note}; {note}" if self._connected_note else note)

    async def _connect(self) -> None:
        """Check the tokens and open the socket. Slack unreachable (or having a bad moment) is
        retried with backoff for as long as aiops runs; a token Slack refuses is reported once."""
        # (In a thread: importing slack-sdk takes a while, and the loop serves the console meanwhile.)
        await asyncio.to_thread(_import_runtime)
        from slack_sdk.socket_mode.aiohttp import SocketModeClient

        from aiops.integrations.slack.poster import Poster, describe, transient, web_client

        app_token, bot_token = self._tokens
        cfg = self.cfg
        logger = sdk_logger(self._tokens)
        web = web_client(bot_token, cfg.api_url, logger)
        self.poster = Poster(web, self._delivery_failed)
        for attempt in itertools.count():
            failed = "auth.test"
            try:
                auth = await web.auth_test()
                failed = "apps.connections.open"
                url = str((await web.apps_connections_open(app_token=app_token))["url"])
                break
            except Exception as e:  # noqa: BLE001 - reported; the rest of aiops runs on
                if not transient(e):
                    check = (f"check {cfg.bot_token_env}" if failed == "auth.test" else
                             f"check {cfg.app_token_env} and that Socket Mode is on for the app")
                    return self._fail(f"{failed} failed: {describe(e)}: {check}")
                delay = CONNECT_BACKOFF[min(attempt, len(CONNECT_BACKOFF) - 1)]
                note = f"cannot reach Slack at {cfg.api_url} ({failed}: {describe(e)}); retrying in {delay:g}s"
                log.warning("slack: %s", note)
                self._report(note)
                await asyncio.sleep(delay)
        self.bot_user_id = str(auth.get("user_id") or "")
        bot = f"@{auth.get('user') or self.bot_user_id}"
        socket = SocketModeClient(app_token=app_token, web_client=web, logger=logger)
        socket.socket_mode_request_listeners.append(self._on_request)
        socket.message_listeners.append(self._on_message)
        socket.on_close_listeners.append(self._on_close)
        socket.wss_uri = url  # the URL just issued: connect() uses it rather than asking again
        self.socket = socket
        await socket.connect()
        self._connected_note = f"connected as {bot} ({auth.get('team') or auth.get('team_id') or 'Slack'})"
        self._report(self._connected_note)
        log.info("slack: %s", self._connected_note)

    def _fail(self, note: str) -> None:
        log.error("slack: %s", note)
        self._report(note)

    # ---- the socket ----

    async def _on_request(self, client: AsyncBaseSocketModeClient, req: SocketModeRequest) -> None:
        # Acknowledged first, at once: Slack redelivers what is not acknowledged within 3 s.
        await client.send_socket_mode_response({"envelope_id": req.envelope_id})
        if req.type == "events_api":
            self._spawn(self._on_event(req.payload))
        elif req.type == "interactive":
            self._spawn(self._on_interactive(req.payload))

    async def _on_message(self, client: AsyncBaseSocketModeClient, message: dict[str, Any],
                          raw: str | None) -> None:
        if message.get("type") == "hello" and self._connected_note:
            self._report(self._connected_note)  # (again, after a reconnection)

    async def _on_close(self, message: Any) -> None:
        # The SDK calls this after its reconnection attempt: only a socket still down is news.
        if self._connected_note and self.socket is not None and not await self.socket.is_connected():
            self._report("connection to Slack lost: reconnecting…")

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("slack: handling an event failed", exc_info=task.exception())

    # ---- messages ----

    async def _on_event(self, payload: Mapping[str, Any]) -> None:
        event_id = payload.get("event_id")
        if isinstance(event_id, str) and not self._events.add(event_id):
            return  # a redelivery
        event = payload.get("event")
        msg = read_message(event, self.bot_user_id) if isinstance(event, Mapping) else None
        if msg is None or not await self._addressed(msg):
            return
        if not self._messages.add(f"{msg.channel}:{msg.ts}"):
            return  # the same message as the other event type
        assert self.poster is not None
        if not self.cfg.channel_allowed(msg.channel):
            await self.poster.post(msg.channel, msg.thread_ts, CHANNEL_REFUSED)
            return
        if not self.cfg.user_allowed(msg.user):
            await self.poster.post(msg.channel, msg.thread_ts, USER_REFUSED)
            return
        await self._answer(msg)

    async def _addressed(self, msg: UserMessage) -> bool:
        """Whether the agent answers `msg`: a DM, a mention, a message in a thread it is in, or
        any channel message when `channel_messages` is on."""
        if msg.direct or msg.mentioned or self.cfg.channel_messages:
            return True
        if not msg.in_thread:
            return False
        if msg.session_id in self._threads:
            return True
        assert self.engine is not None
        try:
            return bool(await self.engine.history(msg.session_id, limit=1))
        except EngineError:
            return False  # no such session: a thread the agent is not part of

    async def _answer(self, msg: UserMessage) -> None:
        assert self.engine is not None and self.poster is not None
        text = msg.text
        names = [command_name(line) for line in parse_input(text).commands]
        if any(n not in SLACK_COMMANDS for n in names):
            await self.poster.post(msg.channel, msg.thread_ts, NOT_PERMITTED)
            return
        if "help" in names:
            # Our own help: the engine's lists commands a Slack user may not run.
            await self.poster.post(msg.channel, msg.thread_ts, HELP)
            text = "\n".join(line for line in text.splitlines()
                             if not (line.lstrip().startswith("!") and command_name(line) == "help"))
        if not text.strip():
            if not names:  # a bare mention: say what the agent does
                await self.poster.post(msg.channel, msg.thread_ts, HELP)
            return
        self._threads.add(msg.session_id)
        if names and not parse_input(text).text:
            await self._run_commands(msg, text)
            return
        from aiops.integrations.slack.threads import ThreadTurn

        await ThreadTurn(self.engine, self.poster, msg, buttons=bool(self.cfg.approvers)).run(text)

    async def _run_commands(self, msg: UserMessage, text: str) -> None:
        """`!reset`, `!stop`: they run at once, even while the thread's turn runs."""
        assert self.engine is not None and self.poster is not None
        try:
            handle = await self.engine.submit(msg.session_id, text, kind="slack")
            result = await handle.wait()
            answer = str(getattr(result, "text", "")) or "done"
        except EngineError as e:
            answer = f"error: {e}"
        await self.poster.post(msg.channel, msg.thread_ts, answer)

    # ---- buttons ----

    async def _on_interactive(self, payload: Mapping[str, Any]) -> None:
        if payload.get("type") != "block_actions":
            return
        assert self.engine is not None and self.poster is not None
        user = str((payload.get("user") or {}).get("id") or "")
        channel = str((payload.get("channel") or {}).get("id") or "")
        container = payload.get("container") or {}
        thread_ts = container.get("thread_ts") or (payload.get("message") or {}).get("thread_ts")
        for action in payload.get("actions") or ():
            decision = ACTIONS.get(str(action.get("action_id")))
            gate_id = str(action.get("value") or "")
            if decision is None or not gate_id:
                continue
            if user not in self.cfg.approvers:
                await self.poster.ephemeral(channel, user, "You are not one of this agent's approvers: an "
                                            "operator answers this in the aiops console.", thread_ts)
                continue
            pending = {g.id: g for g in self.engine.pending_gates()}
            gate = pending.get(gate_id)
            if gate is not None and not gate.session_id.startswith(f"slack-{channel}-"):
                # Buttons answer the gates of their own channel's threads only.
                await self.poster.ephemeral(channel, user, "That gate is not this channel's.", thread_ts)
                continue
            try:
                self.engine.resolve_gate(gate_id, decision, "once", by=f"slack:{user}")
            except GateAlreadyResolved as e:
                await self.poster.ephemeral(
                    channel, user, f"Already answered: {e.resolution.decision} by {who(e.resolution.by)}.",
                    thread_ts)
            except GateError:
                await self.poster.ephemeral(channel, user, "That gate is no longer waiting.", thread_ts)
