"""Configuration: TOML files validated by pydantic (the paths they live in: aiops.paths).

Each file is looked up in the chosen config dir first and falls back to the shipped default (the
repository's `config/`, carried inside an installed wheel as `aiops/_defaults/config`). Validation
errors name the file and the dotted key, so `aiops` can print one clear line and exit non-zero
instead of a traceback.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from aiops.gates.limits import LimitsConfig
from aiops.gates.rules import GatesConfig
from aiops.mcp_config import McpConfig

# Re-exported: the paths moved to aiops.paths (no pydantic there), where they were always imported from here.
from aiops.paths import APP_NAME as APP_NAME
from aiops.paths import REPO_ROOT as REPO_ROOT
from aiops.paths import SHIPPED_CONFIG_DIR as SHIPPED_CONFIG_DIR
from aiops.paths import SHIPPED_PROMPT_DIR as SHIPPED_PROMPT_DIR
from aiops.paths import ConfigError as ConfigError
from aiops.paths import Paths as Paths
from aiops.paths import copy_tree as copy_tree
from aiops.paths import load_env as load_env
from aiops.paths import replace_tree as replace_tree
from aiops.paths import resolve_paths as resolve_paths

CONFIG_FILES = ("aiops.toml", "models.toml", "gates.toml", "limits.toml", "plugins.toml", "mcp.toml")


_M = TypeVar("_M", bound=BaseModel)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---- models.toml ----------------------------------------------------------------------------------


class ModelConfig(_Strict):
    type: Literal["openai", "gemini"]
    model_id: str
    base_url: str | None = None
    api_key_env: str | None = None
    max_context: int = Field(50, gt=0)
    timeout: float = Field(120, gt=0)
    enabled: bool = True
    tool_calling: Literal["native", "text"] = "native"
    description: str = ""
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = Field(None, gt=0)
    # A streamed answer that goes beyond these is cut off with an error and not kept as context:
    # one line without a line break (bytes), and the whole answer (text, thinking and tool-call
    # arguments, characters). A runaway or hostile server cannot fill memory or the store.
    max_line_bytes: int = Field(8 * 1024 * 1024, gt=0)
    max_answer_chars: int = Field(1_000_000, gt=0)
    # A 429 answer's Retry-After is waited for and the call retried while the waits of one call add
    # up to at most this many seconds; 0 fails at the first 429.
    rate_limit_retry_seconds: float = Field(60, ge=0)
    # A folder under <config dir>/system_prompt/ (copied from the shipped one on first use), or an
    # absolute path; "none" sends no system prompt.
    system_prompt_folder: str = "default"
    # A target of the delegation tools (llm_clean_text, llm_clean_tool): another model may hand it
    # a prompt or one tool's task. Only the operator marks a model so; `!llm_call` switches targets
    # off and on per session. `delegation_timeout` bounds each of its answers there (seconds).
    delegation: bool = False
    delegation_timeout: float = Field(60, gt=0, le=3600)

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"expected an http(s) URL like https://api.openai.com/v1, not {v!r}")
        return v

    def api_key(self, env: os._Environ[str] | dict[str, str] | None = None) -> str | None:
        env = os.environ if env is None else env
        return env.get(self.api_key_env) if self.api_key_env else None

    def key_status(self, env: os._Environ[str] | dict[str, str] | None = None) -> str:
        """'present', 'missing' (env var named but unset) or 'not needed'."""
        if not self.api_key_env:
            return "not needed"
        return "present" if self.api_key(env) else "missing"

    def display_url(self) -> str:
        """The model server's address as messages and logs show it: without a user:password or a
        query string, where a key is sometimes put (`?api-key=…`)."""
        if self.base_url:
            try:
                parts = urlsplit(self.base_url)
                host = parts.hostname or ""
                port = parts.port
            except ValueError:
                return "(an unreadable base_url)"
            if ":" in host:
                host = f"[{host}]"
            netloc = host + (f":{port}" if port is not None else "")
            return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
        return ("https://generativelanguage.googleapis.com" if self.type == "gemini"
                else "https://api.openai.com/v1")


class ModelsConfig(_Strict):
    default_model: str
    models: dict[str, ModelConfig]

    @model_validator(mode="after")
    def _default_exists(self) -> ModelsConfig:
        if self.default_model not in self.models:
            raise ValueError(
                f"default_model {self.default_model!r} is not a model in [models.*] "
                f"(known: {', '.join(sorted(self.models)) or 'none'})"
            )
        if not self.models[self.default_model].enabled:
            # Every new session (console, API, chat UIs through `aiops`) would run on it.
            raise ValueError(
                f"default_model {self.default_model!r} is disabled (enabled = false): enable it or "
                f"choose an enabled one ({', '.join(sorted(self.enabled())) or 'none is enabled'})"
            )
        return self

    def enabled(self) -> dict[str, ModelConfig]:
        return {k: m for k, m in self.models.items() if m.enabled}

    def delegation_targets(self) -> dict[str, ModelConfig]:
        """The enabled models marked `delegation = true`: what the delegation tools may call."""
        return {k: m for k, m in self.models.items() if m.enabled and m.delegation}


# ---- aiops.toml -----------------------------------------------------------------------------------


class ServerConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8765, ge=0, le=65535)
    extra_ports: list[Annotated[int, Field(ge=1, le=65535)]] = Field(default_factory=list)
    enabled: bool = True
    # Chat UIs send the whole conversation with every message, earlier images (base64) included:
    # at 1 MiB one screenshot in a chat's history made every later message a 413.
    max_body_bytes: int = Field(32 * 1_048_576, gt=0)
    # Seconds to receive a request: a body slower than that gets 408; headers that do not finish
    # within it (from the connection, or the previous response) get the connection closed, as
    # does a keep-alive connection idle for that long.
    request_timeout: float = Field(60, gt=0)
    # Seconds between keep-alive comments (or empty chunks) on an idle stream.
    keepalive_seconds: float = Field(15, gt=0)
    # Seconds open requests get to finish at shutdown before they are cut; cutting one that does not
    # end (a client that stopped reading) may take as long again (aiohttp waits twice).
    shutdown_timeout: float = Field(10, gt=0)
    # Chat UIs see a short italic line while a gate waits; tool progress stays out unless asked.
    proxy_status_lines: bool = True
    proxy_tool_progress: bool = False
    # A chat request's messages (chat UIs resend the whole history each time: 413 beyond), and the
    # earlier messages one proxy session takes in from clients' histories in all (a new chat's
    # history, what a session lacks: 400 beyond). Unbounded, one 4 MB body of 100,000 messages
    # took 11 s and added 74 MB to the store.
    proxy_max_messages: int = Field(1000, gt=0)
    proxy_max_imported: int = Field(1000, gt=0)
    # A chat client's own tools (`tools` in its request): offered to the model beside the agent's
    # (calls go back to the client, see engine/client_tools.py), dropped, or refused with a 400.
    client_tools: Literal["offer", "ignore", "refuse"] = "offer"
    # The model's reasoning (`thinking` events) reaches chat clients: `reasoning_content` on /v1,
    # `thinking` on /api when the request asks with `think`. False withholds it from every client
    # (it is still recorded in the session and shown in the console).
    proxy_reasoning: bool = True
    # Browser origins allowed to call the server (CORS), `*` matching anything: e.g.
    # ["http://localhost:*", "chrome-extension://*"]. None by default (see server/cors.py).
    cors_origins: list[str] = Field(default_factory=list)
    # The MCP endpoint (/mcp) listens on its own port on the same host; None: the main port + 1
    # (0 lets the OS choose, as port = 0 does). See docs/MCP.md.
    mcp_port: int | None = Field(None, ge=0, le=65535)
    mcp_enabled: bool = True

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, v: list[str]) -> list[str]:
        for origin in v:
            if origin in ("*", "null"):  # any origin (OLLAMA_ORIGINS=* for desktop apps); file:// pages
                continue
            scheme, sep, rest = origin.partition("://")
            if not sep or not scheme or not rest or "/" in rest:
                raise ValueError(f"{origin!r} is not an origin: write scheme://host[:port] (no path), "
                                 f"* matching anything, e.g. http://localhost:* or chrome-extension://*; "
                                 f'"*" alone allows every origin, "null" pages opened from files')
        return v

    def is_loopback(self) -> bool:
        if self.host in ("localhost", ""):
            return self.host == "localhost"
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


class TokenConfig(_Strict):
    token_env: str
    role: Literal["operator", "client"] = "client"


class AuthConfig(_Strict):
    tokens: dict[str, TokenConfig] = Field(default_factory=dict)
    # Invalid tokens one address may present within the window before its requests with a token
    # are answered 429 until the window clears; 0 turns the throttle off.
    failed_auth_limit: int = Field(10, ge=0)
    failed_auth_window_seconds: float = Field(60, gt=0)

    @field_validator("tokens")
    @classmethod
    def _names_without_colon(cls, tokens: dict[str, TokenConfig]) -> dict[str, TokenConfig]:
        # A client token's conversations are named `<token>:<name>`; with ':' in token names,
        # `team`'s namespace would hold `team:web`'s.
        for name in tokens:
            if ":" in name or not name.strip():
                raise ValueError(f"token name {name!r}: use a non-empty name without ':' (a client "
                                 f"token's sessions are named '<token>:…')")
        return tokens


class ConsoleConfig(_Strict):
    bell: bool = True
    theme: str = "textual-dark"
    keymap: dict[str, str] = Field(default_factory=dict)
    history_page: int = Field(50, gt=0)


class EngineConfig(_Strict):
    queue_size: int = Field(1000, gt=0)
    # Idle sessions kept in memory with their history; beyond this the least recently used are
    # dropped from memory (never from the store) and reloaded on their next use.
    cached_sessions: int = Field(256, ge=1)


class PeerConfig(_Strict):
    """One aiops instance this one's agent may call (`agent_call`), under `[swarm.peers.NAME]`."""

    url: str
    # The variable holding the bearer token the peer gave this instance (a client token is
    # enough); unset: the call goes without one (a peer without tokens, on loopback).
    token_env: str | None = None
    # What the model reads to choose this peer by name ("the billing database's agent").
    description: str = ""
    # Seconds to wait for its answer; None: [swarm] timeout_seconds.
    timeout_seconds: float | None = Field(None, gt=0, le=3600)

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.query:
            raise ValueError(f"expected the peer's base URL like http://10.0.0.7:8765, not {v!r}")
        return v.rstrip("/")


