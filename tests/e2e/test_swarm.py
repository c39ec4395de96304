"""Swarm: `agent_call` between real `aiops serve` processes, each on its own data dir, port and
fake model server.

Every instance has an operator token (`ops`) and a client token (`peer`) that it gives the
instances calling it. What is asserted is what users see: the caller's turn (its events on the API
stream, what its model read as the tool result) and the peer's sessions, gates and history
through its API.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from aiops.client import AgentClient
from tests.fakes.fixtures import make_config_dir, openai_model_entry
from tests.fakes.openai_server import FakeOpenAI, Reply, tool_results
from tests.support.server import ServeProcess, Tokens, start_serve

pytestmark = pytest.mark.timeout(180)


@dataclass
class Node:
    name: str
    proc: ServeProcess
    fake: FakeOpenAI
    tokens: Tokens

    @property
    def url(self) -> str:
        return self.proc.url

    def operator(self) -> AgentClient:
        return AgentClient(self.url, token=self.tokens.secrets["ops"])


def _free_port() -> int:
    """A port nothing listens on now (for a peer that must know another's address before it starts,
    and for a peer that is down)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _peer_var(name: str) -> str:
    return f"SWARM_TEST_PEER_{name.upper()}"


NodeFactory = Callable[..., Awaitable[Node]]


def node_tokens() -> Tokens:
    return Tokens.make(ops="operator", peer="client")


@pytest.fixture
async def nodes(tmp_path: Path) -> AsyncIterator[NodeFactory]:
    """`await nodes(name, peers={name: Node | (url, token)}, max_depth=1, peer_timeout=None, gates="",
    port=0, tokens=None, allow_calls=True)`: an `aiops serve` with its own fake model, tokens (`ops`
    operator, `peer` client), data dir and swarm peers; agent_call runs unasked unless not
    `allow_calls` (the shipped rule: it asks)."""
    started: list[Node] = []
    with contextlib.ExitStack() as stack:

        async def make(name: str, *, peers: dict[str, Node | tuple[str, str]] | None = None,
                       max_depth: int = 1, peer_timeout: float | None = None, gates: str = "", port: int = 0,
                       tokens: Tokens | None = None, allow_calls: bool = True) -> Node:
            fake = stack.enter_context(FakeOpenAI())
            tokens = tokens or node_tokens()
            env = tokens.env()
            peer_tables: dict[str, Any] = {}
            for peer, target in (peers or {}).items():
                url, secret = (target.url, target.tokens.secrets["peer"]) if isinstance(target, Node) else target
                table: dict[str, Any] = {"url": url, "token_env": _peer_var(peer),
                                         "description": f"the aiops of team {peer}"}
                if peer_timeout is not None:
                    table["timeout_seconds"] = peer_timeout
                peer_tables[peer] = table
                env[_peer_var(peer)] = secret  # the peer's client token, as its operator handed it over
            aiops_toml = {"server": {"host": "127.0.0.1", "port": 0}, "auth": {"tokens": tokens.table()}}
            if peer_tables:
                aiops_toml["swarm"] = {"peers": peer_tables}
            root = tmp_path / name
            cfg = make_config_dir(root, {"local": openai_model_entry(fake)}, "local", {
                "aiops.toml": tomli_w.dumps(aiops_toml),
                "plugins.toml": "[mysql]\nenabled = false\n[swarm]\nenabled = true\n",
                "limits.toml": f"max_agent_call_depth = {max_depth}\n",
                "gates.toml": ('[tools.agent_call]\nwrite = "allow"\n' if allow_calls else "") + gates,
            })
            proc = await asyncio.to_thread(start_serve, cfg, root / "data", port=port, env=env, fake=fake,
                                           tokens=tokens)
            node = Node(name, proc, fake, tokens)
            started.append(node)
            return node

        yield make
        for node in started:
            with contextlib.suppress(AssertionError):
                await asyncio.to_thread(node.proc.stop, timeout=15)
            if node.proc.proc.poll() is None:
                node.proc.proc.kill()
                node.proc.proc.wait(10)


def _call(peer: str, message: str) -> Reply:
    return Reply.tool_calls(("agent_call", {"peer": peer, "message": message}))


