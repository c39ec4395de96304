"""An engine fixture: a real Engine on a tmp config/data dir, pointed at a fake model server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from aiops.config import Config, load_config, resolve_paths
from aiops.engine.bus import Subscription
from aiops.engine.engine import Engine
from aiops.engine.events import Event
from aiops.engine.plugins import Plugin
from tests.fakes.fixtures import make_config_dir, openai_model_entry
from tests.fakes.openai_server import WAIT_S, FakeOpenAI

EngineFactory = Callable[..., Awaitable[Engine]]


def load_test_config(tmp_path: Path, fake: FakeOpenAI, extra_files: dict[str, str] | None = None,
                     models: dict[str, dict[str, Any]] | None = None, default: str = "m") -> Config:
    models = models or {"m": openai_model_entry(fake)}
    cfg_dir = make_config_dir(tmp_path, models, default, extra_files)
    return load_config(resolve_paths(cfg_dir, tmp_path / "data"), load_dotenv=False)


@pytest.fixture
async def engine_factory(tmp_path: Path, fake_openai: FakeOpenAI) -> AsyncIterator[EngineFactory]:
    """`await engine_factory(extra_files=..., plugins=[...])` → a started Engine, stopped afterwards."""
    engines: list[Engine] = []

    async def make(extra_files: dict[str, str] | None = None, plugins: list[Plugin] | None = None,
                   models: dict[str, dict[str, Any]] | None = None, default: str = "m",
                   env: dict[str, str] | None = None, one_turn: bool = False) -> Engine:
        cfg = load_test_config(tmp_path, fake_openai, extra_files, models, default)
        engine = Engine(cfg, plugins=plugins, env=env)
        await engine.start(one_turn=one_turn)
        engines.append(engine)
        return engine

    yield make
    for e in engines:
        if e.started:
            await e.stop()


async def next_event(sub: Subscription, name: str, timeout: float = WAIT_S) -> Event:
    """The next event called `name` (others are skipped)."""
    import asyncio

    async def find() -> Event:
        async for ev in sub:
            if ev.name == name:
                return ev
        raise AssertionError(f"subscription ended before a {name!r} event")

    return await asyncio.wait_for(find(), timeout)
