"""The aiops API over real HTTP: submit, stream, sessions, gates, health, OpenAPI, AgentClient,
`aiops attach`, and `aiops serve` as a subprocess."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from pydantic import BaseModel

import aiops
from aiops.client import AgentClient, AgentError, EventStream
from aiops.config import SHIPPED_CONFIG_DIR
from aiops.engine.events import CONTRACT_EVENTS
from aiops.engine.plugins import Plugin, PluginAPI
from aiops.engine.tools import Tool, ToolContext, ToolOutput
from aiops.engine.types import SessionKey
from aiops.integrations.remote import RemoteEngine
from aiops.integrations.server.api import CLIENT_ID_PATTERN, ROUTES
from tests.fakes.fixtures import openai_model_entry
from tests.fakes.openai_server import FakeOpenAI, Reply, call_tool_when, split_text
from tests.support.plugins import SlowStopPlugin
from tests.support.server import ApiServer, ApiServerFactory, ServeFactory, ServeProcess, Tokens, clean_env

# ---- helpers -------------------------------------------------------------------------------------------


async def events_until_done(stream: EventStream, turn_id: str | None = None,
                            timeout: float = 30.0) -> list[dict[str, Any]]:
    """Every event of the stream up to (and including) the `done` of `turn_id` (any turn if None)."""
    seen: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout):
        async for e in stream:
            seen.append(e)
            if e["event"] == "done" and (turn_id is None or e["data"].get("turn_id") == turn_id):
                return seen
    raise AssertionError(f"the stream ended before done; got {[e['event'] for e in seen]}")


async def events_until_tok(stream: EventStream, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Every event of the stream up to (and including) the first `tok`."""
    seen: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout):
        async for e in stream:
            seen.append(e)
            if e["event"] == "tok":
                return seen
    raise AssertionError(f"the stream ended before a tok; got {[e['event'] for e in seen]}")


async def next_event(stream: EventStream, name: str, timeout: float = 30.0) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        async for e in stream:
            if e["event"] == name:
                return e
    raise AssertionError(f"the stream ended before a {name!r} event")


class NoteArgs(BaseModel):
    text: str


class NotesPlugin(Plugin):
    """A tiny write tool: gates.toml's defaults make every call to it ask an operator."""

    name = "notes"

    def __init__(self) -> None:
        super().__init__()
        self.written: list[str] = []

    async def setup(self, api: PluginAPI) -> None:
        async def write_note(args: NoteArgs, ctx: ToolContext) -> str:
            self.written.append(args.text)
            return f"wrote {args.text!r}"

        api.register_tool(Tool("write_note", "Write a note", NoteArgs, "notes", write_note, operation="write"))


NOTES_ENABLED = {"plugins.toml": "[notes]\nenabled = true\n"}


async def gated_server(factory: ApiServerFactory, **kw: Any) -> tuple[ApiServer, NotesPlugin, Tokens]:
    plugin = NotesPlugin()
    tokens = Tokens.make(ops="operator", bot="client")
    srv = await factory(tokens=tokens, plugins=[plugin], extra_files=NOTES_ENABLED, **kw)
    return srv, plugin, tokens


# ---- submit and stream ---------------------------------------------------------------------------------


async def test_async_submit_then_the_stream_carries_tok_to_done_in_order(api_server: ApiServer) -> None:
    api_server.fake.script(Reply.text("hello from the agent", chunks=4))
    async with api_server.client() as agent, agent.stream("api-order") as stream:
        accepted = await agent.submit("hi", client_id="api-order")
        assert accepted["status"] == "accepted" and accepted["client_id"] == "api-order"
        events = await events_until_done(stream, accepted["turn_id"])

    names = [e["event"] for e in events]
    assert set(names) <= CONTRACT_EVENTS, names
    assert names[-1] == "done" and "tok" in names
    assert names.index("tok") < names.index("done")
    toks = [e["data"]["text"] for e in events if e["event"] == "tok"]
    assert "".join(toks) == "hello from the agent"
    done = events[-1]["data"]
    assert done["status"] == "complete" and done["text"] == "hello from the agent"
    assert all(e["data"]["session_id"] == "api-order" for e in events)
    assert all(e["data"]["turn_id"] == accepted["turn_id"] for e in events)



async def test_submit_with_wait_answers_with_the_text_and_creates_an_api_session(api_server: ApiServer) -> None:
    api_server.fake.script(Reply.text("forty-two", usage=(12, 3)))
    async with aiohttp.ClientSession() as http:
        async with http.post(api_server.url + "/api/v1/submit", json={"text": "the answer?", "wait": True}) as r:
            assert r.status == 200
            body = await r.json()
    assert body["status"] == "complete" and body["text"] == "forty-two"
    assert body["usage"] == {"prompt_tokens": 12, "completion_tokens": 3}  # the model's own counts
    assert re.fullmatch(r"api-[0-9a-f]{8}", body["client_id"]), body
    assert body["turn_id"].startswith("turn_")
    async with api_server.client() as agent:
        listed = await agent.sessions()
    assert [(s["client_id"], s["kind"]) for s in listed] == [(body["client_id"], "api")]


async def test_a_client_may_say_it_is_the_cli_and_its_session_is_a_cli_session(api_server: ApiServer) -> None:
    # `aiops chat` through a running aiops: its sessions are `cli` sessions, as in-process ones are.
    api_server.fake.script(Reply.text("from the cli"))
    async with aiohttp.ClientSession() as http:
        async with http.post(api_server.url + "/api/v1/submit",
                             json={"text": "hi", "client_id": "chat-1", "kind": "cli", "wait": True}) as r:
            assert r.status == 200, await r.text()
            assert (await r.json())["text"] == "from the cli"
    async with api_server.client() as agent:
        assert [(s["client_id"], s["kind"]) for s in await agent.sessions()] == [("chat-1", "cli")]
        assert [s["client_id"] for s in await agent.sessions(kind="cli")] == ["chat-1"]


async def test_an_operator_may_start_a_console_session_and_a_client_token_may_not(
        api_server_factory: ApiServerFactory) -> None:
    # An attached console's sessions are the operator's console sessions, as the in-process console's are.
    tokens = Tokens.make(ops="operator", bot="client")
    srv = await api_server_factory(tokens=tokens)
    srv.fake.script(Reply.text("from the console"))
    async with aiohttp.ClientSession() as http:
        async with http.post(srv.url + "/api/v1/submit", headers=tokens.header("bot"),
                             json={"text": "hi", "client_id": "bot-console", "kind": "console"}) as r:
            assert r.status == 403, await r.text()
            assert "operator" in (await r.json())["error"]["message"]
        async with http.post(srv.url + "/api/v1/submit", headers=tokens.header("ops"),
                             json={"text": "hi", "client_id": "ops-console", "kind": "console",
                                   "wait": True}) as r:
            assert r.status == 200, await r.text()
            assert (await r.json())["text"] == "from the console"
        async with http.get(srv.url + "/api/v1/sessions", headers=tokens.header("ops")) as r:
            rows = (await r.json())["sessions"]
    assert [(s["client_id"], s["kind"]) for s in rows] == [("ops-console", "console")]


async def test_a_client_may_not_claim_a_kind_the_server_assigns(api_server: ApiServer) -> None:
    # The proxies, Slack, swarm and MCP are what the server says they are, never a client.
    async with aiohttp.ClientSession() as http:
        for kind in ("proxy", "swarm", "mcp", "slack", "CLI", "", 1, None):
            async with http.post(api_server.url + "/api/v1/submit",
                                 json={"text": "hi", "client_id": "claims", "kind": kind}) as r:
                assert r.status == 400, (kind, await r.text())
                err = (await r.json())["error"]
                assert err["message"].startswith("invalid request: kind: "), err
    async with api_server.client() as agent:
        assert await agent.sessions() == []  # nothing was taken in


async def test_an_answer_cut_at_the_models_output_limit_says_so(api_server: ApiServer) -> None:
    api_server.fake.script(Reply.text("Steps one to", finish_reason="length"))
    async with api_server.client() as agent, agent.stream("api-cut-short") as stream:
        reply = await agent.send("all steps", client_id="api-cut-short")
        done = (await next_event(stream, "done"))["data"]
        assert (reply["status"], reply["text"], reply["finish_reason"]) == ("complete", "Steps one to", "length")
        assert done["finish_reason"] == "length"
        assert "finish_reason" not in await agent.send("a natural end", client_id="api-cut-short")
        # The same result shape when the client answers the turn's gates itself.
        api_server.fake.script(Reply.text("Steps one to", finish_reason="length"))
        policed = await agent.send("all steps", client_id="api-cut-short", policy=lambda g: "approve")
        assert (policed["status"], policed["text"], policed["finish_reason"]) == ("complete", "Steps one to", "length")


