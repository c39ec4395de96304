"""Client tools through the proxy: a chat client's own `tools` offered to the model beside the
agent's, a call of one handed back in the dialect's shape, the client's result continuing the same
turn. Real `openai` and `ollama` clients against an in-process server, the fake OpenAI model behind
it; and the request bodies a real Open WebUI 0.12.4 sent (tests/fixtures/open-webui) replayed."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest

from tests.fakes.openai_server import Call, FakeOpenAI, Reply, message_text, tool_results
from tests.support.server import ApiServer, ApiServerFactory

FIXTURES = Path(__file__).parent.parent / "fixtures" / "open-webui"

GET_TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The current time in a time zone.",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}


async def history(srv: ApiServer, sid: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient() as h:
        r = await h.get(f"{srv.url}/api/v1/sessions/{sid}", params={"limit": 1000})
    r.raise_for_status()
    return r.json()["messages"]


def exchange(msgs: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """A session's history as the conversation it holds: (role, text, calls or call id)."""
    out: list[tuple[Any, ...]] = []
    for m in msgs:
        if m["role"] == "user":
            out.append(("user", m["content"]))
        elif m["role"] == "assistant":
            out.append(("assistant", m["content"], tuple(c["name"] for c in m["tool_calls"])))
        elif m["role"] == "tool":
            out.append(("tool", m["name"], m["content"]))
    return out


def offered(body: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in body.get("tools") or ()]


def openai_client(srv: ApiServer, chat: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0,
                              default_headers={"X-OpenWebUI-Chat-Id": chat})


def run_get_time(arguments: dict[str, Any]) -> str:
    """The client's tool: runs on the client's side only."""
    return json.dumps({"tz": arguments["tz"], "time": "10:42"})


# ---- the OpenAI SDK -------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_client_tool_round_trip(api_server: ApiServer, fake_openai: FakeOpenAI, stream: bool) -> None:
    fake_openai.script(Reply.tool_calls(Call("get_time", {"tz": "UTC"}, "call_t1")),
                       Reply.text("It is 10:42 in UTC."))
    client = openai_client(api_server, f"chat-{stream}")
    messages: list[Any] = [{"role": "user", "content": "what time is it in UTC?"}]
    async with client:
        if stream:
            calls: dict[int, dict[str, Any]] = {}
            finish = []
            async for chunk in await client.chat.completions.create(model="aiops", messages=messages,
                                                                    tools=[GET_TIME], stream=True):
                choice = chunk.choices[0]
                for d in choice.delta.tool_calls or ():
                    call = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
                    call["id"] += d.id or ""
                    call["name"] += d.function.name or "" if d.function else ""
                    call["arguments"] += d.function.arguments or "" if d.function else ""
                if choice.finish_reason:
                    finish.append(choice.finish_reason)
            assert finish == ["tool_calls"]
            assert list(calls.values()) == [{"id": "call_t1", "name": "get_time", "arguments": '{"tz": "UTC"}'}]
            tool_calls = [{"id": c["id"], "type": "function",
                           "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls.values()]
        else:
            r = await client.chat.completions.create(model="aiops", messages=messages, tools=[GET_TIME])
            assert r.choices[0].finish_reason == "tool_calls"
            msg = r.choices[0].message
            assert msg.content is None
            assert msg.tool_calls is not None and [(c.id, c.function.name, json.loads(c.function.arguments))
                                                   for c in msg.tool_calls] == [("call_t1", "get_time", {"tz": "UTC"})]
            tool_calls = [c.model_dump() for c in msg.tool_calls]
        # The model was offered the client's tool beside the agent's own.
        assert "get_time" in offered(fake_openai.requests[0].json)
        assert "read_system_prompt" in offered(fake_openai.requests[0].json)
        # The client runs it and sends the result back with the whole chat.
        result = run_get_time({"tz": "UTC"})
        messages += [{"role": "assistant", "content": None, "tool_calls": tool_calls},
                     {"role": "tool", "tool_call_id": "call_t1", "content": result}]
        raw = await client.chat.completions.with_raw_response.create(model="aiops", messages=messages,
                                                                     tools=[GET_TIME], stream=stream)
        if stream:
            text = "".join([c.choices[0].delta.content or "" async for c in raw.parse() if c.choices])
        else:
            answer = raw.parse()
            assert answer.choices[0].finish_reason == "stop"
            text = answer.choices[0].message.content
        assert text == "It is 10:42 in UTC."
        sid = raw.headers["x-aiops-session"]
    # The model got the result as the call's result and answered from it.
    sent = fake_openai.requests[1].json
    assert tool_results(sent) == [result]
    assert sent["messages"][-2]["tool_calls"][0]["id"] == "call_t1"
    # One turn, held once: the question, the call, the client's result, the answer.
    hist = await history(api_server, sid)
    assert exchange(hist) == [("user", "what time is it in UTC?"), ("assistant", "", ("get_time",)),
                              ("tool", "get_time", result), ("assistant", "It is 10:42 in UTC.", ())]
    assert len({m["turn_id"] for m in hist}) == 1
    # The next message, with the whole exchange replayed, continues the same session: nothing imported.
    async with openai_client(api_server, f"chat-{stream}") as client:
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "thanks"}]
        raw = await client.chat.completions.with_raw_response.create(model="aiops", messages=messages,
                                                                     tools=[GET_TIME])
    assert raw.headers["x-aiops-session"] == sid
    hist = await history(api_server, sid)
    assert not any(m["meta"].get("imported") for m in hist)
    assert exchange(hist)[-2:] == [("user", "thanks"), ("assistant", "echo: thanks", ())]


