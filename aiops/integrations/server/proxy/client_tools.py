"""Client tools on the proxy: a chat client's `tools` offered to the agent's model, a call of one
sent back in the dialect's shape, its result continuing the same turn (engine/client_tools.py has
the engine's side; docs/PROXY.md the whole story).

`[server] client_tools` in aiops.toml: "offer" (the default), "ignore" (dropped, logged once per
client) or "refuse" (400 `tools_not_supported`, the behaviour before client tools existed).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from aiohttp import web

from aiops.engine.types import ToolSpec
from aiops.integrations.server.errors import HttpError
from aiops.integrations.server.owners import caller
from aiops.integrations.server.proxy.messages import tools_refused
from aiops.integrations.server.proxy.state import proxy_state

log = logging.getLogger(__name__)

# OpenAI's rule for a function name; Gemini's is as strict. A name the model's API refuses would
# fail every turn of the chat, so it is the client's 400 instead.
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NO_PARAMETERS = {"type": "object", "properties": {}}


def mode(request: web.Request) -> str:
    return proxy_state(request).settings.client_tools


def offered_tools(request: web.Request, tools: Any, *, tool_choice: Any = None,
                  parallel_tool_calls: Any = None) -> tuple[ToolSpec, ...]:
    """The client's tools to offer the model this turn, by `[server] client_tools`. `tools` in
    OpenAI's shape (`{"type": "function", "function": {name, description, parameters}}`), which
    Ollama's API takes too. Empty `tools` count as none (the ollama client sends `[]` always)."""
    setting = mode(request)
    present = bool(tools) or tool_choice is not None or parallel_tool_calls is not None
    if not present:
        return ()
    if setting == "refuse":
        raise tools_refused("tools" if tools else "tool_choice" if tool_choice is not None
                            else "parallel_tool_calls")
    if setting == "ignore":
        state = proxy_state(request)
        who = caller(request).principal
        if who not in state.ignored_clients:
            state.ignored_clients.add(who)
            log.info("client tools of %s ignored ([server] client_tools = \"ignore\" in aiops.toml): "
                     "the model is offered only the agent's own tools; logged once per client", who)
        return ()
    specs = _specs(tools)
    if tool_choice is not None:
        specs = _choice(tool_choice, specs)
    if parallel_tool_calls is not None:
        if not isinstance(parallel_tool_calls, bool):
            raise HttpError(400, "invalid_type", "parallel_tool_calls must be a boolean",
                            param="parallel_tool_calls")
        if parallel_tool_calls is False and specs:
            raise HttpError(400, "unsupported_value",
                            "parallel_tool_calls: false cannot be honoured: the agent's model may call "
                            "several tools in one reply (send true or leave it out)",
                            param="parallel_tool_calls")
    return specs


def _specs(tools: Any) -> tuple[ToolSpec, ...]:
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise HttpError(400, "invalid_type", "tools must be an array of tools", param="tools")
    out: list[ToolSpec] = []
    names: set[str] = set()
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) and t.get("type", "function") == "function" else None
        if not isinstance(fn, dict):
            raise HttpError(400, "invalid_value",
                            f"tools.{i}: only function tools are supported "
                            f"({{\"type\": \"function\", \"function\": {{\"name\": …}}}})", param=f"tools.{i}")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise HttpError(400, "invalid_value",
                            f"tools.{i}.function.name must be 1-64 letters, digits, '_' or '-' (got {name!r})",
                            param=f"tools.{i}.function.name")
        if name in names:
            raise HttpError(400, "invalid_value", f"tools.{i}: a second tool named {name!r}",
                            param=f"tools.{i}.function.name")
        names.add(name)
        description = fn.get("description") or ""
        parameters = fn.get("parameters") or _NO_PARAMETERS
        if not isinstance(description, str) or not isinstance(parameters, dict):
            raise HttpError(400, "invalid_type",
                            f"tools.{i}.function: description must be a string and parameters an object",
                            param=f"tools.{i}.function")
        out.append(ToolSpec(name, description, parameters))
    return tuple(out)


def _choice(choice: Any, specs: tuple[ToolSpec, ...]) -> tuple[ToolSpec, ...]:
    """`tool_choice`: "auto" offers the tools, "none" none of them. Forcing a call ("required", a
    named function) cannot be honoured: the agent's turn runs several model calls, and its own
    tools are offered beside the client's."""
    if choice == "auto":
        return specs
    if choice == "none":
        return ()
    raise HttpError(400, "unsupported_value",
                    f"tool_choice {choice!r} cannot be honoured: aiops cannot force the agent's model to "
                    f"call a tool (send \"auto\" or \"none\", or leave it out)", param="tool_choice")
