"""Bad input over raw HTTP: each gets a clear error in the shape of its surface, and the server
keeps serving (every test ends with a normal request)."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
import openai
import pytest

from aiops.integrations.server.auth import BindRefused
from aiops.integrations.server.context import STATE_KEY
from aiops.integrations.server.run import start_server
from tests.support.server import (
    ApiServer,
    ApiServerFactory,
    ServeFactory,
    Tokens,
    _healthy,
    run_serve,
    server_config_dir,
    start_serve,
)


async def still_serving(srv: ApiServer, headers: dict[str, str] | None = None) -> None:
    """A normal request after the bad one: a full turn on the fake model."""
    async with aiohttp.ClientSession(headers=headers) as http, http.post(
            srv.url + "/api/v1/submit", json={"text": "still there?", "wait": True}) as r:
        assert r.status == 200, await r.text()
        body = await r.json()
    assert (body["status"], body["text"]) == ("complete", "echo: still there?")


async def call(srv: ApiServer, method: str, path: str, *, data: Any = None, json: Any = None,
               headers: dict[str, str] | None = None) -> tuple[int, Any, aiohttp.ClientResponse]:
    async with aiohttp.ClientSession() as http, http.request(method, srv.url + path, data=data, json=json,
                                                             headers=headers) as r:
        body = await r.json(content_type=None)
        return r.status, body, r


def our_error(body: Any) -> tuple[str, str]:
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    return body["error"]["code"], body["error"]["message"]


# ---- malformed JSON and wrong types -----------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "expect"), [
    (b'{"text": "hi"', "malformed JSON body"),
    (b"{bad json}", "malformed JSON body: Expecting property name"),
    (b'{"text": "hi', "malformed JSON body: Unterminated string starting at line 1 column 10"),
    (b"", "body is empty"),
    (b"\xff\xfe{}", "malformed JSON body"),
    (b'["text"]', "must be a JSON object, not an array"),  # JSON's names, not Python's
    (b'"hi"', "must be a JSON object, not a string"),
    (b"null", "must be a JSON object, not null"),
    (b"3.5", "must be a JSON object, not a number"),
    (b"true", "must be a JSON object, not a boolean"),
    # Valid JSON that Python's parser refuses: each was a 500.
    pytest.param(b'{"text": "hi", "timeout": ' + b"9" * 5000 + b"}", "a number has more than 4300 digits",
                 id="5000-digit-number"),
    (b'{"text": "hi", "timeout": NaN}', "NaN is not JSON"),
    (b'{"text": "hi", "timeout": -Infinity}', "-Infinity is not JSON"),
    pytest.param(b'{"text": "hi", "x": ' + b"[" * 700 + rb'"\ud800"' + b"]" * 700 + b"}", "unpaired UTF-16 surrogate",
                 id="deep-lone-surrogate"),
    pytest.param(b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply", id="deep-nesting"),
    # Over a MiB: parsed on a worker thread, with the same answers.
    pytest.param(b'{"text": "' + b"x" * (1 << 21) + b'", "timeout": NaN}', "NaN is not JSON", id="2MiB-NaN"),
    pytest.param(b'{"text": "' + b"x" * (1 << 21) + b'", "x": ' + b"[" * 700 + rb'"\ud800"' + b"]" * 700 + b"}",
                 "unpaired UTF-16 surrogate", id="2MiB-lone-surrogate"),
    pytest.param(b'{"text": "' + b"x" * (1 << 21) + b'"', "malformed JSON body: Expecting ',' delimiter", id="2MiB-cut"),
])
async def test_malformed_json_is_a_400_in_our_shape(api_server: ApiServer, raw: bytes, expect: str) -> None:
    status, body, _ = await call(api_server, "POST", "/api/v1/submit", data=raw,
                                 headers={"Content-Type": "application/json"})
    code, message = our_error(body)
    assert status == 400 and code in ("invalid_json", "invalid_request")
    assert expect in message
    await still_serving(api_server)



async def test_an_unpaired_surrogate_escape_is_a_400_on_every_surface_and_leaves_no_session(
        api_server: ApiServer) -> None:
    """`"\\ud800"` is valid JSON but not valid Unicode: nothing can store or hash it."""
    lone = r"lone \ud800 x"
    cases = [
        ("/api/v1/submit", f'{{"text": "{lone}", "client_id": "api-sur"}}', {}),
        ("/v1/chat/completions", f'{{"model": "aiops", "messages": [{{"role": "user", "content": "{lone}"}}]}}',
         {"X-Aiops-Session": "sur-v1"}),
        ("/api/chat", f'{{"model": "aiops", "stream": false, "messages": [{{"role": "user", "content": "{lone}"}}]}}',
         {"X-Aiops-Session": "sur-ollama"}),
    ]
    for path, raw, headers in cases:
        status, body, _ = await call(api_server, "POST", path, data=raw.encode(),
                                     headers={"Content-Type": "application/json", **headers})
        err = body["error"]
        message = err if isinstance(err, str) else err["message"]
        assert status == 400 and "unpaired UTF-16 surrogate" in message, (path, body)
    status, body, _ = await call(api_server, "GET", "/api/v1/sessions")
    assert status == 200 and body["sessions"] == []
    # A pair is one character (U+1F600), as JSON means it.
    status, body, _ = await call(api_server, "POST", "/api/v1/submit",
                                 data=rb'{"text": "smile \ud83d\ude00", "wait": true}',
                                 headers={"Content-Type": "application/json"})
    assert (status, body["text"]) == (200, "echo: smile \U0001f600")

@pytest.mark.parametrize(("payload", "field", "why"), [
    ({"text": 5}, "text", "valid string"),
    ({}, "text", "required field is missing"),
    ({"text": ""}, "text", "at least 1 character"),
    ({"text": "hi", "wait": "yes"}, "wait", "valid boolean"),
    ({"text": "hi", "wait": 1}, "wait", "valid boolean"),
    ({"text": "hi", "timeout": "10"}, "timeout", "valid number"),
    ({"text": "hi", "timeout": -1}, "timeout", "greater than 0"),
    ({"text": "hi", "client_id": 7}, "client_id", "valid string"),
    ({"text": "hi", "client_id": "a b/c"}, "client_id", "match pattern"),
    ({"text": "hi", "model": ["x"]}, "model", "valid string"),
    ({"text": "hi", "stream": True}, "stream", "unknown field"),
])
async def test_wrong_types_are_a_400_naming_the_field(api_server: ApiServer, payload: dict[str, Any],
                                                      field: str, why: str) -> None:
    status, body, _ = await call(api_server, "POST", "/api/v1/submit", json=payload)
    code, message = our_error(body)
    assert (status, code) == (400, "invalid_request")
    assert f"{field}: " in message and why in message, message
    await still_serving(api_server)


@pytest.mark.parametrize(("payload", "field"), [
    ({"decision": "maybe"}, "decision"),
    ({"decision": "approve", "scope": "forever"}, "scope"),
    ({}, "decision"),
])
async def test_a_bad_gate_decision_is_a_400_naming_the_field(api_server: ApiServer, payload: dict[str, Any],
                                                             field: str) -> None:
    status, body, _ = await call(api_server, "POST", "/api/v1/gates/g123", json=payload)
    code, message = our_error(body)
    assert (status, code) == (400, "invalid_request") and f"{field}: " in message
    await still_serving(api_server)


@pytest.mark.parametrize(("query", "field"), [
    ("limit=0", "limit"), ("limit=abc", "limit"), ("before=-3", "before"), ("page=2", "page"),
    ("before=9223372036854775808", "before"),  # past SQLite's integers: was a 500
])
async def test_bad_query_parameters_are_a_400_naming_them(api_server: ApiServer, query: str, field: str) -> None:
    await still_serving(api_server)
    sessions = (await call(api_server, "GET", "/api/v1/sessions"))[1]["sessions"]
    status, body, _ = await call(api_server, "GET", f"/api/v1/sessions/{sessions[0]['client_id']}?{query}")
    code, message = our_error(body)
    assert (status, code) == (400, "invalid_request") and f"{field}: " in message
    status, body, _ = await call(api_server, "GET", "/api/v1/sessions?kind=robot")
    assert status == 400 and "kind: " in our_error(body)[1]
    status, body, _ = await call(api_server, "GET", "/api/v1/sessions?offset=640395213450840615835777630208")
    assert status == 400 and "offset: " in our_error(body)[1]
    status, body, _ = await call(api_server, "GET", "/api/v1/sessions?offset=9223372036854775807")
    assert (status, body) == (200, {"sessions": []})  # the largest offset SQLite takes


@pytest.mark.parametrize(("before", "why"), [
    ("1732800000.5", "expected `<updated_at>,<client_id>`"),
    ("1732800000.5,", "expected `<updated_at>,<client_id>`"),
    ("soon,api-a", "updated_at 'soon' is not a number"),
    ("nan,api-a", "updated_at 'nan' is not a finite number"),
    ("x" * 201, "at most 200 characters"),
])
async def test_a_malformed_sessions_cursor_is_a_400_saying_why(api_server: ApiServer, before: str, why: str) -> None:
    status, body, _ = await call(api_server, "GET", "/api/v1/sessions?" + urlencode({"before": before}))
    code, message = our_error(body)
    assert (status, code) == (400, "invalid_request") and message.startswith("invalid request: before: "), message
    assert why in message, message
    status, body, _ = await call(api_server, "GET", "/api/v1/sessions?" + urlencode({"before": "1732800000.5,api-a"}))
    assert (status, body) == (200, {"sessions": []})


async def test_submitting_to_an_unknown_shorthand_id_is_404(api_server: ApiServer) -> None:
    status, body, _ = await call(api_server, "POST", "/api/v1/submit", json={"text": "hi", "client_id": "4242"})
    assert (status, our_error(body)[0]) == (404, "not_found")
    await still_serving(api_server)


# ---- unknown routes and methods ---------------------------------------------------------------------------


async def test_unknown_routes_answer_404_in_the_shape_of_their_surface(api_server: ApiServer) -> None:
    status, body, _ = await call(api_server, "GET", "/api/v1/nope")
    assert status == 404 and our_error(body) == ("not_found", "no route GET /api/v1/nope")
    status, body, _ = await call(api_server, "GET", "/nowhere")
    assert status == 404 and our_error(body)[0] == "not_found"
    status, body, _ = await call(api_server, "GET", "/v1/nope")
    assert status == 404
    assert body["error"]["type"] == "invalid_request_error" and "/v1/nope" in body["error"]["message"]
    assert set(body["error"]) == {"message", "type", "param", "code"}
    status, body, _ = await call(api_server, "POST", "/api/nope", json={})
    assert status == 404 and body == {"error": "no route POST /api/nope"}
    await still_serving(api_server)



@pytest.mark.parametrize(("content", "expect"), [
    (5, ("messages.0.content", "expected a string or an array, not a number")),
    ([{"type": "text", "text": 5}], ("messages.0.content.0.text", "Input should be a valid string")),
    ([7], ("messages.0.content.0", "expected an object, not a number")),
])
async def test_a_field_of_several_types_is_named_as_the_client_wrote_it(api_server: ApiServer, content: Any,
                                                                        expect: tuple[str, str]) -> None:
    """Not pydantic's names for the union's members ("content.list[_Part]", "instance of _Part"):
    the field as the client sent it, and what it may be."""
    status, body, _ = await call(api_server, "POST", "/v1/chat/completions",
                                 json={"model": "aiops", "messages": [{"role": "user", "content": content}]})
    assert status == 400
    assert (body["error"]["param"], body["error"]["message"]) == (expect[0], f"invalid request: {expect[0]}: {expect[1]}")
    await still_serving(api_server)


async def test_an_unknown_field_whose_name_looks_like_a_type_is_still_an_unknown_field(api_server: ApiServer) -> None:
    """A client's field name ("Text", "Model") is not a union member's name (review: it read
    "body: expected an object, not a string")."""
    status, body, _ = await call(api_server, "POST", "/api/v1/submit",
                                 json={"text": "hi", "Text": "hi"})
    assert status == 400, body
    assert body["error"]["message"] == "invalid request: Text: unknown field", body
    await still_serving(api_server)


async def test_openai_apis_not_served_say_what_to_use_instead(api_server: ApiServer) -> None:
    """The Responses API (newer SDKs' agents try it first), legacy completions, embeddings: a 501
    in OpenAI's shape naming Chat Completions, not a bare 'no route'; the real SDK shows it."""
    client = openai.AsyncOpenAI(base_url=api_server.url + "/v1", api_key="x", max_retries=0)
    async with client:
        with pytest.raises(openai.APIStatusError) as refused:
            await client.responses.create(model="aiops", input="hi")
        with pytest.raises(openai.APIStatusError) as embeddings:
            await client.embeddings.create(model="aiops", input="hi")
    assert refused.value.status_code == embeddings.value.status_code == 501
    assert "Responses API" in refused.value.message and "/v1/chat/completions" in refused.value.message
    assert "embeddings" in embeddings.value.message
    for method, path in (("POST", "/v1/completions"), ("POST", "/v1/audio/transcriptions"), ("GET", "/responses")):
        status, body, _ = await call(api_server, method, path, json={})
        assert status == 501 and body["error"]["code"] == "not_implemented", (path, body)
    await still_serving(api_server)


async def test_a_doubled_or_trailing_slash_reaches_its_route(api_server: ApiServer) -> None:
    """A client whose base URL ends in "/" joins ".../v1//chat/completions"; another adds a
    trailing slash. Both are sent on with a 308, which keeps the method and the body."""
    body = {"model": "aiops", "messages": [{"role": "user", "content": "slashes"}]}
    async with aiohttp.ClientSession() as http:
        async with http.post(api_server.url + "/v1//chat/completions", json=body, allow_redirects=False) as r:
            assert (r.status, r.headers["Location"]) == (308, "/v1/chat/completions")
        for path in ("/v1//chat/completions", "/v1/chat/completions/"):
            async with http.post(api_server.url + path, json=body) as r:  # aiohttp follows a 308 with the body
                assert r.status == 200, await r.text()
                assert (await r.json())["choices"][0]["message"]["content"] == "echo: slashes"
        async with http.get(api_server.url + "/v1/models/") as r:
            assert r.status == 200 and any(m["id"] == "aiops" for m in (await r.json())["data"])
    status, _, _ = await call(api_server, "GET", "/v1/nope/")  # nothing there either way: still a 404
    assert status == 404
    await still_serving(api_server)


async def test_a_stream_for_an_id_no_session_can_have_is_a_400_not_a_wait(api_server: ApiServer) -> None:
    for bad in ("-bad", "a%20b", "x" * 300):
        async with asyncio.timeout(5):  # not a stream that waits for good
            status, body, _ = await call(api_server, "GET", f"/api/v1/stream/{bad}")
        assert status == 400 and our_error(body)[0] == "invalid_request", (bad, body)
        assert "not a valid session id" in our_error(body)[1]
    await still_serving(api_server)

async def test_a_wrong_method_is_405_with_allow(api_server: ApiServer) -> None:
    status, body, resp = await call(api_server, "DELETE", "/api/v1/health")
    assert (status, our_error(body)[0]) == (405, "method_not_allowed")
    assert resp.headers["Allow"] == "GET,HEAD"
    status, body, _ = await call(api_server, "GET", "/api/v1/submit")
    assert status == 405 and "POST" in our_error(body)[1]
    await still_serving(api_server)


# ---- body size and body timeout ---------------------------------------------------------------------------


async def test_an_oversized_body_is_413_and_the_server_keeps_serving(api_server_factory: ApiServerFactory) -> None:
    srv = await api_server_factory(server={"max_body_bytes": 2048})
    big = {"text": "x" * 5000}
    status, body, _ = await call(srv, "POST", "/api/v1/submit", json=big)  # with Content-Length
    code, message = our_error(body)
    assert (status, code) == (413, "payload_too_large") and "2048" in message

    async def chunks() -> Any:  # no Content-Length: the limit applies while reading
        for _ in range(10):
            yield b"x" * 1000

    status, body, _ = await call(srv, "POST", "/api/v1/submit", data=chunks(),
                                 headers={"Content-Type": "application/json"})
    assert (status, our_error(body)[0]) == (413, "payload_too_large")

    status, body, _ = await call(srv, "POST", "/v1/chat/completions", json=big)
    assert status == 413 and body["error"]["type"] == "invalid_request_error"
    status, body, _ = await call(srv, "POST", "/api/chat", json=big)
    assert status == 413 and isinstance(body["error"], str) and "too large" in body["error"]

    # The answer says `Connection: close` and the server means it: a request sent after the
    # oversized one on the same connection gets nothing.
    for framing in (b"Content-Length: 3000\r\n", b"Transfer-Encoding: chunked\r\n"):
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.handle.port)
        try:
            body_part = b"x" * 3000 if b"Length" in framing else b"bb8\r\n" + b"x" * 3000 + b"\r\n0\r\n\r\n"
            writer.write(b"POST /api/v1/submit HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                         + framing + b"\r\n" + body_part)
            writer.write(b"GET /api/v1/health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            async with asyncio.timeout(10):
                answer = await reader.read()  # to the end: the server closes
        finally:
            writer.close()
        assert answer.startswith(b"HTTP/1.1 413") and b"Connection: close" in answer, answer[:300]
        assert answer.count(b"HTTP/1.1 ") == 1, answer
    await still_serving(srv)


async def test_a_body_that_never_arrives_is_408(api_server_factory: ApiServerFactory) -> None:
    srv = await api_server_factory(server={"request_timeout": 0.2})
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.handle.port)
    try:
        writer.write(b"POST /api/v1/submit HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"text\"")
        await writer.drain()
        async with asyncio.timeout(10):
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408"), head
            rest = await reader.read(4096)
        assert b"request_timeout" in rest
    finally:
        writer.close()
    await still_serving(srv)



async def test_headers_that_never_finish_get_the_connection_closed(api_server_factory: ApiServerFactory) -> None:
    """No handler runs before the headers are complete; without a limit, a client sending half a
    request (one per connection, unauthenticated) would hold its connection open for good."""
    srv = await api_server_factory(server={"request_timeout": 0.5})
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.handle.port)
    try:
        writer.write(b"POST /api/v1/submit HTTP/1.1\r\nHost: localhost\r\nContent-Ty")
        await writer.drain()
        async with asyncio.timeout(10):
            assert await reader.read(4096) == b""  # closed by the server
    finally:
        writer.close()
    await still_serving(srv)


