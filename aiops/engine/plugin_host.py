"""The plugin host: finds the plugins, checks their settings and requirements, starts and stops
them, and keeps the status `aiops plugins` and the console show.

A plugin reaches the engine only through its PluginAPI (registration, its environment, the
engine's facade), never the whole engine.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from aiops.engine.plugins import (
    Plugin,
    PluginAPI,
    PluginStatus,
    PluginUnavailable,
    check_requirements,
    disabled_reason,
    discover,
    validate_settings,
)

if TYPE_CHECKING:
    from aiops.config import Config
    from aiops.engine.commands import CommandRegistry
    from aiops.engine.plugins import PluginEngine
    from aiops.engine.tools import ToolRegistry

log = logging.getLogger(__name__)


class PluginHost:
    def __init__(self, config: Config, facade: PluginEngine, env: Mapping[str, str], tools: ToolRegistry,
                 commands: CommandRegistry, *, plugins: list[Plugin] | None = None,
                 discover_plugins: bool = True) -> None:
        self._config = config
        self.facade = facade
        self.env = env
        self.tools = tools
        self.commands = commands
        self.status: list[PluginStatus] = []
        self._extra = plugins or []
        self._discover = discover_plugins
        self._started: list[Plugin] = []
        self.one_turn = False  # see PluginAPI.one_turn; set before load()

    @property
    def config(self) -> Config:
        return self._config

    async def load(self) -> None:
        """Set up and start every enabled plugin; one that cannot run is reported, the rest start."""
        classes: dict[str, type[Plugin] | Exception] = discover() if self._discover else {}
        instances: list[tuple[Plugin, str]] = [(p, "programmatic") for p in self._extra]
        plugins_file = str(self._config.sources.get("plugins.toml", "plugins.toml"))
        for name, cls in sorted(classes.items()):
            if isinstance(cls, Exception):
                self.status.append(PluginStatus(name, "failed", f"cannot load: {cls}", "entry point"))
                continue
            if any(p.name == cls.name for p, _ in instances):
                continue
            instances.append((cls(), "entry point"))
        for plugin, source in instances:
            name = plugin.name
            table = self._config.plugin_settings(name)
            try:
                plugin.settings = validate_settings(type(plugin), table, plugins_file)
                if not plugin.settings.enabled:
                    # What the file says, or that it says nothing (QA: a misspelled [myslq] was
                    # reported as "enabled = false", which the file never said).
                    known = {p.name for p, _ in instances} | set(classes)
                    why = disabled_reason(name, self._config.plugins, plugins_file, known)
                    self.status.append(PluginStatus(name, "disabled", why, source))
                    continue
                missing = check_requirements(type(plugin))
                if missing:
                    raise PluginUnavailable(missing)
                plugin.api = PluginAPI(self, plugin)
                await plugin.setup(plugin.api)
                await plugin.start()
            except PluginUnavailable as e:
                self.status.append(PluginStatus(name, "skipped", str(e), source))
                log.warning("plugin %s skipped: %s", name, e)
                continue
            except Exception as e:  # noqa: BLE001 - the rest start
                log.exception("plugin %s failed", name)
                self.status.append(PluginStatus(name, "failed", f"{type(e).__name__}: {e}", source))
                continue
            self._started.append(plugin)
            # A plugin may start yet have something to say (e.g. its server was unreachable).
            note = str(getattr(plugin, "status_note", "") or "")
            self.status.append(PluginStatus(name, "started", note, source))

    async def ready(self) -> None:
        """Wait for the plugins' background start-up checks (each bounds its own)."""
        await asyncio.gather(*(p.ready() for p in self._started), return_exceptions=True)

    async def tools_ready(self) -> None:
        """Wait for the tools the plugins register in the background (each bounds its own)."""
        await asyncio.gather(*(p.tools_ready() for p in self._started), return_exceptions=True)

    def tool_unavailable(self, name: str) -> str | None:
        """Why the unregistered tool `name` cannot be called now, from the plugin it belongs to."""
        for p in self._started:
            try:
                why = p.tool_unavailable(name)
            except Exception:  # noqa: BLE001 - the model then hears "unknown tool", as before
                log.exception("plugin %s: tool_unavailable failed", p.name)
                continue
            if why:
                return why
        return None

    def get(self, name: str) -> Plugin | None:
        return next((p for p in self._started if p.name == name), None)

    async def stop(self) -> None:
        """Stop the started plugins, last started first; one failing does not keep the rest."""
        for p in reversed(self._started):
            # A task waited on, not awaited: a stop that swallows its own cancel still cannot hold us.
            stopping = asyncio.ensure_future(p.stop())
            done, _ = await asyncio.wait({stopping}, timeout=p.stop_seconds)
            if not done:
                stopping.cancel()
                log.error("plugin %s did not stop within %g s; left behind", p.name, p.stop_seconds)
            elif (e := stopping.exception()) is not None:
                log.error("plugin %s failed to stop", p.name, exc_info=e)
