"""The `mcp` plugin: every server of mcp.toml connected, its tools registered as gated tools.

Each tool is `SERVER__TOOL` to the model (aiops.integrations.mcp.naming), of tool type `mcp`, with
the gate target `mcp:SERVER:TOOL` that gates.toml rules name. A tool the server annotates
read-only is a read, every other call a write (asking by default). The annotation comes from the
server; gates.toml can tighten any tool or server regardless.

A server's tools are offered from the list it gave when it last connected (tool_cache.py) until it
answers, so a turn that starts first (`aiops chat`'s one turn) need not wait for it. A call of such
a tool waits for the connection. Every call is refused when the server no longer lists the tool,
or now marks it a write where the list it was offered from said read: the gate judged it as
offered (a cached list, or a live one that changed while the gate waited).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, cast

from pydantic import BaseModel, ConfigDict

from aiops.engine.plugins import Plugin, PluginAPI, PluginSettings
from aiops.engine.tools import Classification, Tool, ToolContext, ToolOutput
from aiops.integrations.mcp.naming import SEPARATOR, gate_target, model_tool_name
from aiops.integrations.mcp.results import ArtifactStore, cut_for_model, operator_copy, render_contents

if TYPE_CHECKING:
    import mcp_types as mt

    from aiops.engine.engine import Engine
    from aiops.integrations.mcp.connection import ServerConnection

log = logging.getLogger(__name__)

# `aiops plugins` waits this long for the first connection attempts before it reports.
READY_SECONDS = 10.0


def args_model(schema: dict[str, Any]) -> type[BaseModel]:
    """A model that passes the arguments through (the server validates them) and shows the model
    the server's own input schema."""
    frozen = dict(schema) if isinstance(schema, dict) else {"type": "object"}
    frozen.setdefault("type", "object")

    class McpArgs(BaseModel):
        model_config = ConfigDict(extra="allow")

        @classmethod
        def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
            return dict(frozen)

    return McpArgs


def _summary(server: str, tool: str, args: dict[str, Any]) -> str:
    """The gate's summary: the tool as gates.toml names it (`mcp:SERVER:TOOL`), then its arguments."""
    import json

    text = json.dumps(args, ensure_ascii=False, default=str)
    if len(text) > 160:
        text = text[:159] + "…"
    return f"{gate_target(server, tool)} {text}"


