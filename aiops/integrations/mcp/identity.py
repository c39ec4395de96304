"""Who calls /mcp: decided by the endpoint, read by the MCP server's handlers (a light module: the
endpoint imports it before the SDK is loaded)."""

from __future__ import annotations

import contextvars


class Identity:
    __slots__ = ("principal", "operator")

    def __init__(self, principal: str, operator: bool) -> None:
        self.principal = principal
        self.operator = operator


CALLER: contextvars.ContextVar[Identity | None] = contextvars.ContextVar("aiops_mcp_caller", default=None)
SCOPE_KEY = "aiops_identity"  # where the endpoint puts the Identity in the ASGI scope
