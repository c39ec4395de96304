"""Session ownership across roles: a client token chats and uses only the sessions it created;
operators see and manage every session. Through the API (AgentClient, raw HTTP) and the proxies
(the real openai SDK), in process and against `aiops serve` across a restart."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import pytest

from aiops.client import AgentError
from aiops.engine.commands import Command, CommandContext
from aiops.engine.engine import MAX_COMMANDS, EngineError
from aiops.engine.plugins import Plugin, PluginAPI
from aiops.integrations.server.owners import Caller, owner_meta
from tests.fakes.openai_server import call_tool_when
from tests.integration.test_server_api import NOTES_ENABLED, NotesPlugin, events_until_done, next_event
from tests.support.server import ApiServer, ApiServerFactory, ServeFactory, Tokens


async def two_clients(factory: ApiServerFactory, **kw: Any) -> ApiServer:
    return await factory(tokens=Tokens.make(ops="operator", bot="client", bot2="client"), **kw)


async def forbidden(call: Any) -> AgentError:
    with pytest.raises(AgentError) as e:
        await call
    assert (e.value.status, e.value.code) == (403, "forbidden"), e.value
    return e.value


# ---- the API ---------------------------------------------------------------------------------------------


async def test_a_client_token_uses_only_its_own_sessions_and_an_operator_uses_all(
        api_server_factory: ApiServerFactory) -> None:
    srv = await two_clients(api_server_factory)
    async with srv.client("ops") as ops, srv.client("bot") as bot, srv.client("bot2") as bot2:
        assert (await ops.send("operator business", client_id="api-ops"))["status"] == "complete"
        assert (await bot.send("bot business", client_id="api-bot"))["status"] == "complete"
        mine = await bot.send("no id given")  # a new api-<hex> session, owned by bot too
        ops_short = str((await ops.session("api-ops"))["session"]["short_id"])

        # Another's session: not readable, streamable, stoppable, deletable or continued, by id or
        # by shorthand number.
        for ref in ("api-ops", ops_short, "api-bot"):
            who = bot2 if ref == "api-bot" else bot
            errs = [await forbidden(who.session(ref)), await forbidden(who.stop(ref)),
                    await forbidden(who.delete_session(ref)),
                    await forbidden(who.submit("let me in", client_id=ref)),
                    await forbidden(who.stream(ref).open())]
            # Named as the caller named it: counting through shorthand numbers reveals no other
            # caller's session ids.
            assert all(f"session {ref!r} belongs to another caller" in e.message for e in errs)
        # Nothing happened to the operator's session.
        ops_history = (await ops.session("api-ops"))["messages"]
        assert [m["content"] for m in ops_history] == ["operator business", "echo: operator business"]

        # Lists: each client sees its own; the operator sees every session, with its owner.
        assert {s["client_id"] for s in await bot.sessions()} == {"api-bot", mine["client_id"]}
        assert await bot2.sessions() == []
        owners = {s["client_id"]: s["owner"] for s in await ops.sessions()}
        assert owners == {"api-ops": "ops", "api-bot": "bot", mine["client_id"]: "bot"}
        assert [s["client_id"] for s in await bot.sessions(limit=1)] == [mine["client_id"]]
        # Pages count the caller's own sessions: with the operator's now the most recent, a
        # client's second page is still its second session.
        assert (await ops.send("more operator business", client_id="api-ops"))["status"] == "complete"
        async with httpx.AsyncClient() as http:
            r = await http.get(srv.url + "/api/v1/sessions", params={"limit": 1, "offset": 1},
                               headers=srv.headers("bot"))
        assert [s["client_id"] for s in r.json()["sessions"]] == ["api-bot"]
        assert [s["client_id"] for s in await ops.sessions()] == ["api-ops", mine["client_id"], "api-bot"]

        # Its own: everything works, and the operator manages a client's session too.
        assert (await bot.session("api-bot"))["session"]["owner"] == "bot"
        assert (await bot.send("again", client_id="api-bot"))["status"] == "complete"
        assert (await bot.stop("api-bot"))["stopped"] is False
        assert (await ops.session("api-bot"))["session"]["message_count"] == 4
        assert await bot.delete_session("api-bot") == {"client_id": "api-bot", "deleted": True}
        assert await ops.delete_session(mine["client_id"]) == {"client_id": mine["client_id"], "deleted": True}
        assert await ops.delete_session("api-ops") == {"client_id": "api-ops", "deleted": True}


async def test_session_command_of_a_client_lists_its_own_sessions_with_their_counts(
        api_server_factory: ApiServerFactory) -> None:
    srv = await two_clients(api_server_factory)
    async with srv.client("ops") as ops, srv.client("bot") as bot:
        await ops.send("operator business", client_id="api-ops")
        for _ in range(3):
            await bot.send("bot business", client_id="api-bot")
        await bot.send("elsewhere", client_id="api-bot-2")
        listed = (await bot.send("!session"))["text"]  # no session named: still its own listed
        here = (await bot.send("!session", client_id="api-bot"))["text"]
    rows = listed.splitlines()[1:-1]
    # Its two sessions, the latest first, with the stored counts (three turns of two messages,
    # one of two); not the operator's.
    assert [r.split()[3] for r in rows] == ["2", "6"], listed
    assert "elsewhere" in rows[0] and "bot business" in rows[1] and "operator business" not in listed
    assert any(line.startswith("*") and "bot business" in line for line in here.splitlines()), here


async def test_a_client_stream_of_a_session_another_caller_creates_ends_with_forbidden(
        api_server_factory: ApiServerFactory) -> None:
    srv = await two_clients(api_server_factory)
    async with srv.client("ops") as ops, srv.client("bot") as bot, bot.stream("api-later") as spy, \
            ops.stream("api-later") as own:
        accepted = await ops.submit("secret plans", client_id="api-later")
        events = await events_until_done(own, accepted["turn_id"])
        assert events[-1]["data"]["text"] == "echo: secret plans"
        seen = [e async for e in spy]  # the spy's stream ends after one event
    assert [e["event"] for e in seen] == ["error"]
    assert seen[0]["data"]["code"] == "forbidden"
    assert "secret" not in str(seen)


async def test_a_deleted_sessions_streams_end_so_a_later_session_of_that_name_stays_private(
        api_server_factory: ApiServerFactory) -> None:
    """A fixed name (`api-nightly`) is deleted, then created again by another caller: the first
    owner's open stream must not go on to show the new owner's turn."""
    srv = await two_clients(api_server_factory)
    async with srv.client("ops") as ops, srv.client("bot") as bot, srv.client("bot2") as bot2:
        assert (await bot.send("first run", client_id="api-nightly"))["status"] == "complete"
        async with bot.stream("api-nightly") as old_reader, ops.stream("api-nightly") as ops_reader:
            assert await bot.delete_session("api-nightly") == {"client_id": "api-nightly", "deleted": True}
            assert (await bot2.send("bot2's secret", client_id="api-nightly"))["status"] == "complete"
            async with asyncio.timeout(10):  # without the fix they never end
                seen = [e async for e in old_reader]  # ends at the delete
                ops_seen = [e async for e in ops_reader]
        assert [e["event"] for e in seen] == ["error"]
        assert seen[0]["data"]["code"] == "session_deleted"
        assert "secret" not in str(seen)
        assert ops_seen == seen  # an operator's reader of the deleted session ends the same way
        assert (await bot2.session("api-nightly"))["session"]["owner"] == "bot2"
        await forbidden(bot.session("api-nightly"))


async def test_a_deleted_sessions_approvals_and_rate_limits_do_not_pass_to_a_later_session_of_that_name(
        api_server_factory: ApiServerFactory) -> None:
    """An operator approves `bot`'s notes for the session, and `bot` then exhausts its rate limit,
    which disables the tool. `bot` deletes the session and `bot2` creates one of the same name:
    its first write asks the operator again and is not refused as rate limited."""
    limits = "[rate.notes]\ncalls = 2\nwindow_seconds = 3600\nauto_disable = true\n"
    plugin = NotesPlugin()
    srv = await two_clients(api_server_factory, plugins=[plugin],
                            extra_files={**NOTES_ENABLED, "limits.toml": limits})
    srv.fake.responder = call_tool_when("note it", ("write_note", {"text": "a note"}))

    async def note_it(agent: Any, stream: Any, approve: bool) -> list[dict[str, Any]]:
        turn = await agent.submit("note it", client_id="api-nightly")
        if approve:
            gate = (await next_event(stream, "gate"))["data"]
            await ops.resolve_gate(gate["id"], "approve", scope="session")
        return await events_until_done(stream, turn["turn_id"])

    async with srv.client("ops") as ops, srv.client("bot") as bot, srv.client("bot2") as bot2:
        async with bot.stream("api-nightly") as stream:
            await note_it(bot, stream, approve=True)
            again = await note_it(bot, stream, approve=False)  # the session grant: no question
            assert "gate" not in [e["event"] for e in again] and plugin.written == ["a note"] * 2
            limited = await note_it(bot, stream, approve=False)
            refused = next(e["data"] for e in limited if e["event"] == "tool_result")
            assert refused["is_error"] and "now disabled" in refused["content"]
        assert (await bot.delete_session("api-nightly"))["deleted"]

        async with bot2.stream("api-nightly") as stream:
            turn = await bot2.submit("note it", client_id="api-nightly")
            gate = (await next_event(stream, "gate"))["data"]  # asked again
            await ops.resolve_gate(gate["id"], "approve")
            result = next(e["data"] for e in await events_until_done(stream, turn["turn_id"])
                          if e["event"] == "tool_result")
        assert not result["is_error"] and plugin.written == ["a note"] * 3
    revoked = [a for a in await srv.engine.store.audit("api-nightly") if a.event == "grant_revoked"]
    assert [(a.tool, a.actor) for a in revoked] == [("write_note", "session deleted")]


async def test_a_client_sees_only_the_gates_of_its_own_sessions(api_server_factory: ApiServerFactory) -> None:
    srv = await two_clients(api_server_factory, plugins=[NotesPlugin()], extra_files=NOTES_ENABLED)
    srv.fake.responder = call_tool_when("note it", ("write_note", {"text": "a note"}))
    async with srv.client("ops") as ops, srv.client("bot") as bot, srv.client("bot2") as bot2, \
            ops.stream("api-ops-gated") as ops_events, bot.stream("api-bot-gated") as bot_events:
        first = await ops.submit("note it", client_id="api-ops-gated")
        ops_gate = (await next_event(ops_events, "gate"))["data"]
        assert await bot.gates() == []  # the operator's gate (and its arguments) stay hidden
        second = await bot.submit("note it", client_id="api-bot-gated")
        bot_gate = (await next_event(bot_events, "gate"))["data"]
        assert [g["id"] for g in await bot.gates()] == [bot_gate["id"]]
        assert await bot2.gates() == []
        assert [g["id"] for g in await ops.gates()] == [ops_gate["id"], bot_gate["id"]]
        for gate in (ops_gate, bot_gate):
            await ops.resolve_gate(gate["id"], "deny")
        await events_until_done(ops_events, first["turn_id"])
        await events_until_done(bot_events, second["turn_id"])


async def test_without_tokens_loopback_callers_are_operators_and_own_what_they_create(
        api_server: ApiServer) -> None:
    async with api_server.client() as agent:
        await agent.send("hello", client_id="api-open")
        (listed,) = await agent.sessions()
    assert listed["owner"].startswith("loopback:")



async def test_a_command_only_message_creates_no_session_for_either_role(
        api_server_factory: ApiServerFactory) -> None:
    srv = await two_clients(api_server_factory)
    async with srv.client("ops") as ops, srv.client("bot") as bot:
        for agent, cid in ((ops, "api-cmd-ops"), (bot, "api-cmd-bot")):
            reply = await agent.send("!help", client_id=cid)
            assert reply["status"] == "complete" and "Commands:" in reply["text"]
            with pytest.raises(AgentError) as e:
                await ops.session(cid)
            assert e.value.status == 404
        # The first message that starts a turn creates it, owned by its sender.
        await bot.send("!help\nand now a question", client_id="api-cmd-bot")
        assert (await ops.session("api-cmd-bot"))["session"]["owner"] == "bot"


class HoldPlugin(Plugin):
    """`!hold`: a command that waits until the test lets it go, so a message of commands can be
    caught halfway through."""

    name = "hold"

    def __init__(self) -> None:
        super().__init__()
        self.reached = asyncio.Event()
        self.release = asyncio.Event()

    async def setup(self, api: PluginAPI) -> None:
        async def hold(ctx: CommandContext, argv: list[str], raw: str) -> str:
            self.reached.set()
            await self.release.wait()
            return "held"

        api.register_command(Command("hold", "!hold", "wait for the test", hold))


async def test_commands_racing_another_callers_first_message_do_not_act_on_its_session(
        api_server_factory: ApiServerFactory) -> None:
    """bot's message of commands names an id that does not exist yet; bot2 starts a session of
    that name while the commands run. The rest of bot's commands must not read, switch, reset or
    delete bot2's session, nor write into its history."""
    hold = HoldPlugin()
    srv = await two_clients(api_server_factory, plugins=[hold],
                            extra_files={"plugins.toml": "[hold]\nenabled = true\n"})
    async with srv.client("bot") as bot, srv.client("bot2") as bot2, srv.client("ops") as ops:
        attack = asyncio.create_task(bot.send(
            "!hold\n!session\n!model local\n!reset\n!session api-victim delete\n!stop", client_id="api-victim"))
        await asyncio.wait_for(hold.reached.wait(), 10)
        assert (await bot2.send("TOPSECRET merger plans", client_id="api-victim"))["status"] == "complete"
        hold.release.set()
        reply = await asyncio.wait_for(attack, 10)

        assert "TOPSECRET" not in reply["text"]
        assert "another caller" in reply["text"]
        assert "deleted session" not in reply["text"] and "session reset" not in reply["text"]
        victim = await ops.session("api-victim")  # still there, owned by bot2, untouched
        assert victim["session"]["owner"] == "bot2"
        assert [m["content"] for m in victim["messages"]] == [
            "TOPSECRET merger plans", "echo: TOPSECRET merger plans"]
        # bot2 carries on as if nothing happened.
        assert (await bot2.send("more", client_id="api-victim"))["status"] == "complete"