class SwarmConfig(_Strict):
    """`[swarm]`: the other aiops instances the agent may call (docs/SWARM.md)."""

    # Seconds a call waits for the peer's answer; then the peer's turn is stopped.
    timeout_seconds: float = Field(120, gt=0, le=3600)
    # The model's copy of a peer's answer is cut (head and tail kept) beyond this many characters.
    max_result_chars: int = Field(12_000, ge=500, le=100_000)
    peers: dict[str, PeerConfig] = Field(default_factory=dict)

    @field_validator("peers")
    @classmethod
    def _peer_names(cls, peers: dict[str, PeerConfig]) -> dict[str, PeerConfig]:
        for name in peers:
            # The model names a peer in a tool call, and the name goes into the remote session id.
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", name):
                raise ValueError(f"peer name {name!r}: use letters, digits, '-' and '_' (at most 64)")
        return peers


class AppConfig(_Strict):
    server: ServerConfig = Field(default_factory=ServerConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    console: ConsoleConfig = Field(default_factory=ConsoleConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    swarm: SwarmConfig = Field(default_factory=SwarmConfig)


# ---- loading --------------------------------------------------------------------------------------


def _format_validation_error(path: Path, err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        elif e["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
        lines.append(f"{path}: {key}: {msg}")
    return "\n".join(lines)


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None


def validate_file(path: Path, model: type[_M], data: dict[str, Any] | None = None) -> _M:
    data = read_toml(path) if data is None else data
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(path, e)) from None


@dataclass
class Config:
    paths: Paths
    app: AppConfig
    models: ModelsConfig
    gates: GatesConfig
    limits: LimitsConfig
    plugins: dict[str, dict[str, Any]]
    sources: dict[str, Path] = field(default_factory=dict)
    mcp: McpConfig = field(default_factory=McpConfig)

    def plugin_settings(self, name: str) -> dict[str, Any]:
        return dict(self.plugins.get(name, {}))


def load_config(paths: Paths, *, load_dotenv: bool = True) -> Config:
    if load_dotenv:
        load_env(paths)
    sources = {name: paths.config_file(name) for name in CONFIG_FILES}
    missing = [n for n, p in sources.items() if not p.exists()]
    if missing:
        raise ConfigError(f"no {', '.join(missing)} in {paths.config_dir} nor in the shipped defaults "
                          f"{paths.shipped_config_dir}")
    # Every file is read and checked before anything is refused, so one run names every error
    # in every file (`aiops config check` after an edit shows the whole list, not the first).
    errors: list[str] = []

    def checked(name: str, model: type[_M]) -> _M | None:
        try:
            return validate_file(sources[name], model)
        except ConfigError as e:
            errors.append(str(e))
            return None

    app = checked("aiops.toml", AppConfig)
    models = checked("models.toml", ModelsConfig)
    gates = checked("gates.toml", GatesConfig)
    limits = checked("limits.toml", LimitsConfig)
    mcp = checked("mcp.toml", McpConfig)
    plugins_raw: dict[str, Any] = {}
    try:
        plugins_raw = read_toml(sources["plugins.toml"])
    except ConfigError as e:
        errors.append(str(e))
    for name, table in plugins_raw.items():
        if not isinstance(table, dict):
            errors.append(f"{sources['plugins.toml']}: {name}: expected a table like [{name}]")
    if errors or app is None or models is None or gates is None or limits is None or mcp is None:
        raise ConfigError("\n".join(errors))
    return Config(paths=paths, app=app, models=models, gates=gates, limits=limits,
                  plugins=plugins_raw, sources=sources, mcp=mcp)