async def test_a_result_naming_a_call_nobody_made_is_refused(api_server: ApiServer,
                                                              fake_openai: FakeOpenAI) -> None:
    """A tool result whose tool_call_id is neither a waiting call's nor one of the assistant
    message's answers nothing: a 400, nothing recorded, and the right result still goes through."""
    fake_openai.script(Reply.tool_calls(Call("get_time", {"tz": "UTC"}, "call_t1")), Reply.text("10:42 it is."))
    async with openai_client(api_server, "chat-stray") as client:
        messages: list[Any] = [{"role": "user", "content": "what time is it in UTC?"}]
        first = await client.chat.completions.create(model="aiops", messages=messages, tools=[GET_TIME])
        assert first.choices[0].message.tool_calls is not None
        messages.append(first.choices[0].message.model_dump(exclude_none=True))
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(
                model="aiops", tools=[GET_TIME],
                messages=[*messages, {"role": "tool", "tool_call_id": "call_nobody_made", "content": "rainy"}])
        assert refused.value.status_code == 400
        assert len(fake_openai.requests) == 1  # the model was not asked again
        raw = await client.chat.completions.with_raw_response.create(
            model="aiops", tools=[GET_TIME],
            messages=[*messages, {"role": "tool", "tool_call_id": "call_t1", "content": run_get_time({"tz": "UTC"})}])
        assert raw.parse().choices[0].message.content == "10:42 it is."
    hist = await history(api_server, raw.headers["x-aiops-session"])
    assert [m["content"] for m in hist if m["role"] == "tool"] == [run_get_time({"tz": "UTC"})]


