"""Provider backends: each adapts one provider SDK to the engine's neutral types."""

from aiops.engine.backends.base import Backend, ModelError
from aiops.engine.backends.factory import make_backend

__all__ = ["Backend", "ModelError", "make_backend"]
