"""Tool names the model sees for MCP tools: `SERVER__TOOL`, valid for every provider.

Providers accept `[A-Za-z0-9_-]{1,64}`. Other characters become `_`; a name that is then too long,
or was changed at all, ends in a short hash of the exact original so two tools never share a name
and the same tool always gets the same name. So does a name whose split is ambiguous (a server
name that holds `__` or ends in `_`): server `x` with tool `_t` and server `x_` with tool `t` would
both be `x___t`. The registry keeps the mapping back (the tool's
closure holds the original), so nothing is ever parsed back out of the cut name.
"""

from __future__ import annotations

import hashlib
import re

MAX_NAME = 64
SEPARATOR = "__"
_INVALID = re.compile(r"[^A-Za-z0-9_-]")


def model_tool_name(server: str, tool: str) -> str:
    full = f"{server}{SEPARATOR}{tool}"
    clean = _INVALID.sub("_", full)
    # Read back at the first `__`, the joined name names one pair unless the server's name holds
    # `__` or ends in `_` (`x_` + `t` and `x` + `_t` both join as `x___t`).
    ambiguous = SEPARATOR in server or server.endswith("_")
    if clean == full and len(full) <= MAX_NAME and not ambiguous:
        return full
    # The pair itself when the joined name cannot tell server from tool (the joined name, as
    # before, otherwise: the names models already know stay what they were).
    digest = hashlib.sha256((f"{server}\0{tool}" if ambiguous else full).encode()).hexdigest()[:10]
    return f"{clean[:MAX_NAME - len(digest) - 1]}_{digest}"


def gate_target(server: str, tool: str) -> str:
    """What gates.toml rules name: `mcp:SERVER:TOOL`."""
    return f"mcp:{server}:{tool}"
