"""The OpenAI-compatible surface through the real `openai` SDK (sync and async, streaming and not),
against `aiops serve` in a subprocess with the fake model server behind it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator

import httpx
import openai
import pytest

from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.support.server import ServeProcess, server_config_dir, start_serve


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as f:
        yield f


@pytest.fixture(scope="module")
def served(fake: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """One `aiops serve` for the module: models "local" (default) and "other" on the fake."""
    root = tmp_path_factory.mktemp("openai-proxy")
    cfg = server_config_dir(root, fake, models={
        "local": {"type": "openai", "model_id": "fake-model", "base_url": fake.url, "timeout": 10},
        "other": {"type": "openai", "model_id": "fake-other", "base_url": fake.url, "timeout": 10},
        "off": {"type": "openai", "model_id": "fake-off", "base_url": fake.url, "enabled": False},
    }, server={"keepalive_seconds": 0.2})
    proc = start_serve(cfg, root / "data", fake=fake)
    yield proc
    assert proc.stop() == 0


@pytest.fixture
def client(served: ServeProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture
async def aclient(served: ServeProcess) -> AsyncIterator[openai.AsyncOpenAI]:
    # Closed on this test's loop: left to the collector, its close ran on a later test's closed loop,
    # and asyncio's log of that failure landed in whichever test was running.
    async with openai.AsyncOpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def history(served: ServeProcess, session_id: str) -> list[dict]:
    r = httpx.get(f"{served.url}/api/v1/sessions/{session_id}", params={"limit": 1000})
    r.raise_for_status()
    return r.json()["messages"]


# ---- models ------------------------------------------------------------------------------------------


def test_models_lists_the_session_model_and_every_enabled_registry_model(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == ["aiops", "aiops/local", "aiops/other"]
    assert all(m.object == "model" and m.owned_by == "aiops" for m in models.data)
    assert client.models.retrieve("aiops/other").id == "aiops/other"
    assert client.models.retrieve("aiops:latest").id == "aiops"


def test_unknown_and_disabled_models_are_openai_404s(client: openai.OpenAI, fake: FakeOpenAI) -> None:
    before = len(fake.requests)
    for name in ("gpt-4o", "aiops/off", "aiops/nope"):
        with pytest.raises(openai.NotFoundError) as e:
            client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}])
        assert e.value.status_code == 404
        assert e.value.code == "model_not_found"
        assert name in e.value.message
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("aiops/off")
    assert len(fake.requests) == before  # nothing reached the model


def test_legacy_functions_are_refused_with_a_clear_400(client: openai.OpenAI, fake: FakeOpenAI) -> None:
    """`functions` / `function_call` (replaced by `tools`, which are offered: see
    test_proxy_client_tools) are refused naming the field, as is a `function` message."""
    before = len(fake.requests)
    fn = {"name": "get_weather", "parameters": {"type": "object"}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="aiops", messages=[{"role": "user", "content": "weather?"}],
                                       functions=[fn])
    assert e.value.status_code == 400
    assert e.value.code == "tools_not_supported" and e.value.param == "functions"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="aiops", messages=[
            {"role": "user", "content": "x"},
            {"role": "function", "name": "f", "content": "42"},
            {"role": "user", "content": "and?"}])
    assert e.value.param == "messages.1"
    assert len(fake.requests) == before


# ---- sync ------------------------------------------------------------------------------------------------


def test_sync_non_streaming_answer_has_openai_shape_and_real_usage(client: openai.OpenAI,
                                                                    fake: FakeOpenAI) -> None:
    fake.script(Reply.text("Disk usage is fine.", usage=(120, 6)))
    r = client.chat.completions.create(model="aiops", messages=[{"role": "user", "content": "check disk"}])
    assert r.object == "chat.completion"
    assert r.id.startswith("chatcmpl-")
    assert r.model == "aiops"
    assert len(r.choices) == 1
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == "Disk usage is fine."
    assert r.choices[0].finish_reason == "stop"
    assert r.usage is not None
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (120, 6, 126)
    # The agent's side of the call: its own system prompt and tools went to the model.
    sent = fake.requests[-1].json
    assert sent["messages"][0]["role"] == "system"
    assert sent["messages"][-1] == {"role": "user", "content": "check disk"}
    assert any(t["function"]["name"] == "update_system_prompt" for t in sent["tools"])


def test_sync_streaming_keeps_id_and_created_and_reports_usage_when_asked(client: openai.OpenAI,
                                                                          fake: FakeOpenAI) -> None:
    fake.script(Reply.text("All twelve services are up and answering.", chunks=4, usage=(50, 9)))
    stream = client.chat.completions.create(model="aiops/other", stream=True,
                                            stream_options={"include_usage": True},
                                            messages=[{"role": "user", "content": "status?"}])
    chunks = list(stream)
    assert fake.requests[-1].model == "fake-other"  # aiops/<key> picked the backend
    assert {c.id for c in chunks} == {chunks[0].id}
    assert {c.created for c in chunks} == {chunks[0].created}
    assert all(c.object == "chat.completion.chunk" and c.model == "aiops/other" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "All twelve services are up and answering."
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (50, 9)
    assert all(c.usage is None for c in chunks[:-1])


def test_streaming_without_include_usage_sends_no_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(model="aiops", stream=True,
                                                 messages=[{"role": "user", "content": "ping"}]))
    assert all(c.choices for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "echo: ping"


def test_sse_wire_format_ends_with_done(served: ServeProcess) -> None:
    body = {"model": "aiops", "stream": True, "messages": [{"role": "user", "content": "wire"}]}
    with httpx.stream("POST", served.url + "/v1/chat/completions", json=body, timeout=10) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-aiops-session"].startswith("proxy-")
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    first = json.loads(lines[0].removeprefix("data: "))
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}


# ---- the model's reasoning ------------------------------------------------------------------------------


def _deltas(chunks: list) -> list[tuple[str, str]]:
    """A stream's deltas in order as (field, text), consecutive ones of a field joined."""
    out: list[tuple[str, str]] = []
    for c in chunks:
        if not c.choices:
            continue
        d = c.choices[0].delta
        for field in ("reasoning_content", "content"):
            text = getattr(d, field, None)
            if not text:
                continue
            if out and out[-1][0] == field:
                out[-1] = (field, out[-1][1] + text)
            else:
                out.append((field, text))
    return out


