"""Whether a configured model can answer at all: one cheap request (list its models).

Shared by the in-process console (its start-up check and `check models`) and the server, which
probes for attached consoles and API clients (aiops/integrations/server/model_health.py), so both
say the same thing about the same model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import aiohttp

if TYPE_CHECKING:
    from aiops.config import ModelConfig

PROBE_TIMEOUT = 5.0


async def probe_model(m: ModelConfig, env: Mapping[str, str], timeout: float = PROBE_TIMEOUT) -> str | None:
    """None when `m` answers; otherwise why it does not (a sentence an operator can act on)."""
    if not m.enabled:
        return "it is disabled in models.toml"
    if m.key_status(dict(env)) == "missing":
        return f"{m.api_key_env} is not set (in the environment or a .env file)"
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
        return f"{base} did not answer within {timeout:g} s"
    except aiohttp.ClientError as e:
        return f"cannot connect to {base} ({type(e).__name__})"
    if status in (401, 403):
        return f"{base} refused the API key (HTTP {status})"
    return None
