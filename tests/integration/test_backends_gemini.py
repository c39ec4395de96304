"""GeminiBackend against FakeGemini: the real google-genai SDK over a real socket, no patching."""

from __future__ import annotations

import asyncio
import base64
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

import pytest
from google import genai
from google.genai import types
from pydantic import BaseModel, Field

from aiops.config import ModelConfig
from aiops.engine.backends import ModelError, make_backend
from aiops.engine.backends.gemini_backend import (
    LOCAL_CALL_PREFIX,
    SKIP_SIGNATURE,
    GeminiBackend,
    gemini_schema,
)
from aiops.engine.types import (
    Completion,
    Message,
    StreamItem,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    ToolSpec,
    Usage,
)
from tests.fakes.fixtures import gemini_model_entry
from tests.fakes.gemini_server import Call, FakeGemini, Reply, call_tool_when, signature_for

MakeBackend = Callable[..., GeminiBackend]

DB_QUERY = ToolSpec(
    name="db_query",
    description="Run a read-only SQL query.",
    parameters={"type": "object", "properties": {"sql": {"type": "string"}}, "required": ["sql"]},
)
DB_QUERY_GEMINI = {"type": "OBJECT", "properties": {"sql": {"type": "STRING"}}, "required": ["sql"]}


@pytest.fixture
async def backend_for(fake_gemini: FakeGemini) -> AsyncIterator[MakeBackend]:
    """Builds backends pointed at the fake (or anywhere, via base_url=...) and closes them after."""
    made: list[GeminiBackend] = []

    def make(env: dict[str, str] | None = None, key: str = "gem", **overrides: Any) -> GeminiBackend:
        config = ModelConfig(**{**gemini_model_entry(fake_gemini), **overrides})
        backend = make_backend(key, config, env if env is not None else {})
        assert isinstance(backend, GeminiBackend)
        made.append(backend)
        return backend

    yield make
    for b in made:
        await b.aclose()


async def collect(backend: GeminiBackend, messages: list[Message], tools: list[ToolSpec] | None = None,
                  system: str | None = None) -> list[StreamItem]:
    return [item async for item in backend.stream(messages, tools or [], system=system)]


def completion_of(items: list[StreamItem]) -> Completion:
    completions = [i for i in items if isinstance(i, Completion)]
    assert len(completions) == 1 and items[-1] is completions[0], "exactly one Completion, last"
    return completions[0]


async def stream_error(backend: GeminiBackend, messages: list[Message]) -> tuple[list[StreamItem], ModelError]:
    items: list[StreamItem] = []
    with pytest.raises(ModelError) as info:
        async for item in backend.stream(messages, []):
            items.append(item)
    return items, info.value


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def thinking_config(body: dict[str, Any]) -> dict[str, Any] | None:
    # The SDK writes this one nested object in snake_case; the API accepts either spelling.
    gen = body.get("generationConfig") or {}
    return gen.get("thinkingConfig") or gen.get("thinking_config")


HI = [Message("user", "hi")]


# ---- happy paths ----------------------------------------------------------------------------------


async def test_text_streams_in_pieces_that_make_the_completion(fake_gemini: FakeGemini,
                                                               backend_for: MakeBackend) -> None:
    fake_gemini.script(Reply.text("Replication lag is 3 seconds on db-2.", chunks=4))
    items = await collect(backend_for(), HI)
    deltas = [i.text for i in items if isinstance(i, TextDelta)]
    done = completion_of(items)
    assert len(deltas) == 4
    assert "".join(deltas) == done.text == "Replication lag is 3 seconds on db-2."
    assert done.finish_reason == "stop" and done.tool_calls == []
    assert fake_gemini.last_request.path == "/v1/models/gemini-fake:streamGenerateContent"
    assert fake_gemini.last_request.query == {"alt": "sse"}


async def test_unscripted_fake_echoes_the_last_user_message(backend_for: MakeBackend) -> None:
    done = completion_of(await collect(backend_for(), [Message("user", "ping the cluster")]))
    assert done.text == "echo: ping the cluster"


