"""A running aiops reached over its HTTP API: the attached console's engine, `aiops chat`'s remote path.

See engine.py (`RemoteEngine`) and find.py (the run file, `--url`, tokens).
"""

from aiops.integrations.remote.engine import RemoteEngine, RemoteError

__all__ = ["RemoteEngine", "RemoteError"]
