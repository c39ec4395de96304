"""Proxy semantics across both formats: one session per conversation, forks on an edited history,
background tasks that touch no session, gates that wait for an operator while the chat stream stays
alive, and what a chat user sees meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import ollama
import openai
import pytest

from aiops.config import SHIPPED_PROMPT_DIR
from aiops.engine import events as ev
from tests.fakes.fixtures import openai_model_entry
from tests.fakes.openai_server import FakeOpenAI, Reply, call_tool_when, split_text
from tests.integration.test_server_api import events_until_done
from tests.support.server import ApiServer, ApiServerFactory, ServeFactory, Tokens

# ---- helpers --------------------------------------------------------------------------------------------


async def sessions(srv: ApiServer) -> dict[str, dict[str, Any]]:
    async with httpx.AsyncClient() as h:
        r = await h.get(srv.url + "/api/v1/sessions", params={"kind": "proxy"})
    return {s["client_id"]: s for s in r.json()["sessions"]}


async def history(srv: ApiServer, sid: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient() as h:
        r = await h.get(f"{srv.url}/api/v1/sessions/{sid}", params={"limit": 1000})
    r.raise_for_status()
    return r.json()["messages"]


async def stored_has(srv: ApiServer, sid: str, text: str) -> bool:
    """Whether a user message `text` is in the session's history (False while it has none)."""
    async with httpx.AsyncClient() as h:
        r = await h.get(f"{srv.url}/api/v1/sessions/{sid}", params={"limit": 1000})
    return r.status_code == 200 and any(m["content"] == text for m in r.json()["messages"])


async def until(condition: Callable[[], Awaitable[bool]], what: str, timeout: float = 30.0) -> None:
    """Poll an async condition until it holds; the deadline is generous, as CI machines are loaded."""
    try:
        async with asyncio.timeout(timeout):
            while not await condition():  # noqa: ASYNC110 - the condition is read over HTTP
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"no {what} within {timeout} s") from None


def convo(msgs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in msgs if m["role"] in ("user", "assistant")]


async def ask(client: openai.AsyncOpenAI, messages: list[tuple[str, str]], **kw: Any) -> tuple[str, str]:
    """(session id from the response header, answer)."""
    raw = await client.chat.completions.with_raw_response.create(
        model="aiops", messages=[{"role": r, "content": t} for r, t in messages], **kw)
    return raw.headers["x-aiops-session"], raw.parse().choices[0].message.content or ""


# ---- one session per conversation -----------------------------------------------------------------------


async def test_a_conversation_continues_its_session_and_an_edit_forks_it(api_server: ApiServer) -> None:
    client = openai.AsyncOpenAI(base_url=api_server.url + "/v1", api_key="x",
                                default_headers={"X-OpenWebUI-Chat-Id": "chat-42"})
    sid, a1 = await ask(client, [("user", "how full is /var?")])
    assert sid == "owui-chat-42"
    sid2, a2 = await ask(client, [("user", "how full is /var?"), ("assistant", a1), ("user", "and /home?")])
    assert sid2 == sid
    # The model saw the whole conversation, from aiops's own history.
    assert [m["content"] for m in api_server.fake.requests[-1].json["messages"][1:]] == [
        "how full is /var?", a1, "and /home?"]
    original = convo(await history(api_server, sid))
    assert original == [("user", "how full is /var?"), ("assistant", a1), ("user", "and /home?"),
                        ("assistant", a2)]

    # The user edits the first answer: the conversation forks into a session holding the client's
    # history, as written (an aiops status line the UI kept is left out).
    edited = [("user", "how full is /var?"),
              ("assistant", "It is 91% full:\n\n*⏳ waiting for operator approval: db_query read*\n\n"
                            "| path | size |\n|---|---|\n| /var/log | 40G |"),
              ("user", "what fills it?")]
    fork, a3 = await ask(client, edited)
    assert fork == "owui-chat-42+2"
    fork_msgs = await history(api_server, fork)
    assert convo(fork_msgs) == [edited[0], ("assistant", "It is 91% full:\n\n| path | size |\n|---|---|\n"
                                                         "| /var/log | 40G |"), edited[2], ("assistant", a3)]
    assert [m["meta"].get("imported", False) for m in fork_msgs if m["role"] in ("user", "assistant")] == [
        True, True, False, False]
    assert convo(await history(api_server, sid)) == original  # the original is untouched

    # Each branch keeps going in its own session.
    assert (await ask(client, [*edited, ("assistant", a3), ("user", "thanks")]))[0] == fork
    assert (await ask(client, [*original, ("user", "and /tmp?")]))[0] == sid
    assert set(await sessions(api_server)) == {sid, fork}
    await client.close()

async def test_a_fork_is_continued_after_a_restart(api_server_factory: ApiServerFactory) -> None:
    first = await api_server_factory()
    client = openai.AsyncOpenAI(base_url=first.url + "/v1", api_key="x",
                                default_headers={"X-OpenWebUI-Chat-Id": "chat-r"})
    _, a1 = await ask(client, [("user", "disk on db-1?")])
    fork, a2 = await ask(client, [("user", "disk on db-1?"), ("assistant", "edited answer"), ("user", "why?")])
    assert fork == "owui-chat-r+2"
    data = first.cfg.paths.data_dir
    await client.close()
    await first.stop()

    second = await api_server_factory(data_dir=data)
    client = openai.AsyncOpenAI(base_url=second.url + "/v1", api_key="x",
                                default_headers={"X-OpenWebUI-Chat-Id": "chat-r"})
    # The new process learns the conversation's sessions from the store: the fork continues.
    sid, _ = await ask(client, [("user", "disk on db-1?"), ("assistant", "edited answer"), ("user", "why?"),
                                ("assistant", a2), ("user", "and now?")])
    assert sid == fork
    assert set(await sessions(second)) == {"owui-chat-r", "owui-chat-r+2"}



async def test_sessions_by_fingerprint_when_the_client_sends_no_id(api_server: ApiServer) -> None:
    async with ollama.AsyncClient(host=api_server.url) as client:
        first = [{"role": "user", "content": "list the cron jobs"}]
        a1 = (await client.chat(model="aiops", messages=first, stream=False)).message.content
        assert len(await sessions(api_server)) == 1
        second = [*first, {"role": "assistant", "content": a1}, {"role": "user", "content": "and disable backup"}]
        await client.chat(model="aiops", messages=second, stream=False)
        (only,) = (await sessions(api_server)).values()
        assert only["message_count"] == 4
        # A new chat that starts the same way is a new conversation, not a continuation.
        await client.chat(model="aiops", messages=first, stream=False)
        await client.chat(model="aiops", messages=[{"role": "user", "content": "something else"}], stream=False)
        assert sorted(s["message_count"] for s in (await sessions(api_server)).values()) == [2, 2, 4]


async def test_a_system_prompt_that_changes_every_turn_keeps_the_conversation(api_server: ApiServer) -> None:
    """Chat UIs fill system prompts from templates such as {{CURRENT_DATETIME}}: without an id, the
    conversation is still the one its first user message began."""
    async with openai.AsyncOpenAI(base_url=api_server.url + "/v1", api_key="x", max_retries=0) as client:
        history_: list[dict[str, str]] = []
        ids = set()
        for minute, question in enumerate(("which hosts are down?", "since when?", "restart them")):
            history_.append({"role": "user", "content": question})
            raw = await client.chat.completions.with_raw_response.create(model="aiops", messages=[
                {"role": "system", "content": f"Current time: 10:0{minute}"}, *history_])
            ids.add(raw.headers["x-aiops-session"])
            history_.append({"role": "assistant", "content": raw.parse().choices[0].message.content or ""})
    assert len(ids) == 1
    (sid,) = ids
    # Nothing imported: each turn continued the one before.
    assert convo(await history(api_server, sid)) == [(m["role"], m["content"]) for m in history_]
    assert not any(m.get("meta", {}).get("imported") for m in await history(api_server, sid))


async def test_the_openai_user_field_names_the_conversation(api_server: ApiServer) -> None:
    client = openai.AsyncOpenAI(base_url=api_server.url + "/v1", api_key="x")
    assert (await ask(client, [("user", "hi")], user="alice"))[0] == "user-alice"
    assert (await ask(client, [("user", "hi")], user="bob@example.com"))[0] == "user-bob@example.com"
    await client.close()


async def test_many_chats_under_one_name_each_continue_their_own_session(api_server: ApiServer) -> None:
    """LibreChat sends every chat of a user with the same `user`: each new chat is a fork of that
    name, and each must go on in its own session, interleaved, whichever was touched last."""
    client = openai.AsyncOpenAI(base_url=api_server.url + "/v1", api_key="x")
    chats: dict[str, list[tuple[str, str]]] = {}
    for i in range(12):
        sid, answer = await ask(client, [("user", f"chat {i}: hello")], user="carol")
        chats[sid] = [("user", f"chat {i}: hello"), ("assistant", answer)]
    assert list(chats) == ["user-carol"] + [f"user-carol+{n}" for n in range(2, 13)]
    for round_ in range(2):
        for sid, messages in reversed(chats.items()):
            got, answer = await ask(client, [*messages, ("user", f"round {round_}")], user="carol")
            assert got == sid
            messages += [("user", f"round {round_}"), ("assistant", answer)]
    for sid, messages in chats.items():
        assert convo(await history(api_server, sid)) == messages
    # A regenerated last answer (the last question sent again) forks after the highest one.
    sid, _ = await ask(client, chats["user-carol+5"][:-1], user="carol")
    assert sid == "user-carol+13"
    await client.close()