async def test_conversation_is_sent_in_gemini_shape(fake_gemini: FakeGemini, backend_for: MakeBackend) -> None:
    backend = backend_for(env={"FAKE_GEMINI_KEY": "g-key-123"}, api_key_env="FAKE_GEMINI_KEY",
                          temperature=0.2, top_p=0.9, top_k=40, max_tokens=256)
    calls = [ToolCall(id="call_1", name="db_query", arguments={"sql": "select count(*) from orders"}),
             ToolCall(id="call_2", name="db_query", arguments={"sql": "select count(*) from refunds"})]
    history = [
        Message("user", "How many orders and refunds?"),
        Message("assistant", "Counting.", tool_calls=calls, thinking="two queries"),
        Message("tool", "42", tool_call_id="call_1", name="db_query"),
        Message("tool", "3", tool_call_id="call_2"),  # the name is found from the call
        Message("assistant", "42 orders, 3 refunds."),
        Message("notice", "waiting for approval"),  # history only: never sent
        Message("user", "And yesterday?"),
    ]
    await collect(backend, history, [DB_QUERY], system="You are an ops agent.")

    req = fake_gemini.last_request
    assert req.headers["x-goog-api-key"] == "g-key-123"
    body = req.json
    skip = base64.b64encode(SKIP_SIGNATURE).decode()  # we hold no signature for these calls
    assert body["contents"] == [
        {"role": "user", "parts": [{"text": "How many orders and refunds?"}]},
        {"role": "model", "parts": [
            {"text": "Counting."},
            {"functionCall": {"id": "call_1", "name": "db_query", "args": {"sql": "select count(*) from orders"}},
             "thoughtSignature": skip},
            {"functionCall": {"id": "call_2", "name": "db_query",
                              "args": {"sql": "select count(*) from refunds"}}}]},
        {"role": "user", "parts": [
            {"functionResponse": {"id": "call_1", "name": "db_query", "response": {"result": "42"}}},
            {"functionResponse": {"id": "call_2", "name": "db_query", "response": {"result": "3"}}}]},
        {"role": "model", "parts": [{"text": "42 orders, 3 refunds."}]},
        {"role": "user", "parts": [{"text": "And yesterday?"}]},
    ]
    assert body["systemInstruction"]["parts"] == [{"text": "You are an ops agent."}]
    assert body["tools"] == [{"functionDeclarations": [
        {"name": "db_query", "description": "Run a read-only SQL query.", "parameters": DB_QUERY_GEMINI}]}]
    gen = body["generationConfig"]
    assert (gen["temperature"], gen["topP"], gen["topK"], gen["maxOutputTokens"]) == (0.2, 0.9, 40, 256)
    assert thinking_config(body) == {"include_thoughts": True}


async def test_tool_call_arrives_with_its_id(fake_gemini: FakeGemini, backend_for: MakeBackend) -> None:
    fake_gemini.script(Reply.tool_calls(Call("db_query", {"sql": "select 1", "limit": 5}, id="fc_7")))
    items = await collect(backend_for(), HI, [DB_QUERY])
    done = completion_of(items)
    assert done.tool_calls == [ToolCall(id="fc_7", name="db_query", arguments={"sql": "select 1", "limit": 5})]
    assert done.finish_reason == "tool_calls"  # Gemini itself says STOP
    assert not [i for i in items if isinstance(i, TextDelta)]


