"""Where a running aiops is: `--url`, else the run file of the data dir (aiops/engine/runfile.py);
which token to present: `--token-env NAME`, else `AIOPS_TOKEN`."""

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
