"""The proxy's state on the app: its settings and its sessions index, built as the app starts (a
cleanup context, as aiohttp's own demos build theirs) and let go of as it cleans up."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import web

from aiops.config import Config
from aiops.integrations.server.context import CONFIG_KEY, ENGINE_KEY
from aiops.integrations.server.proxy.sessions import ProxySessions


@dataclass(frozen=True, slots=True)
class ProxySettings:
    keepalive_seconds: float = 15.0
    status_lines: bool = True
    tool_progress: bool = False
    max_messages: int = 1000  # in one request
    max_imported: int = 1000  # into one session, in all
    client_tools: str = "offer"  # offer | ignore | refuse (see client_tools.py)
    reasoning: bool = True  # the model's reasoning may reach clients (`proxy_reasoning`)

    @classmethod
    def from_config(cls, cfg: Config) -> ProxySettings:
        s = cfg.app.server
        return cls(keepalive_seconds=s.keepalive_seconds, status_lines=s.proxy_status_lines,
                   tool_progress=s.proxy_tool_progress, max_messages=s.proxy_max_messages,
                   max_imported=s.proxy_max_imported, client_tools=s.client_tools,
                   reasoning=s.proxy_reasoning)


@dataclass(frozen=True, slots=True)
class ProxyState:
    sessions: ProxySessions
    settings: ProxySettings
    # Callers whose client tools were ignored (`client_tools = "ignore"`): logged once each.
    ignored_clients: set[str] = field(default_factory=set)


PROXY_KEY = web.AppKey("aiops_proxy", ProxyState)


async def _proxy_context(app: web.Application) -> AsyncIterator[None]:
    settings = ProxySettings.from_config(app[CONFIG_KEY])
    state = ProxyState(ProxySessions(app[ENGINE_KEY], max_imported=settings.max_imported), settings)
    app[PROXY_KEY] = state
    yield
    state.sessions.close()


def setup(app: web.Application) -> None:
    """Build the proxy's state when the app starts (both dialects read it)."""
    app.cleanup_ctx.append(_proxy_context)


def proxy_state(request: web.Request) -> ProxyState:
    return request.app[PROXY_KEY]