async def test_parallel_calls_keep_order_and_the_signature_goes_back(fake_gemini: FakeGemini,
                                                                     backend_for: MakeBackend) -> None:
    fake_gemini.script(Reply.tool_calls(("db_query", {"sql": "select 1"}, "fc_a"),
                                        ("web_search", {"q": "mariadb 11"}, "fc_b")))
    backend = backend_for()
    first = completion_of(await collect(backend, HI, [DB_QUERY]))
    assert [(c.id, c.name, c.arguments) for c in first.tool_calls] == [
        ("fc_a", "db_query", {"sql": "select 1"}), ("fc_b", "web_search", {"q": "mariadb 11"})]

    history = [*HI, Message("assistant", "", tool_calls=first.tool_calls),
               Message("tool", "1", tool_call_id="fc_a", name="db_query"),
               Message("tool", "found it", tool_call_id="fc_b", name="web_search")]
    await collect(backend, history, [DB_QUERY])
    model_turn = fake_gemini.last_request.json["contents"][1]
    # Gemini 3 signs the first call of a step and refuses a history without that signature.
    assert model_turn["parts"][0]["thoughtSignature"] == signature_for("fc_a")
    assert "thoughtSignature" not in model_turn["parts"][1]


async def test_calls_without_ids_get_local_ids_that_are_never_sent_back() -> None:
    with FakeGemini(call_ids=False) as fake:
        backend = GeminiBackend("gem", ModelConfig(**gemini_model_entry(fake)), {})
        try:
            fake.script(Reply.tool_calls(("db_query", {"sql": "select 1"})))
            [call] = completion_of(await collect(backend, HI, [DB_QUERY])).tool_calls
            assert call.id.startswith(LOCAL_CALL_PREFIX)
            history = [*HI, Message("assistant", "", tool_calls=[call]),
                       Message("tool", "1", tool_call_id=call.id, name="db_query")]
            await collect(backend, history, [DB_QUERY])
        finally:
            await backend.aclose()
        contents = fake.last_request.json["contents"]
    assert "id" not in contents[1]["parts"][0]["functionCall"]
    assert contents[2]["parts"] == [{"functionResponse": {"name": "db_query", "response": {"result": "1"}}}]


async def test_thought_parts_become_thinking(fake_gemini: FakeGemini, backend_for: MakeBackend) -> None:
    fake_gemini.script(Reply.reasoning("The user wants a count; a query is cheap.", then_text="Running it.",
                                       chunks=3))
    items = await collect(backend_for(), HI)
    thoughts = [i.text for i in items if isinstance(i, ThinkingDelta)]
    done = completion_of(items)
    assert len(thoughts) == 3
    assert "".join(thoughts) == done.thinking == "The user wants a count; a query is cheap."
    assert done.text == "Running it."


async def test_usage_is_reported(fake_gemini: FakeGemini, backend_for: MakeBackend) -> None:
    fake_gemini.script(Reply.text("ok", usage=(1234, 56)))
    assert completion_of(await collect(backend_for(), HI)).usage == Usage(1234, 56)


async def test_multi_step_turn_with_a_rule_based_fake(fake_gemini: FakeGemini, backend_for: MakeBackend) -> None:
    fake_gemini.responder = call_tool_when("disk", ("db_query", {"sql": "select pct from disk"}))
    backend = backend_for()
    history = [Message("user", "check disk usage")]
    first = completion_of(await collect(backend, history, [DB_QUERY]))
    [call] = first.tool_calls
    history += [Message("assistant", first.text, tool_calls=first.tool_calls),
                Message("tool", "71%", tool_call_id=call.id, name=call.name)]
    assert completion_of(await collect(backend, history, [DB_QUERY])).text == "tool said: 71%"


async def test_model_without_thinking_is_asked_again_without_it(fake_gemini: FakeGemini,
                                                                backend_for: MakeBackend) -> None:
    def no_thinking(body: dict[str, Any]) -> Reply | None:
        if thinking_config(body):
            return Reply.error(400, "Thinking is not supported for this model.")
        return None

    fake_gemini.responder = no_thinking
    backend = backend_for()
    assert completion_of(await collect(backend, HI)).text == "echo: hi"
    assert completion_of(await collect(backend, HI)).text == "echo: hi"
    assert [thinking_config(r.json) is not None for r in fake_gemini.requests] == [True, False, False]


