"""Helpers for the data-tool tests (search, extract, drive): run one tool call through a real
engine turn and read back what the model and the operator got."""

from __future__ import annotations

from typing import Any

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
