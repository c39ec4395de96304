"""aiops as an MCP server: the real `mcp` SDK Client against our /mcp endpoint.

The server runs in-process (engine + HTTP server on the test's loop, model on the fake OpenAI
server) with an operator token and two client tokens.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import mcp_types as mt
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ResourceUpdated
from pydantic import BaseModel

from aiops.engine.plugins import Plugin, PluginAPI, PluginSettings
from aiops.engine.tools import Tool, ToolContext
from aiops.integrations.mcp.host import McpPlugin
from tests.fakes.openai_server import Reply
from tests.support.server import ApiServer, Tokens


class NoteArgs(BaseModel):
    text: str


class NotesPlugin(Plugin):
    """`write_note`: a write tool, so a call of it opens a gate."""

    name = "notes"
    settings_model = PluginSettings

    def __init__(self) -> None:
        super().__init__()
        self.written: list[str] = []

    async def setup(self, api: PluginAPI) -> None:
        async def write_note(args: NoteArgs, ctx: ToolContext) -> str:
            self.written.append(args.text)
            return "noted"

        api.register_tool(Tool("write_note", "Write a note", NoteArgs, "notes", write_note, operation="write"))


TOKENS = Tokens.make(ops="operator", bot="client", other="client")


@pytest.fixture
async def served(api_server_factory) -> tuple[ApiServer, NotesPlugin]:
    plugin = NotesPlugin()
    srv = await api_server_factory(tokens=TOKENS, plugins=[plugin], server={"mcp_port": 0},
                                   extra_files={"plugins.toml": "[mysql]\nenabled = false\n[notes]\nenabled = true\n",
                                                "gates.toml": "[wait]\nmcp = 0\n"})
    return srv, plugin


def mcp_url(srv: ApiServer) -> str:
    assert srv.handle.mcp is not None
    return srv.handle.mcp.url


@asynccontextmanager
async def connect(srv: ApiServer, token: str, **kw) -> AsyncIterator[Client]:
    async with create_mcp_http_client(headers=TOKENS.header(token)) as http:
        async with Client(streamable_http_client(mcp_url(srv), http_client=http), **kw) as client:
            yield client


def text_of(result) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


async def test_health_says_where_mcp_is(served):
    srv, _ = served
    async with aiohttp.ClientSession() as s, s.get(srv.url + "/api/v1/health") as r:
        body = await r.json()
    assert body["mcp"]["endpoint"]["url"] == mcp_url(srv)
    assert "servers" not in body["mcp"]  # the external servers' state is for operators


async def test_a_request_without_a_valid_token_is_refused(served):
    srv, _ = served
    async with aiohttp.ClientSession() as s:
        async with s.post(mcp_url(srv), json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}) as r:
            assert r.status == 401
        async with s.post(mcp_url(srv), json={}, headers={"Authorization": "Bearer nope"}) as r:
            assert r.status == 401


async def test_client_sends_a_message_and_lists_only_its_sessions(served):
    srv, _ = served
    srv.fake.script(Reply.text("hello from the agent"))
    async with connect(srv, "bot") as bot:
        tools = {t.name for t in (await bot.list_tools()).tools}
        assert {"send_message", "list_sessions", "approve_gate", "deny_gate"} <= tools
        # Only commands: answered, and no session is made or named (issue 21).
        helped = json.loads(text_of(await bot.call_tool("send_message", {"text": "!help"})))
        assert "Commands:" in helped["text"] and helped["session"] is None
        assert json.loads(text_of(await bot.call_tool("list_sessions", {}))) == []
        answer = json.loads(text_of(await bot.call_tool("send_message", {"text": "hi"})))
        assert answer["text"] == "hello from the agent" and answer["status"] == "complete"
        sid = answer["session"]
        mine = json.loads(text_of(await bot.call_tool("list_sessions", {})))
        assert [s["client_id"] for s in mine] == [sid]
        read = await bot.read_resource(f"aiops://sessions/{sid}")
        history = json.loads(read.contents[0].text)
        assert [m["content"] for m in history["messages"] if m["role"] in ("user", "assistant")] == \
            ["hi", "hello from the agent"]
    async with connect(srv, "other") as other:
        assert json.loads(text_of(await other.call_tool("list_sessions", {}))) == []
        with pytest.raises(MCPError) as e:
            await other.read_resource(f"aiops://sessions/{sid}")
        assert e.value.error.code == -32950 and e.value.error.data == {"decision": "deny_abort"}
        with pytest.raises(MCPError):
            await other.read_resource("aiops://policy")
        with pytest.raises(MCPError) as e:
            await other.call_tool("send_message", {"text": "let me in", "session": sid})
        assert e.value.error.code == -32950
    async with connect(srv, "ops") as ops:
        every = json.loads(text_of(await ops.call_tool("list_sessions", {})))
        assert sid in [s["client_id"] for s in every]
        policy = json.loads((await ops.read_resource("aiops://policy")).contents[0].text)
        assert policy["gates"]["wait"]["mcp"] == 0


async def test_the_tools_say_which_only_read_as_a_client_lists_them(served):
    """A client honouring annotations (another aiops: a read-only tool is a read for its gates) need
    not ask before list_sessions, and should before the others, which change something."""
    srv, _ = served
    async with connect(srv, "bot") as bot:
        listed = {t.name: t.annotations for t in (await bot.list_tools()).tools}
    hints = {name: (a.read_only_hint, a.destructive_hint, a.idempotent_hint) if a else None
             for name, a in listed.items()}
    assert hints == {
        "list_sessions": (True, None, None),
        "send_message": (False, True, False),  # runs a turn, whose tools may write
        "approve_gate": (False, True, True),  # lets a held-back call run
        "deny_gate": (False, False, True),  # keeps a call from running, undoes nothing
    }


async def test_gate_notification_reaches_the_operator_who_approves_it_and_a_client_token_is_refused(served):
    srv, plugin = served
    srv.fake.script(Reply.tool_calls(("write_note", {"text": "remember the milk"})), Reply.text("noted it"))
    async with connect(srv, "ops") as ops, connect(srv, "bot") as bot, connect(srv, "other") as other:
        async with ops.listen(resource_subscriptions=["aiops://gates/pending"]) as ops_events, \
                other.listen(resource_subscriptions=["aiops://gates/pending"]) as other_events:
            sending = asyncio.create_task(bot.call_tool("send_message", {"text": "note it"}))
            async with asyncio.timeout(20):
                event = await anext(aiter(ops_events))
            assert isinstance(event, ResourceUpdated) and event.uri == "aiops://gates/pending"
            pending = json.loads((await ops.read_resource("aiops://gates/pending")).contents[0].text)
            assert len(pending) == 1 and pending[0]["tool"] == "write_note"
            gate_id = pending[0]["id"]
            # The bot sees its own session's gate, the other client token nothing.
            own = json.loads((await bot.read_resource("aiops://gates/pending")).contents[0].text)
            assert [g["id"] for g in own] == [gate_id]
            assert json.loads((await other.read_resource("aiops://gates/pending")).contents[0].text) == []
            with pytest.raises(MCPError) as e:
                await bot.call_tool("approve_gate", {"id": gate_id})
            assert e.value.error.code == -32950 and e.value.error.data["decision"] == "deny_abort"
            assert plugin.written == []
            approved = json.loads(text_of(await ops.call_tool("approve_gate", {"id": gate_id})))
            assert approved["decision"] == "approved" and approved["by"] == "mcp:ops"
            answer = json.loads(text_of(await asyncio.wait_for(sending, 20)))
            assert answer["text"] == "noted it" and plugin.written == ["remember the milk"]
            # The other client token heard nothing of another caller's gate.
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.5):
                    await anext(aiter(other_events))
    audit = await srv.engine.store.audit()
    assert ("gate_resolved", "approved", "mcp:ops") in [(a.event, a.decision, a.actor) for a in audit]


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")  # legacy on purpose
async def test_legacy_resources_subscribe_clients_hear_only_what_they_may_read(served):
    """A handshake-era client (`resources/subscribe`, notifications on its standing stream)."""
    srv, _ = served
    heard: dict[str, asyncio.Queue[str]] = {"ops": asyncio.Queue(), "bot": asyncio.Queue(),
                                            "other": asyncio.Queue()}

    def handler(name: str):
        async def on_message(message) -> None:
            if isinstance(message, mt.ResourceUpdatedNotification):
                heard[name].put_nowait(str(message.params.uri))
        return on_message

    srv.fake.script(Reply.text("first"), Reply.text("second"))
    async with connect(srv, "ops", mode="legacy", message_handler=handler("ops")) as ops, \
            connect(srv, "bot", mode="legacy", message_handler=handler("bot")) as bot, \
            connect(srv, "other", mode="legacy", message_handler=handler("other")) as other:
        sid = json.loads(text_of(await bot.call_tool("send_message", {"text": "one"})))["session"]
        uri = f"aiops://sessions/{sid}"
        await bot.subscribe_resource(uri)
        await ops.subscribe_resource(uri)
        for forbidden in (uri, "aiops://gates/history"):
            with pytest.raises(MCPError) as e:
                await other.subscribe_resource(forbidden)
            assert e.value.error.code == -32950
        await other.subscribe_resource("aiops://gates/pending")  # its own sessions' gates: none here
        await bot.call_tool("send_message", {"text": "two", "session": sid})
        async with asyncio.timeout(20):
            assert await heard["bot"].get() == uri
            assert await heard["ops"].get() == uri
    assert heard["other"].empty()


async def test_without_tokens_loopback_callers_are_operators_and_other_host_names_are_refused(
        api_server_factory):
    srv = await api_server_factory(server={"mcp_port": 0})
    async with Client(mcp_url(srv)) as client:  # no token at all
        policy = json.loads((await client.read_resource("aiops://policy")).contents[0].text)
        assert "gates" in policy
    # A page that points its own name at 127.0.0.1 (DNS rebinding) is not a loopback caller.
    async with aiohttp.ClientSession() as s:
        async with s.post(mcp_url(srv), json={}, headers={"Host": "attacker.example:80"}) as r:
            assert r.status == 403
        async with s.post(mcp_url(srv), json={}, headers={"Origin": "https://attacker.example"}) as r:
            assert r.status == 403


async def test_health_shows_a_failing_mcp_server_with_its_stderr_to_operators_only(api_server_factory, tmp_path):
    script = tmp_path / "crash.py"
    script.write_text("import sys\nprint('fatal: no such index /srv/idx', file=sys.stderr)\nsys.exit(1)\n")
    mcp_toml = (f"retry_first_seconds = 5\n[servers.idx]\ncommand = {json.dumps(sys.executable)}\n"
                f"args = [{json.dumps(str(script))}]\n")
    host = McpPlugin()
    srv = await api_server_factory(tokens=TOKENS, plugins=[host], server={"mcp_port": 0},
                                   extra_files={"plugins.toml": "[mysql]\nenabled = false\n[mcp]\nenabled = true\n",
                                                "mcp.toml": mcp_toml})
    await host.ready()
    async with aiohttp.ClientSession() as s:
        async with s.get(srv.url + "/api/v1/health", headers=TOKENS.header("ops")) as r:
            ops_view = (await r.json())["mcp"]
        async with s.get(srv.url + "/api/v1/health", headers=TOKENS.header("bot")) as r:
            bot_view = (await r.json())["mcp"]
    (idx,) = ops_view["servers"]
    assert idx["name"] == "idx" and idx["state"] == "failed"
    assert "fatal: no such index /srv/idx" in idx["stderr_tail"]
    assert "servers" not in bot_view and bot_view["endpoint"]["url"] == mcp_url(srv)