def test_streamed_reasoning_reaches_the_sdk_as_reasoning_content_before_the_answer(
        client: openai.OpenAI, fake: FakeOpenAI, served: ServeProcess) -> None:
    """As DeepSeek, vLLM and llama.cpp stream it, unasked (clients that do not know the field skip
    it); the answer's text stays the answer alone, so the chat's next message continues it."""
    fake.script(Reply.reasoning("I am pondering deeply", "final answer"))
    raw = client.chat.completions.with_raw_response.create(
        model="aiops", stream=True, messages=[{"role": "user", "content": "THINK a"}])
    chunks = list(raw.parse())
    assert _deltas(chunks) == [("reasoning_content", "I am pondering deeply"), ("content", "final answer")]
    assert {c.id for c in chunks} == {chunks[0].id}
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["stop"]
    session = raw.headers["x-aiops-session"]
    answer = [m for m in history(served, session) if m["role"] == "assistant"][-1]
    assert (answer["content"], answer["thinking"]) == ("final answer", "I am pondering deeply")
    # A chat UI sends the answer back without the reasoning (Open WebUI drops its reasoning block).
    again = client.chat.completions.with_raw_response.create(model="aiops", messages=[
        {"role": "user", "content": "THINK a"}, {"role": "assistant", "content": "final answer"},
        {"role": "user", "content": "and then?"}])
    assert again.headers["x-aiops-session"] == session
    assert again.parse().choices[0].message.content == "echo: and then?"


