"""The models the proxy publishes: `aiops` (each session's own model) and `aiops/<key>` for every
enabled model of the registry, as both dialects list and accept them."""

from __future__ import annotations

from dataclasses import dataclass

from aiops.config import ModelConfig
from aiops.engine.engine import Engine
from aiops.integrations.server.errors import HttpError

PUBLIC_MODEL = "aiops"  # "the session's model"; `aiops/<key>` names a registry model


@dataclass(frozen=True, slots=True)
class PublishedModel:
    name: str  # "aiops" or "aiops/<key>"
    key: str  # the registry key that answers (for "aiops": the default model)
    config: ModelConfig
    session_model: bool  # True for "aiops": each session's own model


def published_models(engine: Engine) -> list[PublishedModel]:
    """`aiops` (each session's model) and `aiops/<key>` for every enabled registry model."""
    models = engine.config.models
    default = models.default_model
    out = [PublishedModel(PUBLIC_MODEL, default, models.models[default], True)]
    out += [PublishedModel(f"{PUBLIC_MODEL}/{key}", key, m, False)
            for key, m in sorted(models.enabled().items())]
    return out


def strip_tag(name: str) -> str:
    """Ollama names carry a tag; `:latest` is the only one we publish, so it is optional. Ollama
    matches the tag without regard to case (`:LATEST`), as the rest of the name."""
    tag = ":latest"
    return name[: -len(tag)] if name[-len(tag):].casefold() == tag else name


def find_model(engine: Engine, requested: str) -> PublishedModel | None:
    """The published model a request names (with or without `:latest`, in any case, as Ollama
    matches names), or None: the entry `published_models` lists under that name, looked up
    without listing them all (every chat request asks)."""
    name = strip_tag(requested.strip())
    models = engine.config.models
    prefix, slash, key = name.partition("/")
    if prefix.casefold() != PUBLIC_MODEL:
        return None
    if not slash:
        return PublishedModel(PUBLIC_MODEL, models.default_model, models.models[models.default_model], True)
    if key not in models.models:  # an exact match first: registry keys may differ only in case
        key = next((k for k in models.models if k.casefold() == key.casefold()), key)
    m = models.models.get(key)
    if m is None or not m.enabled:
        return None
    return PublishedModel(f"{PUBLIC_MODEL}/{key}", key, m, False)


def turn_model(model: PublishedModel) -> str | None:
    """What to pass to `engine.submit(model=...)`: None keeps the session's own model."""
    return None if model.session_model else model.key


def model_not_found(requested: str) -> HttpError:
    return HttpError(404, "model_not_found",
                     f"model {requested!r} not found; this server publishes {PUBLIC_MODEL!r} and "
                     f"'{PUBLIC_MODEL}/<key>' for each enabled model (GET /v1/models or /api/tags)",
                     param="model")

