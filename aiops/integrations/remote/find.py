"""Where a running aiops is: `--url`, else the run file of the data dir (aiops/engine/runfile.py);
which token to present: `--token-env NAME`, else `AIOPS_TOKEN`, else (for the aiops of this
configuration) the operator token whose variable aiops.toml names and the environment holds."""

from __future__ import annotations

import os
from pathlib import Path

from aiops.engine import lock


def running_url(data_dir: Path, lock_path: Path | None = None) -> str | None:
    """The URL of the aiops that holds `data_dir` and serves, or None (none runs, or it has no server)."""
    return lock.holder_url(data_dir, lock_path)


def client_url(url: str) -> str:
    """A server URL as a client reaches it: a wildcard bind on loopback, no trailing slash."""
    url = url.rstrip("/")
    for wildcard, loop in (("//0.0.0.0:", "//127.0.0.1:"), ("//[::]:", "//[::1]:")):
        url = url.replace(wildcard, loop)
    return url if "://" in url else f"http://{url}"


def token_from_env(name: str | None, env: dict[str, str] | None = None) -> str | None:
    """The token in `name` (`--token-env`), else in AIOPS_TOKEN; None without one. A named
    variable that is unset is an error the caller reports (KeyError)."""
    env = dict(os.environ) if env is None else env
    if name:
        value = env.get(name)
        if not value:
            raise KeyError(name)
        return value
    return env.get("AIOPS_TOKEN") or None


def operator_token(aiops_toml: Path, env: dict[str, str] | None = None) -> tuple[str | None, list[str]]:
    """The token of the first `[auth.tokens.*]` of role operator whose variable is set, and the
    names of those variables (to say which to set when none is). Read with tomllib alone: the
    commands that talk to a running aiops do not validate the configuration (it is the server's)."""
    import tomllib

    env = dict(os.environ) if env is None else env
    try:
        doc = tomllib.loads(aiops_toml.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, []
    tokens = (doc.get("auth") or {}).get("tokens") or {}
    names = [t["token_env"] for t in tokens.values() if isinstance(t, dict) and t.get("role") == "operator"
             and isinstance(t.get("token_env"), str)]
    return next((env[n] for n in names if env.get(n)), None), names


def operator_token_hint(aiops_toml: Path) -> str:
    """`, or AIOPS_OPERATOR_TOKEN (the operator token aiops.toml names)` for a refusal's hint; empty
    when aiops.toml names no operator token."""
    names = operator_token(aiops_toml)[1]
    return f", or {' / '.join(names)} (the operator token aiops.toml names)" if names else ""