async def test_a_lone_surrogate_from_the_model_is_replaced_not_a_cut_stream(api_server: ApiServer) -> None:
    """JSON may carry a lone UTF-16 surrogate (`"\\ud800"`); one in a model's text, thinking or
    tool call cut every stream of the session and failed the turn when it was recorded."""
    api_server.fake.script(
        Reply.tool_calls(("no\ud800such_tool", {"q": "x\udfffy"}), thinking="hm \udc00", chunks=1),
        Reply.text("hi \ud800 there", chunks=1))
    async with api_server.client() as agent, agent.stream("api-surrogate") as stream:
        reply = await agent.send("say it", client_id="api-surrogate")
        events = await events_until_done(stream)
        assert (reply["status"], reply["text"]) == ("complete", "hi \ufffd there")
        assert "".join(e["data"]["text"] for e in events if e["event"] == "tok") == "hi \ufffd there"
        assert [e["data"]["text"] for e in events if e["event"] == "thinking"] == ["hm \ufffd"]
        [call] = [e["data"] for e in events if e["event"] == "tool_call"]
        assert (call["name"], call["arguments"]) == ("no\ufffdsuch_tool", {"q": "x\ufffdy"})
        history = await agent.history("api-surrogate")
    assert [m["content"] for m in history if m["role"] == "assistant"][-1] == "hi \ufffd there"
    # The model was told of the unknown tool, by its (replaced) name.
    assert any(m["role"] == "tool" and "no\ufffdsuch_tool" in m["content"] for m in history)


async def test_submit_wait_times_out_and_the_turn_goes_on(api_server: ApiServer) -> None:
    api_server.fake.script(Reply.hang())
    async with api_server.client() as agent:
        got = await agent.send("slow one", client_id="api-slow", timeout=0.2)
        assert got["status"] == "timeout" and got["text"] == ""
        assert (await agent.session("api-slow"))["session"]["state"] == "running"
        assert (await agent.stop("api-slow"))["stopped"] is True


async def test_a_model_can_be_chosen_and_unknown_or_disabled_models_are_refused(
        api_server_factory: ApiServerFactory, fake_openai: Any) -> None:
    srv = await api_server_factory(models={
        "local": openai_model_entry(fake_openai),
        "other": openai_model_entry(fake_openai, "other-model"),
        "off": openai_model_entry(fake_openai, "off-model", enabled=False),
    })
    srv.fake.script(Reply.text("from other"))
    async with srv.client() as agent:
        got = await agent.send("hi", client_id="api-m", model="other")
        assert got["text"] == "from other"
        assert srv.fake.last_request.json["model"] == "other-model"
        with pytest.raises(AgentError) as e:
            await agent.submit("hi", model="nope")
        assert (e.value.status, e.value.code) == (400, "unknown_model")
        assert "'nope'" in e.value.message
        with pytest.raises(AgentError) as e:
            await agent.submit("hi", model="off")
        assert (e.value.status, e.value.code) == (400, "model_disabled")
    assert len(srv.fake.requests) == 1


async def test_commands_go_through_submit(api_server: ApiServer) -> None:
    async with api_server.client() as agent:
        got = await agent.send("!help", client_id="api-cmd")
    assert got["status"] == "complete"
    assert "!stop" in got["text"] and "!model" in got["text"]
    assert api_server.fake.requests == []  # a command is not a model call


async def test_a_message_that_runs_no_model_is_answered_at_once_in_the_shape_of_any_turn(
        api_server: ApiServer) -> None:
    async with api_server.client() as agent:
        # No session, no wait: the answer is in the reply (no stream could have had it), and no
        # session id: one made up for it would be a 404 from then on (issue 21).
        got = await agent.submit("!help")
        assert got["status"] == "complete" and "!stop" in got["text"]
        assert "client_id" in got and got["client_id"] is None
        named = await agent.submit("!help", client_id="api-later")
        assert named["status"] == "complete" and named["client_id"] is None
        assert await agent.sessions() == []
        with pytest.raises(AgentError) as e:
            await agent.session("api-later")
        assert e.value.status == 404
        # Nor does a message asking for a model that is refused.
        refused_new = await agent.submit("@nope hi", client_id="api-never")
        assert refused_new["status"] == "error" and "nope" in refused_new["error"]["message"]
        assert refused_new["client_id"] is None
        assert await agent.sessions() == []
        # A refused @model: the reply's error object is the done event's.
        assert (await agent.send("hello", client_id="api-cmds"))["status"] == "complete"
        async with agent.stream("api-cmds") as events:
            refused = await agent.send("@nope hi", client_id="api-cmds")
            done = (await events_until_done(events, refused["turn_id"]))[-1]["data"]
            accepted = await agent.submit("!model local", client_id="api-cmds")
            switched = (await events_until_done(events, accepted["turn_id"]))[-1]["data"]
    assert refused["status"] == "error" and refused["error"]["code"] == "bad_request"
    assert "nope" in refused["error"]["message"]
    assert (done["status"], done["error"], done["command"]) == ("error", refused["error"], True)
    assert done["model"] == "local"  # the session's model, as any turn's done names it
    assert accepted["status"] == "complete" and switched["model"] == "local" and switched["command"] is True
    assert accepted["client_id"] == "api-cmds"  # a session that exists is named, commands or not


async def test_a_message_of_commands_one_of_which_failed_answers_error_with_every_commands_output(
        api_server: ApiServer) -> None:
    async with api_server.client() as agent:
        assert (await agent.send("hello", client_id="api-bad-cmd"))["status"] == "complete"
        async with agent.stream("api-bad-cmd") as events:
            got = await agent.submit("!help\n!model nope", client_id="api-bad-cmd")
            done = (await events_until_done(events, got["turn_id"]))[-1]["data"]
        # Every command ran and said its piece; the one that failed makes the message fail, in the
        # reply as in the `done` event, with the failed command's own output as the message.
        assert got["status"] == "error" and got["error"]["code"] == "command_failed"
        assert "unknown model 'nope'" in got["error"]["message"] and "!stop" not in got["error"]["message"]
        assert "!stop" in got["text"] and "unknown model 'nope'" in got["text"]
        assert (done["status"], done["error"], done["command"]) == ("error", got["error"], True)
        # Commands that all worked still answer `complete`.
        assert (await agent.submit("!help", client_id="api-bad-cmd"))["status"] == "complete"


