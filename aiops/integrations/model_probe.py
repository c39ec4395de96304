"""Whether a configured model can answer at all: one cheap request (list its models).

Shared by the in-process console (its start-up check and `check models`) and the server, which
probes for attached consoles and API clients (aiops/integrations/server/model_health.py), so both
say the same thing about the same model; and what a finished turn says of its model, by the same
rules for both (`turn_verdict`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiops.engine import events as ev

if TYPE_CHECKING:
    from aiops.config import ModelConfig
    from aiops.engine.backends.base import FailureCause

PROBE_TIMEOUT = 5.0


@dataclass(frozen=True, slots=True)
class Unanswered:
    """Why a model does not answer (a sentence an operator can act on), and which kind of failure
    that is (engine/backends/base.py `FailureCause`), so that advice fits it."""

    reason: str
    cause: FailureCause


def turn_verdict(done: ev.Done) -> tuple[bool, Unanswered | None] | None:
    """What a finished turn says of the model it ran on (`done.model`, a one-turn `@model`'s
    included): (True, None) for a whole answer; (False, why) for a key or connection failure;
    None when it says nothing (a command, a stop, another failure). A server that answered with an
    error (HTTP 500, a stream error) is reachable: (True, None) too, its error is the turn's alone."""
    if not done.model or done.command:
        return None
    if done.status == "complete":
        return True, None
    err = done.error
    if done.status != "error" or err is None or err.code != "model_error":
        return None
    if err.cause in ("key", "connection"):
        return False, Unanswered(_bare_reason(done.model, " ".join(err.message.split())),
                                 "key" if err.cause == "key" else "connection")
    return True, None


def _bare_reason(model: str, message: str) -> str:
    """The failure without the "model 'KEY' at URL: " a ModelError's message starts with: a
    reachability view says the model and its address beside it, and the cause would be cut off
    the end of a narrow line."""
    head = f"model {model!r} at "
    if message.startswith(head) and ": " in message[len(head):]:
        return message[len(head):].split(": ", 1)[1]
    return message


async def probe_model(m: ModelConfig, env: Mapping[str, str],
                      timeout: float = PROBE_TIMEOUT) -> Unanswered | None:
    """None when `m` answers; otherwise why it does not."""
    # Here, not at the top: the console imports this module (turn_verdict) before its first
    # frame, and aiohttp with its ~100 modules is ~0.1 s of that on a 2-core machine.
    import aiohttp

    if not m.enabled:
        return Unanswered("it is disabled in models.toml", "connection")
    if m.key_status(dict(env)) == "missing":
        return Unanswered(f"{m.api_key_env} is not set (in the environment or a .env file)", "key")
    api_key = m.api_key(dict(env))
    base = m.display_url().rstrip("/")
    if m.type == "gemini":
        url = base + "/v1beta/models"
        headers = {"x-goog-api-key": api_key} if api_key else {}
    else:
        url = base + "/models"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with (aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http,
                    http.get(url, headers=headers) as r):
            status = r.status
    except TimeoutError:
        return Unanswered(f"{base} did not answer within {timeout:g} s", "connection")
    except aiohttp.ClientError as e:
        return Unanswered(f"cannot connect to {base} ({type(e).__name__})", "connection")
    if status in (401, 403):
        if not api_key:  # a keyless model (no api_key_env) whose server wants one
            return Unanswered(f"{base} asks for an API key (HTTP {status})", "key")
        return Unanswered(f"{base} refused the API key (HTTP {status})", "key")
    return None