async def test_pydantic_schemas_are_sanitised_for_gemini(fake_gemini: FakeGemini,
                                                         backend_for: MakeBackend) -> None:
    class Target(BaseModel):
        host: str = Field(description="Host name")
        port: int | None = None

    class Args(BaseModel):
        sql: str = Field(title="SQL", description="The query")
        limit: int = 100
        target: Target | None = None
        mode: Literal["read", "explain"] = "read"
        priority: Literal[1, 2, 3] = 2
        tags: list[str] = []
        extra: dict[str, Any] = {}
        docs: str = Field("", json_schema_extra={"format": "uri"})

    await collect(backend_for(), HI, [ToolSpec("q", "Query", Args.model_json_schema())])
    [decl] = fake_gemini.last_request.json["tools"][0]["functionDeclarations"]
    assert decl["parameters"] == {
        "type": "OBJECT",
        "properties": {
            "sql": {"type": "STRING", "description": "The query"},
            "limit": {"type": "INTEGER"},
            "target": {"type": "OBJECT", "nullable": True, "required": ["host"], "properties": {
                "host": {"type": "STRING", "description": "Host name"},
                "port": {"type": "INTEGER", "nullable": True}}},
            "mode": {"type": "STRING", "enum": ["read", "explain"]},
            "priority": {"type": "INTEGER", "description": "Allowed values: 1, 2, 3."},
            "tags": {"type": "ARRAY", "items": {"type": "STRING"}},
            "extra": {"type": "OBJECT"},
            "docs": {"type": "STRING"},
        },
        "required": ["sql"],
    }