async def test_a_client_may_not_send_commands_into_another_clients_conversation_name(
        api_server_factory: ApiServerFactory) -> None:
    """A message of only commands is refused a reserved id too, as a message that starts a turn is:
    it would otherwise act on that conversation the moment its owner starts it."""
    srv = await two_clients(api_server_factory)
    async with srv.client("bot") as bot:
        with pytest.raises(AgentError) as e:
            await bot.send("!help", client_id="bot2:owui-42")
        assert (e.value.status, e.value.code) == (403, "reserved_id")
        assert "Commands:" in (await bot.send("!help", client_id="bot:owui-1"))["text"]


async def test_a_message_of_too_many_commands_is_refused_whole(api_server_factory: ApiServerFactory) -> None:
    """Thousands of `!help` lines in one message once ran on the loop for seconds and answered
    with 100+ MB; a message holds at most MAX_COMMANDS, and one over is refused before any runs."""
    srv = await two_clients(api_server_factory)
    async with srv.client("bot") as bot:
        await bot.send("hello", client_id="api-many")
        with pytest.raises(AgentError) as e:
            await bot.send("\n".join(["!help"] * (MAX_COMMANDS + 1)), client_id="api-many")
        assert e.value.status == 400 and f"at most {MAX_COMMANDS} !commands" in e.value.message
        assert len((await bot.session("api-many"))["messages"]) == 2  # nothing of it was written
        reply = await bot.send("\n".join(["!help"] * MAX_COMMANDS), client_id="api-many")
        assert reply["text"].count("Commands:") == MAX_COMMANDS
        # With a question after them: refused before a session is made for it, on every surface.
        too_many = "\n".join(["!help"] * (MAX_COMMANDS + 1) + ["and a question"])
        with pytest.raises(AgentError) as e:
            await bot.send(too_many, client_id="api-many-new")
        assert e.value.status == 400
        async with httpx.AsyncClient() as http:
            r = await http.post(srv.url + "/v1/chat/completions", headers=srv.headers("bot"), json={
                "model": "aiops", "user": "many", "messages": [{"role": "user", "content": too_many}]})
        assert r.status_code == 400 and f"at most {MAX_COMMANDS} !commands" in r.json()["error"]["message"]
        assert [s["client_id"] for s in await bot.sessions()] == ["api-many"]


