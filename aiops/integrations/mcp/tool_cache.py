"""The tool lists MCP servers gave when they last connected, kept in the data dir.

A server's process can take a second or more to start and answer (an `npx` or `uvx` server more),
and a turn offers the tools registered when it begins: `aiops chat` used to wait for every server
before its one turn. With the list a server gave last time, its tools are offered at once, and a
call of one waits for the connection (see McpPlugin). An entry serves only while the server's
configuration is the one it was listed under (compared by a hash: nothing of the configuration,
its environment or its headers is written here), and the live list replaces it once the server
answers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from aiops.mcp_config import McpServerConfig

log = logging.getLogger(__name__)

VERSION = 1


def fingerprint(cfg: McpServerConfig) -> str:
    return hashlib.sha256(cfg.model_dump_json().encode()).hexdigest()


def read(path: Path) -> dict[str, dict[str, Any]]:
    """Server name → {"config": fingerprint, "tools": [tool dicts]}; empty when there is no
    usable file (a cache that cannot be read is only a slower start, never an error)."""
    try:
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
