"""`GET /api/v1/events`, the operator event stream an attached console follows (issue 22): every
session's events with ids, resumed after `Last-Event-ID` without loss or doubles, a reset when the
ids are of another run; a client token reads its own sessions only; the side panes' routes."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from tests.fakes.fixtures import openai_model_entry
from tests.fakes.openai_server import Reply
from tests.support.server import ApiServer, ApiServerFactory, Tokens

Frame = tuple[str | None, str, dict[str, Any]]  # (id, event, data)


class Reader:
    """One open event stream, read frame by frame."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.resp = resp

    async def frame(self) -> Frame:
        event_id, name, data = None, "", []
        while True:
            line = (await self.resp.content.readline()).decode().rstrip("\n")
            if not line:
                if name:
                    return event_id, name, json.loads("\n".join(data))
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(": ")
            if field == "id":
                event_id = value
            elif field == "event":
                name = value
            elif field == "data":
                data.append(value)

    async def until(self, name: str, session: str | None = None) -> list[Frame]:
        frames = []
        while True:
            f = await self.frame()
            frames.append(f)
            if f[1] == name and (session is None or f[2].get("session_id") == session):
                return frames


async def open_events(http: aiohttp.ClientSession, srv: ApiServer, last: str | None = None,
                      token: str | None = None) -> tuple[aiohttp.ClientResponse, Reader]:
    headers = {**srv.headers(token), **({"Last-Event-ID": last} if last else {})}
    resp = await http.get(srv.url + "/api/v1/events", headers=headers)
    assert resp.status == 200 and resp.content_type == "text/event-stream"
    return resp, Reader(resp)


async def submit(http: aiohttp.ClientSession, srv: ApiServer, text: str, client_id: str,
                 token: str | None = None) -> None:
    async with http.post(srv.url + "/api/v1/submit", json={"text": text, "client_id": client_id, "wait": True},
                         headers=srv.headers(token)) as r:
        assert r.status == 200, await r.text()


async def test_every_sessions_events_with_ids_resumed_after_the_last_one_read(api_server: ApiServer) -> None:
    srv = api_server
    srv.fake.script(Reply.text("one"), Reply.text("two"), Reply.text("three"))
    async with aiohttp.ClientSession() as http:
        resp, reader = await open_events(http, srv)
        _, name, hello = await reader.frame()
        assert name == "hello" and hello["reset"] is False and hello["role"] == "operator"
        assert srv.handle.connected_clients() == 1  # the header's client count includes attached consoles
        await submit(http, srv, "first", "api-a")
        await submit(http, srv, "second", "api-b")
        frames = await reader.until("done", "api-a") + await reader.until("done", "api-b")
        ids = [f[0] for f in frames]
        assert all(ids) and len(set(ids)) == len(ids)
        seqs = [int(str(i).rsplit("-", 1)[1]) for i in ids]
        assert seqs == sorted(seqs)
        assert {f[2]["session_id"] for f in frames} == {"api-a", "api-b"}
        assert {"user", "turn", "tok", "done", "session"} <= {f[1] for f in frames}
        last = frames[-1][0]
        resp.close()

        # Away while a turn ran: the events missed come back, once, then the stream goes on live.
        await submit(http, srv, "third", "api-a")
        resp, reader = await open_events(http, srv, last)
        _, name, hello = await reader.frame()
        assert name == "hello" and hello["reset"] is False and hello["last_event_id"] == last
        missed = await reader.until("done", "api-a")
        assert [f[2].get("text") for f in missed if f[1] == "user"] == ["third"]
        assert "".join(f[2]["text"] for f in missed if f[1] == "tok") == "three"
        assert all(int(str(f[0]).rsplit("-", 1)[1]) > int(str(last).rsplit("-", 1)[1]) for f in missed)
        resp.close()

        # Ids of another run of the server (or of nothing): the reader is told to read its state again.
        resp, reader = await open_events(http, srv, "0123456789ab-5")
        _, name, hello = await reader.frame()
        assert name == "hello" and hello["reset"] is True
        resp.close()


async def test_a_client_token_reads_only_its_own_sessions_and_not_the_side_panes(
        api_server_factory: ApiServerFactory) -> None:
    tokens = Tokens.make(ops="operator", ci="client", other="client")
    srv = await api_server_factory(tokens=tokens)
    srv.fake.script(Reply.text("theirs"), Reply.text("mine"))
    async with aiohttp.ClientSession() as http:
        resp, reader = await open_events(http, srv, token="ci")
        _, _, hello = await reader.frame()
        assert hello["role"] == "client" and hello["principal"] == "ci"
        await submit(http, srv, "not yours", "api-other", token="other")
        await submit(http, srv, "yours", "api-ci", token="ci")
        frames = await reader.until("done", "api-ci")
        assert {f[2]["session_id"] for f in frames} == {"api-ci"}
        resp.close()
        for path in ("/api/v1/rates", "/api/v1/prompt"):
            async with http.get(srv.url + path, headers=srv.headers("ci")) as r:
                assert r.status == 403, path
        async with http.get(srv.url + "/api/v1/console", headers=srv.headers("ci")) as r:
            info = await r.json()
        assert info["principal"] == "ci" and info["role"] == "client" and info["plugins"] is None