async def test_the_engine_never_runs_a_clients_message_on_another_callers_session(
        api_server_factory: ApiServerFactory) -> None:
    """Whatever window a race finds between a surface's look at a session id and the engine's: a
    message from a client, commands or text, is refused on a session another caller owns."""
    srv = await two_clients(api_server_factory)
    async with srv.client("bot2") as bot2, srv.client("ops") as ops:
        await bot2.send("TOPSECRET merger plans", client_id="api-victim")
        for text in ("!session\n!reset", "!model local", "what were the plans?"):
            with pytest.raises(EngineError, match="belongs to another caller"):
                await srv.engine.submit("api-victim", text, kind="api", is_operator=False,
                                        meta=owner_meta(Caller("bot", False)), owner_only=True)
        victim = await ops.session("api-victim")
        assert [m["content"] for m in victim["messages"]] == ["TOPSECRET merger plans",
                                                              "echo: TOPSECRET merger plans"]
        # Its owner and the operators carry on.
        assert (await bot2.send("more", client_id="api-victim"))["status"] == "complete"
        assert (await ops.send("!session", client_id="api-victim"))["status"] == "complete"


# ---- the proxies -----------------------------------------------------------------------------------------


async def _ask(srv: ApiServer, token: str, text: str, **headers: str) -> tuple[str, str]:
    assert srv.tokens is not None
    client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key=srv.tokens.secrets[token], max_retries=0,
                                default_headers=headers)
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model="aiops", messages=[{"role": "user", "content": text}])
        return raw.headers["x-aiops-session"], raw.parse().choices[0].message.content or ""
    finally:
        await client.close()