async def test_agent_tool_and_client_tool_in_one_model_response(api_server: ApiServer,
                                                                fake_openai: FakeOpenAI) -> None:
    """The agent's own call runs first (gated as always: reading the prompt is allowed); only the
    client's call goes back to the client, and both results reach the model."""
    fake_openai.script(Reply.tool_calls(Call("read_system_prompt", {}, "call_a"), Call("get_time", {"tz": "CET"}, "call_c")),
                       Reply.text("Prompt read; it is 10:42 CET."))
    async with openai_client(api_server, "both") as client:
        messages: list[Any] = [{"role": "user", "content": "read your prompt and tell me the time"}]
        r = await client.chat.completions.create(model="aiops", messages=messages, tools=[GET_TIME])
        assert r.choices[0].finish_reason == "tool_calls"
        msg = r.choices[0].message
        assert msg.tool_calls is not None and [c.function.name for c in msg.tool_calls] == ["get_time"]
        result = run_get_time({"tz": "CET"})
        messages += [{"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in msg.tool_calls]},
                     {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": result}]
        raw = await client.chat.completions.with_raw_response.create(model="aiops", messages=messages,
                                                                     tools=[GET_TIME])
        assert raw.parse().choices[0].message.content == "Prompt read; it is 10:42 CET."
    sent = fake_openai.requests[1].json["messages"]
    results = {m["tool_call_id"]: message_text(m) for m in sent if m["role"] == "tool"}
    assert set(results) == {"call_a", "call_c"} and results["call_c"] == result
    assert "Database" in results["call_a"] or results["call_a"]  # the agent's tool ran server-side
    hist = await history(api_server, raw.headers["x-aiops-session"])
    assert exchange(hist)[:2] == [("user", "read your prompt and tell me the time"),
                                  ("assistant", "", ("read_system_prompt", "get_time"))]
    tools = [m for m in hist if m["role"] == "tool"]
    assert [(m["name"], bool(m["meta"].get("client"))) for m in tools] == [("read_system_prompt", False),
                                                                           ("get_time", True)]
    assert exchange(hist)[-1] == ("assistant", "Prompt read; it is 10:42 CET.", ())


async def test_parallel_client_calls_then_another_round_in_the_same_turn(api_server: ApiServer,
                                                                         fake_openai: FakeOpenAI) -> None:
    fake_openai.script(Reply.tool_calls(Call("get_time", {"tz": "UTC"}, "call_p1"), Call("get_time", {"tz": "CET"}, "call_p2")),
                       Reply.tool_calls(Call("get_time", {"tz": "PST"}, "call_p3"), text="One more."),
                       Reply.text("UTC, CET and PST all say 10:42."))
    messages: list[Any] = [{"role": "user", "content": "time in UTC, CET and PST?"}]
    async with openai_client(api_server, "rounds") as client:
        for expected in (["call_p1", "call_p2"], ["call_p3"]):
            r = await client.chat.completions.create(model="aiops", messages=messages, tools=[GET_TIME])
            msg = r.choices[0].message
            assert r.choices[0].finish_reason == "tool_calls" and msg.tool_calls is not None
            assert [c.id for c in msg.tool_calls] == expected
            messages.append({"role": "assistant", "content": msg.content,
                             "tool_calls": [c.model_dump() for c in msg.tool_calls]})
            # Answered in the other order: paired by id.
            messages += [{"role": "tool", "tool_call_id": c.id, "content": run_get_time(json.loads(c.function.arguments))}
                         for c in reversed(msg.tool_calls)]
        raw = await client.chat.completions.with_raw_response.create(model="aiops", messages=messages,
                                                                     tools=[GET_TIME])
        assert raw.parse().choices[0].message.content == "UTC, CET and PST all say 10:42."
        # The same results again (a client retrying): nothing waits for them any more.
        with pytest.raises(openai.BadRequestError) as e:
            await client.chat.completions.create(model="aiops", messages=messages, tools=[GET_TIME])
        assert e.value.param == "messages"
    hist = await history(api_server, raw.headers["x-aiops-session"])
    assert [(m["role"], m.get("tool_call_id")) for m in hist] == [
        ("user", None), ("assistant", None), ("tool", "call_p2"), ("tool", "call_p1"), ("assistant", None),
        ("tool", "call_p3"), ("assistant", None)]
    assert json.loads(hist[2]["content"])["tz"] == "CET" and len({m["turn_id"] for m in hist}) == 1
    assert len(fake_openai.requests) == 3


async def test_a_gated_agent_call_holds_the_client_call_until_the_operator_answers(
        api_server: ApiServer, fake_openai: FakeOpenAI) -> None:
    """Streamed: the agent's call waits at its gate (the chat sees the status line), the client's
    call of the same reply goes out only once the operator has answered."""
    remember = Call("update_system_prompt", {"section": "memory", "operation": "append", "content": "tea"}, "call_g")
    fake_openai.script(Reply.tool_calls(remember, Call("get_time", {"tz": "UTC"}, "call_c")),
                       Reply.text("Not remembered; it is 10:42."))
    engine = api_server.engine
    content: list[str] = []
    calls: list[Any] = []
    finish: list[str] = []
    waiting = asyncio.Event()

    async def chat() -> None:
        async with openai_client(api_server, "gated") as client:
            async for chunk in await client.chat.completions.create(
                    model="aiops", stream=True, tools=[GET_TIME],
                    messages=[{"role": "user", "content": "remember tea, and the time?"}]):
                choice = chunk.choices[0]
                content.append(choice.delta.content or "")
                if "waiting for operator approval" in "".join(content):
                    waiting.set()
                calls.extend(choice.delta.tool_calls or ())
                if choice.finish_reason:
                    finish.append(choice.finish_reason)

    task = asyncio.create_task(chat())
    await asyncio.wait_for(waiting.wait(), 15)  # the chat's status line: the gate is open
    assert not calls and not finish  # the client's call waits behind the gate
    (gate,) = engine.pending_gates()
    engine.resolve_gate(gate.id, "denied", by="test")
    await asyncio.wait_for(task, 15)
    assert "*⛔ denied by the operator*" in "".join(content)
    assert [c.function.name for c in calls] == ["get_time"] and finish == ["tool_calls"]
    sid = next(s["client_id"] for s in await _proxy_sessions(api_server))
    tools = [m for m in await history(api_server, sid) if m["role"] == "tool"]
    assert [(m["name"], m["meta"].get("gate")) for m in tools] == [("update_system_prompt", "denied")]


async def test_a_client_tool_named_like_an_agent_tool_is_renamed_for_the_model(api_server: ApiServer,
                                                                                fake_openai: FakeOpenAI) -> None:
    mine = {"type": "function", "function": {"name": "read_system_prompt", "parameters": {"type": "object"}}}
    fake_openai.script(Reply.tool_calls(Call("client_read_system_prompt", {}, "call_r")))
    async with openai_client(api_server, "clash") as client:
        r = await client.chat.completions.create(model="aiops", messages=[{"role": "user", "content": "go"}],
                                                 tools=[mine])
    names = offered(fake_openai.requests[0].json)
    assert names.count("read_system_prompt") == 1 and "client_read_system_prompt" in names
    calls = r.choices[0].message.tool_calls
    assert calls is not None and [c.function.name for c in calls] == ["read_system_prompt"]


async def test_a_new_message_instead_of_the_result_records_the_call_unanswered(api_server: ApiServer,
                                                                                fake_openai: FakeOpenAI) -> None:
    fake_openai.script(Reply.tool_calls(Call("get_time", {"tz": "UTC"}, "call_u")), Reply.text("Never mind then."))
    async with openai_client(api_server, "unanswered") as client:
        r = await client.chat.completions.create(model="aiops", messages=[{"role": "user", "content": "time?"}],
                                                 tools=[GET_TIME])
        assert r.choices[0].finish_reason == "tool_calls"
        raw = await client.chat.completions.with_raw_response.create(model="aiops", tools=[GET_TIME], messages=[
            {"role": "user", "content": "time?"}, {"role": "user", "content": "actually, forget it"}])
        assert raw.parse().choices[0].message.content == "Never mind then."
    hist = await history(api_server, raw.headers["x-aiops-session"])
    unanswered = [m for m in hist if m["role"] == "tool"]
    assert len(unanswered) == 1 and unanswered[0]["meta"].get("unanswered")
    assert unanswered[0]["content"].startswith("unanswered")
    sent = fake_openai.requests[1].json["messages"]
    assert [m["role"] for m in sent[1:]] == ["user", "assistant", "tool", "user"]
    assert message_text(sent[-1]) == "actually, forget it"


async def test_tool_choice_and_parallel_tool_calls(api_server: ApiServer, fake_openai: FakeOpenAI) -> None:
    async with openai_client(api_server, "choice") as client:
        # "none": the model is offered none of the client's tools.
        await client.chat.completions.create(model="aiops", messages=[{"role": "user", "content": "hi"}],
                                             tools=[GET_TIME], tool_choice="none")
        assert "get_time" not in offered(fake_openai.requests[-1].json)
        before = len(fake_openai.requests)
        for kw, param in (({"tool_choice": "required"}, "tool_choice"),
                          ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice"),
                          ({"parallel_tool_calls": False}, "parallel_tool_calls")):
            with pytest.raises(openai.BadRequestError) as e:
                await client.chat.completions.create(model="aiops", messages=[{"role": "user", "content": "x"}],
                                                     tools=[GET_TIME], **kw)
            assert e.value.param == param, kw
        with pytest.raises(openai.BadRequestError) as e:
            await client.chat.completions.create(model="aiops", messages=[{"role": "user", "content": "x"}],
                                                 tools=[{"type": "function", "function": {"name": "bad name"}}])
        assert e.value.param == "tools.0.function.name"
        assert len(fake_openai.requests) == before


async def test_client_tools_ignore_and_refuse(api_server_factory: ApiServerFactory, fake_openai: FakeOpenAI,
                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="aiops")
    ignoring = await api_server_factory(server={"client_tools": "ignore"})
    async with openai_client(ignoring, "ignored") as client:
        for text in ("one", "two"):
            r = await client.chat.completions.create(model="aiops", messages=[{"role": "user", "content": text}],
                                                     tools=[GET_TIME])
            assert r.choices[0].message.content == f"echo: {text}"
            assert "get_time" not in offered(fake_openai.requests[-1].json)
    logged = [r for r in caplog.records if "client tools" in r.getMessage() and "ignored" in r.getMessage()]
    assert len(logged) == 1  # once per client
    refusing = await api_server_factory(server={"client_tools": "refuse"})
    async with openai_client(refusing, "refused") as client:
        with pytest.raises(openai.BadRequestError) as e:
            await client.chat.completions.create(model="aiops", messages=[{"role": "user", "content": "x"}],
                                                 tools=[GET_TIME])
        assert e.value.code == "tools_not_supported" and e.value.param == "tools"
        # A history with a tool exchange in it is refused too.
        with pytest.raises(openai.BadRequestError) as e:
            await client.chat.completions.create(model="aiops", messages=[
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "42"},
                {"role": "user", "content": "and?"}])
        assert e.value.code == "tools_not_supported"

    def get_weather(city: str) -> str:
        """Weather for a city.

        Args:
          city: the city
        """
        return "sunny"

    with pytest.raises(ollama.ResponseError) as oe:
        await ollama.AsyncClient(host=refusing.url).chat(
            model="aiops", messages=[{"role": "user", "content": "weather?"}], tools=[get_weather])
    assert oe.value.status_code == 400 and "tools" in oe.value.error
    # The ollama client's `"tools": []` with every chat is no tool at all.
    r = await ollama.AsyncClient(host=refusing.url).chat(model="aiops", messages=[{"role": "user", "content": "hi"}])
    assert r.message.content == "echo: hi"
    assert len(fake_openai.requests) == 3  # the two answers while ignoring, and that one


# ---- the ollama client ----------------------------------------------------------------------------------


async def test_ollama_client_tool_round_trip(api_server: ApiServer, fake_openai: FakeOpenAI) -> None:
    fake_openai.script(Reply.tool_calls(Call("get_time", {"tz": "UTC"}, "call_o1")),
                       Reply.text("Ollama says 10:42."))
    client = ollama.AsyncClient(host=api_server.url, headers={"X-OpenWebUI-Chat-Id": "ollama-chat"})
    messages: list[Any] = [{"role": "user", "content": "what time is it?"}]
    r = await client.chat(model="aiops", messages=messages, tools=[GET_TIME], stream=False)
    calls = r.message.tool_calls
    assert calls is not None and [(c.function.name, dict(c.function.arguments)) for c in calls] == [
        ("get_time", {"tz": "UTC"})]
    result = run_get_time(dict(calls[0].function.arguments))
    # As the ollama client sends a call back: no id; the result names the tool.
    messages += [r.message, {"role": "tool", "content": result, "tool_name": "get_time"}]
    chunks = [c async for c in await client.chat(model="aiops", messages=messages, tools=[GET_TIME], stream=True)]
    assert "".join(c.message.content or "" for c in chunks) == "Ollama says 10:42."
    assert chunks[-1].done and chunks[-1].done_reason == "stop"
    assert tool_results(fake_openai.requests[1].json) == [result]
    sessions = {m["client_id"] for m in await _proxy_sessions(api_server)}
    assert len(sessions) == 1
    hist = await history(api_server, sessions.pop())
    assert exchange(hist) == [("user", "what time is it?"), ("assistant", "", ("get_time",)),
                              ("tool", "get_time", result), ("assistant", "Ollama says 10:42.", ())]


async def _proxy_sessions(srv: ApiServer) -> list[dict[str, Any]]:
    async with httpx.AsyncClient() as h:
        r = await h.get(srv.url + "/api/v1/sessions", params={"kind": "proxy"})
    return r.json()["sessions"]


async def test_ollama_streamed_tool_call_line(api_server: ApiServer, fake_openai: FakeOpenAI) -> None:
    fake_openai.script(Reply.tool_calls(Call("get_time", {"tz": "UTC"}, "call_o2"), text="Checking."))
    client = ollama.AsyncClient(host=api_server.url, headers={"X-OpenWebUI-Chat-Id": "ollama-stream"})
    chunks = [c async for c in await client.chat(model="aiops", messages=[{"role": "user", "content": "time?"}],
                                                 tools=[GET_TIME], stream=True)]
    calls = [c for chunk in chunks for c in chunk.message.tool_calls or ()]
    assert [c.function.name for c in calls] == ["get_time"]
    assert "".join(c.message.content or "" for c in chunks) == "Checking."
    assert chunks[-1].done


# ---- Open WebUI 0.12.4, as recorded --------------------------------------------------------------------


def _open_webui_backend(ids: list[str]) -> Any:
    """The recording's backend: a tool call of get_current_timestamp when that tool is offered and
    the question mentions time, "The time tool said: …" after a tool result, else an echo."""
    calls = iter(ids)

    def respond(body: dict[str, Any]) -> Reply | None:
        msgs = body.get("messages") or []
        if results := tool_results(body):
            return Reply.text("The time tool said: " + results[-1])
        last = message_text(msgs[-1]) if msgs else ""
        if msgs and msgs[-1].get("role") == "user" and "time" in last and "get_current_timestamp" in offered(body):
            return Reply.tool_calls(Call("get_current_timestamp", {}, next(calls)))
        if last.lstrip().startswith("### Task:"):
            return Reply.text('{"title": "Chat", "tags": [], "follow_ups": []}')
        return Reply.text("ECHO: " + last)

    return respond


def _recorded(dialect: str) -> list[dict[str, Any]]:
    files = sorted(FIXTURES.glob(f"{dialect}-[0-9]*.json"))
    assert len(files) == 14
    return [json.loads(f.read_text()) for f in files]


def _answer(dialect: str, r: httpx.Response) -> tuple[str, list[dict[str, Any]]]:
    """The text and the tool calls of a streamed answer."""
    text, calls = "", []
    if dialect == "ollama":
        for line in r.text.splitlines():
            obj = json.loads(line)
            assert "error" not in obj, obj
            text += obj["message"].get("content") or ""
            calls += obj["message"].get("tool_calls") or []
        return text, calls
    for frame in r.text.split("\n\n"):
        if not frame.startswith("data: ") or frame == "data: [DONE]":
            continue
        obj = json.loads(frame[6:])
        assert "error" not in obj, obj
        for choice in obj["choices"]:
            text += choice["delta"].get("content") or ""
            calls += choice["delta"].get("tool_calls") or []
    return text, calls


@pytest.mark.parametrize("dialect", ["openai", "ollama"])
async def test_open_webui_recorded_chat_replays_with_its_native_tools(api_server: ApiServer,
                                                                       fake_openai: FakeOpenAI, dialect: str) -> None:
    """Every request Open WebUI's chat page sent (title, tags and follow-up tasks; three messages
    with its 36 built-in tools; a tool round trip; its regeneration) is answered, not refused."""
    recorded = _recorded(dialect)
    # The recorded backend's call ids (OpenAI clients send them back; Ollama's calls had none).
    ids = [m["tool_calls"][0]["id"] for r in recorded if r["path"].endswith("/chat/completions")
           for m in r["body"]["messages"][-2:-1] if m.get("tool_calls")] or ["call_1", "call_2"]
    fake_openai.responder = _open_webui_backend(ids)
    async with httpx.AsyncClient(timeout=30) as h:
        for rec in recorded:
            name = rec.get("path"), rec["body"]["messages"][-1]["content"][:30]
            # Open WebUI's connection named its model "fake"; here it is aiops's.
            body = {**rec["body"], "model": "aiops:latest" if dialect == "ollama" else "aiops"}
            r = await h.post(api_server.url + rec["path"], json=body)
            assert r.status_code == 200, (name, r.text)
            if not rec["body"].get("stream"):
                continue
            text, calls = _answer(dialect, r)
            last = rec["body"]["messages"][-1]
            if last["role"] == "tool":
                assert text == "The time tool said: " + last["content"], name
            elif "time" in last["content"]:
                assert [c["function"]["name"] for c in calls] == ["get_current_timestamp"], name
            else:
                assert text == "ECHO: " + last["content"] and not calls, name
    sessions = await _proxy_sessions(api_server)
    # The chat and the fork its regeneration made; background tasks made none.
    assert len(sessions) == 2
    fork = max(sessions, key=lambda s: s["client_id"])
    hist = await history(api_server, fork["client_id"])
    assert [m["role"] for m in hist if m["role"] in ("user", "assistant", "tool")][-6:] == [
        "user", "assistant", "tool", "assistant", "user", "assistant"]
    assert hist[-1]["content"] == "ECHO: thanks, and now?"


@pytest.mark.parametrize("dialect", ["openai", "ollama"])
async def test_open_webui_with_forwarded_user_headers_gets_its_chat_session(api_server: ApiServer,
                                                                           fake_openai: FakeOpenAI,
                                                                           dialect: str) -> None:
    """ENABLE_FORWARD_USER_INFO_HEADERS: the title task and the first message, its tools and
    headers as sent; the message is answered in the chat's own session."""
    fake_openai.responder = _open_webui_backend([])
    async with httpx.AsyncClient(timeout=30) as h:
        for f in sorted(FIXTURES.glob(f"fwd-headers-{dialect}-*.json")):
            rec = json.loads(f.read_text())
            headers = {k: v for k, v in rec["headers"].items()
                       if k.lower().startswith("x-openwebui-") or k.lower() == "content-type"}
            body = {**rec["body"], "model": "aiops:latest" if dialect == "ollama" else "aiops"}
            r = await h.post(api_server.url + rec["path"], json=body, headers=headers)
            assert r.status_code == 200, (f.name, r.text)
            if rec["body"].get("stream"):
                assert _answer(dialect, r) == ("ECHO: hello", [])
                assert r.headers["x-aiops-session"] == "owui-" + headers["X-OpenWebUI-Chat-Id"]


@pytest.mark.parametrize("dialect", ["openai", "ollama"])
async def test_open_webui_recorded_file_chat_is_one_session_titled_by_the_question(
        api_server: ApiServer, fake_openai: FakeOpenAI, dialect: str) -> None:
    """A chat with a file attached, as the real Open WebUI 0.12.4 sent it (its query task, the first
    message inside its RAG template with the attached files' list, then a second message): one
    session, listed by the question the user typed, not by the template's first words."""
    recorded = [json.loads(f.read_text()) for f in sorted(FIXTURES.glob(f"rag-{dialect}-*.json"))]
    assert len(recorded) == 3
    # What the recorded model answered the first message, as the next request carries it back.
    first_answer = recorded[2]["body"]["messages"][1]["content"]

    def respond(body: dict[str, Any]) -> Reply:
        last = message_text(body["messages"][-1])
        if last.lstrip().startswith("### Task:"):
            return Reply.text(first_answer if "<context>" in last else '{"queries": ["launch code"]}')
        return Reply.text("ECHO: " + last)

    fake_openai.responder = respond
    async with httpx.AsyncClient(timeout=30) as h:
        for rec in recorded:
            body = {**rec["body"], "model": "aiops:latest" if dialect == "ollama" else "aiops"}
            r = await h.post(api_server.url + rec["path"], json=body)
            assert r.status_code == 200, (rec["path"], r.text)
    assert _answer(dialect, r) == ("ECHO: and who is on call?", [])
    (session,) = await _proxy_sessions(api_server)  # the query task made none, the second message no fork
    assert session["title"] == "What is the launch code in the file?"


@pytest.mark.parametrize("dialect", ["openai", "ollama"])
async def test_continue_response_is_a_note_not_an_error_and_the_chat_goes_on(
        api_server_factory: ApiServerFactory, fake_openai: FakeOpenAI, dialect: str) -> None:
    """Open WebUI's "Continue Response" (under every answer) sends the chat ending with the answer
    (recorded from the real 0.12.4). aiops cannot continue an answer it ended: it says so in a
    status line rather than a 400 the chat shows as an error, runs no turn, and the chat then goes
    on in its session. With status lines off it is the 400 it was."""
    api_server = await api_server_factory()
    rec = json.loads((FIXTURES / f"continue-{dialect}-27-continue-response.json").read_text())
    question, answer = (m["content"] for m in rec["body"]["messages"])
    model = "aiops:latest" if dialect == "ollama" else "aiops"
    fake_openai.script(Reply.text(answer), Reply.text("the next answer"))
    async with httpx.AsyncClient(timeout=30) as h:
        first = await h.post(api_server.url + rec["path"], json={
            **rec["body"], "model": model, "messages": [{"role": "user", "content": question}]})
        assert _answer(dialect, first)[0] == answer
        asked = len(fake_openai.requests)
        r = await h.post(api_server.url + rec["path"], json={**rec["body"], "model": model})
        assert r.status_code == 200, r.text
        note, calls = _answer(dialect, r)
        assert note == '\n\n*⛔ aiops does not continue an answer it has ended: send a message to go on ("continue", say)*'
        assert not calls and len(fake_openai.requests) == asked  # no turn ran
        # The chat shows the note under the answer, and sends both back with the next message.
        r = await h.post(api_server.url + rec["path"], json={**rec["body"], "model": model, "messages": [
            *rec["body"]["messages"][:-1], {"role": "assistant", "content": answer + note},
            {"role": "user", "content": "go on then"}]})
        assert _answer(dialect, r)[0] == "the next answer"
        assert r.headers["X-Aiops-Session"] == first.headers["X-Aiops-Session"]  # the same chat, no fork
    quiet = await api_server_factory(server={"proxy_status_lines": False})
    async with httpx.AsyncClient(timeout=30) as h:
        r = await h.post(quiet.url + rec["path"], json={**rec["body"], "model": model})
    assert r.status_code == 400 and "the last message must be the user's new message" in r.text


async def test_a_chat_opening_with_a_command_is_titled_by_its_text(api_server: ApiServer,
                                                                   fake_openai: FakeOpenAI) -> None:
    """Review of 60ccfe9: the title the proxy passes for a file chat must not turn `!help` into
    the title of a chat that opens with it."""
    fake_openai.script(Reply.text("about 91%"))
    async with httpx.AsyncClient(timeout=30) as h:
        r = await h.post(api_server.url + "/v1/chat/completions", json={"model": "aiops", "messages": [
            {"role": "user", "content": "!help\nwhat is the disk usage"}]})
    assert r.status_code == 200, r.text
    (session,) = await _proxy_sessions(api_server)
    assert session["title"] == "what is the disk usage"


async def test_with_status_lines_off_a_failure_and_a_continue_are_said_as_before(
        api_server_factory: ApiServerFactory, fake_openai: FakeOpenAI) -> None:
    """`proxy_status_lines = false`: an Ollama stream's failure is its `error` line alone, and a
    history ending with the answer is the 400 it was; a history with no user message at all is a
    400 with them on too (review of 60ccfe9, 38db131)."""
    quiet = await api_server_factory(server={"proxy_status_lines": False})
    fake_openai.script(Reply.error(500, "upstream exploded"))
    async with httpx.AsyncClient(timeout=30) as h:
        r = await h.post(quiet.url + "/api/chat", json={"model": "aiops", "messages": [
            {"role": "user", "content": "this fails"}]})
        lines = [json.loads(line) for line in r.text.splitlines() if line.strip()]
        assert "upstream exploded" in lines[-1]["error"]
        assert not any("⛔" in (line.get("message") or {}).get("content", "") for line in lines), lines
        loud = await api_server_factory()
        for url, expected in ((quiet.url, 400), (loud.url, 200)):
            r = await h.post(url + "/v1/chat/completions", json={"model": "aiops", "messages": [
                {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})
            assert r.status_code == expected, (url, r.text)
        r = await h.post(loud.url + "/v1/chat/completions", json={"model": "aiops", "messages": [
            {"role": "assistant", "content": "an answer to nothing"}]})
        assert r.status_code == 400 and "the last message must be the user's new message" in r.text


# ---- a tool exchange in a history the session takes in (a new chat, a fork) ------------------------------

LOOKUP_ORDER = {"type": "function", "function": {
    "name": "lookup_order", "description": "An order's shipping status.",
    "parameters": {"type": "object", "properties": {"order": {"type": "string"}}, "required": ["order"]}}}


def seen_by_model(body: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The conversation a model request carried, system prompt left out: (role, text) for user
    messages, (role, text, ((call id, name, arguments), …)) for the assistant's, and
    (role, call id, result) for tool results."""
    out: list[tuple[Any, ...]] = []
    for m in body["messages"]:
        if m["role"] == "user":
            out.append(("user", message_text(m)))
        elif m["role"] == "assistant":
            calls = tuple((c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                          for c in m.get("tool_calls") or ())
            out.append(("assistant", message_text(m), calls))
        elif m["role"] == "tool":
            out.append(("tool", m["tool_call_id"], message_text(m)))
    return out


async def test_a_new_chat_whose_history_holds_a_tool_exchange_gives_the_model_the_exchange(
        api_server: ApiServer, fake_openai: FakeOpenAI) -> None:
    """A user switching Open WebUI to aiops mid-chat: the call and its result reach the model as
    they were, and the next message continues the session without taking anything in again."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "what time"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_x1", "type": "function", "function": {"name": "get_current_timestamp", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_x1", "content": "12:00"},
        {"role": "assistant", "content": "It is noon"},
        {"role": "user", "content": "and in an hour?"}]
    async with httpx.AsyncClient(timeout=30) as h:
        r = await h.post(api_server.url + "/v1/chat/completions", json={"model": "aiops", "messages": messages})
        assert r.status_code == 200, r.text
        sid = r.headers["x-aiops-session"]
        assert seen_by_model(fake_openai.requests[-1].json) == [
            ("user", "what time"), ("assistant", "", (("call_x1", "get_current_timestamp", {}),)),
            ("tool", "call_x1", "12:00"), ("assistant", "It is noon", ()), ("user", "and in an hour?")]
        hist = await history(api_server, sid)
        imported = [m for m in hist if m["meta"].get("imported")]
        assert exchange(imported) == [("user", "what time"), ("assistant", "", ("get_current_timestamp",)),
                                      ("tool", "get_current_timestamp", "12:00"), ("assistant", "It is noon", ())]
        assert len({m["turn_id"] for m in imported}) == 1  # one turn: question, call, result, answer
        # The chat goes on in its session; nothing is taken in twice.
        messages += [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                     {"role": "user", "content": "thanks"}]
        r = await h.post(api_server.url + "/v1/chat/completions", json={"model": "aiops", "messages": messages})
        assert r.status_code == 200, r.text
    assert r.headers["x-aiops-session"] == sid
    hist = await history(api_server, sid)
    assert len([m for m in hist if m["meta"].get("imported")]) == len(imported)
    assert [t[0] for t in seen_by_model(fake_openai.requests[-1].json)] == [
        "user", "assistant", "tool", "assistant", "user", "assistant", "user"]


async def test_a_new_ollama_chat_whose_history_holds_a_tool_exchange_gives_the_model_the_exchange(
        api_server: ApiServer, fake_openai: FakeOpenAI) -> None:
    """Ollama's shape: the call's arguments an object and no id, its result naming the tool. The
    model's protocol pairs them by an id, which aiops gives the call."""
    messages = [
        {"role": "user", "content": "what time"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_current_timestamp", "arguments": {"tz": "UTC"}}}]},
        {"role": "tool", "tool_name": "get_current_timestamp", "content": "12:00"},
        {"role": "assistant", "content": "It is noon"},
        {"role": "user", "content": "and in an hour?"}]
    async with httpx.AsyncClient(timeout=30) as h:
        r = await h.post(api_server.url + "/api/chat", json={"model": "aiops", "messages": messages, "stream": False})
    assert r.status_code == 200, r.text
    seen = seen_by_model(fake_openai.requests[-1].json)
    assert [t[0] for t in seen] == ["user", "assistant", "tool", "assistant", "user"]
    ((call_id, name, arguments),) = seen[1][2]
    assert (name, arguments) == ("get_current_timestamp", {"tz": "UTC"}) and call_id
    assert seen[2] == ("tool", call_id, "12:00")
    assert seen[3:] == [("assistant", "It is noon", ()), ("user", "and in an hour?")]


async def test_an_edit_after_a_client_tool_round_trip_forks_with_the_exchange(api_server: ApiServer,
                                                                              fake_openai: FakeOpenAI) -> None:
    """Open WebUI's edit of the last message: the same history, another final text. The fork's
    model sees the call and its result, as the original session's did."""
    fake_openai.script(Reply.tool_calls(Call("lookup_order", {"order": "A17"}, "call_lo1")),
                       Reply.text("Order A17 shipped on 2026-11-20."))
    result = "order A17: shipped 2026-11-20, tracking ZX991"
    question = {"role": "user", "content": "where is my order A17?"}
    async with openai_client(api_server, "edited") as client:
        r = await client.chat.completions.create(model="aiops", messages=[question], tools=[LOOKUP_ORDER])
        msg = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls" and msg.tool_calls is not None
        chat: list[Any] = [question, {"role": "assistant", "content": None,
                                      "tool_calls": [c.model_dump() for c in msg.tool_calls]},
                           {"role": "tool", "tool_call_id": "call_lo1", "content": result}]
        r = await client.chat.completions.create(model="aiops", messages=chat, tools=[LOOKUP_ORDER])
        chat.append({"role": "assistant", "content": r.choices[0].message.content})
        raw = await client.chat.completions.with_raw_response.create(
            model="aiops", messages=[*chat, {"role": "user", "content": "when will it arrive?"}], tools=[LOOKUP_ORDER])
        sid = raw.headers["x-aiops-session"]
        exchanged = [("user", "where is my order A17?"), ("assistant", "", (("call_lo1", "lookup_order", {"order": "A17"}),)),
                     ("tool", "call_lo1", result), ("assistant", "Order A17 shipped on 2026-11-20.", ())]
        assert seen_by_model(fake_openai.requests[-1].json) == [*exchanged, ("user", "when will it arrive?")]
        # The user edits that message: the same history before it, another text.
        raw = await client.chat.completions.with_raw_response.create(
            model="aiops", messages=[*chat, {"role": "user", "content": "when will it arrive in Oslo?"}],
            tools=[LOOKUP_ORDER])
    fork = raw.headers["x-aiops-session"]
    assert fork == f"{sid}+2"
    assert seen_by_model(fake_openai.requests[-1].json) == [*exchanged, ("user", "when will it arrive in Oslo?")]
    # The original session is left as it was.
    assert [m["content"] for m in await history(api_server, sid) if m["role"] == "user"] == [
        "where is my order A17?", "when will it arrive?"]
