"""`mcp.toml`: the external MCP servers aiops connects to, validated like every other config file.

Kept apart from aiops.config (which loads it) so the schema, the `${VAR}` expansion and the
Claude-Desktop import share one module that knows nothing about connections.

    [servers.time]
    command = "mcp-server-time"          # stdio: command, args, env, inherit_env
    [servers.files]
    url = "http://127.0.0.1:9000/mcp"    # streamable HTTP: url, headers
    headers = { Authorization = "Bearer ${FILES_TOKEN}" }
    enabled_tools = ["read_*", "list_*"]
"""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

# A server's name is part of every tool name the model sees (`SERVER__TOOL`) and of gate rules
# (`mcp:SERVER:TOOL`): letters, digits, `-` and `_`, and no `__` (the separator).
_SERVER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class McpServerConfig(_Strict):
    enabled: bool = True
    # stdio
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    # Set for the server's process; values may name variables as ${VAR}. The process gets only
    # these, the variables named in inherit_env and the SDK's safe few (PATH, HOME, USER, ...),
    # never the rest of aiops's environment (API keys, tokens).
    env: dict[str, str] = Field(default_factory=dict)
    inherit_env: list[str] = Field(default_factory=list)
    cwd: str | None = None
    # streamable HTTP
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)  # values may name variables as ${VAR}
    # Globs on the server's own tool names; a tool must match enabled_tools (when given) and no
    # disabled_tools glob.
    enabled_tools: list[str] | None = None
    disabled_tools: list[str] = Field(default_factory=list)
    # "auto": the 2026 protocol when the server has it, else the initialize handshake; "legacy":
    # always the handshake (servers that ask the user questions mid-call need it over HTTP).
    protocol: Literal["auto", "legacy"] = "auto"
    # Seconds one call may take.
    timeout: float = Field(60, gt=0)
    # Characters of a result the model sees (head and tail); the operator keeps the whole result.
    max_result_chars: int = Field(12_000, ge=200, le=18_000)

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if bool(self.command) == bool(self.url):
            raise ValueError("set either command (a stdio server) or url (a streamable HTTP server)")
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url {self.url!r} must start with http:// or https://")
        if self.url and (self.args or self.env or self.inherit_env or self.cwd):
            raise ValueError("args, env, inherit_env and cwd are for stdio servers (command), not url")
        if self.command and self.headers:
            raise ValueError("headers are for streamable HTTP servers (url), not command")
        return self

    @property
    def transport(self) -> str:
        return "stdio" if self.command else "http"

    def tool_allowed(self, name: str) -> bool:
        if self.enabled_tools is not None and not any(fnmatch.fnmatchcase(name, g) for g in self.enabled_tools):
            return False
        return not any(fnmatch.fnmatchcase(name, g) for g in self.disabled_tools)

    def where(self) -> str:
        return self.url or " ".join([self.command or "", *self.args])


class McpConfig(_Strict):
    """The whole of `mcp.toml`."""

    servers: dict[str, McpServerConfig] = Field(default_factory=dict)
    # Seconds between pings of a connected server (a dead one is noticed within this).
    ping_seconds: float = Field(15, gt=0)
    # Reconnect backoff: the first wait, doubled after every failure up to the last.
    retry_first_seconds: float = Field(1, gt=0)
    retry_max_seconds: float = Field(60, gt=0)

    @field_validator("servers")
    @classmethod
    def _names(cls, v: dict[str, McpServerConfig]) -> dict[str, McpServerConfig]:
        for name in v:
            if not _SERVER_NAME.fullmatch(name) or "__" in name:
                raise ValueError(f"server name {name!r}: use letters, digits, '-' and '_' (no '__', "
                                 f"which separates server and tool in SERVER__TOOL)")
        return v


def expand(value: str, env: Mapping[str, str]) -> str:
    """`Bearer ${TOKEN}` with TOKEN from `env`; KeyError naming the variable when it is unset."""
    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in env:
            raise KeyError(name)
        return env[name]

    return _VAR.sub(sub, value)


