"""`!mcp`: the operator's view of the MCP servers, and their resources and prompts.

    !mcp                          servers, their state, tools, prompts and resources
    !mcp read SERVER URI          a resource's content (non-text content saved as artifacts)
    !mcp prompt SERVER NAME [k=v ...]   run a server's prompt into this session as a message
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from aiops.engine.commands import Command, CommandContext, CommandError
from aiops.integrations.mcp.naming import model_tool_name
from aiops.integrations.mcp.results import render_contents

if TYPE_CHECKING:
    from aiops.integrations.mcp.connection import ServerConnection
    from aiops.integrations.mcp.host import McpPlugin


def _errors() -> tuple[type[Exception], ...]:
    """What a request to a server may raise that the operator should read (imported late: the
    SDK loads only when servers are configured)."""
    from mcp.shared.exceptions import MCPError

    from aiops.integrations.mcp.connection import NotConnected

    return (NotConnected, MCPError)

USAGE = "!mcp [read SERVER URI | prompt SERVER NAME [key=value ...]]"


async def _listing(plugin: McpPlugin, conn: ServerConnection) -> list[str]:
    lines = [f"{conn.name} ({conn.cfg.transport}: {conn.cfg.where()}): {conn.describe_state()}"]
    if conn.state != "connected":
        tail = conn.stderr_tail() if conn.cfg.command else ""
        if tail:
            lines.append("  stderr (last lines):")
            lines += [f"    {line}" for line in tail.splitlines()[-8:]]
        return lines
    registered = set(plugin.model_names(conn.name))
    lines.append("  tools:")
    for t in conn.tools:
        model_name = model_tool_name(conn.name, t.name)
        ro = bool(t.annotations and t.annotations.read_only_hint)
        if model_name in registered:
            lines.append(f"    {model_name}  ({'read' if ro else 'write'}; gate mcp:{conn.name}:{t.name})")
        else:
            lines.append(f"    {t.name}  (hidden by enabled_tools/disabled_tools)")
    caps = conn.client.server_capabilities if conn.client is not None else None
    if caps is not None and caps.prompts is not None:
        try:
            prompts = await conn.call(lambda c: c.list_prompts())
            names = [p.name + (f"({', '.join(a.name for a in p.arguments or [])})" if p.arguments else "")
                     for p in prompts.prompts]
            lines.append(f"  prompts: {', '.join(names) or 'none'}")
        except _errors() as e:
            lines.append(f"  prompts: error: {e}")
    if caps is not None and caps.resources is not None:
        try:
            res = await conn.call(lambda c: c.list_resources())
            lines.append(f"  resources: {', '.join(str(r.uri) for r in res.resources) or 'none'}")
        except _errors() as e:
            lines.append(f"  resources: error: {e}")
    return lines


def _conn(plugin: McpPlugin, name: str) -> ServerConnection:
    conn = plugin.connections.get(name)
    if conn is None:
        raise CommandError(f"no MCP server {name!r}; servers: {', '.join(plugin.connections) or 'none'}")
    return conn


def _prompt_args(argv: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for a in argv:
        key, sep, value = a.partition("=")
        if not sep or not key:
            raise CommandError(f"prompt arguments are key=value, not {a!r}")
        out[key] = value
    return out


def mcp_command(plugin: McpPlugin) -> Command:
    async def handler(ctx: CommandContext, argv: list[str], raw: str) -> str:
        if not argv or argv[0] == "list":
            if not plugin.connections:
                return "no MCP servers are enabled (mcp.toml)"
            lines: list[str] = []
            for conn in plugin.connections.values():
                lines += await _listing(plugin, conn)
            return "\n".join(lines)
        assert plugin.artifacts is not None
        if argv[0] == "read" and len(argv) == 3:
            conn = _conn(plugin, argv[1])
            try:
                result = await conn.call(lambda c: c.read_resource(argv[2]))
            except _errors() as e:
                raise CommandError(f"{argv[1]}: {e}") from None
            rendered = await asyncio.to_thread(render_contents, list(result.contents), plugin.artifacts,
                                               conn.name)
            await ctx.engine.store.add_audit("operator_mcp_read", session_id=await ctx.audit_session_id(),
                                             tool=f"mcp:{conn.name}", operation="read", decision="approved",
                                             actor=f"operator:{ctx.client_kind}", data={"uri": argv[2]})
            return rendered.text or "(empty resource)"
        if argv[0] == "prompt" and len(argv) >= 3:
            conn = _conn(plugin, argv[1])
            arguments = _prompt_args(argv[3:])
            try:
                result = await conn.call(lambda c: c.get_prompt(argv[2], arguments or None))
            except _errors() as e:
                raise CommandError(f"{argv[1]}: {e}") from None
            rendered = await asyncio.to_thread(render_contents, [m.content for m in result.messages],
                                               plugin.artifacts, conn.name)
            text = rendered.text.strip()
            if not text:
                raise CommandError(f"prompt {argv[2]} of {conn.name} has no text")
            # Queued after this command's own message is taken, as if the operator had typed it.
            plugin.spawn(_submit(ctx, text))
            return f"running prompt {conn.name}:{argv[2]} in this session ({len(text)} characters)"
        raise CommandError(f"usage: {USAGE}")

    return Command("mcp", USAGE, "MCP servers: state, tools, prompts, resources; read a resource, "
                   "run a prompt", handler, operator_only=True)


async def _submit(ctx: CommandContext, text: str) -> Any:
    try:
        return await ctx.engine.submit(ctx.session_id, text, kind=ctx.client_kind, is_operator=True)
    except Exception as e:  # noqa: BLE001 - the session gets the reason, the command already answered
        ctx.engine.notice(ctx.session_id, f"the MCP prompt could not be run: {e}")
        return None
