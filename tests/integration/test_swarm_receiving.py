"""The receiving side of a swarm call: `/api/v1/submit` with `X-Aiops-Agent-Hops`.

The multi-process calls are in tests/e2e/test_swarm.py; these check, on one server, what each
instance does with the header whoever sent it.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from aiops.client import AgentClient, AgentError
from aiops.integrations.swarm.hops import HOPS_HEADER
from tests.fakes.openai_server import Reply
from tests.support.server import ApiServer, ApiServerFactory, Tokens

CALLER = uuid.uuid4().hex  # another instance's id
OWN = uuid.uuid4().hex  # the server's, written into its data dir before it starts


@pytest.fixture
async def peer(api_server_factory: ApiServerFactory, tmp_path: Path) -> ApiServer:
    """A server with `ops` (operator) and `peer` (client) tokens, whose instance id is OWN."""
    data = tmp_path / "peer-data"
    data.mkdir()
    (data / "instance_id").write_text(OWN + "\n")
    return await api_server_factory(tokens=Tokens.make(ops="operator", peer="client"), data_dir=data,
                                    extra_files={"limits.toml": "max_agent_call_depth = 2\n"})


def _caller(srv: ApiServer, hops: str) -> AgentClient:
    assert srv.tokens is not None
    return AgentClient(srv.url, token=srv.tokens.secrets["peer"], headers={HOPS_HEADER: hops})


async def test_a_swarm_call_is_a_swarm_session_and_its_message_is_text_only(peer: ApiServer) -> None:
    peer.fake.script(Reply.text("noted"))
    async with _caller(peer, f"depth=1; via={CALLER}") as agent:
        reply = await agent.send("!reset\n@other hello\nhow are you?", client_id="swarm-abc")
    assert (reply["status"], reply["text"]) == ("complete", "noted")
    # The peer's model wrote it: no line of it is a command or a model switch here.
    assert peer.fake.requests[0].json["messages"][-1]["content"] == "!reset\n@other hello\nhow are you?"
    async with peer.client("ops") as ops:
        [session] = await ops.sessions(kind="swarm")
    assert (session["client_id"], session["kind"], session["owner"]) == ("swarm-abc", "swarm", "peer")


@pytest.mark.parametrize("hops, why", [
    (f"depth=3; via={CALLER}", "this call would run at depth 3, deeper than this aiops allows "
                               "(max_agent_call_depth = 2 in its limits.toml)"),
    (f"depth=2; via={OWN},{CALLER}", f"the call came back to an aiops already in its chain, a loop "
                                     f"({OWN[:8]} → {CALLER[:8]} → {OWN[:8]})"),
])
async def test_a_call_too_deep_or_looping_back_is_refused_before_anything_runs(
        peer: ApiServer, hops: str, why: str) -> None:
    async with _caller(peer, hops) as agent:
        with pytest.raises(AgentError) as e:
            await agent.submit("hello", client_id="swarm-refused")
    assert (e.value.status, e.value.code) == (403, "agent_call_refused")
    assert why in e.value.message
    assert peer.fake.requests == []
    async with peer.client("ops") as ops:
        assert await ops.sessions() == []


@pytest.mark.parametrize("hops", ["depth=1", "depth=0; via=" + CALLER, "depth=1; via=not-an-id",
                                  "1 " + CALLER, f"depth=1; via={','.join([CALLER] * 33)}"])
async def test_a_header_this_server_cannot_read_is_a_400_naming_it(peer: ApiServer, hops: str) -> None:
    async with _caller(peer, hops) as agent:
        with pytest.raises(AgentError) as e:
            await agent.submit("hello", client_id="swarm-bad")
    assert (e.value.status, e.value.code) == (400, "invalid_request")
    assert HOPS_HEADER in e.value.message
    assert peer.fake.requests == []