def test_reasoning_of_each_model_call_comes_in_its_place(client: openai.OpenAI, fake: FakeOpenAI) -> None:
    """A turn of two model calls (a tool call between): reasoning, text, reasoning, text, in order."""
    fake.script(Reply.reasoning("first I look", "Let me check. ", calls=[("no_such_tool", {})]),
                Reply.reasoning("the tool is missing", "It cannot be checked."))
    chunks = list(client.chat.completions.create(model="aiops", stream=True,
                                                 messages=[{"role": "user", "content": "THINK twice"}]))
    assert _deltas(chunks) == [("reasoning_content", "first I look"), ("content", "Let me check. \n\n"),
                               ("reasoning_content", "the tool is missing"), ("content", "It cannot be checked.")]


def test_a_whole_answer_carries_its_reasoning_in_the_message(client: openai.OpenAI, fake: FakeOpenAI) -> None:
    fake.script(Reply.reasoning("I am pondering deeply", "final answer"))
    r = client.chat.completions.create(model="aiops", messages=[{"role": "user", "content": "THINK whole"}])
    message = r.choices[0].message
    assert (message.content, getattr(message, "reasoning_content", None)) == ("final answer",
                                                                             "I am pondering deeply")
    # No reasoning, no field (rather than an empty one).
    r = client.chat.completions.create(model="aiops", messages=[{"role": "user", "content": "plain"}])
    assert "reasoning_content" not in (r.choices[0].message.model_extra or {})


# ---- async -----------------------------------------------------------------------------------------------


async def test_async_non_streaming(aclient: openai.AsyncOpenAI, fake: FakeOpenAI) -> None:
    fake.script(Reply.text("async answer", usage=(7, 2)))
    r = await aclient.chat.completions.create(model="aiops/local",
                                              messages=[{"role": "user", "content": "async please"}])
    assert r.choices[0].message.content == "async answer"
    assert r.usage is not None and r.usage.total_tokens == 9
    await aclient.close()


async def test_async_streaming(aclient: openai.AsyncOpenAI) -> None:
    stream = await aclient.chat.completions.create(
        model="aiops", stream=True, messages=[{"role": "user", "content": "stream this asynchronously"}])
    chunks = [c async for c in stream]
    assert len({(c.id, c.created) for c in chunks}) == 1
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "echo: stream this asynchronously"
    await aclient.close()


# ---- failures ------------------------------------------------------------------------------------------


def test_model_failure_mid_stream_is_an_error_chunk(client: openai.OpenAI, fake: FakeOpenAI) -> None:
    fake.script(Reply.drop(after_chunks=4, reply=Reply.text("this answer is cut off by the model server "
                                                            "before it ends", chunks=6)))
    got: list[str] = []
    with pytest.raises(openai.APIError) as e:
        for c in client.chat.completions.create(model="aiops", stream=True,
                                                messages=[{"role": "user", "content": "fail midway"}]):
            got.append(c.choices[0].delta.content or "")
    assert "stream ended unexpectedly" in str(e.value.message)
    assert "".join(got).startswith("this answer")


def test_model_failure_without_stream_is_a_502(client: openai.OpenAI, fake: FakeOpenAI) -> None:
    fake.script(Reply.error(500, "upstream exploded"))
    with pytest.raises(openai.InternalServerError) as e:
        client.chat.completions.create(model="aiops", messages=[{"role": "user", "content": "fail"}])
    assert e.value.status_code == 502
    assert "upstream exploded" in e.value.message


def test_the_sdk_does_not_retry_a_failed_turn(served: ServeProcess, fake: FakeOpenAI) -> None:
    """The SDK retries 5xx twice by default; a failed turn has run (its tools too), and each retry
    would run it again in a fork of the conversation."""
    fake.script(Reply.error(500, "upstream exploded"))  # a retry would be answered, in a fork
    before = len(fake.requests)
    with openai.OpenAI(base_url=served.url + "/v1", api_key="unused") as c:  # default max_retries=2
        assert c.max_retries == 2
        with pytest.raises(openai.InternalServerError) as e:
            c.chat.completions.with_raw_response.create(
                model="aiops", messages=[{"role": "user", "content": "fail once only"}],
                extra_headers={"X-Aiops-Session": "no-retry"})
    assert e.value.status_code == 502
    assert len(fake.requests) == before + 1  # the model was asked once
    sessions = httpx.get(f"{served.url}/api/v1/sessions").json()["sessions"]
    assert [s["client_id"] for s in sessions if s["client_id"].startswith("no-retry")] == ["no-retry"]
    assert [m["role"] for m in history(served, "no-retry")] == ["user", "error"]