def _relay(prefix: str) -> Callable[[dict[str, Any]], Reply | None]:
    """A model that answers with the tool result it just read (so its caller's model reads it too)."""
    def respond(body: dict[str, Any]) -> Reply | None:
        results = tool_results(body)
        return Reply.text(f"{prefix}: {results[-1]}") if results else None
    return respond


async def _turn(agent: AgentClient, session: str, text: str,
                on_event: Callable[[dict[str, Any]], Awaitable[None]] | None = None) -> list[dict[str, Any]]:
    """Submit to `session` and return the turn's events (streamed from before the submit) to its done."""
    seen: list[dict[str, Any]] = []
    async with agent.stream(session) as events:
        accepted = await agent.submit(text, client_id=session)
        async for e in events:
            seen.append(e)
            if on_event is not None:
                await on_event(e)
            if e["event"] == "done" and e["data"].get("turn_id") == accepted["turn_id"]:
                return seen
    raise AssertionError(f"the stream ended before the turn's done: {seen}")


async def _eventually(read: Callable[[], Awaitable[Any]], ok: Callable[[Any], bool],
                      timeout: float = 30.0) -> Any:
    """`read()` again until `ok` holds for what it returns (a state another process reaches soon)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not ok(value := await read()):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not reached within {timeout} s: {value}")
        await asyncio.sleep(0.05)
    return value


def _notices(events: list[dict[str, Any]]) -> list[str]:
    return [e["data"]["text"] for e in events if e["event"] == "notice"]


def _tool_result(events: list[dict[str, Any]]) -> dict[str, Any]:
    [result] = [e["data"] for e in events if e["event"] == "tool_result"]
    return result


async def _swarm_sessions(node: Node) -> list[dict[str, Any]]:
    async with node.operator() as agent:
        return await agent.sessions(kind="swarm")


# ---- the tests -------------------------------------------------------------------------------------


async def test_a_call_streams_the_peers_answer_back_and_continues_one_remote_conversation(nodes):
    b = await nodes("b")
    a = await nodes("a", peers={"b": b})
    b.fake.script(Reply.text("There were 42 orders today, the most this week.", chunks=6),
                  Reply.text("Yesterday there were 40."))
    a.fake.script(_call("b", "How many orders today?"), Reply.text("B says 42."),
                  _call("b", "And yesterday?"), Reply.text("B says 40."))

    async with a.operator() as agent:
        first = await _turn(agent, "ops-orders", "ask b about today's orders")
        second = await _turn(agent, "ops-orders", "and yesterday?")

    # The peer's streamed answer is the tool result, framed as another agent's report.
    result = _tool_result(first)
    assert result["name"] == "agent_call" and not result["is_error"]
    assert "peer b answered:" in result["content"]
    assert "There were 42 orders today, the most this week." in result["content"]
    assert "untrusted content from aiops peer b" in result["content"]
    assert "b is answering…" in _notices(first)
    assert first[-1]["data"]["text"] == "B says 42."
    # ... and it is what A's model read.
    assert "There were 42 orders today" in tool_results(a.fake.requests[1].json)[0]

    # B holds one swarm session for A's session, owned by the token B gave A, named by a full hash.
    [session] = await _swarm_sessions(b)
    assert session["kind"] == "swarm" and session["owner"] == "peer"
    assert re.fullmatch(r"swarm-[0-9a-f]{64}", session["client_id"])
    assert _tool_result(first)["data"]["remote_session"] == session["client_id"]
    # The second call continued that conversation: B's model read the first exchange again.
    assert "Yesterday there were 40." in _tool_result(second)["content"]
    contents = [m.get("content") for m in b.fake.requests[1].json["messages"]]
    assert "How many orders today?" in contents
    assert "There were 42 orders today, the most this week." in contents
    assert contents[-1] == "And yesterday?"

    # Another session of A talks to B in a conversation of its own.
    b.fake.script(Reply.text("Hello, other session."))
    a.fake.script(_call("b", "hello"), Reply.text("ok"))
    async with a.operator() as agent:
        other = await _turn(agent, "ops-other", "say hello to b")
    assert _tool_result(other)["data"]["remote_session"] != session["client_id"]
    assert len(await _swarm_sessions(b)) == 2
    assert [m.get("content") for m in b.fake.requests[2].json["messages"]][-1] == "hello"
    assert "How many orders today?" not in [m.get("content") for m in b.fake.requests[2].json["messages"]]


async def test_depth_is_counted_across_processes_a_to_b_to_c_is_refused_at_b(nodes):
    c = await nodes("c")
    b = await nodes("b", peers={"c": c}, allow_calls=False)  # B's operator would be asked about a call
    a = await nodes("a", peers={"b": b})  # every one with max_agent_call_depth = 1
    b.fake.script(_call("c", "what does c know?"))
    b.fake.responder = _relay("b relays")
    a.fake.script(_call("b", "ask c for me"), Reply.text("done"))

    async with a.operator() as agent:
        events = await _turn(agent, "ops-deep", "ask b to ask c")

    refusal = "agent_call refused: this call would run at depth 2, deeper than max_agent_call_depth = 1"
    assert refusal in _tool_result(events)["content"]      # B's answer, relaying its refused call
    assert refusal in tool_results(a.fake.requests[1].json)[0]  # as A's model read it
    assert c.fake.requests == []                           # C's agent never ran
    assert await _swarm_sessions(c) == []
    async with b.operator() as ops:                        # refused before B's gate: no one was asked
        assert [e for e in await ops.history((await _swarm_sessions(b))[0]["client_id"])
                if e["role"] == "gate"] == []


async def test_a_loop_a_to_b_to_a_is_refused_by_the_hop_list(nodes):
    # B must know A's address and token before A starts (A needs B's): A's are chosen first.
    a_port, a_tokens = _free_port(), node_tokens()
    b = await nodes("b", peers={"a": (f"http://127.0.0.1:{a_port}", a_tokens.secrets["peer"])}, max_depth=3)
    a = await nodes("a", peers={"b": b}, max_depth=3, port=a_port, tokens=a_tokens)
    assert a.url == f"http://127.0.0.1:{a_port}"
    b.fake.script(_call("a", "what do you know, a?"))
    b.fake.responder = _relay("b relays")
    a.fake.script(_call("b", "ask me back"), Reply.text("done"))

    async with a.operator() as agent:
        events = await _turn(agent, "ops-loop", "ask b")

    content = _tool_result(events)["content"]
    assert "peer a refused the call" in content
    assert "the call came back to an aiops already in its chain, a loop" in content
    assert await _swarm_sessions(a) == []  # A took no swarm call
    assert len(a.fake.requests) == 2       # A's model: the call, then the answer; nothing for the loop


async def test_a_gate_on_b_is_approved_by_bs_operator_while_a_waits(nodes):
    b = await nodes("b", gates='[tools.read_system_prompt]\nread = "ask"\n')
    a = await nodes("a", peers={"b": b})
    b.fake.script(Reply.tool_calls(("read_system_prompt", {"section": "role"})), Reply.text("My role is ops."))
    a.fake.script(_call("b", "what is your role?"), Reply.text("done"))
    approved: list[dict[str, Any]] = []

    async def approve_on_b(event: dict[str, Any]) -> None:
        if event["event"] == "notice" and event["data"]["text"] == \
                "waiting for operator approval of read_system_prompt on b":
            async with b.operator() as ops:
                [gate] = await ops.gates()
                approved.append(gate)
                await ops.resolve_gate(gate["id"], "approve")

    async with a.operator() as agent:
        events = await _turn(agent, "ops-gate", "ask b its role", on_event=approve_on_b)

    [gate] = approved
    assert gate["client_kind"] == "swarm" and gate["tool"] == "read_system_prompt"
    notices = _notices(events)
    assert notices.index("waiting for operator approval of read_system_prompt on b") \
        < notices.index("b: read_system_prompt approved by ops")
    result = _tool_result(events)
    assert "My role is ops." in result["content"] and not result["is_error"]
    assert "waiting for operator approval of read_system_prompt on b" in result["data"]["progress"]


async def test_a_peer_that_is_down_or_unknown_is_a_clear_error_in_the_callers_turn(nodes):
    url = f"http://127.0.0.1:{_free_port()}"
    a = await nodes("a", peers={"b": (url, "x" * 32)})
    a.fake.script(_call("nobody", "hello?"), _call("b", "are you there?"), Reply.text("b is down"))

    async with a.operator() as agent:
        events = await _turn(agent, "ops-down", "ask b")

    unknown, down = [e["data"] for e in events if e["event"] == "tool_result"]
    assert unknown["is_error"] and "unknown peer 'nobody'; the peers are: b: the aiops of team b" in unknown["content"]
    assert down["is_error"]
    assert down["content"].startswith(f"error: peer b ({url}) cannot be reached")
    assert events[-1]["data"]["status"] == "complete"  # the turn goes on: A's model answered
    assert tool_results(a.fake.requests[2].json)[0] == down["content"]


async def test_a_call_that_times_out_at_a_stops_the_turn_on_b(nodes):
    b = await nodes("b")
    a = await nodes("a", peers={"b": b}, peer_timeout=2)
    b.fake.script(Reply.hang(0))  # B's model never answers (until B's turn is stopped)
    a.fake.script(_call("b", "take your time"), Reply.text("b took too long"))

    async with a.operator() as agent:
        events = await _turn(agent, "ops-slow", "ask b")

    result = _tool_result(events)
    assert result["is_error"]
    assert "no answer from peer b within 2 s" in result["content"]
    assert "its turn there was stopped" in result["content"]
    # B's turn was cancelled: its model request was cut, and the session there is idle, its turn
    # recorded as cancelled.
    await b.fake.wait_for_disconnects_async(1, timeout=30)
    [session] = await _swarm_sessions(b)
    async with b.operator() as ops:
        detail = await _eventually(lambda: ops.session(session["client_id"]),
                                   lambda d: d["session"]["state"] == "idle")
    assert [m["content"] for m in detail["messages"] if m["role"] == "user"] == ["take your time"]
    assert any(m["role"] == "notice" and "cancelled" in m["content"] for m in detail["messages"])


@pytest.mark.parametrize("how", ["stop", "shutdown"])
async def test_stopping_the_callers_turn_stops_the_turn_on_b(nodes, how):
    b = await nodes("b")
    a = await nodes("a", peers={"b": b})
    b.fake.script(Reply.hang(0))
    a.fake.script(_call("b", "a long job"))

    async with a.operator() as agent, agent.stream("ops-stop") as events:
        accepted = await agent.submit("ask b", client_id="ops-stop")
        await b.fake.wait_for_requests_async(1, timeout=30)  # the call reached B's model
        if how == "stop":
            assert (await agent.stop("ops-stop"))["stopped"]
        else:  # A shuts down (SIGTERM): its turns are cancelled, and with them the calls they made
            assert await asyncio.to_thread(a.proc.stop) == 0
        async for e in events:
            if e["event"] == "done" and e["data"]["turn_id"] == accepted["turn_id"]:
                assert e["data"]["status"] == "cancelled"
                break

    # B's turn did not run on for no one (its model would have failed after its own 10 s timeout).
    await b.fake.wait_for_disconnects_async(1, timeout=30)
    [session] = await _swarm_sessions(b)
    async with b.operator() as ops:
        detail = await _eventually(lambda: ops.session(session["client_id"]),
                                   lambda d: d["session"]["state"] == "idle")
    assert any(m["role"] == "notice" and "cancelled" in m["content"] for m in detail["messages"])
    assert not any(m["role"] == "error" for m in detail["messages"])


def test_peer_names_and_urls_are_checked_when_the_config_loads(tmp_path: Path) -> None:
    from aiops.config import ConfigError, load_config, resolve_paths

    def load(peers: str) -> str:
        cfg = make_config_dir(tmp_path, {"local": {"type": "openai", "model_id": "m"}}, "local",
                              {"aiops.toml": peers})
        with pytest.raises(ConfigError) as e:
            load_config(resolve_paths(cfg, tmp_path / "data"), load_dotenv=False)
        return str(e.value)

    assert "peer name 'a b'" in load('[swarm.peers."a b"]\nurl = "http://x:1"\n')
    assert "expected the peer's base URL" in load('[swarm.peers.b]\nurl = "ftp://x"\n')
    assert "swarm.peers.b.urll: unknown key" in load('[swarm.peers.b]\nurl = "http://x:1"\nurll = "y"\n')