# ---- tokens -----------------------------------------------------------------------------------------------


async def test_missing_or_wrong_tokens_are_401_and_health_stays_public(
        api_server_factory: ApiServerFactory, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    tokens = Tokens.make(ops="operator", bot="client")
    srv = await api_server_factory(tokens=tokens)

    status, body, resp = await call(srv, "GET", "/api/v1/sessions")
    assert (status, our_error(body)[0]) == (401, "unauthorized")
    assert resp.headers["WWW-Authenticate"] == 'Bearer realm="aiops"'
    assert "Authorization: Bearer" in our_error(body)[1]
    for bad in ("Bearer nope", "Bearer " + tokens.secrets["ops"] + "x", "Basic " + tokens.secrets["ops"],
                tokens.secrets["ops"], "Bearer "):
        status, body, resp = await call(srv, "POST", "/api/v1/submit", json={"text": "hi"},
                                        headers={"Authorization": bad})
        assert status == 401, bad
        assert resp.headers["WWW-Authenticate"].startswith('Bearer realm="aiops"')

    status, body, _ = await call(srv, "GET", "/v1/models")  # OpenAI's shape on /v1
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    status, body, _ = await call(srv, "GET", "/api/tags")  # Ollama's on /api
    assert status == 401 and isinstance(body["error"], str)
    status, body, _ = await call(srv, "GET", "/api/v1/nope")  # no route map for strangers
    assert status == 401

    status, body, _ = await call(srv, "GET", "/api/v1/health")
    assert status == 200 and body["role"] is None
    async with aiohttp.ClientSession() as http:
        async with http.get(srv.url + "/") as r:
            assert r.status != 401  # Ollama's probe is public
        async with http.head(srv.url + "/api/v1/health") as r:  # an uptime probe's HEAD is public too
            assert (r.status, await r.read()) == (200, b"")
            assert r.headers["Content-Type"].startswith("application/json")
        async with http.head(srv.url + "/api/v1/sessions") as r:  # ...and the rest still need a token
            assert r.status == 401
        async with http.head(srv.url + "/api/v1/sessions", headers=tokens.header("bot")) as r:
            assert r.status == 200
        async with http.head(srv.url + "/api/v1/stream/s1", headers=tokens.header("bot")) as r:
            assert r.status == 405  # a stream has no end for HEAD to stop at

    await still_serving(srv, tokens.header("bot"))
    await still_serving(srv, {"Authorization": "bearer " + tokens.secrets["ops"]})  # scheme is case-blind
    for secret in tokens.secrets.values():
        assert secret not in caplog.text


async def test_an_authorization_header_that_is_not_utf8_is_a_401_and_health_stays_up(
        api_server_factory: ApiServerFactory, caplog: pytest.LogCaptureFixture) -> None:
    """A byte that is not UTF-8 in the header (aiohttp keeps it as a surrogate) was a 500 with a
    traceback on every route, the public health probe included."""
    caplog.set_level(logging.ERROR)
    tokens = Tokens.make(ops="operator")
    srv = await api_server_factory(tokens=tokens)

    async def raw(path: str, auth: bytes) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.handle.port)
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n".encode()
                         + b"Authorization: " + auth + b"\r\n\r\n")
            async with asyncio.timeout(10):
                return (await reader.read()).split(b"\r\n", 1)[0]
        finally:
            writer.close()

    ops = tokens.secrets["ops"].encode()
    for path in ("/api/v1/sessions", "/v1/models", "/api/tags"):
        assert await raw(path, b"Bearer \xff" + ops) == b"HTTP/1.1 401 Unauthorized", path
        assert await raw(path, b"Bearer " + ops + b"\xfe") == b"HTTP/1.1 401 Unauthorized", path
    assert await raw("/api/v1/health", b"Bearer \xff") == b"HTTP/1.1 200 OK"
    assert await raw("/api/v1/sessions", b"Bearer " + ops) == b"HTTP/1.1 200 OK"
    # The server's records only: asyncio may log a client another test left open meanwhile.
    assert [r.getMessage() for r in caplog.records if r.name.startswith(("aiops", "aiohttp"))] == []


