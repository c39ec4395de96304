"""aiops as an MCP host: external MCP servers' tools called by a model turn through the gates.

Two real servers: `mcp-server-time` from PyPI (stdio), and a streamable-HTTP server written here
with the SDK's MCPServer, served by uvicorn on a local port (stopped and started again to show the
reconnect). The model is the fake OpenAI server.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import socket
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ImageContent, TextContent, ToolAnnotations
from pydantic import BaseModel

from aiops.engine.engine import Engine
from aiops.engine.events import GateOpened
from aiops.integrations.mcp.host import McpPlugin
from aiops.integrations.mcp.naming import model_tool_name
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.support.engine import next_event

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8  # an image's bytes, as a server sends them
TIME_SERVER = str(Path(sys.executable).parent / "mcp-server-time")


def tool_results(fake: FakeOpenAI) -> list[str]:
    """What the model was told by tools in this session so far (the last request carries them all)."""
    return [m["content"] for m in fake.last_request.json.get("messages", []) if m.get("role") == "tool"]


def mcp_plugin(engine: Engine) -> McpPlugin:
    plugin = engine.plugin("mcp")
    assert isinstance(plugin, McpPlugin), engine.plugin_status
    return plugin


async def wait_state(engine: Engine, server: str, state: str, timeout: float = 20.0) -> None:
    conn = mcp_plugin(engine).connections[server]
    async with asyncio.timeout(timeout):
        while conn.state != state:
            await conn.next_change()


def time_toml(**extra: str) -> str:
    lines = ["ping_seconds = 0.3", "retry_first_seconds = 0.2", "retry_max_seconds = 0.5", "",
             "[servers.time]", f"command = {json.dumps(TIME_SERVER)}",
             'args = ["--local-timezone", "UTC"]']
    lines += [f"{k} = {v}" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


# ---- stdio: mcp-server-time -------------------------------------------------------------------------


async def test_time_server_tool_runs_after_the_operator_approves_its_gate(engine_factory, fake_openai):
    gates = '[tools."mcp:time"]\nread = "ask"\n[wait]\napi = 0\n'
    engine = await engine_factory(extra_files={"mcp.toml": time_toml(), "gates.toml": gates})
    await wait_state(engine, "time", "connected")
    name = model_tool_name("time", "get_current_time")
    assert name == "time__get_current_time" and engine.tools.get(name).tool_type == "mcp"
    # The model is offered the server's own schema.
    offered = {t.name: t for t in engine.tools.specs()}[name]
    assert offered.parameters["required"] == ["timezone"]

    fake_openai.script(Reply.tool_calls((name, {"timezone": "Europe/Paris"})), Reply.text("it is late"))
    sub = engine.subscribe()
    turn = await engine.submit("api-t", "what time is it in Paris?", kind="api")
    opened = await next_event(sub, "gate")
    assert isinstance(opened, GateOpened)
    assert opened.gate.tool == name and opened.gate.tool_type == "mcp" and opened.gate.operation == "read"
    assert "time:get_current_time" in opened.gate.summary and "Europe/Paris" in opened.gate.summary
    assert len(fake_openai.requests) == 1  # nothing ran while the gate waited
    engine.resolve_gate(opened.gate.id, "approved", by="test-operator")
    result = await turn.wait(20)
    assert result.status == "complete" and result.text == "it is late"
    told = json.loads(tool_results(fake_openai)[0])
    assert told["timezone"] == "Europe/Paris" and told["day_of_week"]
    history = await engine.history("api-t")
    tool_msg = next(m for m in history if m.role == "tool")
    assert tool_msg.meta["data"]["mcp_server"] == "time"
    assert tool_msg.meta["data"]["structured"]["timezone"] == "Europe/Paris"


async def test_the_apis_gate_names_an_mcp_tool_as_gates_toml_does(api_server_factory):
    """The model calls it `time__get_current_time`; the operator reading the API's `gate` event and
    gate list also gets `rule_target`, the name gates.toml rules use, which says server and tool."""
    host = McpPlugin()
    srv = await api_server_factory(plugins=[host], extra_files={
        "plugins.toml": "[mysql]\nenabled = false\n[mcp]\nenabled = true\n", "mcp.toml": time_toml(),
        "gates.toml": '[tools."mcp:time"]\nread = "ask"\n[wait]\napi = 0\n'})
    await host.ready()
    srv.fake.script(Reply.tool_calls(("time__get_current_time", {"timezone": "UTC"})), Reply.text("noon"))
    async with srv.client() as ops, ops.stream("api-rule") as stream:
        await ops.submit("what time is it?", client_id="api-rule")
        async with asyncio.timeout(20):
            gate = await anext(e["data"] async for e in stream if e["event"] == "gate")
        assert (gate["tool"], gate["tool_type"]) == ("time__get_current_time", "mcp")
        assert gate["rule_target"] == "mcp:time:get_current_time"
        assert gate["summary"] == 'mcp:time:get_current_time {"timezone": "UTC"}'
        assert gate["session_grant"] == ("later mcp:time:get_current_time read calls of this session "
                                         "pass without asking")
        (listed,) = await ops.gates()
        assert listed["rule_target"] == "mcp:time:get_current_time"
        resolved = await ops.resolve_gate(gate["id"], "deny")
        assert resolved["rule_target"] == "mcp:time:get_current_time"


async def test_a_deny_rule_for_one_mcp_tool_keeps_it_from_running(engine_factory, fake_openai):
    gates = '[tools."mcp:time:convert_time"]\nread = "deny"\n'
    engine = await engine_factory(extra_files={"mcp.toml": time_toml(), "gates.toml": gates})
    await wait_state(engine, "time", "connected")
    fake_openai.script(
        Reply.tool_calls(("time__convert_time", {"source_timezone": "UTC", "time": "12:00",
                                                 "target_timezone": "Asia/Tokyo"})),
        Reply.tool_calls(("time__get_current_time", {"timezone": "UTC"})), Reply.text("ok"))
    result = await engine.run("api-d", "convert", kind="api", timeout=20)
    assert result.status == "complete"
    denied, allowed = tool_results(fake_openai)
    assert "policy denies time__convert_time" in denied and "Asia/Tokyo" not in denied
    # The audit log names the rule that denied it, as gates.toml does.
    (audited,) = [a for a in await engine.store.audit("api-d") if a.event == "policy_denied"]
    assert audited.tool == "time__convert_time" and audited.data["rule_target"] == "mcp:time:convert_time"
    # The server rule does not cover the other tool: a read, allowed by the default.
    assert json.loads(allowed)["timezone"] == "UTC"


async def test_a_server_that_cannot_start_shows_its_state_and_stderr_and_the_others_work(
        engine_factory, fake_openai, tmp_path):
    script = tmp_path / "broken_server.py"
    script.write_text("import sys\nprint('boom: cannot open the index', file=sys.stderr)\nsys.exit(3)\n")
    toml = time_toml() + f'\n[servers.broken]\ncommand = {json.dumps(sys.executable)}\n' \
                          f'args = [{json.dumps(str(script))}]\n'
    engine = await engine_factory(extra_files={"mcp.toml": toml})
    await wait_state(engine, "time", "connected")
    await wait_state(engine, "broken", "failed")
    plugin = mcp_plugin(engine)
    await plugin.ready()
    status = {s["name"]: s for s in plugin.status()}
    assert "boom: cannot open the index" in status["broken"]["stderr_tail"]
    note = next(p for p in engine.plugin_status if p.name == "mcp").reason
    assert "broken: failed" in note and "boom: cannot open the index" in note
    assert "time: connected" in note
    listing = (await engine.run("console-1", "!mcp", kind="console", is_operator=True, timeout=20)).text
    assert "broken (stdio" in listing and "boom: cannot open the index" in listing
    assert "time__get_current_time  (read; gate mcp:time:get_current_time)" in listing
    # A client may not look.
    refused = (await engine.run("api-x", "!mcp", kind="api", timeout=20)).text
    assert "broken" not in refused


async def test_the_server_gets_only_the_environment_it_is_given(engine_factory, fake_openai, tmp_path):
    """No inherited secrets: a stdio server sees PATH and friends, `env`, and `inherit_env`."""
    script = tmp_path / "env_server.py"
    script.write_text(
        "import os\nfrom mcp.server.mcpserver import MCPServer\n"
        "s = MCPServer('env')\n"
        "@s.tool()\ndef show_env() -> str:\n    return ' '.join(sorted(os.environ))\n"
        "s.run()\n")
    toml = ("[servers.envy]\n"
            f"command = {json.dumps(sys.executable)}\nargs = [{json.dumps(str(script))}]\n"
            'env = { GREETING = "hello ${WHO}" }\ninherit_env = ["SHARED_TOKEN"]\n')
    env = {"WHO": "world", "SHARED_TOKEN": "s1", "OPENAI_API_KEY": "sk-secret", "PATH": "/usr/bin:/bin"}
    engine = await engine_factory(extra_files={"mcp.toml": toml,
                                               "gates.toml": '[tools."mcp:envy"]\nwrite = "allow"\n'},
                                  env=env)
    await wait_state(engine, "envy", "connected")
    fake_openai.script(Reply.tool_calls(("envy__show_env", {})), Reply.text("ok"))
    await engine.run("api-e", "env?", kind="api", timeout=20)
    names = tool_results(fake_openai)[0].split()
    assert "GREETING" in names and "SHARED_TOKEN" in names and "PATH" in names
    assert "OPENAI_API_KEY" not in names and "WHO" not in names


# ---- streamable HTTP: a server written with MCPServer -------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Confirm(BaseModel):
    """A yes/no question: no fields to fill in."""


class NameForm(BaseModel):
    name: str


class HttpMcp:
    """An MCPServer served by uvicorn on a fixed port, which the test can stop and start again."""

    def __init__(self) -> None:
        self.port = free_port()
        self.calls: list[str] = []
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def build(self) -> MCPServer:
        mcp = MCPServer("files")

        @mcp.tool(annotations=ToolAnnotations(read_only_hint=True))
        def read_note(name: str) -> str:
            """Read a note."""
            self.calls.append(f"read_note {name}")
            return f"note {name}: buy milk"

        @mcp.tool()
        def write_note(name: str, text: str) -> str:
            """Write a note."""
            self.calls.append(f"write_note {name}")
            return "written"

        @mcp.tool()
        def delete_everything() -> str:
            """Delete every note."""
            self.calls.append("delete_everything")
            return "deleted"

        @mcp.tool(annotations=ToolAnnotations(read_only_hint=True))
        def read_log() -> str:
            """The whole log."""
            return "FIRST LINE\n" + "".join(f"line {i}\n" for i in range(20_000)) + "LAST LINE"

        @mcp.tool(annotations=ToolAnnotations(read_only_hint=True))
        def screenshot() -> list[TextContent | ImageContent]:
            """A picture of the board."""
            return [TextContent(type="text", text="the board:"),
                    ImageContent(type="image", data=base64.b64encode(PNG).decode(), mime_type="image/png")]

        @mcp.tool()
        async def wipe_board(ctx: Context) -> str:
            """Wipe the board, after asking."""
            answer = await ctx.elicit("Really wipe the whole board?", Confirm)
            self.calls.append(f"wipe_board {answer.action}")
            return f"answer: {answer.action}"

        @mcp.tool()
        async def sign_up(ctx: Context) -> str:
            """Needs a name."""
            answer = await ctx.elicit("Your name?", NameForm)
            return f"answer: {answer.action}"

        @mcp.resource("notes://index")
        def index() -> str:
            return "milk, eggs"

        @mcp.prompt()
        def summarize(topic: str) -> str:
            return f"Summarize what we know about {topic}."

        return mcp

    async def start(self) -> None:
        app = self.build().streamable_http_app()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on",
                                timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._task = asyncio.get_running_loop().create_task(self._server.serve())
        async with asyncio.timeout(10):
            while not self._server.started:  # noqa: ASYNC110 - uvicorn offers only this flag
                await asyncio.sleep(0.02)

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True  # open streams are cut after timeout_graceful_shutdown
            await asyncio.gather(self._task, return_exceptions=True)
            self._server = self._task = None


@pytest.fixture
async def http_mcp() -> AsyncIterator[HttpMcp]:
    server = HttpMcp()
    await server.start()
    yield server
    await server.stop()


def http_toml(url: str, **extra: str) -> str:
    lines = ["ping_seconds = 0.3", "retry_first_seconds = 0.2", "retry_max_seconds = 0.5", "",
             "[servers.files]", f"url = {json.dumps(url)}", 'disabled_tools = ["delete_*"]']
    lines += [f"{k} = {v}" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


async def test_http_server_read_only_tool_runs_without_a_gate_and_globs_hide_tools(
        engine_factory, fake_openai, http_mcp):
    engine = await engine_factory(extra_files={"mcp.toml": http_toml(http_mcp.url)})
    await wait_state(engine, "files", "connected")
    names = set(engine.tools.names())
    assert {"files__read_note", "files__write_note", "files__read_log"} <= names
    assert "files__delete_everything" not in names
    fake_openai.script(Reply.tool_calls(("files__read_note", {"name": "shopping"})), Reply.text("milk"))
    sub = engine.subscribe()
    result = await engine.run("api-h", "what do I need?", kind="api", timeout=20)
    assert result.text == "milk"
    assert "gate" not in [e.name for e in sub.pending()]
    assert tool_results(fake_openai) == ["note shopping: buy milk"]
    # The model cannot call the hidden tool: it is not a tool at all.
    fake_openai.script(Reply.tool_calls(("files__delete_everything", {})), Reply.text("sorry"))
    await engine.run("api-h", "delete it all", kind="api", timeout=20)
    assert "unknown tool 'files__delete_everything'" in tool_results(fake_openai)[-1]
    assert "delete_everything" not in http_mcp.calls


async def test_http_server_write_tool_waits_for_the_gate_and_a_denial_stops_it(
        engine_factory, fake_openai, http_mcp):
    engine = await engine_factory(extra_files={"mcp.toml": http_toml(http_mcp.url),
                                               "gates.toml": "[wait]\napi = 0\n"})
    await wait_state(engine, "files", "connected")
    fake_openai.script(Reply.tool_calls(("files__write_note", {"name": "a", "text": "b"})), Reply.text("no"))
    sub = engine.subscribe()
    turn = await engine.submit("api-w", "write a note", kind="api")
    opened = await next_event(sub, "gate")
    assert isinstance(opened, GateOpened) and opened.gate.operation == "write"
    engine.resolve_gate(opened.gate.id, "denied", by="test-operator")
    await turn.wait(20)
    assert http_mcp.calls == []
    assert "did not allow" in tool_results(fake_openai)[0]


async def test_a_huge_result_is_cut_for_the_model_and_kept_whole_for_the_operator(
        engine_factory, fake_openai, http_mcp):
    engine = await engine_factory(extra_files={"mcp.toml": http_toml(http_mcp.url, max_result_chars="2000")})
    await wait_state(engine, "files", "connected")
    fake_openai.script(Reply.tool_calls(("files__read_log", {})), Reply.text("long"))
    await engine.run("api-l", "show the log", kind="api", timeout=20)
    told = tool_results(fake_openai)[0]
    assert len(told) <= 2000
    assert told.startswith("FIRST LINE") and told.endswith("LAST LINE")
    assert "characters cut by aiops" in told
    tool_msg = next(m for m in await engine.history("api-l") if m.role == "tool")
    full = tool_msg.meta["data"]["full_text"]
    assert full.startswith("FIRST LINE") and full.endswith("LAST LINE") and "line 19999" in full


async def test_the_http_server_dying_and_coming_back_is_reconnected(engine_factory, fake_openai, http_mcp):
    engine = await engine_factory(extra_files={"mcp.toml": http_toml(http_mcp.url)})
    await wait_state(engine, "files", "connected")
    await http_mcp.stop()
    await wait_state(engine, "files", "retrying")
    fake_openai.script(Reply.tool_calls(("files__read_note", {"name": "x"})), Reply.text("down"))
    await engine.run("api-r", "read x", kind="api", timeout=20)
    assert "MCP server files is not connected (retrying" in tool_results(fake_openai)[-1]
    await http_mcp.start()
    await wait_state(engine, "files", "connected")
    fake_openai.script(Reply.tool_calls(("files__read_note", {"name": "y"})), Reply.text("up"))
    result = await engine.run("api-r", "read y", kind="api", timeout=20)
    assert result.text == "up" and tool_results(fake_openai)[-1] == "note y: buy milk"


async def test_operator_reads_a_resource_and_runs_a_prompt(engine_factory, fake_openai, http_mcp):
    engine = await engine_factory(extra_files={"mcp.toml": http_toml(http_mcp.url)})
    await wait_state(engine, "files", "connected")
    listing = (await engine.run("console-1", "!mcp", kind="console", is_operator=True, timeout=20)).text
    assert "prompts: summarize(topic)" in listing and "resources: notes://index" in listing
    assert "delete_everything  (hidden by enabled_tools/disabled_tools)" in listing
    read = (await engine.run("console-1", "!mcp read files notes://index", kind="console",
                             is_operator=True, timeout=20)).text
    assert read == "milk, eggs"
    fake_openai.script(Reply.text("summary done"))
    out = (await engine.run("console-1", "!mcp prompt files summarize topic=eggs", kind="console",
                            is_operator=True, timeout=20)).text
    assert "running prompt files:summarize" in out
    await fake_openai.wait_for_requests_async(1, timeout=20)
    asked = [m["content"] for m in fake_openai.last_request.json["messages"] if m["role"] == "user"]
    assert asked[-1] == "Summarize what we know about eggs."


async def test_an_image_becomes_an_artifact_not_context(engine_factory, fake_openai, http_mcp):
    engine = await engine_factory(extra_files={"mcp.toml": http_toml(http_mcp.url)})
    await wait_state(engine, "files", "connected")
    fake_openai.script(Reply.tool_calls(("files__screenshot", {})), Reply.text("seen"))
    await engine.run("api-i", "show me", kind="api", timeout=20)
    told = tool_results(fake_openai)[0]
    assert told.startswith("the board:") and "image image/png" in told and "not shown to the model" in told
    assert base64.b64encode(PNG).decode()[:40] not in told
    tool_msg = next(m for m in await engine.history("api-i") if m.role == "tool")
    (artifact,) = tool_msg.meta["data"]["artifacts"]
    assert artifact["mime_type"] == "image/png"
    assert await asyncio.to_thread(Path(artifact["path"]).read_bytes) == PNG
    assert artifact["path"] in told


async def test_a_servers_question_goes_to_the_operator_like_a_gate(engine_factory, fake_openai, http_mcp):
    gates = '[tools."mcp:files"]\nwrite = "allow"\n[wait]\napi = 0\n'
    # Asking mid-call needs the handshake-era protocol over HTTP (the 2026 one has no back-channel).
    engine = await engine_factory(extra_files={"mcp.toml": http_toml(http_mcp.url, protocol='"legacy"'),
                                               "gates.toml": gates})
    await wait_state(engine, "files", "connected")
    fake_openai.script(Reply.tool_calls(("files__wipe_board", {})), Reply.text("asked"))
    sub = engine.subscribe()
    turn = await engine.submit("api-q", "wipe it", kind="api")
    opened = await next_event(sub, "gate")
    assert isinstance(opened, GateOpened)
    assert opened.gate.summary == "MCP server files asks: Really wipe the whole board?"
    engine.resolve_gate(opened.gate.id, "approved", by="test-operator")
    await turn.wait(20)
    assert tool_results(fake_openai)[0] == "answer: accept"
    # Denied: the server hears "decline".
    fake_openai.script(Reply.tool_calls(("files__wipe_board", {})), Reply.text("asked again"))
    turn = await engine.submit("api-q", "wipe it now", kind="api")
    opened = await next_event(sub, "gate")
    engine.resolve_gate(opened.gate.id, "denied", by="test-operator")
    await turn.wait(20)
    assert tool_results(fake_openai)[-1] == "answer: decline"
    assert http_mcp.calls == ["wipe_board accept", "wipe_board decline"]
    # A form with fields cannot be answered from a gate: declined, and the session is told.
    fake_openai.script(Reply.tool_calls(("files__sign_up", {})), Reply.text("no name"))
    await engine.run("api-q", "sign me up", kind="api", timeout=20)
    assert tool_results(fake_openai)[-1] == "answer: decline"
    notices = [m.content for m in await engine.history("api-q") if m.role == "notice"]
    assert any("asked for name" in n and "declined" in n for n in notices), notices


async def test_stopping_a_connection_that_keeps_failing_always_ends(tmp_path, caplog):
    # A server that went away: the connection retries fast. Stopping it at any moment (inside the
    # SDK's connect, in the backoff, in between) must end it: a cancel the SDK's task group hands
    # back wrapped beside the ConnectError once kept a shutdown waiting forever.
    import logging
    import random

    from aiops.integrations.mcp.connection import ServerConnection
    from aiops.mcp_config import McpConfig, McpServerConfig

    caplog.set_level(logging.ERROR, "aiops.integrations.mcp")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = McpServerConfig(url=f"http://127.0.0.1:{port}/mcp")
    settings = McpConfig(retry_first_seconds=0.01, retry_max_seconds=0.02)

    async def on_change(conn: ServerConnection) -> None:
        return None

    async def on_elicit(conn: ServerConnection, params: object) -> object:
        raise AssertionError("no elicitation expected")

    rng = random.Random(7)
    for _ in range(100):
        conn = ServerConnection("gone", cfg, settings, {}, tmp_path / "gone.err", on_change, on_elicit)
        conn.start()
        await asyncio.sleep(rng.random() * 0.02)
        await asyncio.wait_for(conn.stop(), 5)
        assert conn.state == "stopped"


async def test_another_aiops_as_a_server_is_asked_about_only_for_calls_that_change_something(
        engine_factory, api_server_factory, fake_openai):
    """An aiops with another aiops's /mcp in mcp.toml: listing the sessions there only reads, so the
    default rules let it run; sending a message there is a write, which asks (QA: list_sessions of
    a peer waited for approval)."""
    from tests.support.server import Tokens

    tokens = Tokens.make(ops="operator", bot="client")
    peer = await api_server_factory(tokens=tokens, server={"mcp_port": 0})
    assert peer.handle.mcp is not None
    toml = (f"[servers.peer]\nurl = {json.dumps(peer.handle.mcp.url)}\n"
            'headers = { Authorization = "Bearer ${PEER_TOKEN}" }\n')
    engine = await engine_factory(extra_files={"mcp.toml": toml, "gates.toml": "[wait]\napi = 0\n"},
                                  env={"PEER_TOKEN": tokens.secrets["bot"]})
    await wait_state(engine, "peer", "connected")

    fake_openai.script(Reply.tool_calls(("peer__list_sessions", {})), Reply.text("none there"))
    sub = engine.subscribe()
    turn = await engine.submit("api-p", "what runs on the peer?", kind="api")
    async with asyncio.timeout(20):
        first = await anext(e async for e in sub if e.name in ("gate", "done"))
    assert first.name == "done", "listing the peer's sessions waited for approval"
    assert (await turn.wait(20)).text == "none there"
    assert json.loads(tool_results(fake_openai)[0]) == []

    fake_openai.script(Reply.tool_calls(("peer__send_message", {"text": "restart it"})), Reply.text("asked"))
    turn = await engine.submit("api-p", "tell the peer to restart", kind="api")
    opened = await next_event(sub, "gate")
    assert isinstance(opened, GateOpened)
    assert (opened.gate.rule_target, opened.gate.operation) == ("mcp:peer:send_message", "write")
    engine.resolve_gate(opened.gate.id, "denied", by="test-operator")
    await turn.wait(20)
    assert "did not allow" in tool_results(fake_openai)[-1]
    assert await peer.engine.list_sessions() == []  # nothing reached the peer


async def test_a_call_to_a_server_still_connecting_says_so_not_unknown_tool(engine_factory, fake_openai):
    """A turn that starts before a server of mcp.toml has connected is not offered its tools; a
    call of one (a model that knows the name) is told the server is not connected yet, not that
    the tool does not exist (QA: "unknown tool 'self__list_sessions'")."""
    held: list[asyncio.StreamWriter] = []  # its connections, kept open
    silent = await asyncio.start_server(lambda r, w: held.append(w), "127.0.0.1", 0)  # never answers
    port = silent.sockets[0].getsockname()[1]
    try:
        toml = http_toml(f"http://127.0.0.1:{port}/mcp").replace("[servers.files]", "[servers.slow]")
        engine = await engine_factory(extra_files={"mcp.toml": toml})
        assert mcp_plugin(engine).connections["slow"].state == "connecting"
        fake_openai.script(Reply.tool_calls(("slow__read_note", {"name": "a"})), Reply.text("ok"))
        result = await engine.run("api-s", "read it", kind="api", timeout=20)
        assert result.status == "complete"
        told = tool_results(fake_openai)[0]
        assert told.startswith("error: MCP server slow is not connected yet (connecting)"), told
        assert "unknown tool" not in told and "slow__read_note was not executed" in told
        # A name of no configured server is still unknown.
        fake_openai.script(Reply.tool_calls(("nosuch__tool", {})), Reply.text("ok"))
        await engine.run("api-s", "again", kind="api", timeout=20)
        assert "unknown tool 'nosuch__tool'" in tool_results(fake_openai)[-1]
    finally:
        silent.close()


# ---- the tool lists of the last connections (tool_cache.py) --------------------------------------------


async def _listed_once(engine_factory, toml: str) -> Path:
    """One process that connects to the server and stops: its list is kept for the next start."""
    first = await engine_factory(extra_files={"mcp.toml": toml})
    await wait_state(first, "files", "connected")
    cache = first.config.paths.data_dir / "mcp" / "tools.json"
    async with asyncio.timeout(10):
        while not cache.exists():  # noqa: ASYNC110 - written once the list is in, by a thread
            await asyncio.sleep(0.02)
    await first.stop()
    return cache


async def test_a_one_turn_process_offers_the_last_list_and_starts_the_server_for_a_call_only(
        engine_factory, fake_openai, http_mcp):
    """`aiops chat` used to wait for every server of mcp.toml before its one turn (a second or
    more per stdio server). With the list a server gave last time, its tools are offered at once,
    and the server is started only when the model calls one."""
    toml = http_toml(http_mcp.url, headers='{ Authorization = "Bearer sk-literal-token" }')
    cache = await _listed_once(engine_factory, toml)
    kept = cache.read_text()
    assert "127.0.0.1" not in kept and "sk-literal-token" not in kept  # a hash of the config only

    engine = await engine_factory(extra_files={"mcp.toml": toml}, one_turn=True)
    conn = mcp_plugin(engine).connections["files"]
    assert not conn.started and conn.describe_state() == "not started"
    note = next(p for p in engine.plugin_status if p.name == "mcp").reason
    assert "files: started when one of its 6 tools (from its last connection) is called" in note, note
    fake_openai.script(Reply.text("hello"))
    await engine.run("api-c", "hi", kind="api", timeout=20)
    offered = [t["function"]["name"] for t in fake_openai.last_request.json["tools"]]
    assert "files__read_note" in offered and "files__delete_everything" not in offered  # globs still apply
    assert not conn.started  # a turn that calls none of its tools never starts it

    fake_openai.script(Reply.tool_calls(("files__read_note", {"name": "a"})), Reply.text("ok"))
    result = await engine.run("api-c", "read note a", kind="api", timeout=20)
    assert result.status == "complete"
    assert "note a: buy milk" in tool_results(fake_openai)[-1] and http_mcp.calls == ["read_note a"]
    assert conn.state == "connected"


async def test_a_cached_list_the_server_no_longer_matches_runs_nothing_it_did_not_gate(
        engine_factory, fake_openai, http_mcp):
    """The gate judges a call by the tool as offered: from the last list, until the server answers.
    A tool that list called a read but the server now marks a write, or no longer has, is not run."""
    toml = http_toml(http_mcp.url)
    cache = await _listed_once(engine_factory, toml)
    listed = json.loads(cache.read_text())

    async def offered_from(edit: Callable[[list[dict[str, Any]]], None]) -> Engine:
        doc = copy.deepcopy(listed)
        edit(doc["servers"]["files"]["tools"])
        cache.write_text(json.dumps(doc))
        return await engine_factory(extra_files={"mcp.toml": toml}, one_turn=True)

    def write_note_a_read(tools: list[dict[str, Any]]) -> None:
        next(t for t in tools if t["name"] == "write_note")["annotations"] = {"readOnlyHint": True}

    engine = await offered_from(write_note_a_read)
    assert engine.tools.get("files__write_note").operation == "read"
    fake_openai.script(Reply.tool_calls(("files__write_note", {"name": "a", "text": "x"})), Reply.text("ok"))
    assert (await engine.run("api-s", "write it", kind="api", timeout=20)).status == "complete"
    refused = tool_results(fake_openai)[-1]
    assert refused.startswith("error: MCP server files now marks write_note as a write"), refused
    # From the server's own list now: a write, which asks by default.
    assert engine.tools.get("files__write_note").operation == "write"
    await engine.stop()

    engine = await offered_from(lambda tools: tools.append({**tools[0], "name": "read_secret"}))
    fake_openai.script(Reply.tool_calls(("files__read_secret", {"name": "a"})), Reply.text("ok"))
    assert (await engine.run("api-s2", "read it", kind="api", timeout=20)).status == "complete"
    gone = tool_results(fake_openai)[-1]
    assert gone.startswith("error: MCP server files no longer offers read_secret"), gone
    assert "files__read_secret" not in {t.name for t in engine.tools.specs()}  # withdrawn
    assert http_mcp.calls == []  # neither call reached the server


async def test_a_changed_server_config_or_an_unreadable_cache_waits_for_the_server(
        engine_factory, fake_openai, http_mcp):
    toml = http_toml(http_mcp.url)
    cache = await _listed_once(engine_factory, toml)
    engine = await engine_factory(extra_files={"mcp.toml": http_toml(http_mcp.url, timeout="30")}, one_turn=True)
    conn = mcp_plugin(engine).connections["files"]
    assert conn.started and "files__read_note" not in {t.name for t in engine.tools.specs()}
    await engine.stop()
    cache.write_text("{not json")
    engine = await engine_factory(extra_files={"mcp.toml": toml}, one_turn=True)
    assert mcp_plugin(engine).connections["files"].started
    await wait_state(engine, "files", "connected")
    assert "files__read_note" in {t.name for t in engine.tools.specs()}


async def test_a_listed_server_that_does_not_come_up_says_so_and_its_tools_are_withdrawn(
        engine_factory, fake_openai, http_mcp):
    toml = http_toml(http_mcp.url)
    await _listed_once(engine_factory, toml)
    await http_mcp.stop()  # down at the next start
    engine = await engine_factory(extra_files={"mcp.toml": toml}, one_turn=True)
    assert "files__read_note" in {t.name for t in engine.tools.specs()}  # offered from the list
    fake_openai.script(Reply.tool_calls(("files__read_note", {"name": "a"})), Reply.text("ok"))
    assert (await engine.run("api-d", "read it", kind="api", timeout=30)).status == "complete"
    told = tool_results(fake_openai)[-1]
    assert told.startswith("error: MCP server files is not connected (failed"), told
    assert not any(t.name.startswith("files__") for t in engine.tools.specs())  # withdrawn


async def test_aiops_chat_waits_for_a_server_whose_list_is_over_a_day_old(engine_factory, fake_openai, http_mcp):
    """A one-turn process may never start a listed server, so an old list is not used there: the
    server's new tools reach `aiops chat` within a day even if nothing else ever runs."""
    toml = http_toml(http_mcp.url)
    cache = await _listed_once(engine_factory, toml)
    doc = json.loads(cache.read_text())
    doc["servers"]["files"]["listed_at"] -= 25 * 3600
    cache.write_text(json.dumps(doc))
    engine = await engine_factory(extra_files={"mcp.toml": toml}, one_turn=True)
    assert mcp_plugin(engine).connections["files"].started
    await engine.tools_ready()
    assert "files__read_note" in {t.name for t in engine.tools.specs()}
    async with asyncio.timeout(10):
        while json.loads(cache.read_text())["servers"]["files"]["listed_at"] < doc["servers"]["files"]["listed_at"] + 3600:  # noqa: ASYNC110
            await asyncio.sleep(0.02)  # listed again, and kept


