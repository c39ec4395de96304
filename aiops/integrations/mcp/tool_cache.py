"""The tool lists MCP servers gave when they last connected, kept in the data dir.

A server's process can take a second or more to start and answer (an `npx` or `uvx` server more),
and a turn offers the tools registered when it begins: `aiops chat` used to wait for every server
before its one turn. With the list a server gave last time, its tools are offered at once, and a
call of one waits for the connection (see McpPlugin). An entry serves only while the server's
configuration is the one it was listed under (compared by a hash in which the values of `env` and
`headers` appear only as the `${VAR}` names they hold: a literal secret is not hashed, so nothing
here can be checked against a guess of it), and the live list replaces it once the server answers.
A one-turn process (`aiops chat`), which may never start the server, does not use an entry older
than MAX_AGE_SECONDS: it waits for the server then, and the list is renewed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

from aiops.mcp_config import McpServerConfig

log = logging.getLogger(__name__)

VERSION = 1
MAX_AGE_SECONDS = 24 * 3600
MAX_BYTES = 8 * 1024 * 1024  # far above any real list; a file past it is not read (on the loop)
_VARS = re.compile(r"\$\{[^}]*\}")


def fingerprint(cfg: McpServerConfig) -> str:
    def masked(values: dict[str, str]) -> dict[str, str]:
        return {k: " ".join(_VARS.findall(v)) or "<literal>" for k, v in values.items()}

    shown = cfg.model_dump(mode="json")
    shown["env"], shown["headers"] = masked(cfg.env), masked(cfg.headers)
    return hashlib.sha256(json.dumps(shown, sort_keys=True).encode()).hexdigest()


def entry(cfg: McpServerConfig, tools: list[dict[str, Any]]) -> dict[str, Any]:
    return {"config": fingerprint(cfg), "listed_at": time.time(), "tools": tools}


def fresh(e: dict[str, Any], now: float | None = None) -> bool:
    listed = e.get("listed_at")
    return isinstance(listed, (int, float)) and 0 <= (now or time.time()) - listed <= MAX_AGE_SECONDS


def read(path: Path) -> dict[str, dict[str, Any]]:
    """Server name → {"config": fingerprint, "tools": [tool dicts]}; empty when there is no
    usable file (a cache that cannot be read is only a slower start, never an error)."""
    try:
        if path.stat().st_size > MAX_BYTES:
            log.warning("mcp: tool list cache %s is over %d bytes; not read", path, MAX_BYTES)
            return {}
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        log.warning("mcp: tool list cache %s unreadable (%s); waiting for the servers instead", path, e)
        return {}
    if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("servers"), dict):
        return {}
    return {name: entry for name, entry in doc["servers"].items()
            if isinstance(entry, dict) and isinstance(entry.get("config"), str)
            and isinstance(entry.get("tools"), list)}


def write(path: Path, servers: dict[str, dict[str, Any]]) -> None:
    """Replace the file as a whole (a crash mid-write leaves the old one)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"version": VERSION, "servers": servers}, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        log.warning("mcp: tool list cache %s not written: %s", path, e)