async def test_an_unset_token_variable_means_no_token_and_is_warned_by_name_only_beside_a_set_one(
        api_server_factory: ApiServerFactory, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """As shipped (one operator token, its variable unset) a loopback server runs open and says so
    in its ready line: a warning on every start told newcomers something was wrong. A variable left
    unset beside one that is set is a half-made set-up: that is warned about, by name."""
    caplog.set_level(logging.WARNING)
    monkeypatch.setenv("SET_TOKEN_FOR_AIOPS_TEST", "t" * 32)  # (AIOPS_* are kept from the engine)
    half = await api_server_factory(extra_files={"aiops.toml": (
        '[server]\nhost = "127.0.0.1"\nport = 0\n'
        '[auth.tokens.ops]\ntoken_env = "AIOPS_TEST_HALF_SET"\nrole = "operator"\n'
        '[auth.tokens.bot]\ntoken_env = "SET_TOKEN_FOR_AIOPS_TEST"\nrole = "client"\n')})
    assert "AIOPS_TEST_HALF_SET" in caplog.text and "SET_TOKEN_FOR_AIOPS_TEST" not in caplog.text
    assert half.handle.token_count == 1
    caplog.clear()
    srv = await api_server_factory(extra_files={"aiops.toml": (
        '[server]\nhost = "127.0.0.1"\nport = 0\n'
        '[auth.tokens.ops]\ntoken_env = "AIOPS_TEST_NEVER_SET"\nrole = "operator"\n')})
    assert "AIOPS_TEST_NEVER_SET" not in caplog.text
    status, body, _ = await call(srv, "GET", "/api/v1/health")
    assert body["role"] == "operator"  # no token configured: loopback callers are operators
    await still_serving(srv)
    with pytest.raises(BindRefused, match="AIOPS_TEST_NEVER_SET"):
        await start_server(srv.engine, srv.cfg, host="0.0.0.0", port=0)
    await still_serving(srv)


def _ipv6_loopback() -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="this machine has no IPv6 loopback")
async def test_an_ipv6_host_may_be_written_in_brackets(api_server: ApiServer) -> None:
    """`--host '[::1]'` (as in a URL) failed with "Name or service not known"."""
    handle = await start_server(api_server.engine, api_server.cfg, host="[::1]", port=0)
    try:
        assert handle.url.startswith("http://[::1]:")
        async with aiohttp.ClientSession() as http, http.get(handle.url + "/api/v1/health") as r:
            assert r.status == 200 and (await r.json())["role"] == "operator"  # loopback, no tokens
    finally:
        await handle.stop()