# ---- `aiops mcp import`: Claude Desktop's mcpServers JSON ------------------------------------------


def from_claude_desktop(data: Any) -> dict[str, dict[str, Any]]:
    """`{"mcpServers": {name: {command, args, env} | {url, headers}}}` as mcp.toml `servers` tables.

    Raises ValueError naming what is wrong. Names that mcp.toml does not accept are rewritten
    (`my.server` → `my-server`); env values are kept as written, so a secret pasted into the JSON
    lands in mcp.toml: the caller says so.
    """
    if not isinstance(data, dict) or not isinstance(data.get("mcpServers"), dict):
        raise ValueError('expected a JSON object with an "mcpServers" object')
    out: dict[str, dict[str, Any]] = {}
    for raw_name, entry in data["mcpServers"].items():
        if not isinstance(entry, dict):
            raise ValueError(f"mcpServers.{raw_name}: expected an object")
        name = re.sub(r"_{2,}", "_", re.sub(r"[^A-Za-z0-9_-]", "-", str(raw_name))).strip("-_") or "server"
        table: dict[str, Any] = {}
        if entry.get("disabled"):
            table["enabled"] = False
        if "command" in entry:
            table["command"] = str(entry["command"])
            if entry.get("args"):
                table["args"] = [str(a) for a in entry["args"]]
            if entry.get("env"):
                table["env"] = {str(k): str(v) for k, v in entry["env"].items()}
            if entry.get("cwd"):
                table["cwd"] = str(entry["cwd"])
        elif "url" in entry or "serverUrl" in entry:
            table["url"] = str(entry.get("url") or entry.get("serverUrl"))
            if entry.get("headers"):
                table["headers"] = {str(k): str(v) for k, v in entry["headers"].items()}
        else:
            raise ValueError(f"mcpServers.{raw_name}: neither command nor url")
        try:
            McpServerConfig.model_validate(table)
        except ValidationError as e:
            raise ValueError(f"mcpServers.{raw_name}: " + "; ".join(x["msg"].removeprefix("Value error, ")
                                                                     for x in e.errors())) from None
        while name in out:
            name += "-2"
        out[name] = table
    return out


def import_claude_desktop(json_path: Path, toml_path: Path, *, replace: bool = False) -> list[str]:
    """Add the servers of a Claude-Desktop JSON file to `toml_path` (created if absent); returns
    what was done, one line each. A server of the same name is kept unless `replace`.

    The file is rewritten from its data: comments in an existing mcp.toml are not kept.
    Raises ValueError for a file that cannot be read or converted; nothing is written then.
    """
    import tomli_w

    try:
        data = json.loads(json_path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"{json_path}: cannot read: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{json_path}: invalid JSON: {e}") from None
    try:
        servers = from_claude_desktop(data)
    except ValueError as e:
        raise ValueError(f"{json_path}: {e}") from None
    try:
        existing = tomllib.loads(toml_path.read_text(encoding="utf-8")) if toml_path.exists() else {}
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"{toml_path}: cannot read: {e}") from None
    tables = existing.setdefault("servers", {})
    lines: list[str] = []
    for name, table in servers.items():
        if name in tables and not replace:
            lines.append(f"kept     {name} (already in {toml_path.name}; --replace to overwrite)")
            continue
        lines.append(f"{'replaced' if name in tables else 'added   '} {name} ({table.get('url') or table['command']})")
        tables[name] = table
        if table.get("env") or table.get("headers"):
            lines.append(f"         {name}: env/header values were copied as written; put secrets in the "
                         f"environment and write them as ${{VAR}}")
    try:
        McpConfig.model_validate(existing)
    except ValidationError as e:
        raise ValueError(f"{toml_path}: the result would not be valid: {e.errors()[0]['msg']}") from None
    toml_path.parent.mkdir(parents=True, exist_ok=True)
    header = "# MCP servers (docs/MCP.md). Written by `aiops mcp import`.\n\n"
    toml_path.write_text(header + tomli_w.dumps(existing), encoding="utf-8")
    return lines
