"""Helpers for the data-tool tests (search, extract, drive): run one tool call through a real
engine turn and read back what the model and the operator got."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from aiops.engine.engine import Engine
from aiops.engine.types import Message
from tests.fakes.openai_server import FakeOpenAI, Reply


def plugins_toml(tables: dict[str, dict[str, Any]]) -> str:
    """A plugins.toml enabling exactly these plugins (mysql off), with their settings."""
    import tomli_w

    return tomli_w.dumps({"mysql": {"enabled": False},
                          **{name: {"enabled": True, **table} for name, table in tables.items()}})


async def call_tool(engine: Engine, fake: FakeOpenAI, name: str, args: dict[str, Any],
                    session: str = "api-tools") -> Message:
    """The model calls `name(args)` once and then answers; returns the call's tool message
    (content: what the model read; meta: gate decision, data for the operator)."""
    before = len(await engine.history(session)) if await engine.session(session) else 0
    fake.script(Reply.tool_calls((name, args)), Reply.text("done"))
    result = await engine.run(session, "go", kind="api", timeout=30)
    assert result.status == "complete", result
    tools = [m for m in (await engine.history(session))[before:] if m.role == "tool"]
    assert len(tools) == 1, tools
    return tools[0]


def status_of(engine: Engine, name: str) -> tuple[str, str]:
    s = next(s for s in engine.plugin_status if s.name == name)
    return s.state, s.reason


def service_account_file(path: Path, key: rsa.RSAPrivateKey, token_uri: str,
                         email: str = "aiops-test@project.iam.gserviceaccount.com") -> Path:
    """A service-account JSON key file (as Google's console downloads it) for `key`."""
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    path.write_text(json.dumps({"type": "service_account", "project_id": "p", "private_key_id": "k1",
                                "private_key": pem, "client_email": email, "client_id": "1",
                                "token_uri": token_uri}))
    return path