def _soft_open_files(pid: int) -> int:
    line = next(x for x in Path(f"/proc/{pid}/limits").read_text().splitlines() if x.startswith("Max open files"))
    return int(line.split()[3])


@pytest.mark.skipif(not Path("/proc/self/limits").exists(), reason="needs Linux's /proc")
def test_out_of_file_descriptors_the_log_gets_a_line_now_and_then_and_serving_resumes(
        tmp_path: Any, fake_openai: Any) -> None:
    """A soft limit of 1024 is reached by a few hundred idle clients. The server takes what the
    hard limit allows; where that is reached too, asyncio logged a traceback per failed accept
    (50 MB of aiops.log in 30 s); now one line per 10 s, and the server serves again once the
    connections close."""
    import resource
    import socket

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    raised = start_serve(server_config_dir(tmp_path / "a", fake_openai), tmp_path / "a" / "data",
                         open_files=(256, min(hard, 4096)))
    try:
        assert _soft_open_files(raised.proc.pid) == min(hard, 4096)
    finally:
        assert raised.stop() == 0

    proc = start_serve(server_config_dir(tmp_path / "b", fake_openai), tmp_path / "b" / "data",
                       open_files=(128, 128))
    host, port = proc.url.removeprefix("http://").rsplit(":", 1)
    held: list[socket.socket] = []
    try:
        try:
            for _ in range(200):
                s = socket.socket()
                s.setblocking(False)
                s.connect_ex((host, int(port)))
                held.append(s)
            time.sleep(3)
        finally:
            for s in held:
                s.close()
        deadline = time.monotonic() + 20
        while not _healthy(proc.url):
            assert time.monotonic() < deadline, "the server did not serve again"
            time.sleep(0.2)
        log = (proc.data_dir / "aiops.log").read_text()
        lines = [x for x in log.splitlines() if "cannot accept connections" in x]
        assert 1 <= len(lines) <= 2 and "Too many open files" in lines[0], log[-2000:]
        assert "Traceback" not in log and len(log) < 20_000
    finally:
        assert proc.stop() == 0


