"""The backend of a model's type. Apart from base.py, which every backend imports: the factory
imports the backends (lazily: a provider SDK takes about a second to import)."""

from __future__ import annotations

from aiops.config import ModelConfig
from aiops.engine.backends.base import Backend


def make_backend(key: str, config: ModelConfig, env: dict[str, str] | None = None) -> Backend:
    if config.type == "openai":
        from aiops.engine.backends.openai_backend import OpenAIBackend

        return OpenAIBackend(key, config, env)
    if config.type == "gemini":
        from aiops.engine.backends.gemini_backend import GeminiBackend

        return GeminiBackend(key, config, env)
    raise ValueError(f"unknown model type {config.type!r}")
