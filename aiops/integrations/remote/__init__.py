"""A running aiops reached over its HTTP API: the attached console's engine, `aiops chat`'s remote path.

See engine.py (`RemoteEngine`) and find.py (the run file, `--url`, tokens).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiops.integrations.remote.engine import RemoteEngine, RemoteError

__all__ = ["RemoteEngine", "RemoteError"]


def __getattr__(name: str) -> Any:
    # Loaded on first use: `aiops chat` imports find.py from here, and engine.py brings aiohttp
    # (0.3 s) and the engine's event types, which its 0.3 s budget has no room for (issue 27).
    if name in __all__:
        from aiops.integrations.remote import engine

        return getattr(engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