def test_a_non_loopback_bind_without_tokens_refuses_to_start(tmp_path: Any, fake_openai: Any) -> None:
    cfg_dir = server_config_dir(tmp_path, fake_openai)
    done = run_serve(cfg_dir, tmp_path / "data", host="0.0.0.0")
    assert done.returncode == 2
    assert "refusing to listen on 0.0.0.0" in done.stderr and "auth token" in done.stderr
    assert "aiops serving" not in done.stdout


async def _until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def test_clients_hanging_up_mid_body_leave_nothing_in_the_log(api_server: ApiServer) -> None:
    """A body still arriving is read so that a shutdown can refuse it; a client that hangs up
    meanwhile must end that read quietly (no 'exception was never retrieved' for each one)."""
    errors: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    bodies = api_server.handle.app[STATE_KEY].bodies
    host, port = api_server.url.removeprefix("http://").rsplit(":", 1)
    body = json.dumps({"text": "x" * 1000, "client_id": "api-gone"}).encode()
    for _ in range(10):
        _, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /api/v1/submit HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body[:10])
        await _until(lambda: bool(bodies))  # the server is reading the rest of it
        writer.transport.abort()  # gone, mid-body
        await _until(lambda: not bodies)
    gc.collect()
    await asyncio.sleep(0.05)
    assert [c.get("message") for c in errors] == []
    await still_serving(api_server)


