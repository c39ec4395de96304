"""Browser clients (CORS): off by default; listed origins get their preflight answered before
authentication, and every response names them, streams included."""

from __future__ import annotations

import logging
import socket

import httpx
import pytest

from aiops.config import ConfigError, load_config, resolve_paths
from tests.support.server import ApiServer, ApiServerFactory, Tokens, server_config_dir

PAGE = "http://localhost:3000"
EXTENSION = "chrome-extension://abcdefghijklmnop"


async def preflight(srv: ApiServer, path: str, origin: str) -> httpx.Response:
    async with httpx.AsyncClient() as h:
        return await h.options(srv.url + path, headers={
            "Origin": origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})


async def test_no_origin_is_allowed_by_default_and_a_web_page_cannot_drive_the_agent(
        api_server: ApiServer) -> None:
    """A page the operator's browser opens can send a "simple" POST (text/plain, no preflight) to a
    loopback server without tokens, whose callers are operators: it is refused, as Ollama refuses
    origins it does not allow, before anything runs."""
    before = len(api_server.fake.requests)
    async with httpx.AsyncClient(base_url=api_server.url, timeout=10) as h:
        r = await h.post("/api/v1/submit", content=b'{"text": "drop every table", "wait": true}',
                         headers={"Origin": "http://evil.example", "Content-Type": "text/plain"})
        assert r.status_code == 403 and "cors_origins" in r.json()["error"]["message"]
        r = await h.post("/v1/chat/completions", content=b'{"model": "aiops", "messages": '
                         b'[{"role": "user", "content": "hi"}]}',
                         headers={"Origin": "null", "Content-Type": "text/plain"})  # a sandboxed page
        assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
        r = await h.get("/api/tags", headers={"Origin": PAGE})
        assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
        r = await preflight(api_server, "/api/chat", PAGE)
        assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
        # Programs (SDKs, curl, Open WebUI's server) send no Origin: served as before.
        r = await h.post("/api/v1/submit", json={"text": "hello", "wait": True})
        assert r.status_code == 200 and r.json()["text"] == "echo: hello"
    assert len(api_server.fake.requests) == before + 1
    assert [s["client_id"] for s in (await sessions_of(api_server))] == [r.json()["client_id"]]


async def test_without_tokens_only_loopback_names_are_served(api_server: ApiServer) -> None:
    """DNS rebinding: a page whose name now points at 127.0.0.1 makes same-origin requests (no
    Origin on a GET), addressed to its own name. A tokenless server answers loopback names only."""
    async with httpx.AsyncClient(base_url=api_server.url, timeout=10) as h:
        r = await h.get("/api/v1/sessions", headers={"Host": "rebind.evil.example:8765"})
        assert r.status_code == 403 and "loopback name" in r.json()["error"]["message"]
        for host in ("localhost:8765", "LOCALHOST", "127.0.0.1:8765", "127.0.0.2", "[::1]:8765", "app.localhost",
                     f"{socket.gethostname()}:8765"):  # the machine's own name (127.0.1.1 on Debian)
            assert (await h.get("/api/v1/sessions", headers={"Host": host})).status_code == 200, host


async def test_with_tokens_any_name_is_served_to_a_valid_token(api_server_factory: ApiServerFactory) -> None:
    tokens = Tokens.make(ops="operator")
    srv = await api_server_factory(tokens=tokens)
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as h:
        r = await h.get("/api/v1/sessions", headers={"Host": "aiops.internal:8765", **tokens.header("ops")})
        assert r.status_code == 200


async def sessions_of(srv: ApiServer) -> list[dict]:
    async with httpx.AsyncClient() as h:
        return (await h.get(srv.url + "/api/v1/sessions")).json()["sessions"]