async def test_every_session_id_the_proxy_sends_back_can_be_sent_again(api_server_factory: ApiServerFactory) -> None:
    """Namespaced ids and forks of long names stay within the 128 characters X-Aiops-Session takes."""
    srv = await two_clients(api_server_factory)

    async def chat(token: str, messages: list[tuple[str, str]], **headers: str) -> tuple[int, str, str]:
        async with httpx.AsyncClient() as h:
            r = await h.post(srv.url + "/v1/chat/completions", headers={**srv.headers(token), **headers}, json={
                "model": "aiops", "messages": [{"role": ro, "content": t} for ro, t in messages]})
        body = r.json()
        text = body["choices"][0]["message"]["content"] if r.status_code == 200 else body["error"]["message"]
        return r.status_code, r.headers.get("x-aiops-session", ""), text

    # A client token's name is prefixed: a name that would not fit with it is refused up front.
    for name in ("a" * 125, "x" + "+2" * 63):  # too long, or only its prefixed form is
        status, _, message = await chat("bot", [("user", "hi")], **{"X-Aiops-Session": name})
        assert status == 400 and "at most 116 characters with this token" in message, name
    longest = "a" * 116
    status, sid, answer = await chat("bot", [("user", "hi")], **{"X-Aiops-Session": longest})
    assert (status, sid) == (200, "bot:" + longest)
    # The id sent back continues it; an edit forks it, and the fork's id works as well.
    assert (await chat("bot", [("user", "more")], **{"X-Aiops-Session": sid}))[:2] == (200, sid)
    status, fork, _ = await chat("bot", [("user", "hi"), ("assistant", "edited"), ("user", "again")],
                                 **{"X-Aiops-Session": sid})
    assert (status, fork) == (200, sid + "+2") and len(fork) <= 128
    assert (await chat("bot", [("user", "on the fork")], **{"X-Aiops-Session": fork}))[:2] == (200, fork)
    # Forks of forks, each sent back: within 128 every time (past it, named after the first root).
    seen = {sid, fork}
    for i in range(5):
        status, fork, _ = await chat("bot", [("user", f"other {i}"), ("assistant", "x"), ("user", "y")],
                                     **{"X-Aiops-Session": fork})
        assert status == 200 and fork not in seen and fork.startswith(sid + "+") and len(fork) <= 128, fork
        seen.add(fork)
        assert (await chat("bot", [("user", "on it")], **{"X-Aiops-Session": fork}))[:2] == (200, fork)
    assert sid + "+2+2+2+2" in seen and sid + "+3" in seen  # the last that fit, then the first root's next
    # Long chat ids and `user` names are shortened (a hash keeps them apart) to fit as well.
    for headers, extra in (({"X-OpenWebUI-Chat-Id": "c" * 200}, {}), ({}, {"user": "u" * 200})):
        async with httpx.AsyncClient() as h:
            r = await h.post(srv.url + "/v1/chat/completions", headers={**srv.headers("bot"), **headers}, json={
                "model": "aiops", "messages": [{"role": "user", "content": "hi"}], **extra})
        sent_back = r.headers["x-aiops-session"]
        assert r.status_code == 200 and len(sent_back) <= 120, sent_back
        assert (await chat("bot", [("user", "again")], **{"X-Aiops-Session": sent_back}))[:2] == (200, sent_back)