async def test_the_side_panes_state_for_operators(api_server: ApiServer) -> None:
    srv = api_server
    async with aiohttp.ClientSession() as http:
        async with http.get(srv.url + "/api/v1/console") as r:
            info = await r.json()
            position = r.headers["X-Aiops-Event-Id"]
        assert info["role"] == "operator" and "help" in info["commands"]
        assert info["models"] == {"local": f"openai fake-model at {srv.fake.url}"}
        assert info["last_event_id"] == position and position.startswith(info["epoch"] + "-")
        async with http.get(srv.url + "/api/v1/prompt") as r:
            prompt = await r.json()
        # The tree the engine's host reads, rebuilt on this side as the prompt pane draws it.
        from aiops.prompts.wire import tree_from_wire

        tree = tree_from_wire(prompt["tree"])
        assert prompt["model"] == "local" and str(tree.folder) == prompt["folder"]
        assert prompt["folder"].endswith("system_prompt/default") and "role" in tree.names
        async with http.get(srv.url + "/api/v1/rates") as r:
            rates = await r.json()
        # Every configured limit, used or not: the limits pane shows them for the selected session.
        limits = srv.engine.gatekeeper.limiter.config.rate
        assert rates["usage"] == [] and limits
        assert rates["limits"] == [{"tool_type": t, "limit": r.calls, "window_seconds": r.window_seconds,
                                    "auto_disable": r.auto_disable} for t, r in sorted(limits.items())]
        async with http.get(srv.url + "/api/v1/prompt", params={"model": "nosuch"}) as r:
            assert r.status == 400 and "nosuch" in (await r.json())["error"]["message"]


def test_the_ring_is_bounded_by_count_and_by_size_and_says_when_a_reader_is_beyond_it() -> None:
    from aiops.engine import events as ev
    from aiops.integrations.server.operator_api import EventFeed

    feed = EventFeed(size=3, max_bytes=10_000)
    toks = [feed.publish(e) or e for e in (ev.Tok(session_id="s", text="x") for _ in range(5))]
    assert [e.seq for e in feed.ring] == [t.seq for t in toks[2:]]
    assert feed.resume_point(feed.event_id(toks[2].seq)) == (toks[2].seq, False)
    assert feed.resume_point(feed.event_id(toks[0].seq))[1] is True  # beyond the ring: reload
    big = ev.ToolReturned(session_id="s", call_id="c", tool="t", content="y" * 6000, truncated=False,
                          is_error=False, duration_ms=1.0)
    feed.publish(big)
    assert list(feed.ring) == [big] and feed.bytes <= 20_000


async def test_the_servers_picture_of_its_models_reachability_and_its_changes(
        api_server_factory: ApiServerFactory) -> None:
    """What an attached console shows instead of probing itself: the server probes when asked, says
    which models answer, and publishes every change (a probe, a turn's model error, a whole answer)."""
    import socket

    from tests.fakes.openai_server import FakeOpenAI

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        gone = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    with FakeOpenAI() as other:
        srv = await api_server_factory(models={"gone": {"type": "openai", "model_id": "m", "timeout": 5,
                                                        "base_url": gone},
                                               "local": openai_model_entry(other)})
        async with aiohttp.ClientSession() as http:
            async with http.get(srv.url + "/api/v1/console") as r:
                assert (await r.json())["model_status"] == []  # nobody asked: the server has not probed
            resp, reader = await open_events(http, srv)
            await reader.frame()  # hello
            async with http.post(srv.url + "/api/v1/models/check") as r:
                assert r.status == 200
                checked = {m["key"]: m for m in (await r.json())["models"]}
            assert checked["local"]["ok"] is True and checked["local"]["reason"] == ""
            assert checked["gone"]["ok"] is False
            assert checked["gone"]["reason"] == f"cannot connect to {gone} (ClientConnectorError)"
            _, _, event = (await reader.until("models"))[-1]
            assert {m["key"]: m["ok"] for m in event["models"]} == {"gone": False, "local": True}

            # A refused key in a turn marks its model unusable; an error its server answered with,
            # or a whole answer, reachable again.
            other.script(Reply.error(401, "invalid api key"), Reply.error(500, "upstream failure"))
            async with http.post(srv.url + "/api/v1/submit", json={"text": "hi", "client_id": "api-m"}) as r:
                assert r.status in (200, 202)
            _, _, event = (await reader.until("models"))[-1]
            local = next(m for m in event["models"] if m["key"] == "local")
            assert local["ok"] is False and "invalid api key" in local["reason"] and local["cause"] == "key"
            async with http.get(srv.url + "/api/v1/console") as r:
                status = {m["key"]: m for m in (await r.json())["model_status"]}
            assert status["local"]["ok"] is False and status["gone"]["ok"] is False
            await submit(http, srv, "again", "api-m")  # HTTP 500: the server is there
            _, _, event = (await reader.until("models"))[-1]
            assert {m["key"]: m["ok"] for m in event["models"]} == {"gone": False, "local": True}
            assert next(m for m in event["models"] if m["key"] == "gone")["cause"] == "connection"
            async with http.get(srv.url + "/api/v1/console") as r:
                assert {m["key"]: m["cause"] for m in (await r.json())["model_status"]} == {"gone": "connection", "local": ""}
            resp.close()


async def test_a_client_token_neither_probes_nor_reads_the_models_state(api_server_factory: ApiServerFactory) -> None:
    srv = await api_server_factory(tokens=Tokens.make(ops="operator", ci="client"))
    async with aiohttp.ClientSession() as http:
        async with http.post(srv.url + "/api/v1/models/check", headers=srv.headers("ci")) as r:
            assert r.status == 403
        async with http.get(srv.url + "/api/v1/console", headers=srv.headers("ci")) as r:
            assert (await r.json())["model_status"] is None  # its reasons name the servers behind aiops
