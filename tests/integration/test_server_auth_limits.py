"""Tokens that stand up to guessing (issue 20, item 6): a network bind refuses short tokens, and an
address that keeps presenting invalid tokens is slowed down."""

from __future__ import annotations

import secrets
from typing import Any

import aiohttp

from tests.support.server import ApiServerFactory, Tokens, run_serve, server_config_dir


def test_a_network_bind_refuses_a_short_token_and_says_how_to_make_one(tmp_path: Any, fake_openai: Any) -> None:
    tokens = Tokens.make(ops="operator", bot="client")
    tokens.secrets["ops"] = "x"
    done = run_serve(server_config_dir(tmp_path, fake_openai, tokens=tokens), tmp_path / "data",
                     host="0.0.0.0", env=tokens.env())
    assert done.returncode == 2 and "aiops serving" not in done.stdout
    assert "at least 32 characters" in done.stderr
    assert "'ops' (AIOPS_TEST_TOKEN_OPS: 1 characters)" in done.stderr and "'bot'" not in done.stderr
    assert 'python -c "import secrets; print(secrets.token_urlsafe(32))"' in done.stderr


async def test_loopback_keeps_accepting_a_short_token(api_server_factory: ApiServerFactory) -> None:
    # Only the machine itself can reach a loopback bind: a short token there is the owner's call.
    tokens = Tokens.make(ops="operator")
    tokens.secrets["ops"] = "short"
    srv = await api_server_factory(tokens=tokens)
    async with aiohttp.ClientSession() as s, s.get(srv.url + "/api/v1/sessions",
                                                   headers=tokens.header("ops")) as r:
        assert r.status == 200


async def test_repeated_invalid_tokens_from_one_address_are_answered_429(api_server_factory: ApiServerFactory):
    tokens = Tokens.make(ops="operator")
    srv = await api_server_factory(tokens=tokens)
    url = srv.url + "/api/v1/sessions"
    wrong = {"Authorization": f"Bearer {secrets.token_urlsafe(32)}"}
    async with aiohttp.ClientSession() as s:
        statuses = []
        for _ in range(10):
            async with s.get(url, headers=wrong) as r:
                statuses.append(r.status)
        assert statuses == [401] * 10
        async with s.get(url, headers=wrong) as r:
            assert r.status == 429
            retry_after = int(r.headers["Retry-After"])
            body = await r.json()
        assert 1 <= retry_after <= 60
        assert body["error"]["code"] == "rate_limited"
        assert "too many invalid tokens from this address (10 in 60 s)" in body["error"]["message"]
        # While throttled, even the right token is not looked at: guessing gains nothing.
        async with s.get(url, headers=tokens.header("ops")) as r:
            assert r.status == 429
        # A request without a token is no guess: the public route still answers.
        async with s.get(srv.url + "/api/v1/health") as r:
            assert r.status == 200
