"""One plugin interface for built-in and third-party plugins.

Built-in integrations are published through the same `aiops.plugins` entry-point group as
third-party ones (see pyproject.toml), so the engine never imports an integration by name and the
layering holds. A plugin is enabled and configured by its table in plugins.toml; a plugin whose
dependency or secret is missing is reported with the reason and skipped, and the rest start.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from aiops.engine.calls import run_checked
from aiops.engine.commands import Command, CommandRegistry
from aiops.engine.facade import EngineFacade
from aiops.engine.tools import Tool, ToolContext, ToolOutput, ToolRegistry

if TYPE_CHECKING:
    from aiops.config import Config
    from aiops.engine.gatekeeper import GateOutcome
    from aiops.engine.tools import Classification
    from aiops.engine.types import Completion, Message, ToolSpec

log = logging.getLogger(__name__)
ENTRY_POINT_GROUP = "aiops.plugins"


class PluginUnavailable(Exception):
    """Raised by a plugin's setup when it cannot run here; the message is the reason shown."""


class PluginSettings(BaseModel):
    """Base for a plugin's plugins.toml table. `enabled` is common to all."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = False


class Plugin:
    """Subclass and override what you need.

    `setup` registers tools and commands; `start`/`stop` are lifecycle hooks for long-lived
    resources (connections, client interfaces such as a Slack bot).
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    settings_model: ClassVar[type[PluginSettings]] = PluginSettings
    # Python modules that must import for the plugin to work (reported when missing).
    requires: ClassVar[tuple[str, ...]] = ()
    # How long `stop` may take before the engine leaves it behind and goes on shutting down: a
    # plugin that hangs (a peer gone, a library that swallows the cancel) must not keep the process,
    # and with it the data dir's lock, alive.
    stop_seconds: ClassVar[float] = 10.0

    def __init__(self) -> None:
        self.settings: Any = None
        self.api: PluginAPI | None = None
        # Shown next to "started" by `aiops plugins` and the status (e.g. its server was down).
        self.status_note = ""

    async def setup(self, api: PluginAPI) -> None:  # pragma: no cover - default is a no-op
        return None

    async def start(self) -> None:
        """Start quickly: engine start-up (console, serve, chat) waits for this. Checks that may
        take long run in the background and `report` what they find."""
        return None

    async def ready(self) -> None:
        """Return once background start-up checks have finished (bounded by the plugin);
        `aiops plugins` waits for this before it reports."""
        return None

    async def tools_ready(self) -> None:
        """Return once the tools this plugin registers in the background (an MCP server's, once
        connected) are registered, or will not be soon (bounded by the plugin). A one-turn run
        (`aiops chat`) waits for this before its turn, whose model is offered the tools registered
        when the turn starts; unlike `ready`, it does not wait for checks the tools do not need."""
        return None

    def tool_unavailable(self, name: str) -> str | None:
        """Why `name`, not registered, is a tool of this plugin that cannot be called now (its
        server is still connecting), said to the model instead of "unknown tool"; None when the
        name is not this plugin's."""
        return None

    async def stop(self) -> None:
        return None


class PluginEngine(EngineFacade, Protocol):
    """What the plugin host reaches of the engine: the views' facade, and what a tool that acts
    through other models and tools needs (delegation): one model call, the gate check every call
    passes, a tool's prompt guidance. Nothing here changes policy."""

    async def complete(self, model_key: str, messages: list[Message], tools: list[ToolSpec],
                       system: str | None = None) -> Completion: ...

    async def check_call(self, tool: Tool, args: dict[str, Any], cls: Classification,
                         ctx: ToolContext) -> GateOutcome: ...

    def tool_guidance(self, model_key: str, tool: str) -> str: ...


class PluginHostView(Protocol):
    """What a PluginAPI reaches of the plugin host (see plugin_host.py)."""

    @property
    def facade(self) -> PluginEngine: ...

    @property
    def env(self) -> Mapping[str, str]: ...

    @property
    def config(self) -> Config: ...

    @property
    def status(self) -> list[PluginStatus]: ...

    @property
    def tools(self) -> ToolRegistry: ...

    @property
    def commands(self) -> CommandRegistry: ...

    @property
    def one_turn(self) -> bool: ...


