"""A model server that misbehaves (issue 20, items 3 and 8): one endless line, an endless answer, a
429 with Retry-After, a token every few seconds. The real openai SDK against FakeOpenAI over a real
socket; the server's own health must stay responsive throughout."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from aiops.config import ModelConfig
from aiops.engine.backends import ModelError, make_backend
from aiops.engine.backends.openai_backend import OpenAIBackend
from aiops.engine.types import Completion, Message, StreamItem, TextDelta
from tests.fakes.fixtures import openai_model_entry
from tests.fakes.openai_server import Call, FakeOpenAI, Reply
from tests.support.server import ApiServerFactory

MakeBackend = Callable[..., OpenAIBackend]
MiB = 1024 * 1024


@pytest.fixture
async def backend_for(fake_openai: FakeOpenAI) -> AsyncIterator[MakeBackend]:
    made: list[OpenAIBackend] = []

    def make(**overrides: Any) -> OpenAIBackend:
        backend = make_backend("local", ModelConfig(**{**openai_model_entry(fake_openai), **overrides}), {})
        assert isinstance(backend, OpenAIBackend)
        made.append(backend)
        return backend

    yield make
    for b in made:
        await b.aclose()


async def collect(backend: OpenAIBackend) -> list[StreamItem]:
    return [item async for item in backend.stream([Message("user", "hi")], [])]


async def test_a_line_longer_than_the_cap_ends_the_answer_with_a_clear_error(backend_for, fake_openai):
    # 1 MiB of answer in one `data:` line, arriving in 4 KiB reads; the cap is 256 KiB.
    fake_openai.script(Reply(long_line_bytes=MiB, write_bytes=4096, write_pause=0))
    backend = backend_for(max_line_bytes=256 * 1024)
    with pytest.raises(ModelError) as caught:
        await collect(backend)
    assert "longer than 262144 bytes" in str(caught.value)
    assert "max_line_bytes in models.toml" in str(caught.value)
    assert caught.value.discard_partial


async def test_lines_split_across_reads_still_arrive_whole(backend_for, fake_openai):
    # Every line break form, each frame cut into 3-byte reads: a CRLF pair lands in two reads.
    for line_end in ("\n", "\r\n", "\r"):
        fake_openai.script(Reply.text("héllo wörld, " * 20, chunks=5, write_bytes=3, write_pause=0,
                                      line_end=line_end))
        items = await collect(backend_for(max_line_bytes=4096))
        completion = items[-1]
        assert isinstance(completion, Completion)
        assert completion.text == "héllo wörld, " * 20, line_end
        assert "".join(i.text for i in items if isinstance(i, TextDelta)) == completion.text


async def test_an_answer_beyond_max_answer_chars_is_cut_off(backend_for, fake_openai):
    fake_openai.script(Reply.text("y" * 5000, chunks=50))
    backend = backend_for(max_answer_chars=1000)
    with pytest.raises(ModelError) as caught:
        await collect(backend)
    assert "beyond 1000 characters" in str(caught.value) and "max_answer_chars" in str(caught.value)


@pytest.mark.parametrize("reply", [
    Reply.reasoning("t" * 5000, then_text="short", chunks=50),
    Reply.tool_calls(Call("db_query", {"sql": "SELECT '" + "z" * 5000 + "'"}), arg_chunks=50),
], ids=["thinking", "call arguments"])
async def test_thinking_and_call_arguments_count_toward_max_answer_chars(backend_for, fake_openai, reply):
    fake_openai.script(reply)
    with pytest.raises(ModelError) as caught:
        await collect(backend_for(max_answer_chars=1000))
    assert "beyond 1000 characters" in str(caught.value)


async def test_a_429_is_retried_after_its_retry_after_within_the_budget(backend_for, fake_openai):
    fake_openai.script(Reply.error(429, "slow down", headers=(("Retry-After", "0.2"),)),
                       Reply.text("answered after the wait"))
    items = await collect(backend_for(rate_limit_retry_seconds=5))
    completion = items[-1]
    assert isinstance(completion, Completion) and completion.text == "answered after the wait"
    first, second = fake_openai.requests
    assert second.at - first.at >= 0.2  # it waited as asked before asking again


async def test_a_429_asking_beyond_the_budget_fails_at_once_and_says_why(backend_for, fake_openai):
    fake_openai.script(Reply.error(429, "slow down", headers=(("Retry-After", "120"),)))
    with pytest.raises(ModelError) as caught:
        await collect(backend_for(rate_limit_retry_seconds=30))
    text = str(caught.value)
    assert "HTTP 429: slow down" in text
    assert "asked to wait 120 s, beyond the retry budget of 30 s" in text
    assert "rate_limit_retry_seconds in models.toml" in text
    assert len(fake_openai.requests) == 1


async def test_a_429_without_retry_after_fails_clearly(backend_for, fake_openai):
    fake_openai.script(Reply.error(429, "quota"))
    with pytest.raises(ModelError) as caught:
        await collect(backend_for())
    assert "not retried: it named no Retry-After" in str(caught.value)


async def _health_while(url: str, stop: asyncio.Event) -> list[int]:
    """The status of each health request made until `stop` is set, one after another."""
    statuses: list[int] = []
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            async with session.get(url + "/api/v1/health") as resp:
                await resp.read()
                statuses.append(resp.status)
            await asyncio.sleep(0.01)  # a steady prober, not a synchronisation
    return statuses


async def test_health_answers_while_a_long_line_streams_in(api_server_factory: ApiServerFactory,
                                                           fake_openai: FakeOpenAI):
    # One 50 MB line used to hold the event loop for a minute. Here 12 MiB arrive in 8 KiB writes;
    # the default cap (8 MiB) ends the answer. The line is held at the fake once 4 MiB of it are
    # written (what the socket buffers do not hold, the server has read): with a line partly in,
    # the server answers, and it answers throughout. How fast is for the benchmarks, not a test.
    srv = await api_server_factory(models={"local": openai_model_entry(fake_openai)})
    fake_openai.script(Reply(long_line_bytes=12 * MiB, write_bytes=8192, write_pause=0, hold_after=512))
    stop = asyncio.Event()
    prober = asyncio.create_task(_health_while(srv.url, stop))
    try:
        turn = await srv.engine.submit("api-long-line", "hi", kind="api")
        await fake_openai.wait_for_held_async(1)
        async with aiohttp.ClientSession() as session:
            for _ in range(3):
                async with asyncio.timeout(30), session.get(srv.url + "/api/v1/health") as resp:
                    assert resp.status == 200 and (await resp.json())["status"] == "ok"
        assert not turn.done
        fake_openai.release()
        result = await turn.wait(120)
    except BaseException:
        prober.cancel()
        raise
    stop.set()
    statuses = await prober
    assert result.status == "error" and "max_line_bytes" in result.error["message"]
    assert statuses and set(statuses) == {200}
    # The runaway answer is not kept: nothing of it goes back to the model as context.
    history = await srv.engine.history("api-long-line")
    assert not any(m.role == "assistant" for m in history)
    assert any(m.role == "error" and "max_line_bytes" in m.content for m in history)


async def test_a_turn_longer_than_max_turn_seconds_is_ended_and_says_so(api_server_factory: ApiServerFactory,
                                                                       fake_openai: FakeOpenAI):
    # A model that keeps sending (a token every 0.3 s) never trips the silence timeout; the turn's
    # own limit ends it.
    srv = await api_server_factory(extra_files={"limits.toml": "max_turn_seconds = 1\n"})
    fake_openai.script(Reply.text("tick " * 40, chunks=40, chunk_delay=0.3))
    sub = srv.engine.bus.subscribe()
    turn = await srv.engine.submit("api-slow", "hi", kind="api")
    result = await turn.wait(30)
    assert result.status == "error"
    assert result.error == {"code": "turn_time_limit",
                            "message": "the turn ran for 1 s, its limit (max_turn_seconds in limits.toml), "
                                       "and was ended"}
    names = []
    async with asyncio.timeout(5):
        async for ev in sub:
            names.append(ev.name)
            if ev.name == "done":
                break
    assert "error" in names
    # The session still works.
    fake_openai.script(Reply.text("fine"))
    again = await srv.engine.submit("api-slow", "again", kind="api")
    assert (await again.wait(30)).text == "fine"