def test_two_tokens_with_one_value_refuse_to_start(tmp_path: Any, fake_openai: Any) -> None:
    """A value pasted into two token variables: only one token could ever match it, and the
    other's role (the operator's, here) would be lost without a word."""
    tokens = Tokens.make(ops="operator", ci="client")
    tokens.secrets["ci"] = tokens.secrets["ops"]
    done = run_serve(server_config_dir(tmp_path, fake_openai, tokens=tokens), tmp_path / "data",
                     env=tokens.env())
    assert done.returncode == 2 and "aiops serving" not in done.stdout
    assert "auth tokens 'ops' and 'ci' have the same value" in done.stderr, done.stderr
    assert tokens.secrets["ops"] not in done.stderr + done.stdout and "Traceback" not in done.stderr


def test_an_extra_port_that_repeats_the_main_one_is_listened_on_once(aiops_serve_factory: ServeFactory) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    serve = aiops_serve_factory(server={"extra_ports": [port]}, args=["--port", str(port)])  # (the last --port wins)
    assert _healthy(serve.url) and serve.url.endswith(f":{port}")
    assert f"lists port {port}, which aiops already listens on" in (serve.data_dir / "aiops.log").read_text()


def test_an_mcp_port_in_use_is_said_at_start_and_the_rest_serves(aiops_serve_factory: ServeFactory) -> None:
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    try:
        serve = aiops_serve_factory(server={"mcp_port": port})
        assert _healthy(serve.url) and "MCP" not in serve.banner
        assert f"aiops: warning: /mcp is not served: cannot listen for MCP on 127.0.0.1:{port}" in serve.stderr
    finally:
        held.close()