class McpPlugin(Plugin):
    name = "mcp"
    description = "external MCP servers (mcp.toml) as gated tools"
    settings_model: ClassVar[Any] = PluginSettings
    requires = ("mcp",)

    def __init__(self) -> None:
        super().__init__()
        self.connections: dict[str, ServerConnection] = {}
        # Model-facing tool names registered per server, to replace them when the list changes.
        self._registered: dict[str, list[str]] = {}
        self._in_flight: dict[str, dict[int, ToolContext]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self.artifacts: ArtifactStore | None = None
        # The tool lists of the last connections (tool_cache.py), by server, and which servers'
        # registered tools came from there rather than from the server itself.
        self._cache: dict[str, dict[str, Any]] = {}
        self._cache_path: Path | None = None
        self._cache_lock = asyncio.Lock()
        self._fingerprints: dict[str, str] = {}
        self._configured: set[str] = set()  # every server of mcp.toml, enabled or not
        self._cached_only: set[str] = set()

    async def setup(self, api: PluginAPI) -> None:
        from aiops.integrations.mcp.commands import mcp_command

        cfg = api.config.mcp
        data_dir = api.config.paths.data_dir / "mcp"
        self.artifacts = ArtifactStore(data_dir / "artifacts")
        enabled = {name: server for name, server in cfg.servers.items() if server.enabled}
        self._configured = set(cfg.servers)
        if enabled:
            # Without the SDK, which each connection's task imports in a thread (connection.py).
            from aiops.integrations.mcp import tool_cache
            from aiops.integrations.mcp.connection import ServerConnection

            self._cache_path = data_dir / "tools.json"
            self._cache = tool_cache.read(self._cache_path)
            self._fingerprints = {name: tool_cache.fingerprint(server) for name, server in enabled.items()}
        for name, server in enabled.items():
            self.connections[name] = ServerConnection(
                name, server, cfg, api.env, data_dir / f"{name}.stderr.log", self._changed, self._elicited)
        api.register_command(mcp_command(self))

    async def start(self) -> None:
        from aiops.integrations.mcp import tool_cache

        one_turn = self.api is not None and self.api.one_turn
        for name, conn in self.connections.items():
            entry = self._cache.get(name)
            # A one-turn process may never start the server: it takes only a recent list, so
            # that a server's new tools reach `aiops chat` within a day even if nothing else runs.
            if (entry is not None and entry["config"] == self._fingerprints.get(name)
                    and (not one_turn or tool_cache.fresh(entry))):
                if (tools := _listed_from(entry["tools"])) is not None:
                    self._register_tools(conn, tools, cached=True)
            # A one-turn process (`aiops chat`) offered a server's last list starts the server only
            # if the model calls one of its tools: most turns need none, and a server's start and
            # stop would double the command's time.
            if not (one_turn and name in self._cached_only):
                conn.start()
        self._report()

    async def ready(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(READY_SECONDS):
                await asyncio.gather(*(c.first_attempt() for c in self.connections.values()))

    async def tools_ready(self) -> None:
        # A server's tools are registered when it connects: the first attempts are what a turn
        # that starts now would otherwise miss (`aiops chat` starts one right after start-up).
        # A server whose last list is offered already is not waited for.
        first = [c.first_attempt() for name, c in self.connections.items() if name not in self._cached_only]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(READY_SECONDS):
                await asyncio.gather(*first)

    def tool_unavailable(self, name: str) -> str | None:
        # The longest server name the tool name starts with (SERVER__TOOL, the server's name kept
        # as is, see naming.py); one connected is not asked about: the name is then unknown to it.
        servers = [s for s in self.connections if name.startswith(s + SEPARATOR)]
        if not servers:
            return None
        conn = self.connections[max(servers, key=len)]
        if conn.state == "connected":
            return None
        yet = " yet" if conn.state == "connecting" else ""
        return f"MCP server {conn.name} is not connected{yet} ({conn.describe_state()}); its tools are offered once it is"

    async def stop(self) -> None:
        await asyncio.gather(*(c.stop() for c in self.connections.values()), return_exceptions=True)
        for t in list(self._background):
            t.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)

    # ---- state ------------------------------------------------------------------------------------

    def _report(self) -> None:
        if self.api is None:
            return
        if not self.connections:
            self.api.report("no MCP servers enabled in mcp.toml")
            return
        parts = []
        for conn in self.connections.values():
            part = f"{conn.name}: {conn.describe_state()}"
            n = len(self._registered.get(conn.name, []))
            if conn.state == "connected":
                part += f" ({n} tools)"
            elif conn.name in self._cached_only and not conn.started:
                part = f"{conn.name}: started when one of its {n} tools (from its last connection) is called"
            elif conn.name in self._cached_only:
                part += f" ({n} tools offered from its last connection)"
            elif conn.cfg.command and (tail := conn.stderr_tail()):
                part += f" — stderr: {tail.splitlines()[-1][:200]}"
            parts.append(part)
        self.api.report("; ".join(parts))

    def status(self) -> list[dict[str, Any]]:
        return [c.status() for c in self.connections.values()]

    async def _changed(self, conn: ServerConnection) -> None:
        if conn.state == "connected":
            self._register_tools(conn, [Listed.of(t) for t in conn.tools])
        elif conn.name in self._cached_only:
            # The first attempt failed: its last list would only be offered to fail.
            self._unregister_tools(conn.name)
            self._cached_only.discard(conn.name)
        self._report()
        if conn.state == "connected":
            await self._remember(conn)

    async def _remember(self, conn: ServerConnection) -> None:
        """Keep the list the server just gave for the next start (tool_cache.py)."""
        from aiops.integrations.mcp import tool_cache

        if self._cache_path is None or conn.name not in self._fingerprints:
            return
        tools = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in conn.tools]
        old = self._cache.get(conn.name) or {}
        if (old.get("config") == self._fingerprints[conn.name] and old.get("tools") == tools
                and tool_cache.fresh(old, time.time() + tool_cache.MAX_AGE_SECONDS / 2)):
            return  # the same list, listed recently enough: no write per reconnect
        self._cache[conn.name] = tool_cache.entry(conn.cfg, tools)
        for gone in set(self._cache) - set(self._configured):  # servers no longer in mcp.toml
            del self._cache[gone]
        async with self._cache_lock:  # one write at a time, each of the latest lists
            await asyncio.to_thread(tool_cache.write, self._cache_path, dict(self._cache))

    async def _elicited(self, conn: ServerConnection, params: mt.ElicitRequestParams) -> mt.ElicitResult:
        """A server asks the user something during a call: the operator answers it in the console
        inbox like a gate (approve = accept, deny or timeout = decline). A form that needs values
        cannot be filled in from a gate, so it is declined, and said so in the session."""
        import mcp_types as mt

        assert self.api is not None
        # The one place a plugin opens a gate of its own (no view operation does): through the
        # engine's gatekeeper, so the inbox, the audit log and the timeout treat it as any gate.
        engine = cast("Engine", self.api.engine)
        message = (getattr(params, "message", "") or "")[:500]
        calls = list(self._in_flight.get(conn.name, {}).values())
        if not calls:
            log.warning("mcp %s asked for input outside a call (%s); declined", conn.name, message[:200])
            return mt.ElicitResult(action="decline")
        ctx = calls[0]
        url = getattr(params, "url", None)
        requested: Any = getattr(params, "requested_schema", None)
        schema = requested.model_dump() if hasattr(requested, "model_dump") else (requested or {})
        required = list(schema.get("required") or []) if isinstance(schema, dict) else []
        if required:
            ctx.notice(f"MCP server {conn.name} asked for {', '.join(map(str, required))} ({message[:200]}); "
                       f"declined: aiops answers only yes/no questions from MCP servers")
            return mt.ElicitResult(action="decline")
        summary = f"MCP server {conn.name} asks: {message}" + (f" (open {url})" if url else "")
        resolution = await engine.gatekeeper.broker.request(
            session_id=ctx.session_id, client_id=ctx.session_id, client_kind=ctx.client_kind,
            tool=f"mcp:{conn.name}:elicitation", tool_type="mcp",
            args={"message": message, **({"url": url} if url else {})}, operation="write", tables=[],
            summary=summary, turn_id=ctx.turn_id,
            wait_seconds=engine.gatekeeper.rules.wait_seconds(ctx.client_kind), grantable=False)
        if resolution.decision == "approved":
            return mt.ElicitResult(action="accept", content={})
        return mt.ElicitResult(action="decline")

    # ---- tools ------------------------------------------------------------------------------------

    def _unregister_tools(self, server: str) -> None:
        assert self.api is not None
        for old in self._registered.pop(server, []):
            self.api.unregister_tool(old)

    def _register_tools(self, conn: ServerConnection, tools: list[Listed], *, cached: bool = False) -> None:
        assert self.api is not None
        self._unregister_tools(conn.name)
        if cached:
            self._cached_only.add(conn.name)
        else:
            self._cached_only.discard(conn.name)
        names: list[str] = []
        for t in tools:
            if not conn.cfg.tool_allowed(t.name):
                continue
            tool = self._make_tool(conn, t, cached=cached)
            try:
                self.api.register_tool(tool)
            except ValueError as e:
                log.warning("mcp %s: tool %s not registered: %s", conn.name, t.name, e)
                continue
            names.append(tool.name)
        self._registered[conn.name] = names

    def model_names(self, server: str) -> list[str]:
        return list(self._registered.get(server, []))

    def _make_tool(self, conn: ServerConnection, t: Listed, *, cached: bool = False) -> Tool:
        server, original = conn.name, t.name
        read_only = t.read_only
        operation: Literal["read", "write"] = "read" if read_only else "write"
        limit = conn.cfg.max_result_chars

        def classify(args: BaseModel) -> Classification:
            return Classification(operation, summary=_summary(server, original, args.model_dump()))

        async def execute(args: BaseModel, ctx: ToolContext) -> ToolOutput:
            if refused := await _as_listed_now(conn, original, read_only, cached=cached):
                return ToolOutput(f"error: {refused}", is_error=True)
            # After the connection's task has imported the SDK (in a thread), not before.
            import mcp_types as mt
            from mcp.shared.exceptions import MCPError

            from aiops.integrations.mcp.connection import NotConnected

            arguments = args.model_dump()
            calls = self._in_flight.setdefault(server, {})
            calls[id(ctx)] = ctx
            try:
                result = await conn.call(lambda c: c.call_tool(original, arguments))
            except NotConnected as e:
                return ToolOutput(f"error: {e}", is_error=True)
            except MCPError as e:
                return ToolOutput(f"error: MCP server {server} refused {original}: {e}", is_error=True)
            finally:
                calls.pop(id(ctx), None)
            assert self.artifacts is not None
            if not isinstance(result, mt.CallToolResult):
                return ToolOutput(f"error: MCP server {server} answered {original} with "
                                  f"{type(result).__name__}, not a tool result", is_error=True)
            # Artifacts are files: written off the event loop.
            rendered = await asyncio.to_thread(render_contents, list(result.content), self.artifacts, server)
            data = await asyncio.to_thread(operator_copy, rendered, self.artifacts, server, original,
                                           result.structured_content)
            text = cut_for_model(rendered.text, limit) or "(the tool returned no content)"
            return ToolOutput(text, data=data, is_error=bool(result.is_error))

        description = (t.description or t.title or original).strip()
        description = f"[MCP server {server}] {description}"
        if len(description) > 1024:
            description = description[:1023] + "…"
        return Tool(model_tool_name(server, original), description, args_model(t.input_schema), "mcp",
                    execute, operation=operation, classify=classify,
                    meta={"gate_target": gate_target(server, original), "mcp_server": server,
                          "mcp_tool": original, "read_only_hint": read_only})

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def _read_only(t: mt.Tool) -> bool:
    return bool(t.annotations and t.annotations.read_only_hint)


