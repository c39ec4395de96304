"""The configured models: which may be used, and one backend (one connection pool) per model."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from aiops.config import Config, ModelConfig
from aiops.engine.backends import Backend, ModelError, make_backend
from aiops.engine.errors import EngineError
from aiops.engine.types import Completion, Message, ToolSpec, valid_completion

log = logging.getLogger(__name__)


class Models:
    def __init__(self, config: Config, env: Mapping[str, str]) -> None:
        self._config = config
        self._env = env
        self._backends: dict[str, Backend] = {}

    def config(self, key: str) -> ModelConfig:
        models = self._config.models.models
        if key not in models:
            raise EngineError(f"unknown model {key!r}; known: {', '.join(sorted(models))}")
        return models[key]

    def check(self, key: str) -> str | None:
        """Why `key` cannot be used, or None."""
        models = self._config.models.models
        if key not in models:
            return f"unknown model {key!r}; models: {', '.join(sorted(self._config.models.enabled()))}"
        if not models[key].enabled:
            return f"model {key!r} is disabled in models.toml"
        return None

    def backend(self, key: str) -> Backend:
        b = self._backends.get(key)
        if b is None:
            b = make_backend(key, self.config(key), dict(self._env))
            self._backends[key] = b
        return b

    async def complete_plain(self, model_key: str, messages: list[Message],
                             system: str | None = None) -> Completion:
        """One model call with no tools, no gates and no session: chat UIs' background tasks.

        The whole Completion, so callers can report the model's token usage with the text."""
        return await self.complete(model_key, messages, [], system)

    async def complete(self, model_key: str, messages: list[Message], tools: list[ToolSpec],
                       system: str | None = None) -> Completion:
        """One model call, streamed and collected: the whole reply (text, calls, usage)."""
        completion: Completion | None = None
        async for item in self.backend(model_key).stream(messages, tools, system=system):
            if isinstance(item, Completion):
                completion = valid_completion(item)
        if completion is None:
            raise ModelError(model_key, self.config(model_key).display_url(),
                             "the stream ended without a completion")
        return completion

    async def aclose(self) -> None:
        for b in self._backends.values():
            try:
                await b.aclose()
            except Exception:  # noqa: BLE001 - shutting down: one failing must not keep the rest
                log.debug("closing a backend failed", exc_info=True)