def test_several_text_parts_reach_the_model_as_separate_lines(client: openai.OpenAI, fake: FakeOpenAI) -> None:
    client.chat.completions.create(model="aiops", messages=[{"role": "user", "content": [
        {"type": "text", "text": "Summarise this log:"}, {"type": "text", "text": "disk full on db-1"}]}])
    assert fake.requests[-1].json["messages"][-1]["content"] == "Summarise this log:\ndisk full on db-1"


def test_pasted_bang_lines_reach_the_model_and_only_real_commands_run(client: openai.OpenAI,
                                                                      fake: FakeOpenAI) -> None:
    """A chat UI user never learnt our commands: `!important`, `!!! ALERT` and a Markdown image
    in pasted text are text for the model, not "unknown command" and a help page."""
    pasted = "Why this alert?\n!!! ALERT disk /var at 98%\n!important: on-call paged\n![graph](http://x/g.png)"
    answer = client.chat.completions.create(model="aiops", messages=[{"role": "user", "content": pasted}])
    assert fake.requests[-1].json["messages"][-1]["content"] == pasted
    text = answer.choices[0].message.content or ""
    assert "unknown command" not in text and "Commands:" not in text
    # A line naming a real command is still one, in a chat UI too.
    answer = client.chat.completions.create(model="aiops", messages=[
        {"role": "user", "content": "!model\nand how is db-1?"}])
    assert "Models (* = this session" in (answer.choices[0].message.content or "")
    assert fake.requests[-1].json["messages"][-1]["content"] == "and how is db-1?"


def test_json_output_modes_are_refused_for_agent_turns(client: openai.OpenAI, fake: FakeOpenAI) -> None:
    """The agent answers in prose: a client asking for JSON is told so rather than handed prose its
    parser then fails on (LangChain's structured output, the SDK's `parse`)."""
    before = len(fake.requests)
    schema = {"type": "json_schema", "json_schema": {"name": "Title", "schema": {"type": "object"}}}
    for rf in ({"type": "json_object"}, schema):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="aiops", response_format=rf,  # type: ignore[arg-type]
                                           messages=[{"role": "user", "content": "disk usage as JSON"}])
        assert e.value.param == "response_format" and e.value.code == "unsupported_value"
        assert rf["type"] in e.value.message and "prose" in e.value.message
    assert len(fake.requests) == before
    r = client.chat.completions.create(model="aiops", response_format={"type": "text"},
                                       messages=[{"role": "user", "content": "plain"}])
    assert r.choices[0].message.content == "echo: plain"
    # A background task is a plain model call whose prompt asks for its own JSON: the field is ignored.
    r = client.chat.completions.create(model="aiops", response_format={"type": "json_object"},
                                       messages=[{"role": "user", "content": TITLE_TASK}])
    assert r.choices[0].message.content == f"echo: {TITLE_TASK}"


def test_an_answer_cut_at_the_models_output_limit_says_length(client: openai.OpenAI, fake: FakeOpenAI) -> None:
    """Clients tell a truncated answer by finish_reason "length" (LangChain, Continue)."""
    fake.script(Reply.text("The first three of the nine steps are", finish_reason="length"),
                Reply.text("Steps one to", chunks=2, finish_reason="length"))
    r = client.chat.completions.create(model="aiops", messages=[{"role": "user", "content": "all nine steps"}])
    assert (r.choices[0].message.content, r.choices[0].finish_reason) == (
        "The first three of the nine steps are", "length")
    chunks = list(client.chat.completions.create(model="aiops", stream=True,
                                                 messages=[{"role": "user", "content": "again, streamed"}]))
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["length"]
    # A natural end is still "stop".
    assert client.chat.completions.create(model="aiops", messages=[
        {"role": "user", "content": "short one"}]).choices[0].finish_reason == "stop"


