"""Pytest fixtures for the fake model servers, and a helper to write a test config dir.

Registered through `pytest_plugins` in tests/conftest.py, so every test can ask for them:

    def test_x(fake_openai, tmp_path):
        fake_openai.script(Reply.text("hi"))
        cfg = make_config_dir(tmp_path, {"local": openai_model_entry(fake_openai)}, default="local")
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from tests.fakes.gemini_server import FakeGemini
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.slack_server import FakeSlack


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAI]:
    """A started FakeOpenAI (echo replies until scripted); stopped after the test."""
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
def fake_gemini() -> Iterator[FakeGemini]:
    """A started FakeGemini (echo replies until scripted); stopped after the test."""
    with FakeGemini() as fake:
        yield fake


@pytest.fixture
async def fake_slack() -> AsyncIterator[FakeSlack]:
    """A started FakeSlack on the test's loop (the Web API and a Socket Mode socket)."""
    async with FakeSlack() as fake:
        yield fake


def openai_model_entry(fake: FakeOpenAI, model_id: str = "fake-model", **extra: Any) -> dict[str, Any]:
    """A models.toml entry (also valid as `ModelConfig(**entry)`) pointing at the fake."""
    return {"type": "openai", "model_id": model_id, "base_url": fake.url, "timeout": 10, **extra}


def gemini_model_entry(fake: FakeGemini, model_id: str = "gemini-fake", **extra: Any) -> dict[str, Any]:
    """A models.toml entry (also valid as `ModelConfig(**entry)`) pointing at the fake."""
    return {"type": "gemini", "model_id": model_id, "base_url": fake.url, "timeout": 10, **extra}


def make_config_dir(tmp_path: Path, models: dict[str, dict[str, Any]], default: str,
                    extra_files: dict[str, str] | None = None) -> Path:
    """Write tmp_path/"config" with a models.toml for `models` (key -> entry) and `default`, plus
    `extra_files` (file name -> TOML text, e.g. {"gates.toml": "..."}). Files not written fall back
    to the shipped defaults when the config is loaded. Returns the config dir."""
    config_dir = tmp_path / "config"
    config_dir.mkdir(parents=True, exist_ok=True)
    # TOML has no null: an entry's None values mean "not set", so they are left out.
    clean = {key: {k: v for k, v in entry.items() if v is not None} for key, entry in models.items()}
    (config_dir / "models.toml").write_text(tomli_w.dumps({"default_model": default, "models": clean}))
    for name, text in (extra_files or {}).items():
        path = config_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return config_dir


@pytest.fixture
def config_dir_factory(tmp_path: Path) -> Callable[..., Path]:
    """`make_config_dir` bound to this test's tmp_path: `config_dir_factory(models, default)`."""

    def make(models: dict[str, dict[str, Any]], default: str,
             extra_files: dict[str, str] | None = None) -> Path:
        return make_config_dir(tmp_path, models, default, extra_files)

    return make