class PluginAPI:
    """What a plugin may touch: registration and read access, nothing that changes policy."""

    def __init__(self, host: PluginHostView, plugin: Plugin) -> None:
        self._host = host
        self._plugin = plugin

    @property
    def engine(self) -> EngineFacade:
        """The operations every view has (submit, sessions, history, gates): a plugin that is a
        client (Slack, MCP) drives the engine through these."""
        return self._host.facade

    @property
    def env(self) -> Mapping[str, str]:
        return self._host.env

    @property
    def config(self) -> Config:
        """The whole configuration, read-only by convention (a plugin's own file, the data dir)."""
        return self._host.config

    @property
    def one_turn(self) -> bool:
        """True in a process that runs one turn and exits (`aiops chat`): start nothing that turn
        may not need (a server whose tools it is offered can be started when one is called)."""
        return self._host.one_turn

    def report(self, note: str) -> None:
        """Say something about the plugin's state (shown next to "started"), at any time."""
        self._plugin.status_note = note
        for status in self._host.status:
            if status.name == self._plugin.name and status.state == "started":
                status.reason = note

    def register_tool(self, tool: Tool) -> None:
        tool.plugin = self._plugin.name
        self._host.tools.register(tool)

    def unregister_tool(self, name: str) -> None:
        """Withdraw a tool this plugin registered (an MCP server's tool list changed)."""
        self._host.tools.unregister(name)

    def register_command(self, cmd: Command) -> None:
        cmd.plugin = self._plugin.name
        self._host.commands.register(cmd)

    def has_command(self, name: str) -> bool:
        """Whether a `!command` of that name exists (several plugins may offer one command)."""
        return self._host.commands.get(name) is not None

    def tool(self, name: str) -> Tool | None:
        """A registered tool (any plugin's, the engine's own), to read its definition."""
        return self._host.tools.get(name)

    def tool_names(self) -> list[str]:
        return self._host.tools.names()

    async def run_tool(self, name: str, arguments: dict[str, Any], ctx: ToolContext) -> tuple[ToolOutput, str | None]:
        """Run one call of the registered tool `name` for `ctx`'s session, as that session's own
        model's calls run: validated, classified, through its gates and rate limits (the operator
        may be asked), then executed. Returns the output and the gate's decision (None when the
        call never reached the gate). An unknown name is an error output, never a call."""
        tool = self._host.tools.get(name)
        if tool is None:
            return ToolOutput(f"error: unknown tool {name!r}; it was not executed", is_error=True), None
        return await run_checked(self._host.facade.check_call, tool, arguments, ctx)

    async def complete(self, model_key: str, messages: list[Message], tools: list[ToolSpec] | None = None,
                       system: str | None = None) -> Completion:
        """One call of the registry model `model_key` (its backend, its timeout and caps), with
        exactly these messages, tools and system prompt: no session, no history, no gate."""
        return await self._host.facade.complete(model_key, messages, tools or [], system)

    def tool_guidance(self, model_key: str, tool: str) -> str:
        """The system-prompt sections of `model_key`'s tree that are about `tool` (their
        `[REQUIRES ...]` line names it), as the prompt would show them; "" when there are none."""
        return self._host.facade.tool_guidance(model_key, tool)

    def require_env(self, var: str, what: str = "") -> str:
        value = self.env.get(var)
        if not value:
            raise PluginUnavailable(f"secret {var} is not set{' (' + what + ')' if what else ''}")
        return value


@dataclass(slots=True)
class PluginStatus:
    name: str
    state: str  # started | disabled | skipped | failed
    reason: str = ""
    source: str = "builtin"

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "state": self.state, "reason": self.reason, "source": self.source}


def discover() -> dict[str, type[Plugin] | Exception]:
    """Every plugin class published in the entry-point group (or the error loading it)."""
    found: dict[str, type[Plugin] | Exception] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            cls = ep.load()
        except Exception as e:  # noqa: BLE001 - a broken plugin must not stop the others
            found[ep.name] = e
            continue
        found[ep.name] = cls
    return found


def stray_tables(tables: Iterable[str], known: Collection[str]) -> dict[str, str | None]:
    """The plugins.toml tables that no plugin here reads, each with the plugin name closest to it
    (what a misspelled table was likely meant to be), or None. Such a table is ignored, and the
    plugin it was meant for stays off: said, or a typo passes for a plugin switched off."""
    stray = [t for t in tables if t not in known]
    if not stray:
        return {}  # the usual case, asked on start-up for each plugin without a table: no difflib
    import difflib

    return {t: next(iter(difflib.get_close_matches(t, list(known), n=1, cutoff=0.6)), None) for t in stray}


def disabled_reason(name: str, tables: Mapping[str, Any], source: str, known: Collection[str]) -> str:
    """Why the plugin `name` is off, as plugins.toml (`tables`, read from `source`) says it, or as
    its silence does: a plugin is off unless its table sets `enabled = true`."""
    table = tables.get(name)
    if isinstance(table, Mapping) and "enabled" in table:
        return f"enabled = false in {source}"
    if table is not None:
        return f"[{name}] in {source} does not set enabled = true (off by default)"
    misspelled = [t for t, near in stray_tables(tables, known).items() if near == name]
    hint = f"; [{misspelled[0]}] there matches no plugin: a misspelling of [{name}]?" if misspelled else ""
    return f"no [{name}] table in {source} (off by default){hint}"


def check_requirements(cls: type[Plugin]) -> str | None:
    import importlib.util

    missing = [m for m in cls.requires if importlib.util.find_spec(m) is None]
    return f"missing Python package(s): {', '.join(missing)}" if missing else None


def validate_settings(cls: type[Plugin], table: dict[str, Any], source: str) -> Any:
    try:
        return cls.settings_model.model_validate(table)
    except ValidationError as e:
        errs = "; ".join(f"{'.'.join(map(str, x['loc']))}: "
                         f"{'unknown key' if x['type'] == 'extra_forbidden' else x['msg']}"
                         for x in e.errors())
        raise PluginUnavailable(f"invalid settings in {source} [{cls.name}]: {errs}") from None