def test_a_port_in_use_is_one_line_that_says_what_to_do(tmp_path: Any, fake_openai: Any) -> None:
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    try:
        done = run_serve(server_config_dir(tmp_path, fake_openai), tmp_path / "data", port=port)
    finally:
        held.close()
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"port {port} is in use by another program" in lines[0], done.stderr
    assert "--port 0 picks a free one" in lines[0] and "Traceback" not in done.stderr


def test_a_non_loopback_bind_with_a_token_serves_and_needs_it(aiops_serve_factory: ServeFactory,
                                                              tmp_path: Any) -> None:
    import json
    import urllib.error
    import urllib.request

    tokens = Tokens.make(ops="operator")
    proc = aiops_serve_factory(tokens=tokens, args=["--host", "0.0.0.0"])
    port = proc.url.rsplit(":", 1)[1]
    base = f"http://127.0.0.1:{port}"
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(base + "/api/v1/sessions", timeout=10)
    assert e.value.code == 401
    req = urllib.request.Request(base + "/api/v1/sessions", headers=tokens.header("ops"))
    with urllib.request.urlopen(req, timeout=10) as r:
        assert json.loads(r.read()) == {"sessions": []}
    assert proc.stop() == 0
    logs = (proc.data_dir / "aiops.log").read_text()
    assert tokens.secrets["ops"] not in logs + proc.stderr + proc.stdout


async def test_unicode_digits_are_not_shorthand_ids(api_server: ApiServer) -> None:
    # "³".isdigit() is True but int("³") fails: these were 500s.
    for method, path in (("GET", "/api/v1/sessions/%C2%B3"), ("DELETE", "/api/v1/sessions/%C2%B3"),
                         ("POST", "/api/v1/sessions/%C2%B3/stop"), ("GET", "/api/v1/sessions/%D9%A3"),
                         # past SQLite's integers (an OverflowError), past int()'s 4300 digits
                         ("GET", "/api/v1/sessions/99999999999999999999"), ("GET", "/api/v1/sessions/" + "9" * 5000),
                         ("HEAD", "/api/v1/sessions/9223372036854775808"), ("GET", "/api/v1/stream/" + "9" * 20)):
        status, body, _ = await call(api_server, method, path)
        assert status == 404, (method, path[:60], body)
        assert method == "HEAD" or our_error(body)[0] == "not_found", body
    status, body, _ = await call(api_server, "GET", "/api/v1/stream/%C2%B3")
    assert (status, our_error(body)[0]) == (400, "invalid_request"), body
    await still_serving(api_server)