def test_schema_sanitiser_handles_recursion_and_type_lists() -> None:
    schema = {
        "$defs": {"Node": {"type": "object", "title": "Node", "properties": {
            "name": {"type": ["string", "null"]},
            "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}},
        "type": "object",
        "properties": {"root": {"$ref": "#/$defs/Node", "description": "The tree"},
                       "when": {"type": "string", "format": "date-time", "default": "now"}},
        "additionalProperties": False,
    }
    assert gemini_schema(schema) == {
        "type": "OBJECT",
        "properties": {
            "root": {"type": "OBJECT", "description": "The tree", "properties": {
                "name": {"type": "STRING", "nullable": True},
                # A recursive reference cannot be inlined: any object is accepted there.
                "children": {"type": "ARRAY", "items": {"type": "OBJECT"}}}},
            "when": {"type": "STRING", "format": "date-time"},
        },
    }


async def test_tool_without_arguments_sends_no_schema(fake_gemini: FakeGemini, backend_for: MakeBackend) -> None:
    await collect(backend_for(), HI, [ToolSpec("now", "The time", {"type": "object", "properties": {}})])
    [decl] = fake_gemini.last_request.json["tools"][0]["functionDeclarations"]
    assert decl == {"name": "now", "description": "The time"}


# ---- failures -------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [400, 404, 429, 500, 503])
async def test_http_errors_name_model_url_and_status(fake_gemini: FakeGemini, backend_for: MakeBackend,
                                                     status: int) -> None:
    fake_gemini.script(Reply.error(status, "boom"))
    _, err = await stream_error(backend_for(key="gem-pro"), HI)
    assert err.status == status
    assert err.reason == f"HTTP {status}: boom"
    assert "'gem-pro'" in str(err) and fake_gemini.url in str(err)
    assert err.retryable == (status in (429, 500, 503))


async def test_invalid_key_is_reported_without_the_key() -> None:
    with FakeGemini(api_key="right-key") as fake:
        backend = GeminiBackend("gem", ModelConfig(**gemini_model_entry(fake), api_key_env="G_KEY"),
                                {"G_KEY": "wrong-secret-98765"})
        try:
            _, err = await stream_error(backend, HI)
        finally:
            await backend.aclose()
    assert err.status == 400 and "API key not valid" in err.reason and err.cause == "key"
    assert "wrong-secret-98765" not in str(err)


async def test_missing_key_env_names_the_variable(fake_gemini: FakeGemini, backend_for: MakeBackend) -> None:
    _, err = await stream_error(backend_for(env={}, api_key_env="AIOPS_TEST_GEMINI_KEY"), HI)
    assert "AIOPS_TEST_GEMINI_KEY" in err.reason and "not set" in err.reason and err.cause == "key"
    assert fake_gemini.requests == []


async def test_slow_server_times_out(fake_gemini: FakeGemini, backend_for: MakeBackend) -> None:
    fake_gemini.script(Reply.slow(30))
    _, err = await stream_error(backend_for(timeout=0.5), HI)
    assert "timed out after 0.5s" in err.reason and err.retryable


async def test_silence_mid_stream_times_out(fake_gemini: FakeGemini, backend_for: MakeBackend) -> None:
    fake_gemini.script(Reply.hang(after_chunks=2))
    items, err = await stream_error(backend_for(timeout=0.5), HI)
    assert "timed out after 0.5s" in err.reason
    assert [i.text for i in items if isinstance(i, TextDelta)]


async def test_a_long_answer_is_not_cut_by_the_timeout(fake_gemini: FakeGemini, backend_for: MakeBackend) -> None:
    # The timeout bounds silence, not the whole answer: 6 chunks 0.5 s apart outlast a 2 s timeout
    # (a loaded machine only makes the answer longer; each silence has 1.5 s to spare).
    fake_gemini.script(Reply.text("a steady but long answer", chunks=6, chunk_delay=0.5))
    done = completion_of(await collect(backend_for(timeout=2.0), HI))
    assert done.text == "a steady but long answer"


async def test_dropped_stream_is_an_error_not_a_short_answer(fake_gemini: FakeGemini,
                                                             backend_for: MakeBackend) -> None:
    fake_gemini.script(Reply.drop(after_chunks=3, reply=Reply.text("a long answer that is cut", chunks=6)))
    items, err = await stream_error(backend_for(), HI)
    assert err.reason.startswith("stream ended unexpectedly")
    assert not any(isinstance(i, Completion) for i in items)
    assert "".join(i.text for i in items if isinstance(i, TextDelta))


async def test_connection_refused(backend_for: MakeBackend) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    _, err = await stream_error(backend_for(base_url=url, key="gone"), HI)
    assert err.reason == "connection refused" and err.cause == "connection"
    assert url in str(err) and "'gone'" in str(err)


async def test_cancelling_the_consumer_hangs_up_on_the_server(fake_gemini: FakeGemini,
                                                              backend_for: MakeBackend) -> None:
    fake_gemini.script(Reply.hang(after_chunks=2))
    backend = backend_for()
    first_delta = asyncio.Event()

    async def consume() -> None:
        async for item in backend.stream(HI, []):
            if isinstance(item, TextDelta):
                first_delta.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first_delta.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await fake_gemini.wait_for_disconnects_async(1) == 1


# ---- the fake itself (other suites rely on it) ----------------------------------------------------


def test_fake_answers_the_sync_sdk_without_streaming(fake_gemini: FakeGemini) -> None:
    client = genai.Client(api_key="x", http_options=types.HttpOptions(base_url=fake_gemini.url))
    try:
        fake_gemini.script(Reply.reasoning("think", then_text="Checking.", calls=[("db_query", {"sql": "select 1"})]))
        r = client.models.generate_content(model="gemini-fake", contents="hi")
    finally:
        client.close()
    assert r.text == "Checking."
    assert r.function_calls is not None
    assert [(c.name, c.args) for c in r.function_calls] == [("db_query", {"sql": "select 1"})]
    assert r.candidates and r.candidates[0].content and r.candidates[0].content.parts
    assert r.candidates[0].content.parts[0].thought is True
    assert r.usage_metadata is not None and r.usage_metadata.total_token_count
    [req] = fake_gemini.wait_for_requests(1)
    assert req.stream is False and req.path == "/v1/models/gemini-fake:generateContent"