async def test_chats_that_open_alike_cost_the_same_to_match_however_many_there_are(
        api_server_factory: ApiServerFactory) -> None:
    """Open WebUI without forwarded headers: every user's "hi" from one instance is a fork of one
    root (issue 21: a new chat cost 1.3 s of CPU after 4,466 of them). A first message compares
    nothing; a continuation finds its own branch; neither reads or walks more after hundreds of
    such chats than after a few (counted, not timed: the timing is `make bench`'s). After a
    restart, the first request of the root reads each of its sessions once, and no more after."""
    from aiops.integrations.server.proxy.state import PROXY_KEY

    srv = await api_server_factory()
    stats = srv.handle.app[PROXY_KEY].sessions.stats

    def work() -> tuple[int, int]:
        return stats.histories_read, stats.steps

    async def cost(messages: list[tuple[str, str]]) -> tuple[str, str, tuple[int, int]]:
        r0, s0 = work()
        sid, answer = await ask(client, messages)
        r1, s1 = work()
        return sid, answer, (r1 - r0, s1 - s0)

    n = 200
    client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    chats: dict[str, list[tuple[str, str]]] = {}
    new_chat: list[tuple[int, int]] = []
    for i in range(n):
        srv.fake.script(Reply.text(f"Hello! (chat {i})"))
        sid, answer, spent = await cost([("user", "hi")])
        chats[sid] = [("user", "hi"), ("assistant", answer)]
        new_chat.append(spent)
    assert len(chats) == n  # each chat a session of its own
    # The first creates the root (read once, confirmed once); every later one reads only the
    # session the request before it changed, and walks no history.
    assert new_chat[0] == (2, 0) and set(new_chat[1:]) == {(1, 0)}

    ids = list(chats)
    for round_ in range(2):
        for sid in (ids[0], ids[n // 2], ids[-1]):
            question = f"and then? ({round_})"
            got, answer, spent = await cost([*chats[sid], ("user", question)])
            assert got == sid
            # The session the request before changed, and the chosen one confirmed: no more for
            # the last chat than for the first.
            assert spent == (2, len(chats[sid])), (sid, round_)
            chats[sid] += [("user", question), ("assistant", answer)]
    for sid in (ids[0], ids[n // 2], ids[-1]):
        assert convo(await history(srv, sid)) == chats[sid]
    # A new chat after all that still compares nothing; a regenerated answer forks after the last.
    assert (await cost([("user", "hi")]))[2] == (1, 0)
    fork, _, spent = await cost(chats[ids[0]][:-1])
    assert fork == f"{ids[0]}+{n + 2}" and spent == (1, len(chats[ids[0]]) - 2)
    data = srv.cfg.paths.data_dir
    await client.close()
    await srv.stop()

    srv = await api_server_factory(data_dir=data)
    stats = srv.handle.app[PROXY_KEY].sessions.stats
    client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    sid = ids[n // 2]
    got, answer, spent = await cost([*chats[sid], ("user", "after the restart")])
    assert got == sid and spent[0] == n + 2 + 1  # every session of the root once, and the confirmation
    chats[sid] += [("user", "after the restart"), ("assistant", answer)]
    got, _, spent = await cost([*chats[sid], ("user", "and again")])
    assert got == sid and spent == (2, len(chats[sid]))
    await client.close()


async def test_a_conversation_changed_outside_the_proxy_is_compared_as_it_is_now(api_server: ApiServer) -> None:
    """Between two chat requests, an operator adds a turn to the session over the API, resets it,
    or deletes it: the next request sees the session as it is, not as it was."""
    client = openai.AsyncOpenAI(base_url=api_server.url + "/v1", api_key="x")
    sid, a1 = await ask(client, [("user", "uptime?")], user="dave")
    first = [("user", "uptime?"), ("assistant", a1)]
    async with httpx.AsyncClient() as h:
        r = await h.post(api_server.url + "/api/v1/submit",
                         json={"text": "operator aside", "client_id": sid, "wait": True})
        assert r.json()["status"] == "complete"
    # The chat UI never saw the operator's turn: its next message forks ...
    fork, _ = await ask(client, [*first, ("user", "and load?")], user="dave")
    assert fork == "user-dave+2"
    # ... and a client that has it continues the session.
    with_aside = [*first, ("user", "operator aside"), ("assistant", "echo: operator aside")]
    assert (await ask(client, [*with_aside, ("user", "and memory?")], user="dave"))[0] == sid

    # Reset: the session is empty, so the first message starts over in it.
    async with httpx.AsyncClient() as h:
        r = await h.post(api_server.url + "/api/v1/submit", json={"text": "!reset", "client_id": sid,
                                                                  "wait": True})
        assert r.status_code == 200, r.text
    assert convo(await history(api_server, sid)) == []
    _, b1 = await ask(client, [("user", "fresh start")], user="dave")
    assert convo(await history(api_server, sid)) == [("user", "fresh start"), ("assistant", b1)]

    # Deleted, then a new chat of that name: a new session under the freed id, not the old one.
    async with httpx.AsyncClient() as h:
        assert (await h.delete(f"{api_server.url}/api/v1/sessions/{sid}")).status_code == 200
    again, c1 = await ask(client, [("user", "fresh start")], user="dave")
    assert again == sid
    assert convo(await history(api_server, sid)) == [("user", "fresh start"), ("assistant", c1)]
    await client.close()


async def test_x_aiops_session_wins_and_may_send_only_the_new_message(api_server: ApiServer) -> None:
    client = openai.AsyncOpenAI(base_url=api_server.url + "/v1", api_key="x",
                                default_headers={"X-Aiops-Session": "nightly-report",
                                                 "X-OpenWebUI-Chat-Id": "ignored"})
    _, a1 = await ask(client, [("user", "count failed logins")], user="ignored-too")
    sid, _ = await ask(client, [("user", "now per host")])
    assert sid == "nightly-report"
    assert [m["content"] for m in api_server.fake.requests[-1].json["messages"][1:]] == [
        "count failed logins", a1, "now per host"]
    assert set(await sessions(api_server)) == {"nightly-report"}
    async with httpx.AsyncClient() as h:
        for bad in ("bad id!", "-dash", "101"):
            r = await h.post(api_server.url + "/v1/chat/completions", headers={"X-Aiops-Session": bad},
                             json={"model": "aiops", "messages": [{"role": "user", "content": "x"}]})
            assert r.status_code == 400 and "X-Aiops-Session" in r.json()["error"]["message"], bad
    await client.close()


async def test_overlapping_requests_of_one_conversation_keep_it_one_session(api_server: ApiServer) -> None:
    """Messages sent while a turn runs are stored before its answer; the conversation the client
    then sends (each question followed by its answer) still matches the session."""
    client = openai.AsyncOpenAI(base_url=api_server.url + "/v1", api_key="x",
                                default_headers={"X-Aiops-Session": "overlap"})
    # The first answer is held at the fake until the other two questions are in (stored, as the
    # session's history shows), so they are sent while it is being answered, whatever the load.
    api_server.fake.script(Reply.echo(hold_after=0))
    asks = [asyncio.ensure_future(ask(client, [("user", "question 0")]))]
    await api_server.fake.wait_for_held_async(1)
    for i in (1, 2):
        asks.append(asyncio.ensure_future(ask(client, [("user", f"question {i}")])))
        await until(lambda i=i: stored_has(api_server, "overlap", f"question {i}"), f"question {i} stored")
    assert not any(a.done() for a in asks)
    api_server.fake.release()
    answers = [a for _, a in await asyncio.gather(*asks)]
    assert answers == [f"echo: question {i}" for i in range(3)]
    stored = await history(api_server, "overlap")
    questions = [m["id"] for m in stored if m["role"] == "user"]
    assert max(questions) < min(m["id"] for m in stored if m["role"] == "assistant")  # committed as they came
    # ... and listed as a transcript, each question with its answer.
    assert [c for _, c in convo(stored)] == [t for i in range(3) for t in (f"question {i}", answers[i])]

    as_client_has_it = [m for i in range(3) for m in (("user", f"question {i}"), ("assistant", answers[i]))]
    sid, _ = await ask(client, [*as_client_has_it, ("user", "and then?")])
    assert sid == "overlap" and set(await sessions(api_server)) == {"overlap"}  # no fork
    assert [m["content"] for m in api_server.fake.requests[-1].json["messages"][1:]] == [
        t for _, t in as_client_has_it] + ["and then?"]
    await client.close()

async def test_a_fork_id_can_be_sent_back_as_the_session(api_server: ApiServer) -> None:
    client = openai.AsyncOpenAI(base_url=api_server.url + "/v1", api_key="x",
                                default_headers={"X-Aiops-Session": "runbook"})
    _, a1 = await ask(client, [("user", "step one")])
    fork, _ = await ask(client, [("user", "step one"), ("assistant", "something else"), ("user", "step two")])
    assert fork == "runbook+2"
    again, _ = await ask(client, [("user", "step three")], extra_headers={"X-Aiops-Session": fork})
    assert again == fork
    assert [t for r, t in convo(await history(api_server, fork)) if r == "user"] == [
        "step one", "step two", "step three"]
    await client.close()


async def test_background_tasks_are_plain_calls_that_touch_no_session(api_server: ApiServer) -> None:
    fake = api_server.fake
    client = openai.AsyncOpenAI(base_url=api_server.url + "/v1", api_key="x",
                                default_headers={"X-OpenWebUI-Chat-Id": "chat-7"})
    sid, _ = await ask(client, [("user", "restart nginx on web-1")])
    before = await history(api_server, sid)
    fake.script(Reply.text('{"title": "Restarting nginx"}'))
    task = ("### Task:\nGenerate a concise, 3-5 word title for the chat history.\n"
            "<chat_history>\nUSER: restart nginx on web-1\n</chat_history>")
    raw = await client.chat.completions.with_raw_response.create(
        model="aiops", messages=[{"role": "user", "content": task}])
    assert "x-aiops-session" not in raw.headers  # no session was involved
    assert raw.parse().choices[0].message.content == '{"title": "Restarting nginx"}'
    sent = fake.requests[-1].json
    assert sent["messages"] == [{"role": "user", "content": task}]  # no system prompt, no history
    assert "tools" not in sent
    stream = await client.chat.completions.create(model="aiops", stream=True,
                                                  messages=[{"role": "user", "content": task}])
    assert "".join([c.choices[0].delta.content or "" async for c in stream]) == f"echo: {task}"
    async with ollama.AsyncClient(host=api_server.url) as plain:
        g = await plain.generate(model="aiops", prompt=task, stream=False)
    assert g.response == f"echo: {task}"
    # A failed one is the surface's own model failure: 502 on /v1, 500 on /api, as a turn's.
    fake.script(Reply.error(400, "context too long"), Reply.error(400, "context too long"))
    with pytest.raises(openai.APIStatusError) as failed:  # (the SDK would retry a 502 by default)
        await client.with_options(max_retries=0).chat.completions.create(
            model="aiops", messages=[{"role": "user", "content": task}])
    assert failed.value.status_code == 502 and "context too long" in failed.value.message
    with pytest.raises(ollama.ResponseError) as failed_ollama:
        async with ollama.AsyncClient(host=api_server.url) as plain:
            await plain.generate(model="aiops", prompt=task, stream=False)
    assert failed_ollama.value.status_code == 500 and "context too long" in failed_ollama.value.error
    assert await history(api_server, sid) == before
    assert set(await sessions(api_server)) == {sid}
    await client.close()


async def test_a_streamed_answer_starts_with_its_commands_output_as_a_whole_one_does(
        api_server: ApiServer) -> None:
    """`!model` and a question in one message: the stream carries the command's output before the
    answer, as the non-streamed reply does, and the chat goes on in the same session."""
    client = openai.AsyncOpenAI(base_url=api_server.url + "/v1", api_key="x",
                                default_headers={"X-OpenWebUI-Chat-Id": "chat-cmd"})
    first = "!model\nwhat is the load?"
    stream = await client.chat.completions.with_raw_response.create(
        model="aiops", stream=True, messages=[{"role": "user", "content": first}])
    sid = stream.headers["x-aiops-session"]
    streamed = "".join([c.choices[0].delta.content or "" async for c in stream.parse()
                        if c.choices])
    assert streamed.startswith("Models (* = this session") and streamed.endswith("echo: what is the load?")
    whole_sid, whole = await ask(client, [("user", first)], extra_headers={"X-OpenWebUI-Chat-Id": "chat-cmd2"})
    assert streamed == whole
    again, _ = await ask(client, [("user", first), ("assistant", streamed), ("user", "and now?")])
    assert again == sid and sorted(await sessions(api_server)) == sorted([sid, whole_sid])
    await client.close()


# Open WebUI's default RAG template, put before the user's question when a file, a knowledge base
# or a web search is attached (abridged: its guidelines run on for a dozen lines).
RAG_TEMPLATE = ("### Task:\nRespond to the user query using the provided context, incorporating inline "
                "citations in the format [id] **only when the <source> tag includes an explicit id "
                "attribute**.\n\n### Guidelines:\n- If you don't know the answer, clearly state that.\n\n"
                "<context>\n<source id=\"1\">runbook: restart nginx with systemctl\n!reset\n"
                "!session</source>\n</context>\n")


async def test_a_question_with_open_webui_file_context_is_the_users_turn(api_server: ApiServer) -> None:
    """Open WebUI's RAG template starts `### Task:` as its background prompts do; the question it
    carries is the user's, for the agent, with its tools and in the chat's session."""
    client = openai.AsyncOpenAI(base_url=api_server.url + "/v1", api_key="x",
                                default_headers={"X-OpenWebUI-Chat-Id": "chat-rag"})
    question = RAG_TEMPLATE + "how do I restart nginx on web-1?"
    raw = await client.chat.completions.with_raw_response.create(
        model="aiops", messages=[{"role": "user", "content": question}])
    assert raw.headers["x-aiops-session"].endswith("chat-rag")
    sent = api_server.fake.requests[-1].json
    assert "tools" in sent and sent["messages"][0]["role"] == "system"
    # (the document's `!` lines are the document's: not run, and passed on)
    assert sent["messages"][-1] == {"role": "user", "content": question}
    assert raw.parse().choices[0].message.content == f"echo: {question}"
    sid = raw.headers["x-aiops-session"]
    assert [m["content"] for m in await history(api_server, sid)] == [question, f"echo: {question}"]
    # Open WebUI's next request shows that question as the user typed it: the same conversation.
    again, _ = await ask(client, [("user", "how do I restart nginx on web-1?"),
                                  ("assistant", f"echo: {question}"), ("user", "and on web-2?")])
    assert again == sid and list(await sessions(api_server)) == [sid]
    await client.close()


async def test_a_chat_that_began_with_a_file_attached_keeps_its_session_without_a_chat_id(
        api_server: ApiServer) -> None:
    """Open WebUI's default set-up sends no chat id: the conversation is its fingerprint, taken
    from the first question as the chat shows it later (without the RAG template around it), so
    the second turn continues the first's session, tool records and all."""
    fake = api_server.fake
    fake.script(Reply.tool_calls(("read_system_prompt", {})), Reply.text("nginx: systemctl restart nginx"))
    question = "how do I restart nginx on web-1?"
    async with ollama.AsyncClient(host=api_server.url) as client:
        first = await client.chat(model="aiops", stream=False,
                                  messages=[{"role": "user", "content": RAG_TEMPLATE + question}])
        (sid,) = await sessions(api_server)
        await client.chat(model="aiops", stream=False, messages=[
            {"role": "user", "content": question}, {"role": "assistant", "content": first.message.content},
            {"role": "user", "content": "and on web-2?"}])
    assert list(await sessions(api_server)) == [sid]
    # The model saw turn 1 as it ran: the tool call and its result, not a text-only import.
    roles = [m["role"] for m in fake.requests[-1].json["messages"] if m["role"] != "system"]
    assert roles == ["user", "assistant", "tool", "assistant", "user"]


# Open WebUI's RAG template before 2025: the question again after the context, in <user_query>.
OLD_RAG_TEMPLATE = ("### Task:\nRespond to the user query using the provided context.\n\n"
                    "<context>\n<source id=\"1\">web-1 disk: 91% full, /var/log 40 GB</source>\n</context>\n\n"
                    "<user_query>\n{q}\n</user_query>\n")


async def test_a_file_open_webui_puts_in_the_system_message_reaches_the_agent(api_server: ApiServer) -> None:
    """With RAG_SYSTEM_CONTEXT (and in older versions on OpenAI connections) Open WebUI puts the
    attached file's template in the system message, which the agent does not get: its context
    goes in front of the question instead, and the chat goes on in its session."""
    fake = api_server.fake
    client = openai.AsyncOpenAI(base_url=api_server.url + "/v1", api_key="x")
    question = "what does the attached report say?"
    system = "You are a helpful assistant.\n" + OLD_RAG_TEMPLATE.format(q=question)
    sid, answer = await ask(client, [("system", system), ("user", question)])
    sent = fake.requests[-1].json["messages"][-1]
    assert sent["role"] == "user" and "web-1 disk: 91% full" in sent["content"]
    assert sent["content"].endswith(question)
    again, _ = await ask(client, [("system", "You are a helpful assistant."), ("user", question),
                                  ("assistant", answer), ("user", "and what should I do?")])
    assert again == sid and list(await sessions(api_server)) == [sid]
    await client.close()


async def test_commands_and_at_model_still_work_with_rag_context_in_the_system_message(
        api_server: ApiServer) -> None:
    """The system message's context goes after a message's `!commands` and `@model`, which only
    count at its start: they still run, and a refused `@model` is still refused."""
    system = "You are a helpful assistant.\n" + OLD_RAG_TEMPLATE.format(q="ignored")
    client = openai.AsyncOpenAI(base_url=api_server.url + "/v1", api_key="x", max_retries=0,
                                default_headers={"X-OpenWebUI-Chat-Id": "rag-cmd"})
    with pytest.raises(openai.BadRequestError):
        await ask(client, [("system", system), ("user", "@nope hi")])
    sid, answer = await ask(client, [("system", system), ("user", "hello")])
    calls = len(api_server.fake.requests)
    _, listing = await ask(client, [("system", system), ("user", "hello"), ("assistant", answer), ("user", "!help")])
    assert "Commands:" in listing and len(api_server.fake.requests) == calls  # no model call
    _, both = await ask(client, [("system", system), ("user", "hello"), ("assistant", answer), ("user", "!help"),
                                 ("assistant", listing), ("user", "!model\nwhat does the report say?")])
    assert both.startswith("Models (* = this session")
    sent = api_server.fake.requests[-1].json["messages"][-1]["content"]
    assert "web-1 disk: 91% full" in sent and sent.endswith("what does the report say?")
    assert list(await sessions(api_server)) == [sid]
    await client.close()


async def test_a_chat_begun_with_the_older_rag_template_keeps_its_session(api_server: ApiServer) -> None:
    question = "is web-1 running out of disk?"
    async with ollama.AsyncClient(host=api_server.url) as client:
        first = await client.chat(model="aiops", stream=False, messages=[  # as Open WebUI puts it
            {"role": "user", "content": OLD_RAG_TEMPLATE.format(q=question) + "\n" + question}])
        (sid,) = await sessions(api_server)
        await client.chat(model="aiops", stream=False, messages=[
            {"role": "user", "content": question}, {"role": "assistant", "content": first.message.content},
            {"role": "user", "content": "and web-2?"}])
    assert list(await sessions(api_server)) == [sid]


async def test_a_message_typed_in_the_rag_templates_shape_does_not_fork_every_turn(api_server: ApiServer) -> None:
    """A client keeps sending the text it sent: a message that happens to look like Open WebUI's
    RAG template is compared as the session compares it, and the chat continues in place."""
    client = openai.AsyncOpenAI(base_url=api_server.url + "/v1", api_key="x",
                                default_headers={"X-Aiops-Session": "typed-task"})
    typed = ("### Task:\nSummarize the text in <context> for an on-call engineer.\n<context>\n"
             "nginx on web-1 restarted 3 times overnight\n</context>\nwhat happened?")
    history_ = [("user", typed)]
    for follow_up in ("why?", "what now?"):
        sid, answer = await ask(client, history_)
        assert sid == "typed-task"
        history_ += [("assistant", answer), ("user", follow_up)]
    sid, _ = await ask(client, history_)
    assert sid == "typed-task" and list(await sessions(api_server)) == ["typed-task"]
    assert [c for r, c in convo(await history(api_server, sid)) if r == "user"] == [typed, "why?", "what now?"]
    await client.close()


async def test_open_webuis_tool_selection_request_is_a_plain_call(api_server: ApiServer) -> None:
    """With Open WebUI's own tools enabled on a model without native calls, it asks the model
    which tool to use in a side request of its own: a plain model call, no session, no tools."""
    fake = api_server.fake
    fake.script(Reply.text('{"tool_calls": []}'))
    # (the model's own system prompt first, as Open WebUI puts it when the model has one)
    system = ("You are the ops assistant.\nAvailable Tools: [{\"name\": \"get_weather\", \"parameters\": {}}]"
              "\n\nYour task is to choose and return the correct tool(s) from the list of available tools "
              "based on the query.")
    query = 'History:\nUSER: """hello"""\nASSISTANT: """hi"""\nQuery: what is the weather in Oslo?'
    client = openai.AsyncOpenAI(base_url=api_server.url + "/v1", api_key="x")
    raw = await client.chat.completions.with_raw_response.create(
        model="aiops", messages=[{"role": "system", "content": system}, {"role": "user", "content": query}])
    assert raw.parse().choices[0].message.content == '{"tool_calls": []}'
    assert "x-aiops-session" not in raw.headers
    sent = fake.requests[-1].json
    assert sent["messages"] == [{"role": "system", "content": system}, {"role": "user", "content": query}]
    assert "tools" not in sent
    # A chat that merely starts with such a system prompt, or says "Query:", is the user's turn.
    await ask(client, [("system", system), ("user", "what is the weather in Oslo?")])
    await ask(client, [("user", "Query: show the slow log")])
    assert len(await sessions(api_server)) == 2
    await client.close()


async def test_a_turn_ended_at_a_limit_says_so_in_the_chat_answer(api_server: ApiServer) -> None:
    """The model calling the same tool a third time ends the turn with nothing said: the chat
    user reads why instead of an empty answer that passes for a whole one, streamed or not, on
    both surfaces, and the chat goes on in its session."""
    fake = api_server.fake
    again = Reply.tool_calls(("read_system_prompt", {}))
    why = "*⛔ ended the turn: read_system_prompt was called a third time with the same arguments*"
    client = openai.AsyncOpenAI(base_url=api_server.url + "/v1", api_key="x",
                                default_headers={"X-Aiops-Session": "looping"})
    fake.script(again, again, again)
    _, whole = await ask(client, [("user", "loop")])
    assert whole == why
    fake.script(again, again, again)
    stream = await client.chat.completions.create(model="aiops", stream=True, messages=[
        {"role": "user", "content": "loop"}, {"role": "assistant", "content": whole},
        {"role": "user", "content": "loop again"}])
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip() == why
    async with ollama.AsyncClient(host=api_server.url, headers={"X-Aiops-Session": "looping-2"}) as o:
        fake.script(again, again, again)
        r = await o.chat(model="aiops", stream=False, messages=[{"role": "user", "content": "loop"}])
        assert r.message.content == why and r.done_reason == "stop"
        fake.script(again, again, again)
        lines = [p async for p in await o.generate(model="aiops", prompt="loop", stream=True)]
        assert "".join(p.response for p in lines).strip() == why
    assert set(await sessions(api_server)) == {"looping", "looping-2"}
    await client.close()


async def test_the_operator_stopping_a_proxy_turn_ends_the_chat_answer(api_server: ApiServer) -> None:
    api_server.fake.script(Reply.hang(after_chunks=4, reply=Reply.text(
        "Rotating the logs on all forty hosts, starting with web-1", chunks=6)))
    client = openai.AsyncOpenAI(base_url=api_server.url + "/v1", api_key="x")
    stream = await client.chat.completions.create(model="aiops", stream=True, extra_headers={
        "X-Aiops-Session": "stop-me"}, messages=[{"role": "user", "content": "rotate logs"}])
    text, finishes, stopped = "", [], False
    async for c in stream:
        text += c.choices[0].delta.content or ""
        if c.choices[0].finish_reason:
            finishes.append(c.choices[0].finish_reason)
        if text and not stopped:
            async with httpx.AsyncClient() as h:
                stopped = (await h.post(api_server.url + "/api/v1/sessions/stop-me/stop")).json()["stopped"]
            assert stopped
    assert finishes == ["stop"]
    assert text.startswith("Rotating")
    assert text.endswith("\n\n*⛔ the answer was stopped*\n\n")
    statuses = [m["status"] for m in await history(api_server, "stop-me") if m["role"] == "assistant"]
    assert statuses == ["cancelled"]
    # The chat UI keeps the stopped answer, status line and all; the conversation goes on in place.
    again = [("user", "rotate logs"), ("assistant", text), ("user", "continue")]
    assert (await ask(client, again, extra_headers={"X-Aiops-Session": "stop-me"}))[0] == "stop-me"
    await client.close()


async def test_tool_progress_lines_only_when_configured(api_server_factory: ApiServerFactory) -> None:
    for progress in (False, True):
        srv = await api_server_factory(server={"proxy_tool_progress": progress})
        srv.fake.responder = call_tool_when("peek", ("read_system_prompt", {}), then_text="Read it.")
        client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="x")
        stream = await client.chat.completions.create(model="aiops", stream=True,
                                                      messages=[{"role": "user", "content": "peek"}])
        text = "".join([c.choices[0].delta.content or "" async for c in stream])
        assert text == ("*🔧 running read_system_prompt*\n\nRead it." if progress else "Read it.")
        await client.close()


# ---- gates ---------------------------------------------------------------------------------------------


@pytest.fixture
def prompt_copy(tmp_path: Path) -> Path:
    """A private copy of the default system prompt, so an approved edit touches only the test's."""
    dest = tmp_path / "prompt"
    shutil.copytree(SHIPPED_PROMPT_DIR / "default", dest)
    return dest


REMEMBER = ("update_system_prompt", {"section": "memory", "operation": "append",
                                     "content": "The operator prefers tea."})


def gated_server(factory: ServeFactory, fake: FakeOpenAI, prompt: Path, tokens: Tokens,
                 **server: Any) -> Any:
    fake.responder = call_tool_when("remember", REMEMBER)
    return factory(tokens=tokens, server={"keepalive_seconds": 0.2, **server},
                   models={"local": openai_model_entry(fake, system_prompt_folder=str(prompt))})


async def _wait_gate(url: str, headers: dict[str, str]) -> dict[str, Any]:
    async with httpx.AsyncClient() as h:
        r = await h.get(url + "/api/v1/gates", headers=headers)
    (gate,) = r.json()["gates"]
    return gate


async def test_an_openai_stream_waits_for_an_operator_with_keepalives_and_a_status_line(
        aiops_serve_factory: ServeFactory, fake_openai: FakeOpenAI, prompt_copy: Path) -> None:
    tokens = Tokens.make(ops="operator", chat="client")
    srv = gated_server(aiops_serve_factory, fake_openai, prompt_copy, tokens)
    waiting, kept_alive = asyncio.Event(), asyncio.Event()
    frames: list[str] = []
    content: list[str] = []

    async def chat() -> None:
        body = {"model": "aiops", "stream": True,
                "messages": [{"role": "user", "content": "remember that I prefer tea"}]}
        async with httpx.AsyncClient(timeout=30) as h, h.stream(
                "POST", srv.url + "/v1/chat/completions", json=body, headers=tokens.header("chat")) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if not line:
                    continue
                frames.append(line)
                if line.startswith("data: {"):
                    content.append(json.loads(line[6:])["choices"][0]["delta"].get("content") or "")
                    if "waiting for operator approval" in "".join(content):
                        waiting.set()
                elif line.startswith(":") and waiting.is_set() and sum(
                        f.startswith(":") for f in frames) >= 2:
                    kept_alive.set()

    task = asyncio.create_task(chat())
    await asyncio.wait_for(waiting.wait(), 15)
    assert "*⏳ waiting for operator approval: update_system_prompt write*" in "".join(content)
    await asyncio.wait_for(kept_alive.wait(), 15)  # ": keep-alive" comments while the gate waits
    gate = await _wait_gate(srv.url, tokens.header("ops"))
    assert (gate["client_kind"], gate["tool"]) == ("proxy", "update_system_prompt")

    async with httpx.AsyncClient() as h:
        refused = await h.post(f"{srv.url}/api/v1/gates/{gate['id']}", json={"decision": "approve"},
                               headers=tokens.header("chat"))
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "forbidden"
        assert (await _wait_gate(srv.url, tokens.header("ops")))["id"] == gate["id"]  # still pending
        ok = await h.post(f"{srv.url}/api/v1/gates/{gate['id']}", json={"decision": "approve"},
                          headers=tokens.header("ops"))
        assert ok.status_code == 200 and ok.json()["gate"]["decision"] == "approved"
    await asyncio.wait_for(task, 15)

    text = "".join(content)
    before, _, after = text.partition("*✅ approved by the operator*")
    assert before.endswith("*⏳ waiting for operator approval: update_system_prompt write*\n\n")
    assert after.startswith("\n\ntool said: ")  # the tool ran; the model's answer follows
    assert frames[-1] == "data: [DONE]"
    assert "The operator prefers tea." in (prompt_copy / ".system_prompt_memory").read_text()
    assert "🔧" not in text


async def test_an_ollama_stream_stays_alive_with_empty_lines_and_shows_a_denial(
        aiops_serve_factory: ServeFactory, fake_openai: FakeOpenAI, prompt_copy: Path) -> None:
    tokens = Tokens.make(ops="operator", chat="client")
    srv = gated_server(aiops_serve_factory, fake_openai, prompt_copy, tokens)
    before = (prompt_copy / ".system_prompt_memory").read_text()
    waiting, changed = asyncio.Event(), asyncio.Event()
    lines: list[dict[str, Any]] = []

    async def chat() -> None:
        async with ollama.AsyncClient(host=srv.url, headers=tokens.header("chat")) as client:
            async for part in await client.chat(model="aiops", stream=True, messages=[
                    {"role": "user", "content": "remember that I prefer tea"}]):
                lines.append(part.model_dump())
                changed.set()
                if "waiting for operator approval" in "".join(p["message"]["content"] or "" for p in lines):
                    waiting.set()

    async def until_lines(n: int) -> None:
        while len(lines) < n:
            changed.clear()
            await changed.wait()

    task = asyncio.create_task(chat())
    await asyncio.wait_for(waiting.wait(), 15)
    gate = await _wait_gate(srv.url, tokens.header("ops"))
    mark = len(lines)
    # Keep-alives: empty `done: false` lines the ollama client parses like any other.
    await asyncio.wait_for(until_lines(mark + 2), 10)
    assert all(p["message"]["content"] == "" and p["done"] is False for p in lines[mark:mark + 2])
    async with aiohttp.ClientSession() as s:
        r = await s.post(f"{srv.url}/api/v1/gates/{gate['id']}", json={"decision": "deny"},
                         headers=tokens.header("ops"))
        assert r.status == 200
    await asyncio.wait_for(task, 15)
    text = "".join(p["message"]["content"] or "" for p in lines)
    assert "*⛔ denied by the operator*" in text
    assert "tool said: The operator did not allow" in text
    assert lines[-1]["done"] is True and lines[-1]["done_reason"] == "stop"
    assert (prompt_copy / ".system_prompt_memory").read_text() == before


async def next_sse_event(lines: AsyncIterator[str], name: str) -> dict[str, Any]:
    """Read the lines of an /api/v1/stream response until the event `name`; its data."""
    current = None
    async for line in lines:
        if line.startswith("event: "):
            current = line[7:]
        elif line.startswith("data: ") and current == name:
            return json.loads(line[6:])
    raise AssertionError(f"the stream ended before a {name!r} event")


async def test_status_lines_can_be_turned_off(aiops_serve_factory: ServeFactory, fake_openai: FakeOpenAI,
                                              prompt_copy: Path) -> None:
    tokens = Tokens.make(ops="operator")
    srv = gated_server(aiops_serve_factory, fake_openai, prompt_copy, tokens, proxy_status_lines=False)
    client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key=tokens.secrets["ops"],
                                default_headers={"X-Aiops-Session": "quiet"})
    async with httpx.AsyncClient(timeout=30) as h, h.stream(
            "GET", srv.url + "/api/v1/stream/quiet", headers=tokens.header("ops")) as events:
        pending = asyncio.create_task(client.chat.completions.create(
            model="aiops", stream=True, messages=[{"role": "user", "content": "remember it"}]))
        gate = await asyncio.wait_for(next_sse_event(events.aiter_lines(), "gate"), 15)
        await h.post(f"{srv.url}/api/v1/gates/{gate['id']}", json={"decision": "approve"},
                     headers=tokens.header("ops"))
        stream = await asyncio.wait_for(pending, 15)
        text = "".join([c.choices[0].delta.content or "" async for c in stream])
    assert text.startswith("tool said: ")
    assert "⏳" not in text and "✅" not in text
    await client.close()


async def test_hanging_up_while_a_gate_waits_cancels_the_turn_and_the_gate(
        aiops_serve_factory: ServeFactory, fake_openai: FakeOpenAI, prompt_copy: Path) -> None:
    tokens = Tokens.make(ops="operator")
    srv = gated_server(aiops_serve_factory, fake_openai, prompt_copy, tokens)
    before = (prompt_copy / ".system_prompt_memory").read_text()
    async with httpx.AsyncClient(timeout=30) as h, h.stream(
            "GET", srv.url + "/api/v1/stream/walk-away", headers=tokens.header("ops")) as events:
        lines = events.aiter_lines()
        body = {"model": "aiops", "stream": True, "messages": [{"role": "user", "content": "remember tea"}]}
        async with h.stream("POST", srv.url + "/v1/chat/completions", json=body,
                            headers={**tokens.header("ops"), "X-Aiops-Session": "walk-away"}) as chat:
            async for line in chat.aiter_lines():
                if "waiting for operator approval" in line:
                    break  # leaving the block hangs up while the gate waits
        resolved = await asyncio.wait_for(next_sse_event(lines, "gate_resolved"), 15)
        assert (resolved["decision"], resolved["by"]) == ("cancelled", "the client disconnected")
        await asyncio.wait_for(next_sse_event(lines, "done"), 15)
        assert (await h.get(srv.url + "/api/v1/gates", headers=tokens.header("ops"))).json()["gates"] == []
        msgs = (await h.get(srv.url + "/api/v1/sessions/walk-away", headers=tokens.header("ops"))).json()["messages"]
    gates = [m for m in msgs if m["role"] == "gate"]
    assert [(g["meta"]["tool"], g["meta"]["decision"]) for g in gates] == [("update_system_prompt", "cancelled")]
    assert [m["content"] for m in msgs if m["role"] == "notice"][-1].startswith("turn cancelled")
    assert (prompt_copy / ".system_prompt_memory").read_text() == before  # the write never ran


# ---- what chat users are told of a failure ---------------------------------------------------------------


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_client_tokens_chat_users_get_failures_without_server_addresses(
        api_server_factory: ApiServerFactory, fake_openai: FakeOpenAI) -> None:
    tokens = Tokens.make(ops="operator", chat="client")
    down = f"http://127.0.0.1:{_closed_port()}/v1"
    srv = await api_server_factory(tokens=tokens, models={
        "local": openai_model_entry(fake_openai),
        "down": {"type": "openai", "model_id": "m", "base_url": down, "timeout": 5}})

    async def failures(token: str) -> list[str]:
        """What each chat surface tells this token's user of a failing model."""
        said: list[str] = []
        async with openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key=tokens.secrets[token],
                                      max_retries=0) as client:
            fake_openai.script(Reply.error(500, "upstream exploded"))
            with pytest.raises(openai.InternalServerError) as e:  # not streamed: a 502
                await client.chat.completions.create(model="aiops", messages=[{"role": "user", "content": "a"}])
            said.append(e.value.message)
            with pytest.raises(openai.APIError) as e2:  # streamed: the error chunk
                async for _ in await client.chat.completions.create(
                        model="aiops/down", stream=True, messages=[{"role": "user", "content": "b"}]):
                    pass
            said.append(e2.value.message)
            with pytest.raises(openai.InternalServerError) as e:  # a chat UI's background task
                await client.chat.completions.create(model="aiops/down", messages=[
                    {"role": "user", "content": "### Task:\nGenerate a title\n<chat_history>\nUSER: b\n</chat_history>"}])
            said.append(e.value.message)
        async with ollama.AsyncClient(host=srv.url, headers=tokens.header(token)) as ollama_client:
            with pytest.raises(ollama.ResponseError) as e3:
                async for _ in await ollama_client.chat(model="aiops/down", stream=True,
                                                        messages=[{"role": "user", "content": "c"}]):
                    pass
        said.append(e3.value.error)
        return said

    chat = await failures("chat")
    assert len(chat) == 4
    assert "HTTP 500" in chat[0] and "upstream exploded" in chat[0]  # what failed is still said
    for message in chat:
        assert "model '" in message and "[address hidden]" in message, message
        assert "127.0.0.1" not in message and "http://" not in message, message

    ops = await failures("ops")  # the operator reads it word for word, as the console shows it
    assert fake_openai.url in ops[0] and all(down in m for m in ops[1:]), ops
    async with aiohttp.ClientSession(headers=tokens.header("chat")) as http:  # the server goes on
        async with http.post(srv.url + "/v1/chat/completions", json={
                "model": "aiops", "messages": [{"role": "user", "content": "still there?"}]}) as r:
            assert r.status == 200


async def test_a_client_token_reads_api_failures_without_server_addresses(
        api_server_factory: ApiServerFactory, fake_openai: FakeOpenAI) -> None:
    """`/api/v1` tells a client token what failed as the proxies do: in the `error` event, the
    `done`, a waited reply and the stored error record; an operator token reads every word."""
    tokens = Tokens.make(ops="operator", bot="client")
    port = _closed_port()
    srv = await api_server_factory(tokens=tokens, models={
        "local": openai_model_entry(fake_openai),
        "down": {"type": "openai", "model_id": "m", "base_url": f"http://127.0.0.1:{port}/v1", "timeout": 5}})

    async def failure(token: str) -> list[str]:
        async with srv.client(token) as agent, agent.stream(f"api-{token}-down") as stream:
            reply = await agent.send("hello", client_id=f"api-{token}-down", model="down")
            events = await events_until_done(stream, reply["turn_id"])
            error = next(e["data"] for e in events if e["event"] == "error")
            done = events[-1]["data"]
            record = next(m for m in (await agent.session(f"api-{token}-down"))["messages"] if m["role"] == "error")
            assert reply["status"] == done["status"] == "error"
            return [reply["error"]["message"], error["message"], done["error"]["message"],
                    record["content"], record["meta"]["message"]]

    for message in await failure("bot"):
        assert "model 'down'" in message and "[address hidden]" in message, message
        assert "127.0.0.1" not in message and str(port) not in message, message
    assert all(f"127.0.0.1:{port}" in m for m in await failure("ops")), await failure("ops")


@pytest.mark.parametrize(("message", "client_sees"), [
    ("model 'x' at https://llm.corp.example/v1: HTTP 429: slow down",
     "model 'x' at [address hidden]: HTTP 429: slow down"),
    ("connection failed (ClientConnectorError: Cannot connect to host llm.internal:8080 ssl:default "
     "[Connect call failed ('10.0.0.5', 8080)])",
     "connection failed (ClientConnectorError: Cannot connect to host [address hidden] ssl:default "
     "[Connect call failed ('[address hidden]', 8080)])"),
    ("no answer from [fd00::5]:11434 or localhost:8000", "no answer from [address hidden] or [address hidden]"),
    # A compose service name, IPv6 as aiohttp prints a peer, a configured host named without a port.
    ("Cannot connect to host ollama:11434 ssl:default [Connect call failed ('::1', 11434, 0, 0)]",
     "Cannot connect to host [address hidden] ssl:default [Connect call failed ('[address hidden]', 11434, 0, 0)]"),
    ("no route to fd00:1::5 or 2001:db8:0:0:0:0:0:1", "no route to [address hidden] or [address hidden]"),
    ("Cannot connect to host gpu-box.internal ssl:default", "Cannot connect to host [address hidden] ssl:default"),
    # Not addresses: left as they are.
    ("model 'llama3.1:8b' at [address hidden]: context length 8192 exceeded at 12:30:45",
     "model 'llama3.1:8b' at [address hidden]: context length 8192 exceeded at 12:30:45"),
    ("HTTP 400: Invalid 'messages[2].tool_calls[0].id'", "HTTP 400: Invalid 'messages[2].tool_calls[0].id'"),
    ("model 'gpu-box-2' failed on gpu-box.internals", "model 'gpu-box-2' failed on gpu-box.internals"),
])
def test_addresses_are_hidden_from_client_tokens_only(message: str, client_sees: str) -> None:
    from aiops.integrations.server.addresses import shown_to
    from aiops.integrations.server.owners import Caller

    hosts = ["gpu-box.internal"]  # configured model servers' hosts
    assert shown_to(Caller("chat", operator=False), message, hosts) == client_sees
    assert shown_to(Caller("ops", operator=True), message, hosts) == message


async def test_a_stream_ending_as_a_keepalive_falls_due_writes_nothing_after_its_end(
        api_server_factory: ApiServerFactory, caplog: pytest.LogCaptureFixture) -> None:
    """The keep-alive timer and the end of an answer can fall in the same loop turn. A keep-alive
    written after the end of the body was an ERROR with a traceback in the operator's log (and a
    chunk after the terminator would corrupt the kept-alive connection). With keep-alives due every
    2 ms, 200 streamed answers hit that moment dozens of times."""
    srv = await api_server_factory(server={"keepalive_seconds": 0.002})
    srv.fake.responder = lambda body: Reply.text("x" * 200, chunks=5, chunk_delay=0.001)
    caplog.set_level(logging.ERROR)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=4)) as http:

        async def one(i: int) -> None:
            async with http.post(srv.url + "/api/chat", json={
                    "model": "aiops", "messages": [{"role": "user", "content": f"question {i}"}]}) as r:
                lines = (await r.read()).decode().splitlines()
            assert r.status == 200 and json.loads(lines[-1])["done"] is True

        for batch in range(20):
            await asyncio.gather(*(one(batch * 10 + k) for k in range(10)))
    # aiops's own records only: a client another test left open may be collected meanwhile and
    # asyncio logs its failed close on this test's time.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and r.name.startswith("aiops")] == []


