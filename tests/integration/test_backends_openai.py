"""OpenAIBackend against FakeOpenAI: the real openai SDK over a real socket, no patching."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from aiops.config import REPO_ROOT, ModelConfig
from aiops.engine.backends import ModelError, make_backend
from aiops.engine.backends.openai_backend import OpenAIBackend
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
from tests.fakes.fixtures import openai_model_entry
from tests.fakes.openai_server import Call, FakeOpenAI, Reply, call_tool_when, split_text
from tests.fakes.tls_proxy import Authority

MakeBackend = Callable[..., OpenAIBackend]

DB_QUERY = ToolSpec(
    name="db_query",
    description="Run a read-only SQL query.",
    parameters={"type": "object", "properties": {"sql": {"type": "string"}}, "required": ["sql"]},
)


@pytest.fixture
async def backend_for(fake_openai: FakeOpenAI) -> AsyncIterator[MakeBackend]:
    """Builds backends pointed at the fake (or anywhere, via base_url=...) and closes them after."""
    made: list[OpenAIBackend] = []

    def make(env: dict[str, str] | None = None, key: str = "local", **overrides: Any) -> OpenAIBackend:
        config = ModelConfig(**{**openai_model_entry(fake_openai), **overrides})
        backend = make_backend(key, config, env if env is not None else {})
        assert isinstance(backend, OpenAIBackend)
        made.append(backend)
        return backend

    yield make
    for b in made:
        await b.aclose()


async def collect(backend: OpenAIBackend, messages: list[Message], tools: list[ToolSpec] | None = None,
                  system: str | None = None) -> list[StreamItem]:
    return [item async for item in backend.stream(messages, tools or [], system=system)]


def completion_of(items: list[StreamItem]) -> Completion:
    completions = [i for i in items if isinstance(i, Completion)]
    assert len(completions) == 1 and items[-1] is completions[0], "exactly one Completion, last"
    return completions[0]


async def stream_error(backend: OpenAIBackend, messages: list[Message]) -> tuple[list[StreamItem], ModelError]:
    """The items yielded before the stream failed, and the ModelError it failed with."""
    items: list[StreamItem] = []
    with pytest.raises(ModelError) as info:
        async for item in backend.stream(messages, []):
            items.append(item)
    return items, info.value


def closed_port() -> int:
    """A local port nothing listens on (bound then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


HI = [Message("user", "hi")]


# ---- happy paths ----------------------------------------------------------------------------------


async def test_text_streams_in_pieces_that_make_the_completion(fake_openai: FakeOpenAI,
                                                               backend_for: MakeBackend) -> None:
    # Held at the fake after the first piece (frame 0 is the role) until the backend passed it on:
    # the first piece is streamed while the rest is still to come (the rest, arriving together
    # when the machine is slow, may come as one delta).
    text = "Disk usage is at 71 percent on db-1."
    fake_openai.script(Reply.text(text, chunks=4, hold_after=2))
    items: list[StreamItem] = []
    async for item in backend_for().stream(HI, []):
        items.append(item)
        if len(items) == 1:  # passed on while the rest is held back (until this release)
            fake_openai.release()
    deltas = [i.text for i in items if isinstance(i, TextDelta)]
    done = completion_of(items)
    assert deltas[0] == split_text(text, 4)[0] and len(deltas) >= 2
    assert "".join(deltas) == done.text == text
    assert done.finish_reason == "stop" and done.tool_calls == [] and done.thinking == ""


async def test_unscripted_fake_echoes_the_last_user_message(backend_for: MakeBackend) -> None:
    done = completion_of(await collect(backend_for(), [Message("user", "ping the cluster")]))
    assert done.text == "echo: ping the cluster"


async def test_conversation_is_sent_in_openai_shape(fake_openai: FakeOpenAI, backend_for: MakeBackend) -> None:
    backend = backend_for(env={"FAKE_OPENAI_KEY": "sk-test-123"}, api_key_env="FAKE_OPENAI_KEY",
                          temperature=0.2, top_p=0.9, max_tokens=256, top_k=40)
    call = ToolCall(id="call_1", name="db_query", arguments={"sql": "select count(*) from orders"})
    history = [
        Message("user", "How many orders?"),
        Message("assistant", "", tool_calls=[call], thinking="count them"),
        Message("tool", "42", tool_call_id="call_1", name="db_query"),
        Message("assistant", "There are 42 orders."),
        Message("notice", "waiting for approval"),  # history only: never sent
        Message("user", "And yesterday?"),
    ]
    await collect(backend, history, [DB_QUERY], system="You are an ops agent.")

    req = fake_openai.last_request
    assert req.path == "/v1/chat/completions"
    assert req.headers["authorization"] == "Bearer sk-test-123"
    body = req.json
    assert body["model"] == "fake-model"
    assert body["messages"] == [
        {"role": "system", "content": "You are an ops agent."},
        {"role": "user", "content": "How many orders?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "db_query", "arguments": '{"sql": "select count(*) from orders"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
        {"role": "assistant", "content": "There are 42 orders."},
        {"role": "user", "content": "And yesterday?"},
    ]
    assert body["tools"] == [{"type": "function", "function": {
        "name": "db_query", "description": "Run a read-only SQL query.", "parameters": DB_QUERY.parameters}}]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert (body["temperature"], body["top_p"], body["max_tokens"]) == (0.2, 0.9, 256)
    assert "top_k" not in body  # gemini-only


async def test_no_tools_and_no_key_sends_neither(fake_openai: FakeOpenAI, backend_for: MakeBackend) -> None:
    await collect(backend_for(), HI)
    req = fake_openai.last_request
    assert "tools" not in req.json and "temperature" not in req.json
    assert req.headers["authorization"] == "Bearer not-needed"  # keyless local server


async def test_tool_call_split_across_chunks_is_assembled(fake_openai: FakeOpenAI,
                                                          backend_for: MakeBackend) -> None:
    sql = "select host, pct from disk_usage where pct > 80 order by pct desc"
    fake_openai.script(Reply.tool_calls(Call("db_query", {"sql": sql}, id="call_abc"), arg_chunks=6))
    items = await collect(backend_for(), HI, [DB_QUERY])
    done = completion_of(items)
    assert done.tool_calls == [ToolCall(id="call_abc", name="db_query", arguments={"sql": sql})]
    assert done.finish_reason == "tool_calls"
    assert not [i for i in items if isinstance(i, TextDelta)]


async def test_parallel_tool_calls_keep_their_order_and_ids(fake_openai: FakeOpenAI,
                                                            backend_for: MakeBackend) -> None:
    fake_openai.script(Reply.tool_calls(("db_query", {"sql": "select 1"}, "call_a"),
                                        ("web_search", {"q": "mariadb 11 release notes", "n": 3}, "call_b"),
                                        text="Checking two things."))
    done = completion_of(await collect(backend_for(), HI, [DB_QUERY]))
    assert done.text == "Checking two things."
    assert [(c.id, c.name, c.arguments) for c in done.tool_calls] == [
        ("call_a", "db_query", {"sql": "select 1"}),
        ("call_b", "web_search", {"q": "mariadb 11 release notes", "n": 3}),
    ]


async def test_undecodable_arguments_set_parse_error(fake_openai: FakeOpenAI, backend_for: MakeBackend) -> None:
    fake_openai.script(Reply.tool_calls(Call("db_query", '{"sql": "select', id="call_x")))
    [call] = completion_of(await collect(backend_for(), HI, [DB_QUERY])).tool_calls
    assert call.arguments == {} and call.parse_error and "not valid JSON" in call.parse_error
    assert (call.id, call.name) == ("call_x", "db_query")


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
async def test_reasoning_deltas_become_thinking(fake_openai: FakeOpenAI, backend_for: MakeBackend,
                                               field: str) -> None:
    # Held after the first thinking piece (frame 0 is the role) until it is passed on.
    fake_openai.script(Reply.reasoning("The user wants a count; a query is cheap.", then_text="Running it.",
                                       reasoning_field=field, chunks=3, hold_after=2))
    items: list[StreamItem] = []
    async for item in backend_for().stream(HI, []):
        items.append(item)
        if len(items) == 1:
            fake_openai.release()
    thoughts = [i.text for i in items if isinstance(i, ThinkingDelta)]
    done = completion_of(items)
    assert len(thoughts) >= 2
    assert "".join(thoughts) == done.thinking == "The user wants a count; a query is cheap."
    assert done.text == "Running it."
    # Thinking arrives before the answer, as the server sent it.
    first_text = next(n for n, i in enumerate(items) if isinstance(i, TextDelta))
    assert all(n < first_text for n, i in enumerate(items) if isinstance(i, ThinkingDelta))


async def test_usage_is_reported(fake_openai: FakeOpenAI, backend_for: MakeBackend) -> None:
    fake_openai.script(Reply.text("ok", usage=(1234, 56)))
    assert completion_of(await collect(backend_for(), HI)).usage == Usage(1234, 56)


async def test_multi_step_turn_with_a_rule_based_fake(fake_openai: FakeOpenAI, backend_for: MakeBackend) -> None:
    fake_openai.responder = call_tool_when("disk", ("db_query", {"sql": "select pct from disk"}))
    backend = backend_for()
    history = [Message("user", "check disk usage")]
    first = completion_of(await collect(backend, history, [DB_QUERY]))
    [call] = first.tool_calls
    history += [Message("assistant", first.text, tool_calls=first.tool_calls),
                Message("tool", "71%", tool_call_id=call.id, name=call.name)]
    second = completion_of(await collect(backend, history, [DB_QUERY]))
    assert second.text == "tool said: 71%"
    assert fake_openai.last_request.json["messages"][-1] == {"role": "tool", "tool_call_id": call.id,
                                                              "content": "71%"}


async def test_server_rejecting_stream_options_is_retried_without(fake_openai: FakeOpenAI,
                                                                  backend_for: MakeBackend) -> None:
    def strict_server(body: dict[str, Any]) -> Reply | None:
        if "stream_options" in body:
            return Reply.error(400, "Unrecognized request argument supplied: stream_options")
        return None

    fake_openai.responder = strict_server
    backend = backend_for()
    assert completion_of(await collect(backend, HI)).text == "echo: hi"
    assert completion_of(await collect(backend, HI)).text == "echo: hi"
    assert ["stream_options" in r.json for r in fake_openai.requests] == [True, False, False]


# ---- failures -------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [400, 404, 429, 500, 503])
async def test_http_errors_name_model_url_and_status(fake_openai: FakeOpenAI, backend_for: MakeBackend,
                                                     status: int) -> None:
    fake_openai.script(Reply.error(status, "boom"))
    _, err = await stream_error(backend_for(key="ops-local"), HI)
    assert err.status == status
    # A 429 also says why it was not retried (tests/integration/test_upstream_limits.py).
    assert err.reason.startswith(f"HTTP {status}: boom") if status == 429 else err.reason == f"HTTP {status}: boom"
    assert "'ops-local'" in str(err) and fake_openai.url in str(err)
    assert err.retryable == (status in (429, 500, 503))
    assert err.cause == "server"  # it answered: reachable, whatever the error


async def test_invalid_key_is_reported_without_the_key() -> None:
    with FakeOpenAI(api_key="sk-right-key") as fake:
        backend = OpenAIBackend("cloud", ModelConfig(**openai_model_entry(fake), api_key_env="OPS_KEY"),
                                {"OPS_KEY": "sk-wrong-secret-98765"})
        try:
            _, err = await stream_error(backend, HI)
        finally:
            await backend.aclose()
    assert err.status == 401 and err.cause == "key"
    assert err.reason.startswith("HTTP 401: Incorrect API key provided")
    assert "sk-wrong-secret-98765" not in str(err) and "[redacted]" in str(err)


async def test_missing_key_env_names_the_variable(fake_openai: FakeOpenAI, backend_for: MakeBackend) -> None:
    backend = backend_for(env={}, api_key_env="AIOPS_TEST_OPENAI_KEY")
    _, err = await stream_error(backend, HI)
    assert "AIOPS_TEST_OPENAI_KEY" in err.reason and "not set" in err.reason and err.cause == "key"
    assert fake_openai.requests == []  # nothing was sent without a key


async def test_slow_server_times_out(fake_openai: FakeOpenAI, backend_for: MakeBackend) -> None:
    fake_openai.script(Reply.slow(30))
    _, err = await stream_error(backend_for(timeout=0.5), HI)
    assert "timed out after 0.5s" in err.reason and err.retryable and err.cause == "connection"


async def test_silence_mid_stream_times_out(fake_openai: FakeOpenAI, backend_for: MakeBackend) -> None:
    fake_openai.script(Reply.hang(after_chunks=2))
    items, err = await stream_error(backend_for(timeout=0.5), HI)
    assert "timed out after 0.5s" in err.reason
    assert [i.text for i in items if isinstance(i, TextDelta)]  # what arrived was passed on


async def test_a_long_answer_is_not_cut_by_the_timeout(fake_openai: FakeOpenAI, backend_for: MakeBackend) -> None:
    # The timeout bounds silence, not the whole answer: 6 chunks 0.5 s apart outlast a 2 s timeout
    # (a loaded machine only makes the answer longer; each silence has 1.5 s to spare).
    fake_openai.script(Reply.text("a steady but long answer", chunks=6, chunk_delay=0.5))
    done = completion_of(await collect(backend_for(timeout=2.0), HI))
    assert done.text == "a steady but long answer"


async def test_dropped_stream_is_an_error_not_a_short_answer(fake_openai: FakeOpenAI,
                                                             backend_for: MakeBackend) -> None:
    fake_openai.script(Reply.drop(after_chunks=3, reply=Reply.text("a long answer that is cut", chunks=6)))
    items, err = await stream_error(backend_for(), HI)
    assert err.reason.startswith("stream ended unexpectedly")
    assert not any(isinstance(i, Completion) for i in items)
    assert "".join(i.text for i in items if isinstance(i, TextDelta))  # the part that did arrive


async def test_connection_refused(backend_for: MakeBackend) -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    _, err = await stream_error(backend_for(base_url=url, key="gone"), HI)
    assert err.reason == "connection refused" and err.cause == "connection"
    assert url in str(err) and "'gone'" in str(err)


async def test_a_model_over_https_answers_only_behind_a_certificate_the_machine_trusts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """https keeps the SDK's own TLS: a certificate from an unknown CA is refused, and the CA named
    by SSL_CERT_FILE (a company's own, say) is trusted. (Plain-http models skip the SSL context the
    SDK would make for them: see test_import_discipline.)"""
    authority = Authority(tmp_path)
    with FakeOpenAI(tls=authority.context("127.0.0.1")) as fake:
        assert fake.url.startswith("https://")
        config = ModelConfig(**openai_model_entry(fake))
        monkeypatch.delenv("SSL_CERT_FILE", raising=False)
        monkeypatch.delenv("SSL_CERT_DIR", raising=False)
        untrusted = make_backend("corp", config, {})
        try:
            _, err = await stream_error(untrusted, HI)
        finally:
            await untrusted.aclose()
        assert "TLS handshake failed" in str(err) and "CERTIFICATE_VERIFY_FAILED" in str(err)
        assert fake.requests == []  # refused before a byte of the request was sent

        monkeypatch.setenv("SSL_CERT_FILE", str(authority.ca_file))
        fake.script(Reply.text("over tls"))
        trusted = make_backend("corp", config, {})
        try:
            done = completion_of(await collect(trusted, HI))
        finally:
            await trusted.aclose()
        assert done.text == "over tls"


async def test_cancelling_the_consumer_hangs_up_on_the_server(fake_openai: FakeOpenAI,
                                                              backend_for: MakeBackend) -> None:
    fake_openai.script(Reply.hang(after_chunks=2))
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
    assert await fake_openai.wait_for_disconnects_async(1) == 1


# ---- the fake itself (other suites rely on it) ----------------------------------------------------


def test_fake_serves_sync_clients_and_non_streaming_calls(fake_openai: FakeOpenAI) -> None:
    client = openai.OpenAI(base_url=fake_openai.url, api_key="x", max_retries=0)
    try:
        fake_openai.script(Reply.tool_calls(("db_query", {"sql": "select 1"}, "call_1"), text="Checking."))
        r = client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}])
        assert [m.id for m in client.models.list()] == ["fake-model"]
    finally:
        client.close()
    assert r.object == "chat.completion" and r.choices[0].finish_reason == "tool_calls"
    message = r.choices[0].message
    assert message.content == "Checking."
    assert message.tool_calls is not None
    [call] = message.tool_calls
    assert call.id == "call_1" and json.loads(call.function.arguments) == {"sql": "select 1"}
    assert r.usage is not None and r.usage.total_tokens > 0
    [req] = fake_openai.wait_for_requests(1)
    assert req.stream is False and req.json["messages"] == [{"role": "user", "content": "hi"}]


