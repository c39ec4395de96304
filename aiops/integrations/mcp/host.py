"""The `mcp` plugin: every server of mcp.toml connected, its tools registered as gated tools.

Each tool is `SERVER__TOOL` to the model (aiops.integrations.mcp.naming), of tool type `mcp`, with
the gate target `mcp:SERVER:TOOL` that gates.toml rules name. A tool the server annotates
read-only is a read, every other call a write (asking by default). The annotation comes from the
server; gates.toml can tighten any tool or server regardless.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
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
    import json

    text = json.dumps(args, ensure_ascii=False, default=str)
    if len(text) > 160:
        text = text[:159] + "…"
    return f"MCP {server}:{tool} {text}"


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

    async def setup(self, api: PluginAPI) -> None:
        from aiops.integrations.mcp.commands import mcp_command

        cfg = api.config.mcp
        data_dir = api.config.paths.data_dir / "mcp"
        self.artifacts = ArtifactStore(data_dir / "artifacts")
        enabled = {name: server for name, server in cfg.servers.items() if server.enabled}
        if enabled:
            # The SDK costs ~1.5 s of CPU to import: only when there is a server to talk to.
            from aiops.integrations.mcp.connection import ServerConnection
        for name, server in enabled.items():
            self.connections[name] = ServerConnection(
                name, server, cfg, api.env, data_dir / f"{name}.stderr.log", self._changed, self._elicited)
        api.register_command(mcp_command(self))

    async def start(self) -> None:
        for conn in self.connections.values():
            conn.start()
        self._report()

    async def ready(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(READY_SECONDS):
                await asyncio.gather(*(c.first_attempt() for c in self.connections.values()))

    async def tools_ready(self) -> None:
        # A server's tools are registered when it connects: the first attempts are what a turn
        # that starts now would otherwise miss (`aiops chat` starts one right after start-up).
        await self.ready()

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
            if conn.state == "connected":
                part += f" ({len(self._registered.get(conn.name, []))} tools)"
            elif conn.cfg.command and (tail := conn.stderr_tail()):
                part += f" — stderr: {tail.splitlines()[-1][:200]}"
            parts.append(part)
        self.api.report("; ".join(parts))

    def status(self) -> list[dict[str, Any]]:
        return [c.status() for c in self.connections.values()]

    async def _changed(self, conn: ServerConnection) -> None:
        if conn.state == "connected":
            self._register_tools(conn)
        self._report()

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

    def _register_tools(self, conn: ServerConnection) -> None:
        assert self.api is not None
        for old in self._registered.pop(conn.name, []):
            self.api.unregister_tool(old)
        names: list[str] = []
        for t in conn.tools:
            if not conn.cfg.tool_allowed(t.name):
                continue
            tool = self._make_tool(conn, t)
            try:
                self.api.register_tool(tool)
            except ValueError as e:
                log.warning("mcp %s: tool %s not registered: %s", conn.name, t.name, e)
                continue
            names.append(tool.name)
        self._registered[conn.name] = names

    def model_names(self, server: str) -> list[str]:
        return list(self._registered.get(server, []))

    def _make_tool(self, conn: ServerConnection, t: mt.Tool) -> Tool:
        server, original = conn.name, t.name
        read_only = bool(t.annotations and t.annotations.read_only_hint)
        operation: Literal["read", "write"] = "read" if read_only else "write"
        limit = conn.cfg.max_result_chars

        def classify(args: BaseModel) -> Classification:
            return Classification(operation, summary=_summary(server, original, args.model_dump()))

        async def execute(args: BaseModel, ctx: ToolContext) -> ToolOutput:
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