async def test_aiops_chat_without_a_terminal_declines_a_servers_question_and_says_why(
        tmp_path, fake_openai, http_mcp):
    """A question an MCP server asks during a call is a gate no rule answers: `aiops chat` with no
    terminal declines it, and does not suggest a gates.toml rule that would change nothing."""
    import os

    from tests.fakes.fixtures import make_config_dir, openai_model_entry

    cfg = make_config_dir(tmp_path, {"local": openai_model_entry(fake_openai)}, "local", {
        "plugins.toml": "[mysql]\nenabled = false\n[mcp]\nenabled = true\n",
        "mcp.toml": http_toml(http_mcp.url, protocol='"legacy"'),  # asking mid-call needs it over HTTP
        "gates.toml": '[tools."mcp:files:wipe_board"]\nwrite = "allow"\n'})
    fake_openai.script(Reply.tool_calls(("files__wipe_board", {})), Reply.text("it said no"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOPS_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aiops.cli", "chat", "wipe it", "--config-dir", str(cfg), "--data-dir",
        str(tmp_path / "data"), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    said = out.decode() + err.decode()
    assert proc.returncode == 0, said
    assert "[declined: " in said and "Really wipe the whole board?" in said, said
    assert "no rule in gates.toml answers an MCP server's question" in said
    assert "elicitation" not in said  # no rule named after it is suggested
    assert http_mcp.calls == ["wipe_board decline"] and out.decode().rstrip().endswith("it said no")