async def test_listed_origins_are_allowed_and_still_need_their_token(api_server_factory: ApiServerFactory) -> None:
    tokens = Tokens.make(webui="client")
    srv = await api_server_factory(tokens=tokens, server={
        "cors_origins": ["http://localhost:*", "chrome-extension://*"]})
    for origin in (PAGE, EXTENSION):
        r = await preflight(srv, "/v1/chat/completions", origin)  # no token: browsers send none here
        assert r.status_code == 204, origin
        assert r.headers["access-control-allow-origin"] == origin
        assert "POST" in r.headers["access-control-allow-methods"]
        assert "authorization" in r.headers["access-control-allow-headers"].lower()
    # Another origin gets nothing a browser would accept.
    r = await preflight(srv, "/v1/chat/completions", "http://evil.example")
    assert "access-control-allow-origin" not in r.headers and r.status_code != 204
    # The request itself is authenticated as any other, and its answer (an error too) names the origin.
    body = {"model": "aiops", "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as h:
        r = await h.post("/v1/chat/completions", json=body, headers={"Origin": PAGE})
        assert r.status_code == 401 and r.headers["access-control-allow-origin"] == PAGE
        r = await h.post("/v1/chat/completions", json=body, headers={"Origin": PAGE, **tokens.header("webui")})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "echo: hi"
        assert r.headers["access-control-allow-origin"] == PAGE
        assert r.headers["access-control-expose-headers"] == "X-Aiops-Session"
        # A stream's headers leave before its handler returns: they carry it too.
        async with h.stream("POST", "/api/chat",
                            json={"model": "aiops", "messages": [{"role": "user", "content": "stream"}]},
                            headers={"Origin": EXTENSION, **tokens.header("webui")}) as s:
            assert s.status_code == 200 and s.headers["access-control-allow-origin"] == EXTENSION
            assert '"done": true' in (await s.aread()).decode()


async def test_allowing_origins_without_tokens_is_warned(api_server_factory: ApiServerFactory, caplog) -> None:
    """Without tokens every loopback caller is an operator, and so is every page of an allowed origin."""
    with caplog.at_level(logging.WARNING, logger="aiops"):
        await api_server_factory(server={"cors_origins": ["http://localhost:*"]})
    (warning,) = [r.getMessage() for r in caplog.records if "cors_origins without tokens" in r.getMessage()]
    assert "http://localhost:*" in warning and "as an operator" in warning
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="aiops"):
        await api_server_factory(tokens=Tokens.make(ops="operator"), server={"cors_origins": ["http://localhost:*"]})
    assert not [r for r in caplog.records if "cors_origins without tokens" in r.getMessage()]


async def test_origin_patterns_match_whole_origins_literally(api_server_factory: ApiServerFactory) -> None:
    srv = await api_server_factory(server={"cors_origins": ["http://localhost:*", "http://[::1]:*",
                                                           "HTTPS://Tools.Example"]})
    cases = {"http://localhost:5173": True, "http://localhost": True,  # `:*` covers no port (80) too
             "http://[::1]:3000": True,  # brackets are literal, not a character class
             "https://tools.example": True,  # browsers send origins lower-case
             "http://localhost.evil.example": False, "http://localhost:80.evil.example": False,
             "https://tools.example.evil": False, "http://127.0.0.1:5173": False}
    for origin, allowed in cases.items():
        r = await preflight(srv, "/v1/chat/completions", origin)
        assert (r.status_code == 204) is allowed, origin
        assert (r.headers.get("access-control-allow-origin") == origin) is allowed, origin


async def test_every_origin_and_file_pages_can_be_allowed_as_ollama_origins_star_does(
        api_server_factory: ApiServerFactory) -> None:
    """Desktop chat apps built on web views (their users set OLLAMA_ORIGINS=* for Ollama) send an
    app's own origin, or "null" from a file:// page."""
    srv = await api_server_factory(tokens=Tokens.make(ops="operator"), server={"cors_origins": ["*"]})
    for origin in ("app://chatbox", "null", "https://anything.example"):
        r = await preflight(srv, "/api/chat", origin)
        assert r.status_code == 204 and r.headers["access-control-allow-origin"] == origin, origin
    only_files = await api_server_factory(tokens=Tokens.make(ops="operator"), server={"cors_origins": ["null"]})
    assert (await preflight(only_files, "/api/chat", "null")).status_code == 204
    assert (await preflight(only_files, "/api/chat", "app://chatbox")).status_code == 403


@pytest.mark.parametrize("origin", ["localhost:3000", "http://localhost:3000/app", "://x", "**x"])
def test_an_entry_that_is_not_an_origin_is_a_config_error(tmp_path, fake_openai, origin: str) -> None:
    cfg_dir = server_config_dir(tmp_path, fake_openai, server={"cors_origins": [origin]})
    with pytest.raises(ConfigError) as e:
        load_config(resolve_paths(cfg_dir, tmp_path / "data"), load_dotenv=False)
    assert "cors_origins" in str(e.value) and "is not an origin" in str(e.value)
