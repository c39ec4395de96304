"""Configuration: TOML files validated by pydantic, and the paths they live in.

Each file is looked up in the chosen config dir first and falls back to the default shipped in the
repository's `config/`. Validation errors name the file and the dotted key, so `aiops` can print
one clear line and exit non-zero instead of a traceback.
"""

from __future__ import annotations

import ipaddress
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from aiops.gates.limits import LimitsConfig
from aiops.gates.rules import GatesConfig

APP_NAME = "aiops"
REPO_ROOT = Path(__file__).resolve().parent.parent
SHIPPED_CONFIG_DIR = REPO_ROOT / "config"
SHIPPED_PROMPT_DIR = REPO_ROOT / "system_prompt"

CONFIG_FILES = ("aiops.toml", "models.toml", "gates.toml", "limits.toml", "plugins.toml")


_M = TypeVar("_M", bound=BaseModel)


class ConfigError(Exception):
    """A configuration problem, already phrased for the operator (file and key named)."""


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
    # A folder under system_prompt/ (or an absolute path); "none" sends no system prompt.
    system_prompt_folder: str = "default"

    def api_key(self, env: os._Environ[str] | dict[str, str] | None = None) -> str | None:
        env = os.environ if env is None else env
        return env.get(self.api_key_env) if self.api_key_env else None

    def key_status(self, env: os._Environ[str] | dict[str, str] | None = None) -> str:
        """'present', 'missing' (env var named but unset) or 'not needed'."""
        if not self.api_key_env:
            return "not needed"
        return "present" if self.api_key(env) else "missing"

    def display_url(self) -> str:
        if self.base_url:
            return self.base_url
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
        return self

    def enabled(self) -> dict[str, ModelConfig]:
        return {k: m for k, m in self.models.items() if m.enabled}


# ---- aiops.toml -----------------------------------------------------------------------------------


class ServerConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8765, ge=0, le=65535)
    extra_ports: list[int] = Field(default_factory=list)
    enabled: bool = True
    max_body_bytes: int = Field(1_048_576, gt=0)
    # Seconds to receive a request body; a slower sender gets 408.
    request_timeout: float = Field(60, gt=0)
    # Seconds between keep-alive comments (or empty chunks) on an idle stream.
    keepalive_seconds: float = Field(15, gt=0)
    # Seconds open requests get to finish at shutdown before they are cut.
    shutdown_timeout: float = Field(10, gt=0)
    # Chat UIs see a short italic line while a gate waits; tool progress stays out unless asked.
    proxy_status_lines: bool = True
    proxy_tool_progress: bool = False

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


class ConsoleConfig(_Strict):
    bell: bool = True
    theme: str = "textual-dark"
    keymap: dict[str, str] = Field(default_factory=dict)
    history_page: int = Field(50, gt=0)


class EngineConfig(_Strict):
    queue_size: int = Field(1000, gt=0)


class AppConfig(_Strict):
    server: ServerConfig = Field(default_factory=ServerConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    console: ConsoleConfig = Field(default_factory=ConsoleConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)


# ---- paths ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Paths:
    config_dir: Path
    data_dir: Path
    shipped_config_dir: Path = SHIPPED_CONFIG_DIR
    prompt_dir: Path = SHIPPED_PROMPT_DIR

    def config_file(self, name: str) -> Path:
        """The user's copy when present, else the shipped default."""
        user = self.config_dir / name
        return user if user.exists() else self.shipped_config_dir / name

    @property
    def db_path(self) -> Path:
        return self.data_dir / "aiops.sqlite3"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "aiops.log"

    @property
    def lock_path(self) -> Path:
        return self.data_dir / "aiops.lock"

    def env_files(self) -> list[Path]:
        return [Path.cwd() / ".env", self.config_dir / ".env"]

    def prompt_folder(self, name: str) -> Path | None:
        if name.lower() == "none":
            return None
        p = Path(name).expanduser()
        if p.is_absolute():
            return p
        user = self.config_dir / "system_prompt" / name
        return user if user.exists() else self.prompt_dir / name


def resolve_paths(config_dir: str | Path | None = None, data_dir: str | Path | None = None) -> Paths:
    import platformdirs  # deferred: keeps `import aiops.config` cheap

    cfg = config_dir or os.environ.get("AIOPS_CONFIG_DIR") or platformdirs.user_config_dir(APP_NAME)
    data = data_dir or os.environ.get("AIOPS_DATA_DIR") or platformdirs.user_data_dir(APP_NAME)
    return Paths(config_dir=Path(cfg).expanduser().resolve(), data_dir=Path(data).expanduser().resolve())


# ---- loading --------------------------------------------------------------------------------------


def _format_validation_error(path: Path, err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
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

    def plugin_settings(self, name: str) -> dict[str, Any]:
        return dict(self.plugins.get(name, {}))


def load_env(paths: Paths) -> None:
    """Secrets come from the environment or a .env file; the environment wins."""
    from dotenv import load_dotenv

    for p in paths.env_files():
        if p.is_file():
            load_dotenv(p, override=False)


def load_config(paths: Paths, *, load_dotenv: bool = True) -> Config:
    if load_dotenv:
        load_env(paths)
    sources = {name: paths.config_file(name) for name in CONFIG_FILES}
    missing = [n for n, p in sources.items() if not p.exists()]
    if missing:
        raise ConfigError(f"no {', '.join(missing)} in {paths.config_dir} nor in the shipped defaults "
                          f"{paths.shipped_config_dir}")
    app = validate_file(sources["aiops.toml"], AppConfig)
    models = validate_file(sources["models.toml"], ModelsConfig)
    gates = validate_file(sources["gates.toml"], GatesConfig)
    limits = validate_file(sources["limits.toml"], LimitsConfig)
    plugins_raw = read_toml(sources["plugins.toml"])
    for name, table in plugins_raw.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{sources['plugins.toml']}: {name}: expected a table like [{name}]")
    return Config(paths=paths, app=app, models=models, gates=gates, limits=limits,
                  plugins=plugins_raw, sources=sources)