async def test_proxy_conversation_names_are_namespaced_by_client_token(api_server_factory: ApiServerFactory) -> None:
    srv = await two_clients(api_server_factory)
    for header in ("X-Aiops-Session", "X-OpenWebUI-Chat-Id"):
        name = "shared-chat" if header == "X-Aiops-Session" else "owui-chat"
        sid_bot, _ = await _ask(srv, "bot", "bot's question", **{header: name})
        sid_bot2, _ = await _ask(srv, "bot2", "bot2's question", **{header: name})
        assert sid_bot.startswith("bot:") and sid_bot2.startswith("bot2:") and sid_bot != sid_bot2
        # Naming the other client's session outright does not reach it either.
        sid_spy, _ = await _ask(srv, "bot2", "spying", **{header: sid_bot})
        assert sid_spy != sid_bot and sid_spy.startswith("bot2:")
    # The session id the server sent back continues the conversation as it is (not namespaced twice).
    assert (await _ask(srv, "bot", "follow-up", **{"X-Aiops-Session": "bot:shared-chat"}))[0] == "bot:shared-chat"
    # The OpenAI `user` field is namespaced the same way.
    async with httpx.AsyncClient() as h:
        ids = []
        for token in ("bot", "bot2"):
            r = await h.post(srv.url + "/v1/chat/completions", headers=srv.headers(token), json={
                "model": "aiops", "user": "alice", "messages": [{"role": "user", "content": "hi"}]})
            ids.append(r.headers["x-aiops-session"])
    assert ids == ["bot:user-alice", "bot2:user-alice"]

    async with srv.client("ops") as ops, srv.client("bot") as bot, srv.client("bot2") as bot2:
        bot_sessions = {s["client_id"] for s in await bot.sessions(kind="proxy")}
        assert bot_sessions == {"bot:shared-chat", "bot:owui-owui-chat", "bot:user-alice"}
        history = (await bot.session("bot:shared-chat"))["messages"]
        assert [m["content"] for m in history if m["role"] == "user"] == ["bot's question", "follow-up"]
        await forbidden(bot2.session("bot:shared-chat"))
        owners = {s["owner"] for s in await ops.sessions(kind="proxy")}
        assert owners == {"bot", "bot2"}


