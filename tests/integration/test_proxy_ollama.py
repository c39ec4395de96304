"""The Ollama-compatible surface through the real `ollama` Python client (chat, generate, list,
show, ps, version), against `aiops serve` in a subprocess with the fake model server behind it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import datetime

import httpx
import ollama
import openai
import pytest

from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.support.server import ApiServerFactory, ServeProcess, server_config_dir, start_serve


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as f:
        yield f


@pytest.fixture(scope="module")
def served(fake: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    root = tmp_path_factory.mktemp("ollama-proxy")
    cfg = server_config_dir(root, fake, models={
        "local": {"type": "openai", "model_id": "fake-model", "base_url": fake.url, "timeout": 10},
        "other": {"type": "openai", "model_id": "fake-other", "base_url": fake.url, "timeout": 10},
    }, server={"keepalive_seconds": 0.2})
    proc = start_serve(cfg, root / "data", fake=fake)
    yield proc
    assert proc.stop() == 0


@pytest.fixture
def client(served: ServeProcess) -> Iterator[ollama.Client]:
    with ollama.Client(host=served.url) as c:
        yield c


# ---- discovery ---------------------------------------------------------------------------------------


def test_root_answers_like_ollama(served: ServeProcess) -> None:
    r = httpx.get(served.url + "/")
    assert (r.status_code, r.text) == (200, "Ollama is running")
    h = httpx.head(served.url + "/")
    assert h.status_code == 200


def test_version(client: ollama.Client) -> None:
    version = client._request_raw("GET", "/api/version").json()["version"]  # no public method for it
    assert [int(p) for p in version.split(".")] >= [0, 5, 0]


def test_list_publishes_tagged_models_with_full_objects(client: ollama.Client, served: ServeProcess) -> None:
    models = client.list().models
    assert [m.model for m in models] == ["aiops:latest", "aiops/local:latest", "aiops/other:latest"]
    for m in models:
        assert isinstance(m.modified_at, datetime)
        assert m.digest is not None and len(m.digest) == 64
        assert m.size is not None
        assert m.details is not None and m.details.family == "openai"
    raw = httpx.get(served.url + "/api/tags").json()["models"]
    for entry in raw:
        assert {"name", "model", "modified_at", "size", "digest", "details"} <= set(entry)
        assert entry["name"] == entry["model"]
        assert "." in entry["modified_at"]  # fractional seconds, as Ollama writes them
        assert set(entry["details"]) == {"parent_model", "format", "family", "families", "parameter_size",
                                         "quantization_level"}
        assert all(isinstance(v, str) for k, v in entry["details"].items() if k != "families")


def test_show_accepts_names_with_or_without_latest(client: ollama.Client) -> None:
    for name in ("aiops", "aiops:latest", "aiops/other", "aiops/other:latest"):
        shown = client.show(name)
        assert shown.details is not None and shown.details.family == "openai"
        # As Ollama names them: editors' Ollama providers pick tool mode by "tools" (client_tools
        # "offer" by default), chat UIs offer `think` by "thinking".
        assert shown.capabilities == ["completion", "tools", "thinking"]
        assert shown.modelfile
    assert "fake-other" in str(client.show("aiops/other").modelinfo)


def test_model_names_match_without_regard_to_case(client: ollama.Client, fake: FakeOpenAI) -> None:
    """As Ollama matches them, tag included; the answer names the model as the client did."""
    for name, model_id in (("AIOPS", "fake-model"), ("Aiops:Latest", "fake-model"), ("aiops:LATEST", "fake-model"),
                           ("aiops/LOCAL", "fake-model"), ("AIOPS/Other:LATEST", "fake-other")):
        r = client.chat(model=name, messages=[{"role": "user", "content": f"case {name}"}], stream=False)
        assert (r.model, r.message.content) == (name, f"echo: case {name}")
        assert fake.requests[-1].model == model_id, name
    shown = client.show("AIOPS/OTHER")
    assert shown.details is not None and "fake-other" in str(shown.modelinfo)
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="AIOPS:7B", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 404


def test_ps_lists_the_models(client: ollama.Client) -> None:
    running = client.ps().models
    assert [m.name for m in running] == ["aiops:latest", "aiops/local:latest", "aiops/other:latest"]
    assert all(m.expires_at is not None and m.details is not None for m in running)


def test_unknown_model_is_an_ollama_404(client: ollama.Client, fake: FakeOpenAI) -> None:
    before = len(fake.requests)
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="llama3.2", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 404
    assert "llama3.2" in e.value.error and "not found" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.generate(model="aiops:7b", prompt="hi")
    assert e.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as e:
        client.show("nope")
    assert e.value.status_code == 404
    assert len(fake.requests) == before


def test_errors_have_ollama_shape(served: ServeProcess) -> None:
    for path, body in [("/api/chat", b"{oops"), ("/api/chat", b'{"messages": []}'),
                       ("/api/generate", b'{"model": 3}'), ("/api/show", b"{}")]:
        r = httpx.post(served.url + path, content=body)
        assert r.status_code == 400, (path, body)
        assert isinstance(r.json()["error"], str) and r.json()["error"]


# ---- chat and generate ---------------------------------------------------------------------------------


def test_chat_streams_by_default_and_ends_with_stats(client: ollama.Client, fake: FakeOpenAI) -> None:
    fake.script(Reply.text("The backup finished at 03:12 without errors.", chunks=4, usage=(40, 11)))
    parts = list(client.chat(model="aiops:latest", messages=[{"role": "user", "content": "backup?"}],
                             stream=True))
    assert all(p.model == "aiops:latest" for p in parts)
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p.message.content or "" for p in parts) == "The backup finished at 03:12 without errors."
    last = parts[-1]
    assert last.done_reason == "stop"
    assert (last.prompt_eval_count, last.eval_count) == (40, 11)
    assert last.total_duration and last.total_duration > 0
    assert last.load_duration == 0 and last.eval_duration is not None


def test_chat_without_stream(client: ollama.Client, fake: FakeOpenAI) -> None:
    fake.script(Reply.text("one answer", usage=(3, 2)))
    r = client.chat(model="aiops/other", messages=[{"role": "user", "content": "once"}], stream=False)
    assert fake.requests[-1].model == "fake-other"
    assert r.done and r.done_reason == "stop"
    assert r.message.role == "assistant" and r.message.content == "one answer"
    assert (r.prompt_eval_count, r.eval_count) == (3, 2)


def test_durations_split_waiting_from_generating_with_and_without_stream(client: ollama.Client,
                                                                         fake: FakeOpenAI) -> None:
    """prompt_eval_duration is the wait for the first text, eval_duration the generating after it
    (a client's tokens per second is eval_count / eval_duration), streamed or not. The fake waits
    0.3 s before its first byte and 0.1 s between its four chunks: lower bounds only."""
    for stream in (True, False):
        fake.script(Reply.text("The backup finished at 03:12.", chunks=4, delay=0.3, chunk_delay=0.1,
                               usage=(40, 11)))
        parts = list(client.chat(model="aiops", messages=[{"role": "user", "content": f"backup {stream}?"}],
                                 stream=True)) if stream else [
            client.chat(model="aiops", messages=[{"role": "user", "content": f"backup {stream}?"}], stream=False)]
        last = parts[-1]
        assert last.prompt_eval_duration is not None and last.eval_duration is not None
        assert last.prompt_eval_duration >= 0.3e9, (stream, last)
        assert last.eval_duration >= 0.25e9, (stream, last)
        assert last.total_duration >= last.prompt_eval_duration + last.eval_duration
    # A background task is one plain model call: its time counts as generating, never as 0,
    # streamed or not (its text is sent only once the call is over).
    for stream in (False, True):
        fake.script(Reply.text('{"tags": ["ops"]}', delay=0.2, usage=(50, 4)))
        r = list(client.chat(model="aiops", messages=[{"role": "user", "content": TITLE_TASK}],
                             stream=True))[-1] if stream else client.chat(
            model="aiops", messages=[{"role": "user", "content": TITLE_TASK}], stream=False)
        assert r.eval_count == 4 and r.eval_duration is not None and r.eval_duration >= 0.2e9, (stream, r)


def test_line_separators_in_an_answer_do_not_split_a_streamed_line(client: ollama.Client,
                                                                    fake: FakeOpenAI) -> None:
    """The ollama client splits the stream with httpx's iter_lines, which breaks lines as
    str.splitlines does: at U+2028, U+2029 and U+0085 too, not only at the newline."""
    text = "Disk report:\u2028web-1 is 91% full\u2029web-2 is fine\x85done"
    fake.script(Reply.text(text, chunks=3), Reply.text(text, chunks=3))
    chat = list(client.chat(model="aiops", messages=[{"role": "user", "content": "disk report"}], stream=True))
    assert "".join(p.message.content or "" for p in chat) == text
    generated = list(client.generate(model="aiops", prompt="disk report, generated", stream=True))
    assert "".join(p.response or "" for p in generated) == text


def test_an_image_earlier_in_the_chat_is_a_placeholder_and_only_a_new_one_is_refused(
        client: ollama.Client, fake: FakeOpenAI) -> None:
    png = "iVBORw0KGgo="
    # A real screenshot's size: the chat UI sends it (base64) with every later message too.
    screenshot = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 12_000
    history = [{"role": "user", "content": "what is this graph?", "images": [screenshot]},
               {"role": "assistant", "content": "a disk filling up"}]
    r = client.chat(model="aiops", stream=False, messages=[*history, {"role": "user", "content": "which disk?"}])
    assert r.message.content == "echo: which disk?"
    sent = fake.requests[-1].json["messages"]
    assert {"role": "user", "content": "what is this graph?\n[image omitted: aiops passes on text only]"} in sent
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="aiops", stream=False, messages=[
            *history, {"role": "user", "content": "and this?", "images": [png]}])
    assert e.value.status_code == 400 and "images are not supported" in e.value.error


def test_chat_shows_thinking_only_when_the_request_asks_for_it(client: ollama.Client, fake: FakeOpenAI,
                                                                served: ServeProcess) -> None:
    """`think: true` (or a level): the model's reasoning in `message.thinking`, before the answer,
    streamed or whole. Without `think`, or with `think: false`, no `thinking` key at all, as Ollama
    answers."""
    fake.script(Reply.reasoning("I am pondering deeply", "final answer"),
                Reply.reasoning("pondering once more", "another answer"))
    parts = list(client.chat(model="aiops", messages=[{"role": "user", "content": "THINK b"}], think=True,
                             stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == "I am pondering deeply"
    assert "".join(p.message.content or "" for p in parts) == "final answer"
    kinds = ["thinking" if p.message.thinking else "content" for p in parts if p.message.thinking or p.message.content]
    assert kinds == sorted(kinds, reverse=True)  # all the thinking first
    assert parts[-1].done and parts[-1].message.thinking is None
    r = client.chat(model="aiops", messages=[{"role": "user", "content": "THINK high"}], think="high", stream=False)
    assert (r.message.thinking, r.message.content) == ("pondering once more", "another answer")
    for think in (None, False):
        body: dict = {"model": "aiops", "messages": [{"role": "user", "content": f"THINK quietly {think}"}]}
        if think is not None:
            body["think"] = think
        for stream in (True, False):
            fake.script(Reply.reasoning("I am pondering deeply", "final answer"))
            resp = httpx.post(served.url + "/api/chat", json={**body, "stream": stream}, timeout=10)
            lines = [json.loads(line) for line in resp.text.splitlines() if line]
            assert all("thinking" not in line["message"] for line in lines), (think, stream)
            assert "".join(line["message"]["content"] for line in lines) == "final answer"


def test_generate_shows_thinking_beside_the_response_when_asked(client: ollama.Client, fake: FakeOpenAI) -> None:
    fake.script(*[Reply.reasoning("I am pondering deeply", "final answer")] * 3)
    parts = list(client.generate(model="aiops", prompt="THINK generated", think=True, stream=True))
    assert "".join(p.thinking or "" for p in parts) == "I am pondering deeply"
    assert "".join(p.response or "" for p in parts) == "final answer"
    r = client.generate(model="aiops", prompt="THINK generated whole", think=True, stream=False)
    assert (r.thinking, r.response) == ("I am pondering deeply", "final answer")
    r = client.generate(model="aiops", prompt="THINK generated unasked", stream=False)
    assert (r.thinking, r.response) == (None, "final answer")


def test_think_is_a_boolean_or_a_level(served: ServeProcess, fake: FakeOpenAI) -> None:
    before = len(fake.requests)
    for path, body in [("/api/chat", {"model": "aiops", "think": 1, "messages": [{"role": "user", "content": "hi"}]}),
                       ("/api/generate", {"model": "aiops", "think": ["high"], "prompt": "hi"})]:
        r = httpx.post(served.url + path, json=body)
        assert r.status_code == 400, path
        assert "think" in r.json()["error"]
    assert len(fake.requests) == before


async def test_the_operator_may_withhold_reasoning_and_refuse_client_tools(api_server_factory: ApiServerFactory,
                                                                           fake_openai: FakeOpenAI) -> None:
    """`proxy_reasoning = false`: no client gets the reasoning, asked or not, and /api/show says no
    "thinking"; `client_tools = "refuse"`: no "tools" either."""
    srv = await api_server_factory(server={"proxy_reasoning": False, "client_tools": "refuse"})
    fake_openai.script(*[Reply.reasoning("I am pondering deeply", "final answer")] * 3)
    async with ollama.AsyncClient(host=srv.url) as c:
        assert (await c.show("aiops")).capabilities == ["completion"]
        parts = [p async for p in await c.chat(model="aiops", messages=[{"role": "user", "content": "THINK c"}],
                                               think=True, stream=True)]
        assert [p.message.thinking for p in parts] == [None] * len(parts)
        assert "".join(p.message.content or "" for p in parts) == "final answer"
    async with openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0) as oc:
        chunks = [c async for c in await oc.chat.completions.create(
            model="aiops", stream=True, messages=[{"role": "user", "content": "THINK a"}])]
    assert not any(getattr(c.choices[0].delta, "reasoning_content", None) for c in chunks if c.choices)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "final answer"
    async with httpx.AsyncClient(base_url=srv.url) as h:
        r = await h.post("/api/chat", json={"model": "aiops", "think": True, "stream": False,
                                            "messages": [{"role": "user", "content": "THINK b"}]})
    assert r.json()["message"] == {"role": "assistant", "content": "final answer"}
    # Withheld from clients, kept in the session (the console shows it).
    async with srv.client() as agent:
        answer = [m for m in await agent.history(r.headers["x-aiops-session"]) if m["role"] == "assistant"][-1]
    assert answer["thinking"] == "I am pondering deeply"


def test_stream_is_the_default_on_the_wire(served: ServeProcess) -> None:
    body = {"model": "aiops", "messages": [{"role": "user", "content": "wire check"}]}
    with httpx.stream("POST", served.url + "/api/chat", json=body, timeout=10) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert len(lines) > 1 and lines[-1]["done"] is True
    assert all(line["done"] is False for line in lines[:-1])
    assert "".join(line["message"]["content"] for line in lines) == "echo: wire check"


def test_generate_stream_and_not(client: ollama.Client, fake: FakeOpenAI) -> None:
    parts = list(client.generate(model="aiops", prompt="uptime?", stream=True))
    assert "".join(p.response or "" for p in parts) == "echo: uptime?"
    assert parts[-1].done and parts[-1].done_reason == "stop"
    r = client.generate(model="aiops/local", prompt="load?", system="be brief", stream=False)
    assert r.response == "echo: load?"
    sent = fake.requests[-1].json["messages"]
    assert sent[-1] == {"role": "user", "content": "load?"}


def test_empty_chat_and_prompt_load_the_model(client: ollama.Client, fake: FakeOpenAI) -> None:
    before = len(fake.requests)
    r = client.chat(model="aiops", messages=[])
    assert r.done and r.done_reason == "load"
    g = client.generate(model="aiops", prompt="", keep_alive=0)
    assert g.done and g.done_reason == "unload"
    assert len(fake.requests) == before


def test_any_zero_keep_alive_unloads_and_a_malformed_one_is_a_400(client: ollama.Client, served: ServeProcess,
                                                                    fake: FakeOpenAI) -> None:
    """Ollama reads keep_alive as whole seconds (a number) or a Go duration (a string): any zero
    is the unload probe, a negative is "for ever", and a string Go cannot parse is a 400."""
    before = len(fake.requests)
    assert client.generate(model="aiops", prompt="", keep_alive="0m0s").done_reason == "unload"
    assert client.chat(model="aiops", messages=[], keep_alive="-0s").done_reason == "unload"
    for path, probe in (("/api/generate", {"prompt": ""}), ("/api/chat", {"messages": []})):
        def reply(keep_alive: object, probe: dict[str, object] = probe, path: str = path) -> httpx.Response:
            return httpx.post(served.url + path, json={"model": "aiops", "keep_alive": keep_alive, **probe})

        for keep_alive in (0, 0.5, "0", "-0", "0s", "0h", "0ms", "0us", "0\u00b5s", "0\u03bcs", "0m0s", "0.0s",
                           "-0s", ".0h", "0.s"):
            assert reply(keep_alive).json()["done_reason"] == "unload", (path, keep_alive)
        for keep_alive in (1, -1, "5m", "-1s", "1ns", "0.5s", "1h30m", "0s1ns"):
            assert reply(keep_alive).json()["done_reason"] == "load", (path, keep_alive)
        for keep_alive in ("soon", "", "5", "5 m", "1d", "0x", ".s", "-", "1e3s", "9999999999h"):
            r = reply(keep_alive)
            assert r.status_code == 400, (path, keep_alive)
            assert "keep_alive" in r.json()["error"], (path, keep_alive)
    # Refused on an answer too, as Ollama's decoder does, before any model call.
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="aiops", messages=[{"role": "user", "content": "hi"}], keep_alive="soon")
    assert e.value.status_code == 400 and "keep_alive" in e.value.error
    assert len(fake.requests) == before


async def test_async_client(served: ServeProcess) -> None:
    async with ollama.AsyncClient(host=served.url) as c:
        parts = [p.message.content or "" async for p in await c.chat(
            model="aiops", messages=[{"role": "user", "content": "async ollama"}], stream=True)]
        assert "".join(parts) == "echo: async ollama"
        assert (await c.generate(model="aiops", prompt="async gen", stream=False)).response == "echo: async gen"


def test_model_failure_mid_stream_is_a_final_error_line(client: ollama.Client, fake: FakeOpenAI) -> None:
    fake.script(Reply.drop(after_chunks=4, reply=Reply.text("this reply is cut off by the model server "
                                                            "before it ends", chunks=6)))
    got: list[str] = []
    with pytest.raises(ollama.ResponseError) as e:
        for p in client.chat(model="aiops", messages=[{"role": "user", "content": "cut"}], stream=True):
            got.append(p.message.content or "")
    assert "stream ended unexpectedly" in e.value.error
    assert "".join(got).startswith("this reply")


@pytest.mark.parametrize("failure", ["refused", "cut"])
def test_a_failed_answer_says_so_in_its_text_and_the_chat_goes_on(served: ServeProcess, fake: FakeOpenAI,
                                                                  failure: str) -> None:
    """Open WebUI reads only `message.content` of an Ollama stream and drops `error` lines (QA with
    the real Open WebUI 0.12.4): a failed model call showed as an empty answer, one cut mid-stream
    as a finished one. The failure is said in the text too; sent back as history, that line does
    not fork the chat."""
    fake.script(Reply.error(500, "upstream exploded") if failure == "refused" else
                Reply.drop(after_chunks=3, reply=Reply.text("this reply is cut off before it ends", chunks=6)))
    question = f"a question that fails ({failure})"
    with httpx.Client(base_url=served.url, timeout=30) as http:
        r = http.post("/api/chat", json={"model": "aiops", "messages": [{"role": "user", "content": question}]})
        lines = [json.loads(line) for line in r.text.splitlines() if line.strip()]
        assert r.status_code == 200 and "error" in lines[-1], lines
        shown = "".join(line.get("message", {}).get("content", "") for line in lines[:-1])
        assert "*⛔ the answer failed: " in shown, shown
        assert ("upstream exploded" if failure == "refused" else "stream ended unexpectedly") in shown
        if failure == "cut":
            assert shown.startswith("this reply")
        session = r.headers["X-Aiops-Session"]

        fake.script(Reply.text("second answer"))
        r = http.post("/api/chat", json={"model": "aiops", "stream": False, "messages": [
            {"role": "user", "content": question}, {"role": "assistant", "content": shown},
            {"role": "user", "content": "try again"}]})
        assert r.status_code == 200 and r.json()["message"]["content"] == "second answer", r.text
        assert r.headers["X-Aiops-Session"] == session  # the same chat, not a fork


def test_legacy_v1_api_alias(served: ServeProcess) -> None:
    tags = httpx.get(served.url + "/v1/api/tags").json()
    assert [m["name"] for m in tags["models"]][0] == "aiops:latest"
    r = httpx.post(served.url + "/v1/api/chat", json={"model": "aiops", "stream": False,
                                                      "messages": [{"role": "user", "content": "legacy"}]})
    assert r.json()["message"]["content"] == "echo: legacy"
    assert httpx.post(served.url + "/v1/api/chat", json={"model": "nope"}).json() == {
        "error": 'model "nope" not found; this server has aiops:latest, aiops/local:latest, aiops/other:latest'}


def test_an_unknown_model_is_a_404_whatever_else_the_request_asks(served: ServeProcess) -> None:
    """Ollama finds the model before it looks at what is asked of it (suffix, tools, images)."""
    asks = [("/api/generate", {"model": "nope", "prompt": "x", "suffix": "y"}),
            ("/api/chat", {"model": "nope", "messages": [{"role": "user", "content": "x"}],
                           "tools": [{"type": "function", "function": {"name": "f"}}]}),
            ("/api/chat", {"model": "nope", "messages": [{"role": "user", "content": "x", "images": ["AAAA"]}]})]
    for path, body in asks:
        r = httpx.post(served.url + path, json=body)
        assert r.status_code == 404 and r.json()["error"].startswith('model "nope" not found'), (path, r.text)


def test_a_slow_model_still_gets_the_stream_started(served: ServeProcess, fake: FakeOpenAI) -> None:
    fake.script(Reply.hang())
    body = {"model": "aiops", "messages": [{"role": "user", "content": "slow one"}]}
    with httpx.stream("POST", served.url + "/api/chat", json=body, timeout=10,
                      headers={"X-Aiops-Session": "ollama-slow-start"}) as r:
        assert (r.status_code, r.headers["x-aiops-session"]) == (200, "ollama-slow-start")
        first = json.loads(next(line for line in r.iter_lines() if line))  # a keep-alive line
    assert first["done"] is False and first["message"]["content"] == ""


def test_a_client_that_hangs_up_cancels_the_turn(served: ServeProcess, fake: FakeOpenAI) -> None:
    gone = fake.disconnects
    fake.script(Reply.hang(after_chunks=4, reply=Reply.text(
        "Scanning every table for orphaned rows, this may take a while", chunks=6)))
    body = {"model": "aiops", "messages": [{"role": "user", "content": "scan"}]}
    with httpx.stream("POST", served.url + "/api/chat", json=body, timeout=10,
                      headers={"X-Aiops-Session": "ollama-hangup"}) as r:
        for line in r.iter_lines():
            if line and json.loads(line)["message"]["content"]:
                break  # leaving the block closes the connection mid-answer
    fake.wait_for_disconnects(gone + 1, timeout=10)
    done = httpx.post(served.url + "/api/v1/submit", json={"client_id": "ollama-hangup", "text": "hello?",
                                                           "wait": True, "timeout": 10}, timeout=15).json()
    assert done["status"] == "complete"
    msgs = httpx.get(served.url + "/api/v1/sessions/ollama-hangup").json()["messages"]
    assert [(m["role"], m["status"]) for m in msgs[:3]] == [
        ("user", "complete"), ("assistant", "cancelled"), ("notice", "complete")]


def test_an_answer_cut_at_the_models_output_limit_is_done_reason_length(client: ollama.Client,
                                                                         fake: FakeOpenAI) -> None:
    fake.script(Reply.text("Steps one to", finish_reason="length"), Reply.text("Steps", finish_reason="length"))
    assert client.chat(model="aiops", messages=[{"role": "user", "content": "all steps"}],
                       stream=False).done_reason == "length"
    parts = list(client.generate(model="aiops", prompt="all steps, streamed", stream=True))
    assert parts[-1].done and parts[-1].done_reason == "length"
    assert client.generate(model="aiops", prompt="short", stream=False).done_reason == "stop"


def test_only_an_empty_prompt_is_the_load_probe(served: ServeProcess, fake: FakeOpenAI) -> None:
    """Ollama's own rule: no prompt and no system prompt. Spaces, or a system prompt alone, are a
    turn with no question: a 400 as on /api/chat, not an empty answer."""
    before = len(fake.requests)
    for body in ({"prompt": "   "}, {"prompt": "", "system": "be brief"}, {"system": "be brief"}):
        r = httpx.post(served.url + "/api/generate", json={"model": "aiops", "stream": False, **body})
        assert r.status_code == 400, body
        assert "user message" in r.json()["error"], body
    assert len(fake.requests) == before


def test_completion_engine_requests_are_refused(served: ServeProcess, fake: FakeOpenAI) -> None:
    """An editor's fill-in-the-middle (Continue's autocomplete), a raw prompt or a template would
    otherwise start an agent turn per keystroke and paste its prose into the code."""
    before = len(fake.requests)
    for extra, name in (({"suffix": "    return x"}, "suffix"), ({"raw": True}, "raw"),
                        ({"template": "{{ .Prompt }}"}, "template")):
        r = httpx.post(served.url + "/api/generate",
                       json={"model": "aiops", "prompt": "def f():", "stream": False, **extra})
        assert r.status_code == 400, extra
        assert r.json()["error"].startswith(f"{name} is not supported"), extra
    assert len(fake.requests) == before
    # The empty values older ollama clients send with every request are not a request for any of it.
    r = httpx.post(served.url + "/api/generate", json={"model": "aiops", "prompt": "plain", "stream": False,
                                                       "suffix": "", "raw": False, "template": "",
                                                       "format": "", "context": []})
    assert r.status_code == 200 and r.json()["response"] == "echo: plain"


def test_json_output_is_refused_for_agent_turns(client: ollama.Client, fake: FakeOpenAI) -> None:
    before = len(fake.requests)
    for fmt in ("json", {"type": "object", "properties": {"free": {"type": "integer"}}}):
        with pytest.raises(ollama.ResponseError) as e:
            client.chat(model="aiops", format=fmt, messages=[{"role": "user", "content": "free disk as JSON"}])
        assert e.value.status_code == 400 and "format" in e.value.error and "prose" in e.value.error
        with pytest.raises(ollama.ResponseError) as e:
            client.generate(model="aiops", format=fmt, prompt="free disk as JSON")
        assert e.value.status_code == 400
    assert len(fake.requests) == before
    # A background task is a plain model call whose prompt asks for its own JSON: format is ignored.
    assert client.generate(model="aiops", format="json", prompt=TITLE_TASK).response == f"echo: {TITLE_TASK}"


def test_a_string_where_a_boolean_belongs_is_a_400(served: ServeProcess, fake: FakeOpenAI) -> None:
    before = len(fake.requests)
    for path, body in [("/api/chat", {"model": "aiops", "stream": "yes",
                                      "messages": [{"role": "user", "content": "hi"}]}),
                       ("/api/generate", {"model": "aiops", "stream": "false", "prompt": "hi"})]:
        r = httpx.post(served.url + path, json=body)
        assert r.status_code == 400, path
        assert "stream" in r.json()["error"]
    assert len(fake.requests) == before


TITLE_TASK = ("### Task:\nGenerate 1-3 broad tags categorizing the main themes of the chat history.\n"
              "<chat_history>\nUSER: rotate the logs\n</chat_history>")


def test_background_tasks_report_the_models_real_counts(client: ollama.Client, fake: FakeOpenAI) -> None:
    fake.script(Reply.text('{"tags": ["ops"]}', usage=(52, 6)))
    r = client.generate(model="aiops", prompt=TITLE_TASK, stream=False)
    assert r.response == '{"tags": ["ops"]}'
    assert (r.prompt_eval_count, r.eval_count) == (52, 6)
    fake.script(Reply.text('{"tags": ["ops"]}', usage=(52, 7)))
    parts = list(client.chat(model="aiops", messages=[{"role": "user", "content": TITLE_TASK}], stream=True))
    assert "".join(p.message.content or "" for p in parts) == '{"tags": ["ops"]}'
    assert parts[-1].done and (parts[-1].prompt_eval_count, parts[-1].eval_count) == (52, 7)
    assert parts[-1].done_reason == "stop"
    fake.script(Reply.text('{"tags": ["o', finish_reason="length"))
    assert client.generate(model="aiops", prompt=TITLE_TASK, stream=False).done_reason == "length"


def test_keep_alive_lines_carry_the_time_they_are_sent_and_a_stop_omits_unknown_counts(
        served: ServeProcess, fake: FakeOpenAI) -> None:
    fake.script(Reply.hang())
    parts = []
    with ollama.Client(host=served.url, headers={"X-Aiops-Session": "ollama-ticks"}) as client:
        for p in client.chat(model="aiops", messages=[{"role": "user", "content": "wait for it"}], stream=True):
            parts.append(p)
            if len(parts) == 4:  # keep-alives every 0.2 s while the model says nothing; then stop the turn
                assert httpx.post(served.url + "/api/v1/sessions/ollama-ticks/stop").json()["stopped"] is True
    keepalives = [p for p in parts if not p.done and not p.message.content]
    assert len(keepalives) >= 4
    stamps = [datetime.fromisoformat(p.created_at.replace("Z", "+00:00")) for p in keepalives]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)  # each line stamped when sent
    last = parts[-1]
    assert last.done and last.done_reason == "stop"
    assert "the answer was stopped" in "".join(p.message.content or "" for p in parts)
    assert last.prompt_eval_count is None and last.eval_count is None  # nothing counted: omitted, not zeros


async def test_a_stopped_non_streaming_answer_keeps_its_text_and_says_it_was_stopped(
        served: ServeProcess, fake: FakeOpenAI) -> None:
    full = "Rotating the logs on web-1 first"
    fake.script(Reply.hang(after_chunks=2, reply=Reply.text(full, chunks=4)))
    async with httpx.AsyncClient(base_url=served.url, timeout=15) as h, \
            h.stream("GET", "/api/v1/stream/ollama-partial") as events:
        lines = events.aiter_lines()
        assert await anext(lines) == ": connected"
        async with ollama.AsyncClient(host=served.url, headers={"X-Aiops-Session": "ollama-partial"}) as client:
            answer = asyncio.create_task(client.generate(model="aiops", prompt="rotate logs", stream=False))
            async for line in lines:
                if line == "event: tok":  # the model has begun: stop it mid-answer
                    break
            assert (await h.post("/api/v1/sessions/ollama-partial/stop")).json()["stopped"] is True
            r = await answer
    said, line = r.response.split("\n\n")
    assert said and full.startswith(said) and said != full
    assert line == "*⛔ the answer was stopped*"
    assert r.done and r.done_reason == "stop"


def test_embeddings_and_model_management_say_aiops_does_not_serve_them(client: ollama.Client) -> None:
    """Not a generic 'no route': the ollama client shows the reason it is given."""
    calls = [("embeddings", lambda: client.embed(model="aiops", input="hello")),
             ("embeddings", lambda: client.embeddings(model="aiops", prompt="hello")),
             ("model downloads", lambda: client.pull("llama3")),
             ("model deletion", lambda: client.delete("aiops"))]
    for what, call in calls:
        with pytest.raises(ollama.ResponseError) as e:
            call()
        assert f"aiops does not serve {what}" in e.value.error and e.value.status_code == 501