def merged_toks(events: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """(event, data) with consecutive `tok` deltas joined: deltas still queued for a reader are
    merged, so where one reader's tok ends and the next begins depends on how fast it reads."""
    out: list[tuple[str, Any]] = []
    for e in events:
        if e["event"] == "tok" and out and out[-1][0] == "tok":
            out[-1] = ("tok", {**e["data"], "text": out[-1][1]["text"] + e["data"]["text"]})
        else:
            out.append((e["event"], e["data"]))
    return out


async def test_two_readers_of_one_session_each_get_every_event(api_server: ApiServer) -> None:
    # The answer is held at the fake after its first piece (frame 0 is the role) until both readers
    # have it: each then sees the answer stream (a tok, then more), however loaded the machine.
    api_server.fake.script(Reply.text("one two three four five six seven eight nine ten eleven", chunks=6)
                           .with_(hold_after=2))
    assert api_server.handle.connected_clients() == 0
    async with api_server.client() as agent, agent.stream("api-two") as a, agent.stream("api-two") as b:
        assert api_server.handle.connected_clients() == 2
        accepted = await agent.submit("go", client_id="api-two")
        first_a, first_b = await asyncio.gather(events_until_tok(a), events_until_tok(b))
        api_server.fake.release()
        rest_a, rest_b = await asyncio.gather(events_until_done(a, accepted["turn_id"]),
                                              events_until_done(b, accepted["turn_id"]))
    got_a, got_b = first_a + rest_a, first_b + rest_b
    assert first_a == first_b and merged_toks(got_a) == merged_toks(got_b)
    assert "".join(e["data"]["text"] for e in got_a if e["event"] == "tok") == \
        "one two three four five six seven eight nine ten eleven"
    assert [e["event"] for e in rest_a].count("tok") >= 1 and got_a[-1]["data"]["turn_id"] == accepted["turn_id"]


async def test_the_stream_sends_keep_alive_comments_while_idle(api_server_factory: ApiServerFactory) -> None:
    srv = await api_server_factory(server={"keepalive_seconds": 0.05})
    async with aiohttp.ClientSession() as http, http.get(srv.url + "/api/v1/stream/api-idle") as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        lines: list[bytes] = []
        async with asyncio.timeout(10):
            while lines.count(b": keep-alive\n") < 2:
                lines.append(await r.content.readline())


async def test_a_shorthand_id_that_names_no_session_is_404_for_the_stream(api_server: ApiServer) -> None:
    async with api_server.client() as agent:
        with pytest.raises(AgentError) as e:
            async for _ in agent.stream("999"):
                pass
    assert (e.value.status, e.value.code) == (404, "not_found")


async def test_a_reader_that_falls_behind_is_dropped_with_an_error_event(
        api_server_factory: ApiServerFactory) -> None:
    # A small per-reader queue (engine.queue_size) and a reader that never reads, with a tiny
    # receive buffer: it falls more than 8 events behind, so the server drops it with an `error`
    # event and ends its stream. The turn itself is never held up, and the session streams again.
    # (Token deltas merge while queued, so the flood is 300 large tool calls: 600 events that
    # cannot merge; the unknown tool is answered with an error and never run.)
    srv = await api_server_factory(engine={"queue_size": 8})
    srv.fake.script(Reply.tool_calls(*[("no_such_tool", {"i": i, "pad": "y" * 2000}) for i in range(300)]),
                    Reply.text("x" * 1000))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", srv.handle.port))
    reader, writer = await asyncio.open_connection(sock=sock)
    try:
        writer.write(b"GET /api/v1/stream/api-slowpoke HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        await writer.drain()
        await reader.readuntil(b": connected\n\n")
        async with srv.client() as agent:
            got = await agent.send("flood", client_id="api-slowpoke", timeout=60)
            assert got["status"] == "complete" and got["text"] == "x" * 1000
            async with asyncio.timeout(30):
                data = await reader.read()  # to EOF: the server ended the slow stream
            head, _, tail = data.partition(b"slow_consumer")
            assert tail and b"event: error" in head[-200:], data[-300:]
            assert b"event: tool_call" in head and b"event: done" not in head
            assert b"event:" not in tail  # nothing after the drop

            srv.fake.script(Reply.text("back again"))
            async with agent.stream("api-slowpoke") as again:
                accepted = await agent.submit("hello?", client_id="api-slowpoke")
                assert (await events_until_done(again, accepted["turn_id"]))[-1]["data"]["text"] == "back again"
    finally:
        writer.close()


# ---- sessions --------------------------------------------------------------------------------------------


async def test_sessions_are_listed_read_page_by_page_and_deleted(api_server: ApiServer) -> None:
    async with api_server.client() as agent:
        for i in range(3):
            assert (await agent.send(f"message {i}", client_id="api-hist"))["status"] == "complete"
        await agent.send("elsewhere", client_id="api-other")
        listed = await agent.sessions()
        assert {s["client_id"] for s in listed} == {"api-hist", "api-other"}
        hist = next(s for s in listed if s["client_id"] == "api-hist")
        assert hist["message_count"] == 6 and hist["state"] == "idle" and hist["title"] == "message 0"
        short = str(hist["short_id"])
        assert [s["client_id"] for s in await agent.sessions(kind="console")] == []
        # Paged: most recently updated first ("api-other" spoke last).
        assert [s["client_id"] for s in await agent.sessions(limit=1)] == ["api-other"]
        assert [s["client_id"] for s in await agent.sessions(limit=1, offset=1)] == ["api-hist"]

        full = await agent.session("api-hist", limit=1000)
        msgs = full["messages"]
        assert [m["role"] for m in msgs] == ["user", "assistant"] * 3
        assert [m["content"] for m in msgs[:2]] == ["message 0", "echo: message 0"]
        assert full["has_more"] is False and full["next_before"] is None
        assert full["session"]["client_id"] == "api-hist"

        page1 = await agent.session(short, limit=4)  # the shorthand id works too
        assert page1["messages"] == msgs[-4:]
        assert page1["has_more"] is True and page1["next_before"] == msgs[-4]["id"]
        page2 = await agent.session("api-hist", limit=4, before=page1["next_before"])
        assert page2["messages"] == msgs[:2] and page2["has_more"] is False
        assert await agent.history("api-hist", page=2) == msgs

        assert await agent.delete_session(short) == {"client_id": "api-hist", "deleted": True}
        for call in (agent.session("api-hist"), agent.delete_session("api-hist"), agent.stop(short)):
            with pytest.raises(AgentError) as e:
                await call
            assert (e.value.status, e.value.code) == (404, "not_found")
        assert [s["client_id"] for s in await agent.sessions()] == ["api-other"]


async def test_sessions_are_paged_after_the_last_one_listed_whatever_is_deleted_meanwhile(
        api_server: ApiServer) -> None:
    """`before=<updated_at>,<client_id>` of a page's last session: the next page. A session deleted
    meanwhile moves none of the rest past it, as it moves an offset (which still works)."""
    async with api_server.client() as agent:
        for name in ("api-a", "api-b", "api-c+d", "api-e"):  # (a `+`: quoted, not read as a space)
            assert (await agent.send("hi", client_id=name))["status"] == "complete"
        first = await agent.sessions(limit=2)
        assert [s["client_id"] for s in first] == ["api-e", "api-c+d"]
        assert (await agent.delete_session("api-e"))["deleted"] is True
        assert [s["client_id"] for s in await agent.sessions(limit=2, before=first[-1])] == ["api-b", "api-a"]
        assert [s["client_id"] for s in await agent.sessions(limit=2, offset=2)] == ["api-a"]  # api-b skipped
        assert [s["client_id"] for s in await agent.sessions(kind="proxy", before=first[-1])] == []
    # On the wire: the listed `updated_at` as JSON wrote it, a comma, the id (quoted).
    key = f"{first[0]['updated_at']!r},{first[0]['client_id']}"
    async with aiohttp.ClientSession() as http, http.get(
            api_server.url + "/api/v1/sessions", params={"before": key, "limit": "1"}) as r:
        assert r.status == 200 and [s["client_id"] for s in (await r.json())["sessions"]] == ["api-c+d"]


async def test_an_attached_console_pages_an_older_aiops_by_offset(api_server: ApiServer) -> None:
    """An aiops from before keyset paging refuses `before` (an unknown parameter) and its
    `/api/v1/console` does not say `sessions_before`: the attached console's engine pages it as
    consoles did then, the page after a session it listed starting where that listing ended."""
    stored = [{"client_id": f"api-{i}", "updated_at": 100.0 - i} for i in range(5)]
    asked: list[dict[str, str]] = []

    async def older_aiops(request: web.Request) -> web.Response:
        if request.path == "/api/v1/console":
            return web.json_response({"principal": "ops", "role": "operator", "console_sessions": True})
        if request.path == "/api/v1/gates":
            return web.json_response({"gates": []})
        if request.path == "/api/v1/rates":
            return web.json_response({"usage": [], "limits": []})
        asked.append(dict(request.query))
        if set(request.query) - {"kind", "limit", "offset"}:
            return web.json_response({"error": {"code": "invalid_request", "message": "unknown field"}}, status=400)
        offset, limit = int(request.query.get("offset", 0)), int(request.query["limit"])
        return web.json_response({"sessions": stored[offset:offset + limit]})

    app = web.Application()
    app.router.add_get("/{tail:.*}", older_aiops)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    remote = RemoteEngine(f"http://127.0.0.1:{runner.addresses[0][1]}")
    try:
        await remote.start(follow=False)
        first = await remote.list_sessions(limit=2)
        second = await remote.list_sessions(limit=2, before=SessionKey.of(first[-1]))
        third = await remote.list_sessions(limit=2, before=SessionKey.of(second[-1]))
        assert [s["client_id"] for s in first + second + third] == [s["client_id"] for s in stored]
        assert [q.get("offset") for q in asked] == [None, "2", "4"]
        # After a session it did not list last: from the top.
        assert await remote.list_sessions(limit=1, before=SessionKey(50.0, "api-9")) == stored[:1]
    finally:
        await remote.close()
        await runner.cleanup()
    # The current aiops says it pages by key.
    remote = RemoteEngine(api_server.url)
    try:
        await remote.start(follow=False)
        assert remote.info["sessions_before"] is True
    finally:
        await remote.close()


async def test_stop_cancels_a_hanging_turn(api_server: ApiServer) -> None:
    api_server.fake.script(Reply.hang())
    async with api_server.client() as agent, agent.stream("api-hang") as stream:
        accepted = await agent.submit("this will hang", client_id="api-hang")
        await api_server.fake.wait_for_requests_async(1)
        short = str((await agent.session("api-hang"))["session"]["short_id"])
        # Several stops at once (an impatient operator, two scripts): only the one that ended it says so.
        stops = await asyncio.gather(agent.stop(short), agent.stop("api-hang"), agent.stop(short))
        assert sorted(r["stopped"] for r in stops) == [False, False, True]
        assert {r["client_id"] for r in stops} == {"api-hang"}
        events = await events_until_done(stream, accepted["turn_id"])
        assert events[-1]["data"]["status"] == "cancelled"
        assert (await agent.stop("api-hang"))["stopped"] is False  # nothing runs any more
        history = (await agent.session("api-hang"))["messages"]
        assert any(m["role"] == "notice" and "cancelled" in m["content"] for m in history)



async def test_a_session_deleting_itself_still_ends_its_message_with_done(api_server: ApiServer) -> None:
    """`!session ID delete` sent to that session: its readers get the command's `done` (the end of
    the turn, always), then `session_deleted`; a send with a gate policy returns the result."""
    async with api_server.client() as agent:
        assert (await agent.send("hello", client_id="api-self"))["status"] == "complete"
        async with agent.stream("api-self") as stream:
            got = await agent.send("!session api-self delete", client_id="api-self")
            async with asyncio.timeout(10):
                events = [e async for e in stream]
        assert got["status"] == "complete" and "deleted" in got["text"]
        assert [e["event"] for e in events][-2:] == ["done", "error"]
        assert events[-2]["data"]["turn_id"] == got["turn_id"] and events[-2]["data"]["model"] == "local"
        assert events[-1]["data"]["code"] == "session_deleted"
        assert (await agent.send("hello", client_id="api-self2"))["status"] == "complete"
        policy_run = await agent.send("!session api-self2 delete", client_id="api-self2", auto_resolve=True,
                                      policy=lambda gate: "deny")
        assert policy_run["status"] == "complete" and "deleted" in policy_run["text"]


async def test_history_lists_a_message_sent_during_a_turn_after_that_turns_answer(api_server: ApiServer) -> None:
    # The first answer is held at the fake, part-written, until the second question is in.
    api_server.fake.script(Reply.text("an earlier answer"),
                           Reply.text("first answer", chunks=4, hold_after=2), Reply.text("second answer"))
    async with api_server.client() as agent, agent.stream("api-queue") as stream:
        assert (await agent.send("an earlier question", client_id="api-queue"))["status"] == "complete"
        first = await agent.submit("first question", client_id="api-queue")
        await api_server.fake.wait_for_held_async(1)
        second = await agent.submit("second question, sent meanwhile", client_id="api-queue")
        api_server.fake.release()
        await events_until_done(stream, second["turn_id"])
        page = await agent.session("api-queue")
        messages = page["messages"]
        both = [("user", "first question"), ("assistant", "first answer"),
                ("user", "second question, sent meanwhile"), ("assistant", "second answer")]
        earlier = [("user", "an earlier question"), ("assistant", "an earlier answer")]
        assert [(m["role"], m["content"]) for m in messages] == earlier + both
        assert [m["turn_id"] for m in messages[2:]] == [first["turn_id"]] * 2 + [second["turn_id"]] * 2
        # Stored in the order they came (the second question before the first answer).
        assert messages[4]["id"] < messages[3]["id"]
        # Cut by id alone, the latest three would be the second question and both answers: the
        # first answer without its question, listed after the second turn. A page keeps turns whole.
        newest = await agent.session("api-queue", limit=3)
        assert [(m["role"], m["content"]) for m in newest["messages"]] == both
        assert newest["has_more"] and newest["next_before"] == messages[2]["id"]
        older = await agent.session("api-queue", limit=3, before=newest["next_before"])
        assert [(m["role"], m["content"]) for m in older["messages"]] == earlier
        assert not older["has_more"] and older["next_before"] is None
        assert await agent.history("api-queue", page=3) == messages


async def test_deleting_a_session_ends_its_running_and_queued_turns_for_every_reader(
        api_server: ApiServer) -> None:
    api_server.fake.script(Reply.hang())
    async with api_server.client() as agent, agent.stream("api-del") as stream:
        running = await agent.submit("this will hang", client_id="api-del")
        await api_server.fake.wait_for_requests_async(1)
        queued = await agent.submit("and this waits behind it", client_id="api-del")
        waiting = asyncio.ensure_future(events_until_done(stream, queued["turn_id"]))
        assert await agent.delete_session("api-del") == {"client_id": "api-del", "deleted": True}
        events = await waiting  # a reader waiting for the queued turn hears that it ended
        if not any(e["event"] == "done" and e["data"]["turn_id"] == running["turn_id"] for e in events):
            events += await events_until_done(stream, running["turn_id"])
        ends = {e["data"]["turn_id"]: e["data"]["status"] for e in events if e["event"] == "done"}
        assert ends == {running["turn_id"]: "cancelled", queued["turn_id"]: "cancelled"}


# ---- gates -----------------------------------------------------------------------------------------------


async def test_a_gate_is_resolved_by_an_operator_token_and_refused_to_a_client_token(
        api_server_factory: ApiServerFactory) -> None:
    srv, plugin, _ = await gated_server(api_server_factory)
    srv.fake.script(Reply.tool_calls(("write_note", {"text": "hello"})), Reply.text("noted"))
    async with srv.client("ops") as ops, srv.client("bot") as bot, bot.stream("api-gated") as stream:
        accepted = await bot.submit("write a note", client_id="api-gated")
        gate = (await next_event(stream, "gate"))["data"]
        assert (gate["tool"], gate["operation"], gate["session_id"]) == ("write_note", "write", "api-gated")
        assert gate["args"] == {"text": "hello"} and gate["client_kind"] == "api"
        assert [g["id"] for g in await bot.gates()] == [gate["id"]]  # pending, visible to every role
        # The same object as the event's (which adds only the turn), as docs/API.md has it.
        assert await ops.gates() == [{k: v for k, v in gate.items() if k != "turn_id"}]

        with pytest.raises(AgentError) as e:
            await bot.resolve_gate(gate["id"], "approve")
        assert (e.value.status, e.value.code) == (403, "forbidden")
        assert plugin.written == [] and [g["id"] for g in await ops.gates()] == [gate["id"]]

        resolved = await ops.resolve_gate(gate["id"], "approve")
        assert (resolved["id"], resolved["decision"], resolved["scope"], resolved["by"]) == (
            gate["id"], "approved", "once", "ops")
        events = await events_until_done(stream, accepted["turn_id"])

        with pytest.raises(AgentError) as e:
            await ops.resolve_gate(gate["id"], "deny")
        assert (e.value.status, e.value.code) == (409, "already_resolved")
        assert "approved by ops" in e.value.message
        with pytest.raises(AgentError) as e:
            await ops.resolve_gate("g000000000000", "deny")
        assert (e.value.status, e.value.code) == (404, "not_found")
        with pytest.raises(AgentError) as e:
            await ops.resolve_gate("g" * 5000, "deny")
        assert e.value.status == 404 and len(e.value.message) < 100  # the id quoted, not all of it
        assert await ops.gates() == []

    names = [e["event"] for e in events]
    assert names.index("gate_resolved") < names.index("tool_result") < names.index("done")
    assert plugin.written == ["hello"]
    assert events[-1]["data"]["text"] == "noted"


async def test_a_gate_on_the_stream_is_followed_by_one_waiting_notice_naming_it(
        api_server_factory: ApiServerFactory) -> None:
    """Readers of the stream have always had, right after each `gate` event, a `notice` saying what
    waits for approval and naming the gate (so that they can drop it when the gate is answered):
    once per gate, never twice, whoever produces it."""
    srv, plugin, _ = await gated_server(api_server_factory)
    srv.fake.script(Reply.tool_calls(("write_note", {"text": "hello"})), Reply.text("noted"))
    async with srv.client("ops") as ops, srv.client("bot") as bot, bot.stream("api-waiting") as stream:
        accepted = await bot.submit("write a note", client_id="api-waiting")
        seen = []
        async with asyncio.timeout(10):
            async for e in stream:
                seen.append(e)
                if e["event"] == "gate":
                    await ops.resolve_gate(e["data"]["id"], "approve")
                if e["event"] == "done":
                    break
    gate = next(e["data"] for e in seen if e["event"] == "gate")
    at = [e["event"] for e in seen].index("gate")
    assert seen[at + 1] == {"event": "notice", "data": {
        "text": "waiting for operator approval: write_note write", "gate_id": gate["id"],
        "session_id": "api-waiting", "turn_id": accepted["turn_id"]}}
    assert [e["data"].get("gate_id") for e in seen if e["event"] == "notice"] == [gate["id"]]
    assert plugin.written == ["hello"]


async def test_a_gate_closed_by_deleting_its_session_says_so(api_server_factory: ApiServerFactory) -> None:
    srv, plugin, _ = await gated_server(api_server_factory)
    srv.fake.script(Reply.tool_calls(("write_note", {"text": "never"})))
    async with srv.client("ops") as ops, ops.stream("api-doomed") as stream:
        await ops.submit("write a note", client_id="api-doomed")
        gate = (await next_event(stream, "gate"))["data"]
        await ops.delete_session("api-doomed")
        resolved = (await next_event(stream, "gate_resolved"))["data"]
        assert (resolved["decision"], resolved["by"]) == ("cancelled", "session deleted")
        with pytest.raises(AgentError) as e:  # an operator answering it late is told why it closed
            await ops.resolve_gate(gate["id"], "approve")
        assert e.value.status == 409 and "cancelled by session deleted" in e.value.message
    assert plugin.written == []


async def test_a_denied_gate_does_not_run_the_tool(api_server_factory: ApiServerFactory) -> None:
    srv, plugin, tokens = await gated_server(api_server_factory)
    srv.fake.script(Reply.tool_calls(("write_note", {"text": "no"})), Reply.text("ok, not written"))
    async with srv.client("ops") as ops, ops.stream("api-deny") as stream:
        accepted = await ops.submit("write", client_id="api-deny")
        gate = (await next_event(stream, "gate"))["data"]
        async with aiohttp.ClientSession() as http, http.post(
                f"{srv.url}/api/v1/gates/{gate['id']}", json={"decision": "deny"},
                headers=tokens.header("ops")) as r:
            assert r.status == 200
            assert (await r.json())["gate"]["decision"] == "denied"
        events = await events_until_done(stream, accepted["turn_id"])
    result = next(e["data"] for e in events if e["event"] == "tool_result")
    assert result["is_error"] is True and result["gate"] == "denied"
    assert plugin.written == []


# ---- health and OpenAPI ------------------------------------------------------------------------------------


async def test_health_reports_models_sessions_gates_and_the_callers_role(
        api_server_factory: ApiServerFactory) -> None:
    tokens = Tokens.make(ops="operator", bot="client")
    srv = await api_server_factory(tokens=tokens)
    async with aiohttp.ClientSession() as http:
        async with http.get(srv.url + "/api/v1/health") as r:  # public: no token needed
            assert r.status == 200
            h = await r.json()
        async with http.get(srv.url + "/api/v1/health", headers=tokens.header("bot")) as r:
            bot = await r.json()
        async with http.get(srv.url + "/api/v1/health", headers=tokens.header("ops")) as r:
            ops = await r.json()
    assert bot["role"] == "client" and "plugins" not in bot
    # Operators also see every plugin's state, as `aiops plugins` shows it.
    assert ops["role"] == "operator"
    assert ops["plugins"] == [p.to_dict() for p in srv.engine.plugin_status]
    assert all(set(p) == {"name", "state", "reason", "source"} for p in ops["plugins"])
    assert h == {"status": "ok", "version": aiops.__version__, "models": ["local"], "default_model": "local",
                 "sessions": 0, "pending_gates": 0, "role": None,
                 "mcp": {"endpoint": {"url": srv.handle.mcp.url}}}  # where /mcp is (docs/MCP.md)


async def test_the_openapi_document_matches_the_routes(api_server: ApiServer) -> None:
    async with aiohttp.ClientSession() as http, http.get(api_server.url + "/api/v1/openapi.json") as r:
        assert r.status == 200
        doc = await r.json()
    assert doc["openapi"] == "3.1.0"
    documented = {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}
    registered = {(route.method, route.resource.canonical) for route in api_server.handle.app.router.routes()
                  if route.resource is not None and route.resource.canonical.startswith("/api/v1")}
    assert documented == registered
    gets = [r for r in ROUTES if r.method == "GET"]
    streams = [r for r in gets if r.event_model is not None]
    assert len(registered) == len(ROUTES) + len(gets) - len(streams)  # HEAD with every GET but the streams
    assert "head" not in doc["paths"]["/api/v1/stream/{client_id}"]
    stream_op = doc["paths"]["/api/v1/stream/{client_id}"]["get"]
    assert "400" in stream_op["responses"]  # an id no session can have
    assert stream_op["parameters"][0]["schema"] == {"type": "string", "pattern": CLIENT_ID_PATTERN, "maxLength": 128}
    assert doc["paths"]["/api/v1/health"]["head"]["security"] == []

    def refs(node: Any) -> list[str]:
        if isinstance(node, dict):
            return [v for k, v in node.items() if k == "$ref"] + [r for v in node.values() for r in refs(v)]
        if isinstance(node, list):
            return [r for v in node for r in refs(v)]
        return []

    schemas = doc["components"]["schemas"]
    for ref in refs(doc):
        assert ref.startswith("#/components/schemas/") and ref.rsplit("/", 1)[1] in schemas, ref
    submit = doc["paths"]["/api/v1/submit"]["post"]
    body = schemas[submit["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]]
    assert body["required"] == ["text"]
    assert set(body["properties"]) == {"text", "client_id", "model", "wait", "timeout", "kind"}
    assert body["properties"]["kind"]["enum"] == ["api", "cli", "console"]
    assert doc["paths"]["/api/v1/health"]["get"]["security"] == []
    assert "403" in doc["paths"]["/api/v1/gates/{id}"]["post"]["responses"]
    history = doc["paths"]["/api/v1/sessions/{id}"]["get"]["parameters"]
    assert {p["name"] for p in history} == {"id", "limit", "before"}


# ---- AgentClient -------------------------------------------------------------------------------------------


async def test_agent_client_auto_resolves_gates_with_its_policy(api_server_factory: ApiServerFactory) -> None:
    srv, plugin, _ = await gated_server(api_server_factory)
    srv.fake.script(Reply.tool_calls(("write_note", {"text": "keep"})), Reply.text("kept"),
                    Reply.tool_calls(("write_note", {"text": "drop"})), Reply.text("dropped"))
    asked: list[dict[str, Any]] = []

    async def policy(gate: dict[str, Any]) -> str:
        asked.append(gate)
        return "approve" if gate["args"]["text"] == "keep" else "deny"

    async with srv.client("ops", gate_policy=policy) as ops:
        first = await ops.send("note keep", auto_resolve=True)
        second = await ops.run_with_policy("note drop", client_id=first["client_id"])
    assert (first["status"], first["text"]) == ("complete", "kept")
    assert (second["status"], second["text"]) == ("complete", "dropped")
    assert second["client_id"] == first["client_id"]
    assert [g["args"]["text"] for g in asked] == ["keep", "drop"]
    assert plugin.written == ["keep"]

    requests_before = len(srv.fake.requests)
    async with srv.client("bot", gate_policy=policy) as bot:
        with pytest.raises(AgentError, match="operator token") as e:
            await bot.send("note keep", auto_resolve=True)
        assert e.value.status == 403
    assert len(srv.fake.requests) == requests_before  # refused before anything was submitted


async def test_a_policy_that_abstains_leaves_the_gate_to_a_human(api_server_factory: ApiServerFactory) -> None:
    srv, plugin, _ = await gated_server(api_server_factory)
    srv.fake.script(Reply.tool_calls(("write_note", {"text": "human"})), Reply.text("a human said yes"))

    async def human(ops: AgentClient, watching: EventStream) -> None:
        gate = (await next_event(watching, "gate"))["data"]  # a human watching the inbox
        assert [g["id"] for g in await ops.gates()] == [gate["id"]]  # the policy left it pending
        await ops.resolve_gate(gate["id"], "approve")

    async with srv.client("ops", gate_policy=lambda gate: None) as ops, ops.stream("api-human") as watching:
        got, _ = await asyncio.gather(ops.send("note", client_id="api-human", auto_resolve=True),
                                      human(ops, watching))
    assert got["text"] == "a human said yes" and plugin.written == ["human"]


async def test_agent_client_reports_server_errors_with_status_and_code(api_server_factory: ApiServerFactory) -> None:
    tokens = Tokens.make(ops="operator")
    srv = await api_server_factory(tokens=tokens)
    async with AgentClient(srv.url, token="wrong") as agent:
        with pytest.raises(AgentError) as e:
            await agent.sessions()
    assert (e.value.status, e.value.code) == (401, "unauthorized")
    async with AgentClient(srv.url, token=tokens.secrets["ops"]) as agent:
        assert await agent.sessions() == []


async def test_agent_client_sends_each_id_as_one_path_segment(api_server: ApiServer) -> None:
    """Ids come from chat text and gate events: `x/../victim` must name a session of that name, not
    reach `victim` (or any other route)."""
    async with api_server.client() as agent:
        await agent.send("keep me", client_id="victim")
        for call in (lambda: agent.delete_session("x/../victim"), lambda: agent.stop("x/../victim"),
                     lambda: agent.session("victim?limit=1"), lambda: agent.session(".."),
                     lambda: agent.resolve_gate("../sessions/victim", "approve")):
            with pytest.raises(AgentError) as e:
                await call()
            assert e.value.status == 404, e.value
        # Not the health route's JSON taken for an empty event stream: a refusal.
        with pytest.raises(AgentError) as e:
            async for _ in agent.stream("x/../../health"):
                pass
        assert e.value.status == 400 and "not a valid session id" in e.value.message
        assert [m["content"] for m in (await agent.session("victim"))["messages"]] == ["keep me", "echo: keep me"]


async def test_something_that_is_not_aiops_or_does_not_answer_is_an_agent_error() -> None:
    """A reverse proxy's HTML page, a JSON answer where a stream belongs, a server that hangs:
    each an AgentError saying so, as the docs promise, not a JSONDecodeError or a bare timeout."""
    async def not_aiops(request: web.Request) -> web.Response:
        if request.path.endswith("/health"):
            return web.Response(text="<html>502 Bad Gateway</html>", content_type="text/html")
        if request.path.endswith("/sessions"):
            await released.wait()
        if request.path.endswith("/gates"):
            return web.Response(body=b"\x89PNG\r\n\x1a\n\xff\xfe", content_type="application/json")
        if "/sessions/" in request.path:
            return web.json_response([1, 2])
        return web.json_response({"status": "ok"})

    released = asyncio.Event()

    app = web.Application()
    app.router.add_get("/{tail:.*}", not_aiops)
    app.router.add_post("/{tail:.*}", not_aiops)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with AgentClient(f"http://127.0.0.1:{port}", token="", timeout=0.5) as agent:
            with pytest.raises(AgentError) as e:
                await agent.stream("api-x").open()
            assert e.value.code == "not_an_event_stream" and "application/json" in e.value.message
            with pytest.raises(AgentError) as e:
                await agent.health()
            assert (e.value.status, e.value.code) == (200, "invalid_response")
            assert "text/html" in e.value.message and "502 Bad Gateway" in e.value.message
            with pytest.raises(AgentError) as e:
                await agent.sessions()
            assert (e.value.status, e.value.code) == (0, "timeout") and "within 0.5 s" in e.value.message
            # Bytes that are not text, JSON that is not an object, an object of another API.
            with pytest.raises(AgentError) as e:
                await agent.gates()
            assert (e.value.status, e.value.code) == (200, "invalid_response") and "not a JSON object" in e.value.message
            with pytest.raises(AgentError) as e:
                await agent.history("api-x")
            assert (e.value.status, e.value.code) == (200, "invalid_response") and "[1, 2]" in e.value.message
            with pytest.raises(AgentError) as e:
                await agent.resolve_gate("g1", "approve")
            assert (e.value.status, e.value.code) == (200, "invalid_response") and "without gate" in e.value.message
        released.set()
    finally:
        await runner.cleanup()


async def test_a_lost_connection_is_an_error_not_the_end_of_the_stream(aiops_serve: ServeProcess) -> None:
    """A script reading events must be able to tell a server that went away (events missed) from
    one that ended the stream."""
    aiops_serve.fake.script(Reply.hang())
    async with AgentClient(aiops_serve.url, token="") as agent:
        with pytest.raises(AgentError) as e:
            async with agent.stream("api-cut") as events:
                await agent.submit("this hangs", client_id="api-cut")
                await aiops_serve.fake.wait_for_requests_async(1)  # the turn runs: the stream is open
                aiops_serve.proc.kill()
                async for _ in events:
                    pass
        assert (e.value.status, e.value.code) == (0, "stream_cut")
        assert "may have been missed" in e.value.message
        await asyncio.to_thread(aiops_serve.proc.wait, 10)
        with pytest.raises(AgentError) as e:  # and a call to a server that is gone says so, as an AgentError
            await agent.send("anyone there?")
        assert (e.value.status, e.value.code) == (0, "connection_error")
        assert aiops_serve.url in e.value.message


async def test_agent_client_argument_mistakes_are_clear(api_server_factory: ApiServerFactory) -> None:
    srv, _, _ = await gated_server(api_server_factory)
    async with AgentClient(srv.url, token="wrong", gate_policy=lambda g: "approve") as agent:
        with pytest.raises(AgentError) as e:
            await agent.send("note", auto_resolve=True)
        assert (e.value.status, e.value.code) == (401, "unauthorized")
    srv.fake.script(Reply.tool_calls(("write_note", {"text": "x"})))
    async with srv.client("ops", gate_policy=lambda g: ("deny",)) as ops:
        with pytest.raises(ValueError, match=r"gate policy returned \('deny',\)"):
            await ops.send("note", client_id="api-policy", auto_resolve=True)
        await ops.stop("api-policy")
        srv.fake.script(Reply.text("no hurry"))
        reply = await ops.send("whenever", timeout=None)  # None: as long as the server allows
        assert (reply["status"], reply["text"]) == ("complete", "no hurry")


async def test_aiops_attach_prints_the_session_events(api_server: ApiServer, tmp_path: Any) -> None:
    api_server.fake.script(Reply.text("attached and watching"))
    before = api_server.engine.bus.subscriber_count
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aiops.cli", "--config-dir", str(api_server.cfg.paths.config_dir),
        "--data-dir", str(tmp_path / "attach-data"), "attach", "api-watched", "--wait", "--url", api_server.url,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env(), cwd=tmp_path)
    try:
        async with asyncio.timeout(30):
            while api_server.engine.bus.subscriber_count <= before:  # attach has subscribed
                if proc.returncode is not None:
                    raise AssertionError((await proc.stderr.read()).decode())  # type: ignore[union-attr]
                await asyncio.sleep(0.02)
        async with api_server.client() as agent:
            await agent.submit("watch this", client_id="api-watched")
        lines: list[dict[str, Any]] = []
        async with asyncio.timeout(10):
            while not lines or lines[-1]["event"] != "done":
                lines.append(json.loads(await proc.stdout.readline()))  # type: ignore[union-attr]
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()
    assert lines[-1]["text"] == "attached and watching" and lines[-1]["session_id"] == "api-watched"
    assert {line["event"] for line in lines} <= CONTRACT_EVENTS
    # Attached before the session existed: said so at once, instead of a silent wait.
    said = (await proc.stderr.read()).decode()  # type: ignore[union-attr]
    assert "no session 'api-watched'" in said and "waiting for its first message" in said


async def test_aiops_attach_failures_are_one_line_not_a_traceback(api_server_factory: ApiServerFactory,
                                                                   tmp_path: Any) -> None:
    srv = await api_server_factory(tokens=Tokens.make(ops="operator"))
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: a refused connection
    cases = [(srv.url, {}, "401 unauthorized"),
             (srv.url, {"AIOPS_TOKEN": "wrong"}, "401 unauthorized"),
             # A session that does not exist (a mistyped id): said at once, not waited on forever.
             (srv.url, {"AIOPS_TOKEN": srv.tokens.secrets["ops"]},  # type: ignore[union-attr]
              f"no session 'api-x' on {srv.url} (`aiops watch --wait api-x` waits for its first message)"),
             (f"http://127.0.0.1:{closed.getsockname()[1]}", {}, "cannot reach the aiops server at")]
    # No --url: the configured [server] address, an IPv6 wildcard bind here (reached on ::1).
    v6 = tmp_path / "v6-config"
    v6.mkdir()
    (v6 / "aiops.toml").write_text(f'[server]\nhost = "::"\nport = {closed.getsockname()[1]}\n')
    cases.append((None, {}, f"cannot reach the aiops server at http://[::1]:{closed.getsockname()[1]}"))
    try:
        for url, env, expect in cases:
            where = ["--config-dir", str(v6)] if url is None else ["--config-dir", str(srv.cfg.paths.config_dir)]
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "aiops.cli", *where,
                "--data-dir", str(tmp_path / "attach-data"), "attach", "api-x", *(["--url", url] if url else []),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**clean_env(), **env}, cwd=tmp_path)
            out, err = await asyncio.wait_for(proc.communicate(), 30)
            assert proc.returncode == 2, (url, err)
            lines = err.decode().strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("aiops: ") and expect in lines[0], err
            assert "Traceback" not in err.decode() and out == b""
    finally:
        closed.close()


# ---- aiops serve -------------------------------------------------------------------------------------------


def _post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_aiops_serve_answers_and_exits_cleanly_on_sigterm(aiops_serve: ServeProcess) -> None:
    assert aiops_serve.banner.startswith("aiops serving on http://127.0.0.1:")
    with urllib.request.urlopen(aiops_serve.url + "/api/v1/health", timeout=10) as r:
        assert json.loads(r.read())["status"] == "ok"
    aiops_serve.fake.script(Reply.text("hello from a subprocess"))  # type: ignore[union-attr]
    status, body = _post(aiops_serve.url + "/api/v1/submit", {"text": "hi", "wait": True})
    assert (status, body["status"], body["text"]) == (200, "complete", "hello from a subprocess")
    assert aiops_serve.stop(signal.SIGTERM) == 0


def test_aiops_serve_with_the_shipped_auth_and_plugins_says_one_line_when_ready(
        aiops_serve_factory: ServeFactory) -> None:
    """The shipped aiops.toml names AIOPS_OPERATOR_TOKEN; unset, a loopback server runs open, as
    its ready line says: a warning about it on every start told a newcomer something was wrong.
    Plugins skipped for a missing key (the data tools, as shipped) are one line, not one each."""
    shipped = (SHIPPED_CONFIG_DIR / "plugins.toml").read_text().replace(
        "[mysql]\nenabled = true", "[mysql]\nenabled = false")
    serve = aiops_serve_factory(extra_files={
        "aiops.toml": '[server]\nhost = "127.0.0.1"\nport = 0\n'
                      '[auth.tokens.ops]\ntoken_env = "AIOPS_OPERATOR_TOKEN"\nrole = "operator"\n',
        "plugins.toml": shipped})
    assert serve.stop(signal.SIGTERM) == 0
    ready = serve.stdout.strip().splitlines()
    assert len(ready) == 1 and ready[0].startswith(serve.banner)
    assert "no tokens: loopback callers are operators" in ready[0]
    assert "AIOPS_OPERATOR_TOKEN" not in serve.stderr
    skipped = [line for line in serve.stderr.splitlines() if "skipped" in line]
    assert len(skipped) == 1 and "tavily_search" in skipped[0] and "aiops plugins" in skipped[0]


def test_a_request_whose_body_is_still_arriving_at_shutdown_gets_a_503_at_once(
        aiops_serve_factory: ServeFactory) -> None:
    """aiohttp stops reading from its connections as it shuts them down: a body still on its way
    would never arrive, and its request used to end at shutdown_timeout with no answer at all."""
    serve = aiops_serve_factory(server={"shutdown_timeout": 60})
    host, port = serve.url.removeprefix("http://").rsplit(":", 1)
    body = json.dumps({"text": "a message sent slowly", "client_id": "api-slow-body"}).encode()
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(b"POST /api/v1/submit HTTP/1.1\r\nHost: %b\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % (host.encode(), len(body)) + body[:10])
        # Answered after the first request's head: that one is waiting for the rest of its body.
        with urllib.request.urlopen(serve.url + "/api/v1/health", timeout=10) as r:
            assert r.status == 200
        serve.proc.send_signal(signal.SIGTERM)
        answer = b""
        while chunk := conn.recv(65536):  # (a timeout, 30 s, fails the test)
            answer += chunk
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 ") and b"Connection: close" in head, answer
    assert json.loads(payload)["error"]["code"] == "unavailable"
    assert serve.proc.wait(30) == 0 and "Traceback" not in serve.stderr


@pytest.mark.parametrize(("sig", "delays"), [(signal.SIGTERM, (0.02, 0.05, 0.1)), (signal.SIGINT, (0.05,))])
def test_a_second_signal_during_the_stop_still_exits_0(aiops_serve_factory: ServeFactory, sig: int,
                                                         delays: tuple[float, ...]) -> None:
    """Ctrl-C pressed twice, or a service manager repeating its SIGTERM: the stop goes on and the
    exit stays clean. (The second signal used to kill the process when it came as the stop ended.)"""
    for delay in delays:
        serve = aiops_serve_factory()
        serve.fake.script(Reply.hang())  # type: ignore[union-attr]
        assert _post(serve.url + "/api/v1/submit", {"text": "a long job"})[0] == 202
        serve.fake.wait_for_requests(1)  # type: ignore[union-attr]
        serve.proc.send_signal(sig)
        time.sleep(delay)
        serve.proc.send_signal(sig)  # a no-op once the process has exited
        assert serve.proc.wait(30) == 0, (delay, serve.stderr)
        assert "Traceback" not in serve.stderr


async def test_shutdown_cancels_running_turns_cleanly_and_loses_nothing(
        aiops_serve_factory: ServeFactory) -> None:
    first = aiops_serve_factory()
    first.fake.script(Reply.hang())  # type: ignore[union-attr]
    async with AgentClient(first.url, token="") as agent, agent.stream("api-shutdown") as stream:
        accepted = await agent.submit("this never ends", client_id="api-shutdown")
        await first.fake.wait_for_requests_async(1)  # type: ignore[union-attr]
        first.proc.send_signal(signal.SIGINT)
        events = await events_until_done(stream, accepted["turn_id"], timeout=30)
        assert events[-1]["data"]["status"] == "cancelled"
        async with asyncio.timeout(30):
            async for _ in stream:  # the server ends the stream as it goes
                pass
    assert await asyncio.to_thread(first.proc.wait, 30) == 0

    second = aiops_serve_factory(config_dir=first.config_dir, data_dir=first.data_dir)
    async with AgentClient(second.url, token="") as agent:
        messages = (await agent.session("api-shutdown"))["messages"]
    assert messages[0]["content"] == "this never ends"
    assert any(m["role"] == "notice" and "cancelled" in m["content"] for m in messages)


async def test_a_shutdown_amid_new_proxy_conversations_leaves_none_half_taken_in(
        aiops_serve_factory: ServeFactory) -> None:
    """Proxy requests still choosing, importing and submitting when SIGTERM came went on after
    the engine had stopped: 500s (the store closed under them), half-imported histories, and
    questions acknowledged with a 200 that no record ever ended. Each is now either refused
    (503) or taken in whole and then stopped like every running turn."""
    first = aiops_serve_factory()
    assert first.fake is not None
    first.fake.responder = lambda body: Reply.text("a slow answer in many parts", chunks=10, chunk_delay=0.3)

    def conversation(i: int) -> list[dict[str, str]]:  # begun elsewhere: aiops imports two exchanges
        return [{"role": "user", "content": f"c{i} q1"}, {"role": "assistant", "content": f"c{i} a1"},
                {"role": "user", "content": f"c{i} q2"}, {"role": "assistant", "content": f"c{i} a2"},
                {"role": "user", "content": f"c{i} now"}]

    async def chat(http: aiohttp.ClientSession, i: int) -> tuple[int, str | None]:
        async with http.post(first.url + "/v1/chat/completions",
                             json={"model": "aiops", "stream": True, "messages": conversation(i)}) as r:
            await r.read()
            return r.status, r.headers.get("X-Aiops-Session")

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        chats = [asyncio.create_task(chat(http, i)) for i in range(60)]
        await first.fake.wait_for_requests_async(3)  # some turns run, others are being taken in
        first.proc.send_signal(signal.SIGTERM)
        answers = await asyncio.gather(*chats)
    assert await asyncio.to_thread(first.proc.wait, 30) == 0
    assert {status for status, _ in answers} <= {200, 503}, answers
    assert "Traceback" not in first.stderr and " ERROR " not in (first.data_dir / "aiops.log").read_text()
    taken = {sid for status, sid in answers if status == 200}
    assert taken

    second = aiops_serve_factory(config_dir=first.config_dir, data_dir=first.data_dir)
    async with AgentClient(second.url, token="") as agent:
        assert {s["client_id"] for s in await agent.sessions(limit=1000)} == taken  # no empty leftovers
        for sid in taken:
            messages = [m for m in await agent.history(sid) if m["role"] in ("user", "assistant", "notice")]
            i = messages[0]["content"].split()[0]
            assert [m["content"] for m in messages[:5]] == [f"{i} q1", f"{i} a1", f"{i} q2", f"{i} a2", f"{i} now"]
            # The question taken in has an end: its stopped answer, or a notice that it never ran.
            ending = messages[5:]
            assert ending and (ending[0]["status"] == "cancelled" or "cancelled" in ending[-1]["content"]), ending


async def test_after_a_sigkill_the_restart_records_what_was_cut_off(
        aiops_serve_factory: ServeFactory, fake_openai: FakeOpenAI, tmp_path: Any) -> None:
    """A SIGTERM records each running turn as cancelled; a SIGKILL cannot. The next start finds
    the lock left by the dead process and records its turns that never ended (the running one and
    one queued behind it, a turn waiting on a gate) and closes its open gates in the audit log, so
    a reader of the history or the audit sees what happened; a clean stop after that adds nothing."""
    import shutil

    from aiops.config import SHIPPED_PROMPT_DIR
    from aiops.engine.engine import INTERRUPTED_NOTICE
    from aiops.engine.store import Store

    prompt = tmp_path / "prompt"
    shutil.copytree(SHIPPED_PROMPT_DIR / "default", prompt)
    first = aiops_serve_factory(models={"local": openai_model_entry(fake_openai, system_prompt_folder=str(prompt))})
    replies = {"remember tea": Reply.tool_calls(("update_system_prompt", {
        "section": "memory", "operation": "append", "content": "tea"})), "this never ends": Reply.hang()}
    fake_openai.responder = lambda body: replies.get(body["messages"][-1].get("content"))
    async with AgentClient(first.url, token="") as agent:
        answered = await agent.send("an answered question", client_id="api-killed")
        assert answered["status"] == "complete", answered
        running = await agent.submit("this never ends", client_id="api-killed")
        queued = await agent.submit("queued behind it", client_id="api-killed")
        async with agent.stream("api-gated") as stream:
            gated = await agent.submit("remember tea", client_id="api-gated")
            await next_event(stream, "gate")
    first.proc.kill()
    assert await asyncio.to_thread(first.proc.wait, 10) == -signal.SIGKILL

    second = aiops_serve_factory(config_dir=first.config_dir, data_dir=first.data_dir)
    async with AgentClient(second.url, token="") as agent:
        killed = (await agent.session("api-killed"))["messages"]
        gated_history = (await agent.session("api-gated"))["messages"]
        assert await agent.gates() == []
    notices = [(m["turn_id"], m["content"]) for m in killed + gated_history if m["role"] == "notice"]
    assert notices == [(running["turn_id"], INTERRUPTED_NOTICE), (queued["turn_id"], INTERRUPTED_NOTICE),
                       (gated["turn_id"], INTERRUPTED_NOTICE)]
    assert [m["content"] for m in killed if m["role"] == "user"] == [
        "an answered question", "this never ends", "queued behind it"]
    assert "did not stop cleanly" in (second.data_dir / "aiops.log").read_text()
    assert second.stop() == 0

    store = Store(second.data_dir / "aiops.sqlite3")
    await store.open()
    try:
        rows = [(a.event, a.decision, a.actor) for a in await store.audit("api-gated")]
        count = len(await store.history("api-killed"))
    finally:
        await store.close()
    assert rows == [("gate_opened", None, None), ("gate_resolved", "cancelled", "restart")]
    third = aiops_serve_factory(config_dir=first.config_dir, data_dir=first.data_dir)
    async with AgentClient(third.url, token="") as agent:
        assert len((await agent.session("api-killed"))["messages"]) == count  # a clean stop: nothing added


def test_the_server_modules_never_import_textual() -> None:
    code = ("import sys, aiops.cli, aiops.integrations.server.run, aiops.client; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'textual' or m.startswith('aiops.tui')); "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=60)


async def test_a_message_sent_while_its_session_is_being_deleted_goes_to_a_new_session(
        api_server_factory: ApiServerFactory) -> None:
    """While DELETE waits for the running turn to end, a new message to that id was queued on the
    session going away: it then crashed ("no session") with no `done`, so a proxy stream hung and a
    waited submit got internal_error. It now waits for the delete and starts the id afresh."""
    import openai

    for surface in ("api", "proxy"):
        plugin = SlowStopPlugin()
        srv = await api_server_factory(plugins=[plugin], extra_files={"plugins.toml": "[slowstop]\nenabled = true\n"})
        srv.fake.responder = call_tool_when("slow job", ("slow_job", {"text": ""}))
        sid = f"{surface}-doomed"
        proxy = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        async with srv.client() as agent:
            if surface == "api":
                await agent.submit("start the slow job", client_id=sid)
            else:
                first = asyncio.create_task(proxy.chat.completions.create(
                    model="aiops", messages=[{"role": "user", "content": "start the slow job"}],
                    extra_headers={"X-Aiops-Session": sid}))
            await asyncio.wait_for(plugin.running.wait(), 10)
            deleting = asyncio.create_task(agent.delete_session(sid))
            await asyncio.wait_for(plugin.winding_down.wait(), 10)
            async with asyncio.timeout(15):  # it hung for good
                if surface == "api":
                    result = await agent.send("are you there?", client_id=sid, timeout=10)
                    assert (result["status"], result["text"]) == ("complete", "echo: are you there?"), result
                else:
                    reply = await proxy.chat.completions.create(
                        model="aiops", stream=True, messages=[{"role": "user", "content": "are you there?"}],
                        extra_headers={"X-Aiops-Session": sid})
                    text = "".join([c.choices[0].delta.content or "" async for c in reply])
                    assert text == "echo: are you there?"
                    await first
                assert (await deleting)["deleted"] is True
            messages = (await agent.session(sid))["messages"]
        assert [(m["role"], m["content"]) for m in messages] == [
            ("user", "are you there?"), ("assistant", "echo: are you there?")], surface
        await proxy.close()


async def test_deletes_racing_each_other_one_deletes_the_others_answer_false(
        api_server_factory: ApiServerFactory) -> None:
    plugin = SlowStopPlugin()
    srv = await api_server_factory(plugins=[plugin], extra_files={"plugins.toml": "[slowstop]\nenabled = true\n"})
    async with srv.client() as agent:
        # An idle session, three deletes at once: one deletes it. The others answer false while
        # it is under way, or 404 if they arrive after it is done (an idle one goes fast).
        await agent.send("hi", client_id="idle-one", timeout=10)

        async def delete(ref: str) -> bool | int:
            try:
                return (await agent.delete_session(ref))["deleted"]
            except AgentError as e:
                return e.status

        answers = await asyncio.gather(*(delete("idle-one") for _ in range(3)))
        assert answers.count(True) == 1 and all(a in (True, False, 404) for a in answers), answers
        # A busy one: the first delete waits for the stopped turn to wind down; two more come
        # meanwhile, one by its shorthand id.
        srv.fake.responder = call_tool_when("slow job", ("slow_job", {"text": ""}))
        await agent.submit("start the slow job", client_id="busy-one")
        await asyncio.wait_for(plugin.running.wait(), 10)
        short = (await agent.session("busy-one"))["session"]["short_id"]
        first = asyncio.create_task(agent.delete_session("busy-one"))
        await asyncio.wait_for(plugin.winding_down.wait(), 10)
        later = await asyncio.gather(agent.delete_session("busy-one"), agent.delete_session(str(short)))
        assert (await first)["deleted"] is True
        assert [a["deleted"] for a in later] == [False, False]
        # Once it is gone, a delete is a plain 404.
        with pytest.raises(AgentError) as gone:
            await agent.delete_session("busy-one")
        assert gone.value.status == 404


async def test_a_stream_iterated_without_async_with_is_closed_when_the_loop_is_left(api_server: ApiServer) -> None:
    """`async for e in agent.stream(id): … break` must not leave its connection, and the server
    its subscription and queue, open until the client closes."""
    bus = api_server.engine.bus
    idle = bus.subscriber_count

    async def when(predicate: Any) -> None:
        async with asyncio.timeout(10):
            # The bus announces no subscriber coming or going: its count is all there is to watch.
            while not predicate():  # noqa: ASYNC110
                await asyncio.sleep(0.01)

    async with api_server.client() as agent:
        for n in range(3):
            async def submit_once_subscribed(n: int = n) -> None:
                await when(lambda: bus.subscriber_count > idle)
                await agent.submit("hi", client_id=f"api-brk{n}")

            submitting = asyncio.create_task(submit_once_subscribed())
            stream = agent.stream(f"api-brk{n}")
            async for e in stream:
                assert e["event"] == "tok" and e["data"]["session_id"] == f"api-brk{n}"
                break
            await submitting
            await when(lambda: bus.subscriber_count == idle)  # let go as the loop was left
        with pytest.raises(AgentError) as closed:  # and a read after that says why nothing comes
            await anext(stream)
        assert closed.value.code == "stream_closed" and "async with" in closed.value.message
        # Inside `async with`, leaving one loop keeps the stream for the next.
        async with agent.stream("api-brk0") as events:
            await agent.submit("again", client_id="api-brk0")
            async for _ in events:
                break
            async for e in events:
                if e["event"] == "done":
                    assert e["data"]["text"] == "echo: again"
                    break
            assert bus.subscriber_count > idle


async def test_an_opened_stream_is_read_in_several_loops_and_by_anext(api_server: ApiServer) -> None:
    """`await stream.open()` subscribes before the submit as `async with` does, and the stream is
    the caller's to close: leaving one loop does not end it."""
    # Held after the first piece (frame 0 is the role): the first loop's tok is that piece alone,
    # so there is more for the second loop, however the rest is merged while queued.
    api_server.fake.script(Reply.text("one two three four", chunks=4, hold_after=2))
    async with api_server.client() as agent:
        events = await agent.stream("api-loops").open()
        try:
            await agent.submit("count", client_id="api-loops")
            seen = []
            async for e in events:
                seen.append(e)
                break
            api_server.fake.release()
            async for e in events:
                seen.append(e)
                break
            async with asyncio.timeout(30):
                while seen[-1]["event"] != "done":
                    seen.append(await anext(events))
            names = [e["event"] for e in seen]
            assert seen[0]["data"]["text"] == split_text("one two three four", 4)[0] and names[1:-1] == ["tok"] * (len(seen) - 2)
            assert names[-1] == "done" and len(seen) >= 3
            # nothing lost between the loops
            assert "".join(e["data"]["text"] for e in seen[:-1]) == "one two three four"
        finally:
            await events.aclose()


class ListingPlugin(Plugin):
    """A read tool whose structured result holds a file name decoded with surrogateescape, as
    os.listdir gives non-UTF-8 names (an MCP server's structured content can hold them too)."""

    name = "listing"

    async def setup(self, api: PluginAPI) -> None:
        async def list_dir(args: NoteArgs, ctx: ToolContext) -> ToolOutput:
            name = b"caf\xe9.log".decode("utf-8", "surrogateescape")  # 'caf\udce9.log'
            return ToolOutput(f"1 file: {name}", data={"files": [name]})

        api.register_tool(Tool("list_dir", "List a directory", NoteArgs, "listing", list_dir, operation="read"))


async def test_a_lone_surrogate_in_a_tools_structured_result_does_not_cut_the_stream(
        api_server_factory: ApiServerFactory) -> None:
    srv = await api_server_factory(plugins=[ListingPlugin()], extra_files={"plugins.toml": "[listing]\nenabled = true\n"})
    srv.fake.responder = call_tool_when("list", ("list_dir", {"text": "/var/log"}))
    async with srv.client() as agent, agent.stream("api-listing") as events:
        await agent.submit("list the logs", client_id="api-listing")
        seen = await events_until_done(events)
    [result] = [e["data"] for e in seen if e["event"] == "tool_result"]
    assert result["content"] == "1 file: caf\ufffd.log" and result["data"] == {"files": ["caf\ufffd.log"]}
    assert seen[-1]["data"]["status"] == "complete"