async def test_an_operator_may_continue_a_client_conversation_and_a_client_may_not_name_an_operators(
        api_server_factory: ApiServerFactory) -> None:
    srv = await two_clients(api_server_factory)
    sid, _ = await _ask(srv, "bot", "first", **{"X-Aiops-Session": "helpdesk"})
    assert sid == "bot:helpdesk"
    # Operators name sessions directly and may continue anyone's.
    assert (await _ask(srv, "ops", "operator steps in", **{"X-Aiops-Session": sid}))[0] == sid
    assert (await _ask(srv, "ops", "ops own", **{"X-Aiops-Session": "ops-room"}))[0] == "ops-room"
    # A session that carries the client's namespace but was created by an operator stays theirs.
    assert (await _ask(srv, "ops", "planted", **{"X-Aiops-Session": "bot:planted"}))[0] == "bot:planted"
    assert srv.tokens is not None
    client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key=srv.tokens.secrets["bot"], max_retries=0)
    with pytest.raises(openai.PermissionDeniedError) as e:
        await client.chat.completions.create(model="aiops", messages=[{"role": "user", "content": "x"}],
                                             extra_headers={"X-Aiops-Session": "bot:planted"})
    await client.close()
    assert e.value.status_code == 403 and "belongs to another caller" in e.value.message
    async with srv.client("ops") as ops:
        planted = (await ops.session("bot:planted"))["messages"]
    assert [m["content"] for m in planted if m["role"] == "user"] == ["planted"]