def test_fake_stop_releases_a_hanging_request() -> None:
    fake = FakeOpenAI().start()
    fake.script(Reply.hang())
    client = openai.OpenAI(base_url=fake.url, api_key="x", max_retries=0, timeout=60)
    failures: list[Exception] = []

    def call() -> None:
        try:
            client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}])
        except openai.APIConnectionError as e:
            failures.append(e)

    worker = threading.Thread(target=call)
    worker.start()
    fake.wait_for_requests(1)
    fake.stop()  # must not wait for the hanging reply
    worker.join(10)
    client.close()
    assert not worker.is_alive() and len(failures) == 1


def test_fake_runs_standalone_for_subprocess_and_benchmark_use() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "tests.fakes.openai_server", "--port", "0"],
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()  # printed once it listens
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        with openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=10) as client:
            r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "yo"}])
        assert r.choices[0].message.content == "echo: yo"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(10)
        proc.stdout.close()


@pytest.mark.parametrize("line_end", ["\n", "\r\n", "\r"], ids=["lf", "crlf", "cr"])
async def test_stream_survives_any_sse_line_ending_and_split_network_reads(
        fake_openai: FakeOpenAI, backend_for: MakeBackend, line_end: str) -> None:
    # 5-byte writes split CRLF pairs, "data:" prefixes and the multi-byte characters apart.
    text = "Grüße — 東京 ✓ done"
    fake_openai.script(Reply.tool_calls(Call("db_query", {"sql": "SELECT 'é'"}), text=text)
                       .with_(line_end=line_end, write_bytes=5))
    items = await collect(backend_for(), [Message("user", "q")], [DB_QUERY])
    done = completion_of(items)
    assert "".join(i.text for i in items if isinstance(i, TextDelta)) == text
    assert done.text == text
    assert [(c.name, c.arguments) for c in done.tool_calls] == [("db_query", {"sql": "SELECT 'é'"})]
    assert done.finish_reason == "tool_calls"


