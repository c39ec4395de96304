"""Browser clients (CORS): off by default; listed origins get their preflight answered before
authentication, and every response names them, streams included."""

from __future__ import annotations

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


async def test_no_origin_is_allowed_by_default(api_server: ApiServer) -> None:
    r = await preflight(api_server, "/api/chat", PAGE)
    assert r.status_code == 405
    assert "access-control-allow-origin" not in r.headers
    async with httpx.AsyncClient() as h:
        r = await h.get(api_server.url + "/api/tags", headers={"Origin": PAGE})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


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


@pytest.mark.parametrize("origin", ["*", "localhost:3000", "http://localhost:3000/app", "://x"])
def test_an_entry_that_is_not_an_origin_is_a_config_error(tmp_path, fake_openai, origin: str) -> None:
    cfg_dir = server_config_dir(tmp_path, fake_openai, server={"cors_origins": [origin]})
    with pytest.raises(ConfigError) as e:
        load_config(resolve_paths(cfg_dir, tmp_path / "data"), load_dotenv=False)
    assert "cors_origins" in str(e.value) and "is not an origin" in str(e.value)