async def test_a_client_token_cannot_take_another_clients_conversation_name_through_the_api(
        api_server_factory: ApiServerFactory) -> None:
    """bot2 creating `bot:user-alice` through /api/v1 would own it, and lock bot's proxy conversation
    for `user: alice` out with a 403. Ids with ':' belong to the token they name."""
    srv = await two_clients(api_server_factory)
    async with srv.client("bot2") as bot2, srv.client("bot") as bot, srv.client("ops") as ops:
        with pytest.raises(AgentError) as e:
            await bot2.submit("squatting", client_id="bot:user-alice")
        assert (e.value.status, e.value.code) == (403, "reserved_id")
        assert "'bot2:'" in e.value.message
        assert await ops.sessions() == []  # nothing was created
        # Its own namespace, and names without ':', stay open to it; bot uses its own likewise.
        assert (await bot2.send("mine", client_id="bot2:notes", timeout=30))["status"] == "complete"
        assert (await bot2.send("plain", client_id="plain-name", timeout=30))["status"] == "complete"
        assert (await bot.send("via api", client_id="bot:from-api", timeout=30))["status"] == "complete"
        # The operator names anything.
        assert (await ops.send("ops", client_id="bot2:ops-made", timeout=30))["status"] == "complete"
    async with httpx.AsyncClient() as h:
        r = await h.post(srv.url + "/v1/chat/completions", headers=srv.headers("bot"), json={
            "model": "aiops", "user": "alice", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.headers["x-aiops-session"] == "bot:user-alice"


# ---- across a restart, against `aiops serve` -------------------------------------------------------------


def test_ownership_survives_a_restart_of_aiops_serve(aiops_serve_factory: ServeFactory) -> None:
    tokens = Tokens.make(ops="operator", bot="client", bot2="client")
    first = aiops_serve_factory(tokens=tokens)
    with openai.OpenAI(base_url=first.url + "/v1", api_key=tokens.secrets["bot"], max_retries=0) as c:
        raw = c.chat.completions.with_raw_response.create(
            model="aiops", messages=[{"role": "user", "content": "remember me"}],
            extra_headers={"X-Aiops-Session": "durable"})
    assert raw.headers["x-aiops-session"] == "bot:durable"
    assert first.stop() == 0

    again = aiops_serve_factory(tokens=tokens, config_dir=first.config_dir, data_dir=first.data_dir)
    url = again.url + "/api/v1/sessions/bot:durable"
    assert httpx.get(url, headers=tokens.header("bot")).status_code == 200
    r = httpx.get(url, headers=tokens.header("bot2"))
    assert (r.status_code, r.json()["error"]["code"]) == (403, "forbidden")
    assert httpx.get(url, headers=tokens.header("ops")).json()["session"]["owner"] == "bot"
    with openai.OpenAI(base_url=again.url + "/v1", api_key=tokens.secrets["bot"], max_retries=0) as c:
        raw = c.chat.completions.with_raw_response.create(
            model="aiops", extra_headers={"X-Aiops-Session": "durable"},
            messages=[{"role": "user", "content": "remember me"}, {"role": "assistant", "content": "echo: remember me"},
                      {"role": "user", "content": "still me"}])
    assert raw.headers["x-aiops-session"] == "bot:durable"
    msgs = httpx.get(url, headers=tokens.header("bot")).json()["messages"]
    assert [m["content"] for m in msgs if m["role"] == "user"] == ["remember me", "still me"]



async def test_session_command_in_a_chat_ui_does_not_list_its_other_users_chats(
        api_server_factory: ApiServerFactory, fake_openai: Any) -> None:
    """One client token serves every user of a chat UI (docs/PROXY.md: Open WebUI's connection
    key): a `!session` typed in one user's chat must not show the titles (their first words) of the
    other users' chats (review finding: it listed every session the token made)."""
    srv = await two_clients(api_server_factory)
    headers = srv.headers("bot")
    async with httpx.AsyncClient(base_url=srv.url, headers=headers, timeout=20) as h:
        r = await h.post("/v1/chat/completions", json={
            "model": "aiops", "user": "alice",
            "messages": [{"role": "user", "content": "alice's private salary question"}]})
        assert r.status_code == 200, r.text
        r = await h.post("/v1/chat/completions", json={
            "model": "aiops", "user": "bob", "messages": [{"role": "user", "content": "!session"}]})
        assert r.status_code == 200, r.text
    listed = r.json()["choices"][0]["message"]["content"]
    assert "salary" not in listed, listed