def test_bad_input_is_an_openai_400(served: ServeProcess) -> None:
    url = served.url + "/v1/chat/completions"
    cases = [
        b"{not json",
        json.dumps({"model": "aiops"}).encode(),
        json.dumps({"model": "aiops", "messages": "hi"}).encode(),
        json.dumps({"model": "aiops", "messages": []}).encode(),
        # (A history that ends with the answer is a chat UI's "Continue Response": a status line, see
        # test_continue_response_is_a_note_not_an_error_and_the_chat_goes_on.)
        json.dumps({"model": "aiops", "messages": [{"role": "user", "content": "a"},
                                                   {"role": "tool", "content": "b"}]}).encode(),
        json.dumps({"model": "aiops", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:,"}}]}]}).encode(),
    ]
    for body in cases:
        r = httpx.post(url, content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 400, body
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["message"], body


def test_an_image_earlier_in_the_chat_is_a_placeholder_and_only_a_new_one_is_refused(
        client: openai.OpenAI, fake: FakeOpenAI) -> None:
    """A screenshot a vision model once answered stays in the chat's history: refusing it there
    would make every later message of that chat a 400. Only an image in the new message is."""
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    history = [{"role": "user", "content": [{"type": "text", "text": "what is this graph?"}, image]},
               {"role": "assistant", "content": "a disk filling up"}]
    answer = client.chat.completions.create(model="aiops", messages=[
        *history, {"role": "user", "content": "which disk?"}])
    assert answer.choices[0].message.content == "echo: which disk?"
    sent = fake.requests[-1].json["messages"]
    assert {"role": "user", "content": "what is this graph?\n[image omitted: aiops passes on text only]"} in sent
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="aiops", messages=[
            *history, {"role": "user", "content": [{"type": "text", "text": "and this?"}, image]}])
    assert e.value.code == "unsupported_content" and e.value.param == "messages.2.content"


def test_a_slow_model_still_gets_the_stream_started(served: ServeProcess, fake: FakeOpenAI) -> None:
    """Headers and the role chunk go out with the first text, or on their own when none comes."""
    fake.script(Reply.hang())
    body = {"model": "aiops", "stream": True, "messages": [{"role": "user", "content": "slow one"}]}
    with httpx.stream("POST", served.url + "/v1/chat/completions", json=body, timeout=10,
                      headers={"X-Aiops-Session": "slow-start"}) as r:
        assert r.status_code == 200
        first = next(line for line in r.iter_lines() if line)
    assert json.loads(first.removeprefix("data: "))["choices"][0]["delta"]["role"] == "assistant"


# ---- disconnects -----------------------------------------------------------------------------------------


def test_a_client_that_hangs_up_cancels_the_turn_and_keeps_the_partial_answer(
        client: openai.OpenAI, served: ServeProcess, fake: FakeOpenAI) -> None:
    gone = fake.disconnects
    fake.script(Reply.hang(after_chunks=4, reply=Reply.text(
        "Checking the replication lag on every replica now, one moment", chunks=6)))
    stream = client.chat.completions.create(
        model="aiops", stream=True, messages=[{"role": "user", "content": "check replication"}],
        extra_headers={"X-Aiops-Session": "hangup-1"})
    seen = ""
    for c in stream:
        seen += c.choices[0].delta.content or ""
        if seen:
            break
    stream.close()  # hang up mid-answer
    fake.wait_for_disconnects(gone + 1, timeout=10)  # aiops hung up on the model in turn
    # A session runs one turn at a time: this one starts only once the cancelled one has ended.
    r = httpx.post(f"{served.url}/api/v1/submit", json={"client_id": "hangup-1", "text": "still there?",
                                                          "wait": True, "timeout": 10}, timeout=15)
    assert r.json()["status"] == "complete"
    msgs = history(served, "hangup-1")
    assert [m["role"] for m in msgs] == ["user", "assistant", "notice", "user", "assistant"]
    partial = msgs[1]
    assert partial["status"] == "cancelled"
    assert partial["content"].startswith(seen)
    assert "turn cancelled" in msgs[2]["content"]


def test_openai_style_validation_refuses_what_openai_refuses(served: ServeProcess, fake: FakeOpenAI) -> None:
    before = len(fake.requests)
    url = served.url + "/v1/chat/completions"
    msgs = [{"role": "user", "content": "hi"}]
    cases = [  # (body, the param OpenAI names, code)
        ({"stream": "yes"}, "stream", "invalid_request"),
        ({"stream": 1}, "stream", "invalid_request"),
        ({"stream": True, "stream_options": {"include_usage": "true"}}, "stream_options.include_usage",
         "invalid_request"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "invalid_value"),
        ({"stream": False, "stream_options": {"include_usage": True}}, "stream_options", "invalid_value"),
        ({"tools": "get_time"}, "tools", "invalid_type"),
        ({"tool_choice": "required"}, "tool_choice", "unsupported_value"),
        ({"functions": []}, "functions", "tools_not_supported"),
        ({"function_call": "none"}, "function_call", "tools_not_supported"),
        ({"user": 42}, "user", "invalid_request"),
        ({"n": 2}, "n", "invalid_value"),  # one answer per request: not silently one of two
        ({"n": "2"}, "n", "invalid_request"),
    ]
    for extra, param, code in cases:
        r = httpx.post(url, json={"model": "aiops", "messages": msgs, **extra})
        assert r.status_code == 400, extra
        assert r.json()["error"] | {"message": ""} == {"message": "", "type": "invalid_request_error",
                                                       "param": param, "code": code}, extra
    # The SDK's own way of sending stream_options without a stream gets the same answer.
    with openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0) as c, \
            pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="aiops", messages=msgs, stream_options={"include_usage": True})
    assert e.value.param == "stream_options" and "stream is true" in e.value.message
    assert len(fake.requests) == before  # nothing reached the model
    # null is OpenAI's "not given": accepted.
    r = httpx.post(url, json={"model": "aiops", "messages": msgs, "tools": None, "stream": None, "n": 1},
                   timeout=10)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "echo: hi"