@dataclass(frozen=True)
class Listed:
    """What a tool is offered as: from the server's list now, or from its last one (without the
    SDK's types, which the cached list is read without)."""

    name: str
    title: str | None
    description: str | None
    input_schema: dict[str, Any]
    read_only: bool

    @classmethod
    def of(cls, t: mt.Tool) -> Listed:
        return cls(t.name, t.title, t.description, t.input_schema, _read_only(t))


def _listed_from(dicts: list[Any]) -> list[Listed] | None:
    """The tools of a cached list (as `Tool.model_dump(by_alias=True)` wrote them); None when it
    does not read as tools (then the server is waited for, as with no cache)."""
    out: list[Listed] = []
    for d in dicts:
        if not (isinstance(d, dict) and isinstance(d.get("name"), str) and isinstance(d.get("inputSchema"), dict)
                and d["inputSchema"].get("type", "object") == "object"):
            log.warning("mcp: a cached tool list is unusable; waiting for its server")
            return None
        annotations = d.get("annotations")
        if not isinstance(annotations, dict):
            annotations = {}
        title, description = d.get("title"), d.get("description")
        out.append(Listed(d["name"], title if isinstance(title, str) else None,
                          description if isinstance(description, str) else None, d["inputSchema"],
                          annotations.get("readOnlyHint") is True))
    return out


async def _as_listed_now(conn: ServerConnection, original: str, read_only: bool, *, cached: bool) -> str | None:
    """Why a call of a tool must not run now, if it must not: the server must still list the tool,
    and must not mark as a write what the gate let through as a read. A tool offered from the
    server's last list waits for the first connection (a one-turn process starts it now)."""
    if cached:
        conn.start()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(READY_SECONDS):
                await conn.first_attempt()
    if conn.state != "connected":
        return None  # the call says the server's state
    live = next((x for x in conn.tools if x.name == original), None)
    if live is None or not conn.cfg.tool_allowed(original):
        return f"MCP server {conn.name} no longer offers {original}"
    if read_only and not _read_only(live):
        return (f"MCP server {conn.name} now marks {original} as a write, not the read it was offered as; "
                f"not run: call it again to have it gated as a write")
    return None