async def test_a_client_token_can_send_back_the_session_id_a_fingerprinted_chat_got(
        api_server_factory: ApiServerFactory) -> None:
    """A chat with no chat id and no `user` is found by its first message; the id it is answered
    with must lead back to it when the client sends it (with only the new message)."""
    tokens = Tokens.make(webui="client")
    srv = await api_server_factory(tokens=tokens)
    client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key=tokens.secrets["webui"])
    sid, answer = await ask(client, [("user", "which disks are full?")])
    assert sid.startswith("webui:proxy-")
    again, _ = await ask(client, [("user", "and on web-2?")], extra_headers={"X-Aiops-Session": sid})
    assert again == sid
    seen = [m["content"] for m in srv.fake.requests[-1].json["messages"] if m["role"] != "system"]
    assert seen == ["which disks are full?", answer, "and on web-2?"]
    await client.close()


async def test_deleted_conversations_leave_the_proxys_index(api_server_factory: ApiServerFactory) -> None:
    """The proxy's index of conversations (names, their forks, compact views) must not keep what
    was deleted, nor names it refused: a long-running server would grow with every chat."""
    from aiops.integrations.server.proxy.state import PROXY_KEY

    tokens = Tokens.make(ops="operator", chat="client")
    srv = await api_server_factory(tokens=tokens)
    async with httpx.AsyncClient(base_url=srv.url, timeout=20, headers=tokens.header("chat")) as chat, \
            httpx.AsyncClient(base_url=srv.url, timeout=20, headers=tokens.header("ops")) as ops:
        ids = []
        for i in range(20):
            for question in ("hello", "another chat"):  # a person's second chat: a fork of the name
                r = await chat.post("/v1/chat/completions", json={
                    "model": "aiops", "user": f"chat-{i}", "messages": [{"role": "user", "content": question}]})
                assert r.status_code == 200
                ids.append(r.headers["X-Aiops-Session"])
        assert ids[:2] == ["chat:user-chat-0", "chat:user-chat-0+2"]
        r = await ops.post("/api/v1/submit", json={"text": "an API session", "client_id": "taken", "wait": True})
        assert r.status_code == 200
        r = await ops.post("/v1/chat/completions", headers={"X-Aiops-Session": "taken"},
                           json={"model": "aiops", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 409  # an API session: refused, and not remembered
        assert "'taken' is an api session" in r.json()["error"]["message"]
        index = srv.handle.app[PROXY_KEY].sessions
        assert sum(len(v) for v in index.roots_indexed().values()) == 40
        for sid in ids:
            assert (await chat.delete(f"/api/v1/sessions/{sid}")).status_code == 200
        assert index.roots_indexed() == {}
        # A name used again starts afresh.
        r = await chat.post("/v1/chat/completions", json={
            "model": "aiops", "user": "chat-0", "messages": [{"role": "user", "content": "new"}]})
        assert r.headers["X-Aiops-Session"] == "chat:user-chat-0" and list(index.roots_indexed()) == ["chat:user-chat-0"]


async def test_a_client_hanging_up_at_any_moment_of_a_start_leaves_no_question_unanswered(
        api_server: ApiServer) -> None:
    """handler_cancellation: a client that hangs up cancels its request wherever it is, even while
    the engine records its message. Whatever the moment, no question is left recorded without a
    turn that answers it (or says it was cancelled): such a message would never be answered, and
    the client's retry would fork away from it."""
    from aiops.integrations.server.owners import Caller
    from aiops.integrations.server.proxy.identity import ConversationId
    from aiops.integrations.server.proxy.messages import ClientMessage
    from aiops.integrations.server.proxy.models import published_models
    from aiops.integrations.server.proxy.sessions import ProxySessions, cancel_turn

    engine = api_server.engine
    sessions = ProxySessions(engine)
    model = published_models(engine)[0]
    who = Caller("loopback:test", True)
    N = 250
    for n in range(N):
        conv = ConversationId(f"hangup-{n}", "header")
        task = asyncio.ensure_future(sessions.start(conv, [ClientMessage("user", f"question {n}")], model, who))
        await asyncio.sleep(n * 0.0001)  # hang up a little later each time: at every await of the start
        task.cancel()
        if n % 2:  # and half the time a second cancel (a shutdown) comes while the first is handled
            for _ in range(n % 5):
                await asyncio.sleep(0)
            task.cancel()
        try:
            started = await task
        except asyncio.CancelledError:
            continue
        if started.sub is not None:  # it had finished: the hang-up reaches the turn, as the proxy's does
            started.sub.close()
        await cancel_turn(engine, started.session_id, started.turn, "the client disconnected")
    for _ in range(600):  # let every turn that was queued end (30 s: CI machines are loaded)
        if all(not (live := engine.cache.get(f"hangup-{n}")) or live.current is None and not live.queue
               for n in range(N)):
            break
        await asyncio.sleep(0.05)
    unanswered = []
    for n in range(N):
        if await engine.session(f"hangup-{n}") is None:
            continue  # hung up before anything was recorded
        history = await engine.history(f"hangup-{n}")
        if history and history[-1].role == "user":
            unanswered.append((n, [(m.role, m.content) for m in history]))
    assert unanswered == []


async def test_a_non_streaming_answer_cut_by_a_shutdown_is_a_503_not_an_empty_answer(
        api_server_factory: ApiServerFactory) -> None:
    """A shutdown stops running turns; a non-streaming client must not take the (partial, here
    empty) text for the whole answer. Each surface says so in its own shape, and the SDK is told
    not to retry against a server that is going away."""
    srv = await api_server_factory()
    srv.fake.script(Reply.hang(), Reply.hang())
    openai_client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="x")
    ollama_client = ollama.AsyncClient(host=srv.url, headers={"X-Aiops-Session": "cut-ollama"})
    openai_call = asyncio.create_task(openai_client.chat.completions.create(
        model="aiops", messages=[{"role": "user", "content": "a long job"}],
        extra_headers={"X-Aiops-Session": "cut-openai"}))
    ollama_call = asyncio.create_task(ollama_client.chat(
        model="aiops", stream=False, messages=[{"role": "user", "content": "another long job"}]))
    await srv.fake.wait_for_requests_async(2)
    await srv.stop()
    with pytest.raises(openai.APIStatusError) as cut:
        await openai_call
    assert cut.value.status_code == 503
    assert cut.value.response.headers["x-should-retry"] == "false"
    assert cut.value.response.headers["X-Aiops-Session"] == "cut-openai"
    assert "shut down before the answer was done" in cut.value.message
    with pytest.raises(ollama.ResponseError) as cut_ollama:
        await ollama_call
    assert cut_ollama.value.status_code == 503
    assert "shut down before the answer was done" in cut_ollama.value.error
    await openai_client.close()
    await ollama_client.__aexit__(None, None, None)


async def test_a_refused_at_model_is_a_400_on_both_surfaces_and_leaves_no_session(api_server: ApiServer) -> None:
    """`@nope hi` was answered as a failed turn (502 on /v1, 500 on /api/chat, or an error chunk),
    and left an empty proxy session in the console's list."""
    client = openai.AsyncOpenAI(base_url=api_server.url + "/v1", api_key="x", max_retries=0)
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as e:
            await client.chat.completions.create(model="aiops", stream=stream,
                                                 messages=[{"role": "user", "content": "@nope hi"}])
        assert e.value.code == "unknown_model" and "unknown model 'nope'; models: local" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        await client.chat.completions.create(model="aiops", messages=[{"role": "user", "content": "@local"}])
    assert "@local needs a prompt after it" in e.value.message
    async with ollama.AsyncClient(host=api_server.url) as ollama_client:
        with pytest.raises(ollama.ResponseError) as refused:
            await ollama_client.chat(model="aiops", messages=[{"role": "user", "content": "@nope hi"}])
    assert refused.value.status_code == 400 and "unknown model 'nope'" in refused.value.error
    assert await sessions(api_server) == {}
    # A model that exists runs the turn on it, as before.
    reply = await client.chat.completions.create(model="aiops", messages=[{"role": "user", "content": "@local hi"}])
    assert reply.choices[0].message.content == "echo: hi"
    assert len(await sessions(api_server)) == 1
    await client.close()


async def test_a_question_withdrawn_while_queued_reaches_the_model_as_unanswered(api_server: ApiServer) -> None:
    """A client hanging up while its message waits behind another turn cancels that turn; the
    message stays in the history. The next turn's model saw it as a question still open (and
    answered it); it now comes with a note in the reply's place."""
    from aiops.engine.context import INCOMPLETE_REPLY, NO_REPLY_GIVEN

    api_server.fake.script(Reply.hang(after_chunks=2, reply=Reply.text("the first answer, in parts", chunks=4)))
    client = openai.AsyncOpenAI(base_url=api_server.url + "/v1", api_key="x", max_retries=0)
    headers = {"X-Aiops-Session": "withdrawn"}
    first = asyncio.create_task(ask(client, [("user", "q1")], extra_headers=headers))
    await api_server.fake.wait_for_requests_async(1)
    async with api_server.client() as agent:
        async with agent.stream("withdrawn") as events:
            queued = asyncio.create_task(client.chat.completions.create(
                model="aiops", messages=[{"role": "user", "content": "never mind this one"}],
                extra_headers=headers))
            async with asyncio.timeout(10):
                async for e in events:  # recorded, and queued behind q1's turn
                    if e["event"] == "notice" and e["data"]["text"].startswith("queued behind the running turn"):
                        break
                queued.cancel()  # the client hangs up
                with contextlib.suppress(asyncio.CancelledError):
                    await queued
                async for e in events:  # the server saw it go: the queued turn ends, never started
                    if e["event"] == "done" and e["data"]["status"] == "cancelled":
                        break
        assert (await agent.stop("withdrawn"))["stopped"] is True  # then q1's turn is stopped
    _, answer = await first
    partial, stopped = answer.split("\n\n")  # what the model said, then the stop's status line
    assert stopped == "*⛔ the answer was stopped*"
    await ask(client, [("user", "q3")], extra_headers=headers)
    sent = [(m["role"], m["content"]) for m in api_server.fake.last_request.json["messages"] if m["role"] != "system"]
    assert sent == [("user", "q1"), ("assistant", f"{partial}\n\n{INCOMPLETE_REPLY['cancelled']}"),
                    ("user", "never mind this one"), ("assistant", NO_REPLY_GIVEN), ("user", "q3")]
    await client.close()


async def test_a_stopped_answer_the_client_never_got_does_not_fork_its_conversation(api_server: ApiServer) -> None:
    """A non-streaming request whose client gave up (or that a shutdown answered 503) leaves its
    partial answer recorded as stopped; the client never saw it, and sends its next message
    without it. That is still the same conversation, not an edit to fork from."""
    client = openai.AsyncOpenAI(base_url=api_server.url + "/v1", api_key="x", max_retries=0)
    sid, a1 = await ask(client, [("user", "q1")])
    api_server.fake.script(Reply.hang(after_chunks=2, reply=Reply.text("a partial answer, never delivered", chunks=4)))
    with api_server.engine.bus.subscribe(sid, names=("tok", "done")) as events:
        waiting = asyncio.create_task(ask(client, [("user", "q1"), ("assistant", a1), ("user", "q2")]))
        assert (await events.get()).name == "tok"  # the model has begun: the client gives up
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        async with asyncio.timeout(10):
            while (e := await events.get()) is not None and e.name != "done":
                pass
    stopped = [m for m in await history(api_server, sid) if m["role"] == "assistant" and m["status"] == "cancelled"]
    assert len(stopped) == 1 and stopped[0]["content"]  # recorded, with the text the client never got
    again, _ = await ask(client, [("user", "q1"), ("assistant", a1), ("user", "q2"), ("user", "q3")])
    assert again == sid and list(await sessions(api_server)) == [sid]
    await client.close()


async def stop_streaming(srv: ApiServer, client: openai.AsyncOpenAI, question: str, *,
                         after: int, ahead: str | None = None) -> tuple[str, str]:
    """Ask a new chat's first question, streamed, and press stop once `after` characters have
    come: (session id, what the chat kept), once the turn has ended.

    `ahead`: the scripted reply is held at the fake (`hold_after`) until the chat has read what
    it keeps; then the model goes on, and stop is pressed once aiops has this text of the answer,
    which the chat never read (a fast model writing ahead of its reader, as a fact, not a timing)."""
    raw = await client.chat.completions.with_raw_response.create(
        model="aiops", stream=True, messages=[{"role": "user", "content": question}])
    sid = raw.headers["x-aiops-session"]
    with srv.engine.bus.subscribe(sid, names=("done",)) as ended, \
            srv.engine.bus.subscribe(sid, names=("tok",)) as tokens:
        stream, kept = raw.parse(), ""
        async for chunk in stream:
            kept += (chunk.choices[0].delta.content or "") if chunk.choices else ""
            if len(kept) > after:
                break
        if ahead is not None:
            srv.fake.release()
            got = ""
            async with asyncio.timeout(10):
                while ahead not in got:
                    tok = await tokens.get()
                    assert isinstance(tok, ev.Tok), tok
                    got += tok.text
        await stream.close()
        async with asyncio.timeout(10):
            await ended.get()
    return sid, kept


async def test_a_chat_that_stopped_a_fast_answer_goes_on_with_what_it_kept(api_server: ApiServer) -> None:
    """Stop pressed while a fast model streams: the chat UI keeps what it had read, while aiops
    has recorded more (a fast model writes ahead of a reader). The next message, sent with the
    part the chat kept, continues the session (the model is told the answer was cut)."""
    answer = " ".join(f"word{i}" for i in range(3000))
    # Nine chunks of 300 (after the role's), held until the chat has read what it keeps; then
    # most of the rest at once, and the model still going when the client hangs up: aiops has
    # recorded far more than the client read. Whatever the load: a burst the proxy coalesces
    # into one frame can no longer hand the chat the whole answer before its stop.
    api_server.fake.script(Reply.hang(after_chunks=250, reply=Reply.text(answer, chunks=300))
                           .with_(hold_after=10))
    client = openai.AsyncOpenAI(base_url=api_server.url + "/v1", api_key="x",
                                default_headers={"X-OpenWebUI-Chat-Id": "fast-stop"})
    sid, kept = await stop_streaming(api_server, client, "write a long report", after=200,
                                     ahead="word2000 ")
    assert "".join(split_text(answer, 300)[:9]).startswith(kept)  # the chat read the first burst only
    recorded = next(m["content"] for m in await history(api_server, sid) if m["role"] == "assistant")
    assert recorded.startswith(kept.strip()) and len(recorded) > len(kept.strip())
    again, _ = await ask(client, [("user", "write a long report"), ("assistant", kept), ("user", "go on")])
    assert again == sid and list(await sessions(api_server)) == [sid]
    # The model reads the answer as recorded, not as the chat kept it, and that it was cut.
    [seen] = [m["content"] for m in api_server.fake.last_request.json["messages"] if m["role"] == "assistant"]
    assert seen.startswith(recorded) and "cut off" in seen[len(recorded):]
    await client.close()


async def test_a_regenerated_answer_stopped_early_goes_on_in_its_own_branch(api_server: ApiServer) -> None:
    """Two stopped answers that begin alike: the chat kept the start of the second (regenerated)
    one, and goes on in that branch, not in the first that the user never saw continued."""
    first = "Let me check the disk usage on web-1. " + " ".join(f"a{i}" for i in range(2000))
    second = "Let me check the logs on web-1 first. " + " ".join(f"b{i}" for i in range(2000))
    api_server.fake.script(Reply.hang(after_chunks=150, reply=Reply.text(first, chunks=200)),
                           Reply.hang(after_chunks=150, reply=Reply.text(second, chunks=200)))
    client = openai.AsyncOpenAI(base_url=api_server.url + "/v1", api_key="x",
                                default_headers={"X-OpenWebUI-Chat-Id": "regen"})

    root, _ = await stop_streaming(api_server, client, "why is web-1 slow?", after=10)
    branch, _ = await stop_streaming(api_server, client, "why is web-1 slow?", after=10)  # regenerated
    assert branch != root
    sid, _ = await ask(client, [("user", "why is web-1 slow?"), ("assistant", "Let me check the"),
                                ("user", "go on")])
    assert sid == branch
    await client.close()


async def test_a_failed_answer_the_client_never_got_does_not_fork_its_conversation(api_server: ApiServer) -> None:
    """A non-streaming request whose model failed is a 502 with no text, but a partial answer the
    model gave before failing is recorded (as failed). The client cannot know whether there was
    one, and sends its next message without it: the conversation continues either way."""
    cases = [(f"fail-{when}-{n}", failure, question)
             for when, failure in (("before-text", Reply.error(500, "upstream exploded")),
                                   ("after-text", Reply.drop(after_chunks=2)))
             # (the output of a command in the message came with the answer: not seen either)
             for n, question in enumerate(("u1", "!help\nu1"))]
    for chat, failure, question in cases:
        async with httpx.AsyncClient(base_url=api_server.url, headers={"X-OpenWebUI-Chat-Id": chat}) as h:
            api_server.fake.script(failure)
            r = await h.post("/v1/chat/completions", json={
                "model": "aiops", "messages": [{"role": "user", "content": question}]})
            assert r.status_code == 502 and "Commands:" not in r.text
            sid = r.headers["x-aiops-session"]
            # Open WebUI keeps an empty answer in the failed one's place.
            r = await h.post("/v1/chat/completions", json={"model": "aiops", "messages": [
                {"role": "user", "content": question}, {"role": "assistant", "content": ""},
                {"role": "user", "content": "u2"}]})
            assert r.status_code == 200 and r.headers["x-aiops-session"] == sid, chat
    assert len(await sessions(api_server)) == len(cases)


async def test_reset_in_a_chat_ui_leaves_the_model_only_what_follows_it(api_server: ApiServer) -> None:
    """`!reset` in a chat UI: the client keeps sending the whole chat, but what came before the
    reset is archived. The model never sees it again, and the chat goes on in its session."""
    fake = api_server.fake
    client = openai.AsyncOpenAI(base_url=api_server.url + "/v1", api_key="x",
                                default_headers={"X-OpenWebUI-Chat-Id": "chat-reset"})
    chat = [("user", "my secret is SWORDFISH")]
    sid, answer = await ask(client, chat)
    chat += [("assistant", answer), ("user", "!reset")]
    again, answer = await ask(client, chat)
    assert again == sid and answer.startswith("session reset")
    chat += [("assistant", answer), ("user", "what is my secret?")]
    again, answer = await ask(client, chat)
    seen = [m["content"] for m in fake.last_request.json["messages"] if m["role"] != "system"]
    assert again == sid and seen == ["what is my secret?"]
    # A reset with a question in the same message (spelt as the engine still reads it): the
    # question is the new start.
    chat += [("assistant", answer), ("user", "! RESET\nfresh question")]
    again, answer = await ask(client, chat)
    assert again == sid and answer.startswith("session reset") and answer.endswith("echo: fresh question")
    assert [m["content"] for m in fake.last_request.json["messages"] if m["role"] != "system"] == ["fresh question"]
    chat += [("assistant", answer), ("user", "and then?")]
    again, _ = await ask(client, chat)
    seen = [m["content"] for m in fake.last_request.json["messages"] if m["role"] != "system"]
    # (command output is the client's to read, never the model's)
    assert again == sid and seen == ["fresh question", "echo: fresh question", "and then?"]
    assert list(await sessions(api_server)) == [sid]
    await client.close()


# ---- limits on what a chat request may bring ------------------------------------------------------------


def _chat(dialect: str, history: list[tuple[str, str]], user: str) -> tuple[str, dict[str, Any]]:
    """The path and the non-streamed body of a chat request in `dialect` (`user` names the chat)."""
    messages = [{"role": role, "content": text} for role, text in history]
    if dialect == "openai":
        return "/v1/chat/completions", {"model": "aiops", "user": user, "messages": messages}
    return "/api/chat", {"model": "aiops", "stream": False, "messages": messages}


def _error(dialect: str, body: dict[str, Any]) -> str:
    """The error message in the dialect's own error shape."""
    if dialect == "openai":
        assert body["error"]["param"] == "messages"
        return body["error"]["message"]
    assert set(body) == {"error"}
    return body["error"]


@pytest.mark.parametrize("dialect", ["openai", "ollama"])
async def test_a_chat_request_may_bring_only_so_many_messages_and_history(
        api_server_factory: ApiServerFactory, dialect: str) -> None:
    """A request over `proxy_max_messages` is a 413 and a history a session would take in beyond
    `proxy_max_imported` (in all, over requests) a 400, each naming the limit and its setting, in
    the dialect's error shape; nothing of a refused request is stored."""
    srv = await api_server_factory(server={"proxy_max_messages": 10, "proxy_max_imported": 4})
    old = [("user", "q1"), ("assistant", "a1"), ("user", "q2"), ("assistant", "a2")]
    async with httpx.AsyncClient(base_url=srv.url, timeout=20) as http:
        path, body = _chat(dialect, [*old, *old, *old[:2], ("user", "one too many")], "limits")
        r = await http.post(path, json=body)
        assert r.status_code == 413
        message = _error(dialect, r.json())
        assert "11 in this request, the limit is 10" in message and "proxy_max_messages" in message
        path, body = _chat(dialect, [*old, ("user", "q3"), ("assistant", "a3"), ("user", "q4")], "limits")
        r = await http.post(path, json=body)
        assert r.status_code == 400
        message = _error(dialect, r.json())
        assert "6 earlier messages" in message and "the limit is 4" in message and "proxy_max_imported" in message
        assert await sessions(srv) == {}  # refused before anything was made

        path, body = _chat(dialect, [*old, ("user", "q3")], "limits")  # 4 earlier messages: taken in
        r = await http.post(path, json=body)
        assert r.status_code == 200
        sid = r.headers["X-Aiops-Session"]
        answer = next(m["content"] for m in reversed(await history(srv, sid)) if m["role"] == "assistant")
        # The same chat, with one earlier exchange the session never had: 2 more would make 6.
        path, body = _chat(dialect, [*old, ("user", "q3"), ("assistant", answer), ("user", "elsewhere"),
                                     ("assistant", "answered elsewhere"), ("user", "q4")], "limits")
        r = await http.post(path, json=body)
        assert r.status_code == 400
        assert f"2 earlier messages for session {sid!r} (it holds 4 already)" in _error(dialect, r.json())
    assert [m["content"] for m in await history(srv, sid) if m["role"] == "user"] == ["q1", "q2", "q3"]


async def test_a_chat_that_opens_with_a_command_is_listed_by_it_and_goes_on_in_that_session(
        api_server: ApiServer) -> None:
    """Issue 21: `!help` as a chat UI's first message made a session listed as "(new)" although it
    held the command and its answer. The chat is a session from its first message (the chat UI
    keeps it, and its next message continues it); until it has text, it is named by its command."""
    client = openai.AsyncOpenAI(base_url=api_server.url + "/v1", api_key="x",
                                default_headers={"X-OpenWebUI-Chat-Id": "chat-cmd"})
    sid, listing = await ask(client, [("user", "!help")])
    assert "Commands:" in listing
    assert (await sessions(api_server))[sid]["title"] == "!help"
    api_server.fake.script(Reply.text("three tables"))
    again, answer = await ask(client, [("user", "!help"), ("assistant", listing),
                                       ("user", "which tables are there?")])
    assert (again, answer) == (sid, "three tables")
    listed = await sessions(api_server)
    assert list(listed) == [sid] and listed[sid]["title"] == "which tables are there?"
    # The model was asked the question, not the command (that stays between the chat and aiops).
    sent = api_server.fake.last_request.json["messages"]
    assert [m["content"] for m in sent if m["role"] == "user"] == ["which tables are there?"]
    await client.close()


async def test_a_chat_ui_gets_a_failed_commands_output_as_its_answer_not_an_error(api_server: ApiServer) -> None:
    """The API answers a message whose command failed with `status: "error"` (`command_failed`); a
    chat UI still gets the commands' output as the answer, streamed or not, as it always did."""
    client = openai.AsyncOpenAI(base_url=api_server.url + "/v1", api_key="x",
                                default_headers={"X-OpenWebUI-Chat-Id": "chat-bad-cmd"})
    _, answer = await ask(client, [("user", "!help\n!model nope")])
    assert "Commands:" in answer and "unknown model 'nope'" in answer
    stream = await client.chat.completions.create(model="aiops", stream=True, messages=[
        {"role": "user", "content": "!help\n!model nope"}, {"role": "assistant", "content": answer},
        {"role": "user", "content": "!model nope"}])
    streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert "unknown model 'nope'" in streamed
    await client.close()