async def test_a_malformed_request_is_a_400_and_one_log_line_without_its_bytes(
        api_server_factory: ApiServerFactory, caplog: pytest.LogCaptureFixture) -> None:
    """aiohttp logs a request it cannot parse as an ERROR with a traceback and the offending line:
    anyone who can connect could fill the log, and the line may hold a token."""
    tokens = Tokens.make(ops="operator")
    srv = await api_server_factory(tokens=tokens)
    caplog.set_level(logging.DEBUG)
    secret = tokens.secrets["ops"]
    for raw in (f"GET /api/v1/sessions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {secret}\x00\r\n\r\n",
                "GET /api/v1/sessions HTTP/1.1\r\nHost: localhost\r\nBad Header: 1\r\n\r\n",
                # aiohttp's message quotes the first 100 bytes of a header line that is too long
                f"GET /api/v1/sessions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {secret}{'a' * 9000}\r\n\r\n",
                # ...and the whole request target of a URL it cannot parse
                f"GET http://[bad/?api_key={secret} HTTP/1.1\r\nHost: localhost\r\n\r\n",
                # a scanner's first bytes: aiohttp logs those at DEBUG, and so do we
                f"\x16\x03\x01{secret}\r\n\r\n"):
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.handle.port)
        try:
            writer.write(raw.encode())
            await writer.drain()
            async with asyncio.timeout(10):
                assert (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")[0].endswith(b" 400 Bad Request")
        finally:
            writer.close()
    records = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert len(records) == 5, [r.getMessage() for r in records]
    assert [r.levelno for r in records] == [logging.INFO] * 4 + [logging.DEBUG]
    for r in records:
        assert r.exc_info is None and "\n" not in r.getMessage(), r.getMessage()
        assert r.getMessage().startswith("malformed HTTP request from 127.0.0.1 (400):"), r.getMessage()
    assert secret not in caplog.text and "Traceback" not in caplog.text
    await still_serving(srv, tokens.header("ops"))


_SURFACES = [  # path, a valid body, extra headers: each surface once
    ("/api/v1/submit", b'{"text": "%s", "client_id": "api-enc"}', {}),
    ("/v1/chat/completions", b'{"model": "aiops", "messages": [{"role": "user", "content": "%s"}]}',
     {"X-Aiops-Session": "enc-v1"}),
    ("/api/chat", b'{"model": "aiops", "stream": false, "messages": [{"role": "user", "content": "%s"}]}',
     {"X-Aiops-Session": "enc-ollama"}),
]


def _message(body: Any) -> str:
    err = body["error"]
    return err if isinstance(err, str) else err["message"]


async def test_a_body_whose_content_encoding_does_not_decode_is_a_400_without_a_traceback(
        api_server: ApiServer, caplog: pytest.LogCaptureFixture) -> None:
    """Corrupt gzip or deflate was a 500 and two ERROR tracebacks per request: any caller could
    fill the log with them."""
    import gzip

    caplog.set_level(logging.DEBUG)
    bodies = {"gzip": b"\x1f\x8b\x08\x00garbage-not-gzip", "deflate": b"\x78\x9cgarbage-not-deflate"}
    for path, template, headers in _SURFACES:
        for encoding, raw in [*bodies.items(), ("gzip", gzip.compress(template % b"hi") + b"junk")]:
            status, body, _ = await call(api_server, "POST", path, data=raw, headers={
                "Content-Type": "application/json", "Content-Encoding": encoding, **headers})
            assert status == 400, (path, encoding, body)
            assert f"the request body could not be decoded (Content-Encoding: {encoding})" in _message(body)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    # aiohttp fails once more draining such a body; the 400 said it all, so the log gets nothing.
    assert not [r for r in caplog.records if r.name == "aiohttp.server"], caplog.text
    assert "Traceback" not in caplog.text
    # A body that does decode is taken as the JSON it holds.
    status, body, _ = await call(api_server, "POST", "/api/v1/submit", data=gzip.compress(
        b'{"text": "zipped", "wait": true}'), headers={"Content-Type": "application/json",
                                                       "Content-Encoding": "gzip"})
    assert (status, body["text"]) == (200, "echo: zipped")
    await still_serving(api_server)


async def test_encoded_surrogates_are_invalid_json_on_every_surface(api_server: ApiServer) -> None:
    """Bytes ED A0 80 (a surrogate written out as CESU-8/WTF-8 do) are not UTF-8, and a `\\ud800`
    escape in a UTF-16 body is no more Unicode than in a UTF-8 one: each reached the proxies as a
    lone surrogate and failed with a 500 hashing it."""
    for path, template, headers in _SURFACES:
        for raw, expect in ((template % b"hi \xed\xa0\x80", "malformed JSON body: not valid UTF-8"),
                            ((template % rb"hi \ud800").decode().encode("utf-16-le"), "unpaired UTF-16 surrogate"),
                            ((template % b"hi \xed\xa0\x80").decode("latin-1").encode("utf-16-le")[:-1],
                             "malformed JSON body: not valid UTF-16-LE")):
            status, body, _ = await call(api_server, "POST", path, data=raw,
                                         headers={"Content-Type": "application/json", **headers})
            assert status == 400 and expect in _message(body), (path, raw[:20], body)
            if path.startswith("/api/v1"):
                assert body["error"]["code"] == "invalid_json"
    status, body, _ = await call(api_server, "GET", "/api/v1/sessions")
    assert status == 200 and body["sessions"] == []
    await still_serving(api_server)


async def test_a_chat_id_header_that_is_not_utf8_names_a_session_of_its_own(api_server: ApiServer) -> None:
    """Open WebUI's chat id in Latin-1 ("chat-été") was a 500; now it names a session like any other
    id with characters outside an id's, and two such ids never share one."""
    ids = []
    first = b'{"role": "user", "content": "hi"}'
    more = first + b', {"role": "assistant", "content": "echo: hi"}, {"role": "user", "content": "more"}'
    for raw_id, messages in ((b"chat-\xe9t\xe9", first), (b"chat-\xe8t\xe8", first), (b"chat-\xe9t\xe9", more)):
        reader, writer = await asyncio.open_connection("127.0.0.1", api_server.handle.port)
        body = b'{"model": "aiops", "messages": [' + messages + b"]}"
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     b"X-OpenWebUI-Chat-Id: " + raw_id + b"\r\nConnection: close\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        await writer.drain()
        async with asyncio.timeout(30):
            response = await reader.read()
        writer.close()
        head = response.split(b"\r\n\r\n", 1)[0].decode("latin-1")
        assert head.startswith("HTTP/1.1 200"), response[:300]
        ids.append(next(line.split(": ", 1)[1] for line in head.split("\r\n")
                        if line.lower().startswith("x-aiops-session:")))
    assert ids[0].startswith("owui-chat-_t_-") and ids[1].startswith("owui-chat-_t_-")
    assert ids[0] != ids[1] and ids[2] == ids[0]  # the same chat continues in its session