TITLE_TASK = ("### Task:\nGenerate a concise, 3-5 word title for the chat history.\n"
              "<chat_history>\nUSER: restart nginx\n</chat_history>")


def test_background_tasks_report_the_models_real_usage(client: openai.OpenAI, fake: FakeOpenAI) -> None:
    fake.script(Reply.text('{"title": "Restart nginx"}', usage=(41, 7)))
    r = client.chat.completions.create(model="aiops", messages=[{"role": "user", "content": TITLE_TASK}])
    assert r.choices[0].message.content == '{"title": "Restart nginx"}'
    assert r.usage is not None and (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (
        41, 7, 48)
    fake.script(Reply.text('{"title": "Restart nginx"}', usage=(41, 8)))
    chunks = list(client.chat.completions.create(model="aiops", stream=True, stream_options={"include_usage": True},
                                                 messages=[{"role": "user", "content": TITLE_TASK}]))
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (41, 8)


def test_a_background_task_cut_at_the_models_output_limit_says_length(client: openai.OpenAI,
                                                                        fake: FakeOpenAI) -> None:
    fake.script(Reply.text('{"title": "Restart', finish_reason="length"),
                Reply.text('{"title": "Restart', finish_reason="length"), Reply.text('{"title": "ok"}'))
    whole = client.chat.completions.create(model="aiops", messages=[{"role": "user", "content": TITLE_TASK}])
    assert whole.choices[0].finish_reason == "length"
    chunks = list(client.chat.completions.create(model="aiops", stream=True,
                                                 messages=[{"role": "user", "content": TITLE_TASK}]))
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["length"]
    whole = client.chat.completions.create(model="aiops", messages=[{"role": "user", "content": TITLE_TASK}])
    assert whole.choices[0].finish_reason == "stop"


def test_a_stopped_turn_reports_no_usage_rather_than_zeros(client: openai.OpenAI, served: ServeProcess,
                                                          fake: FakeOpenAI) -> None:
    """Streamed with include_usage: the model never answered, so there is no usage chunk at all."""
    n = len(fake.requests)
    fake.script(Reply.hang())
    stream = client.chat.completions.create(model="aiops", stream=True, stream_options={"include_usage": True},
                                            messages=[{"role": "user", "content": "hang on"}],
                                            extra_headers={"X-Aiops-Session": "usage-stop"})
    chunks = []
    for c in stream:
        chunks.append(c)
        if len(chunks) == 1:  # the role chunk; stop the turn once the model has the request
            fake.wait_for_requests(n + 1)
            assert httpx.post(served.url + "/api/v1/sessions/usage-stop/stop").json()["stopped"] is True
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert all(c.usage is None and c.choices for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"


async def test_a_stopped_api_turn_has_no_usage_key(served: ServeProcess, fake: FakeOpenAI) -> None:
    n = len(fake.requests)
    fake.script(Reply.hang())
    async with httpx.AsyncClient(base_url=served.url, timeout=15) as h:
        waiting = asyncio.create_task(h.post("/api/v1/submit", json={
            "client_id": "usage-stop-api", "text": "hang on", "wait": True, "timeout": 10}))
        await asyncio.to_thread(fake.wait_for_requests, n + 1)
        assert (await h.post("/api/v1/sessions/usage-stop-api/stop")).json()["stopped"] is True
        body = (await waiting).json()
    assert body["status"] == "cancelled"
    assert "usage" not in body


async def test_a_stopped_non_streaming_turn_has_no_usage(aclient: openai.AsyncOpenAI, served: ServeProcess,
                                                         fake: FakeOpenAI) -> None:
    n = len(fake.requests)
    fake.script(Reply.hang())
    waiting = asyncio.create_task(aclient.chat.completions.create(
        model="aiops", messages=[{"role": "user", "content": "hang on"}],
        extra_headers={"X-Aiops-Session": "usage-stop-plain"}))
    await asyncio.to_thread(fake.wait_for_requests, n + 1)
    async with httpx.AsyncClient(base_url=served.url) as h:
        assert (await h.post("/api/v1/sessions/usage-stop-plain/stop")).json()["stopped"] is True
    r = await waiting
    assert r.choices[0].finish_reason == "stop"
    assert r.usage is None
    # The model said nothing: the answer is the stop's status line, not an empty reply.
    assert r.choices[0].message.content == "*⛔ the answer was stopped*"


def test_a_bare_base_url_reaches_the_same_routes_without_v1(served: ServeProcess, fake: FakeOpenAI) -> None:
    """Clients configured with the server's bare URL call /chat/completions and /models."""
    fake.script(Reply.text("no prefix needed"))
    with openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0) as bare:
        assert "aiops" in [m.id for m in bare.models.list()]
        reply = bare.chat.completions.create(model="aiops", messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.content == "no prefix needed"
        with pytest.raises(openai.NotFoundError) as e:  # and its errors in OpenAI's shape
            bare.models.retrieve("nosuch")
        assert e.value.body["code"] == "model_not_found"  # type: ignore[index]


def test_asked_for_outputs_aiops_cannot_give_are_refused_naming_the_field(client: openai.OpenAI,
                                                                           fake: FakeOpenAI) -> None:
    """Log probabilities and audio were accepted and silently left out; a developer-only chat was
    refused as if it were a 'system' message."""
    hi = [{"role": "user", "content": "hi"}]
    cases = [({"logprobs": True}, "logprobs"), ({"top_logprobs": 2}, "top_logprobs"),
             ({"modalities": ["text", "audio"]}, "modalities"),
             ({"audio": {"voice": "alloy", "format": "wav"}}, "audio")]
    for extra, field in cases:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="aiops", messages=hi, **extra)  # type: ignore[call-overload]
        assert e.value.body["param"] == field and field in e.value.body["message"]  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="aiops", messages=[{"role": "developer", "content": "be brief"}])
    assert "'developer'" in e.value.body["message"] and "'system'" not in e.value.body["message"]  # type: ignore[index]
    fake.script(Reply.text("fine"))  # what can be honoured still is: logprobs false, text only
    ok = client.chat.completions.create(model="aiops", messages=hi, logprobs=False, modalities=["text"])
    assert ok.choices[0].message.content == "fine"