async def test_pieces_that_arrive_together_are_passed_on_as_one_delta_per_kind(
        fake_openai: FakeOpenAI, backend_for: MakeBackend) -> None:
    # A fast server's burst: every chunk in one network read. Thinking then text, in order, each
    # merged, so the turn loop and every client stream handle two deltas instead of eight.
    fake_openai.script(Reply.reasoning("Count first, then answer.", then_text="There are 42 rows.",
                                       chunks=4, one_write=True))
    items = await collect(backend_for(), HI)
    done = completion_of(items)
    assert [(type(i).__name__, i.text) for i in items[:-1]] == [
        ("ThinkingDelta", "Count first, then answer."), ("TextDelta", "There are 42 rows.")]
    assert (done.thinking, done.text) == ("Count first, then answer.", "There are 42 rows.")


@pytest.mark.parametrize("one_write", [True, False], ids=["one read", "a read each"])
async def test_an_error_the_server_reports_mid_stream_fails_the_turn_after_the_text_before_it(
        fake_openai: FakeOpenAI, backend_for: MakeBackend, one_write: bool) -> None:
    # Frames: the role chunk, then "Hello ", "there" ...: the error comes after the first text.
    fake_openai.script(Reply.text("Hello there friend", chunks=3, one_write=one_write,
                                  inject=(2, json.dumps({"error": {"message": "overloaded, try later"}}))))
    items, err = await stream_error(backend_for(), HI)
    assert "".join(i.text for i in items if isinstance(i, TextDelta)) == "Hello "
    assert "overloaded, try later" in str(err) and err.retryable and err.cause == "server"


@pytest.mark.parametrize("one_write", [True, False], ids=["one read", "a read each"])
async def test_status_text_among_the_chunks_is_skipped(fake_openai: FakeOpenAI, backend_for: MakeBackend,
                                                       one_write: bool) -> None:
    fake_openai.script(Reply.text("Hello there friend", chunks=3, one_write=one_write,
                                  inject=(2, "queue position 3, please wait")))
    done = completion_of(await collect(backend_for(), HI))
    assert done.text == "Hello there friend" and done.finish_reason == "stop"
