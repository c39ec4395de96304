"""Admission: the taking in of new messages, closed when the engine begins to stop.

A stop waits (boundedly) for the messages being taken in, so that a turn one of them queues is
stopped and recorded like every other, never left half taken in, nor started on a closed store.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from aiops.engine.errors import STOPPING, EngineStopping

log = logging.getLogger(__name__)

ADMISSION_WAIT = 10.0  # seconds a stop waits for messages being taken in


class _Admission:
    """One open admission of one gate; a context that outlives it (a task born inside) no longer
    counts as inside it."""
    __slots__ = ("gate", "open")

    def __init__(self, gate: Admissions) -> None:
        self.gate, self.open = gate, True


# The admission the current task is inside: the work it brackets may take in its message to the
# end, even once a stop has begun (the stop waits for it), nested calls included. An object, not a
# flag: a task born inside one (a listener's, say) outlives it, and must not count as inside it.
_ADMITTED: ContextVar[_Admission | None] = ContextVar("aiops_admitted", default=None)


class Admissions:
    def __init__(self) -> None:
        self.stopping = False
        self._open = 0  # admissions open, nested ones too: one may outlive its outer admission
        self._over: asyncio.Event | None = None  # set by the last, while a stop waits

    @contextmanager
    def admit(self) -> Iterator[None]:
        """Bracket the taking in of a new message: refused with EngineStopping once a stop has
        begun (unless nested in an admission still open), waited for by the stop."""
        outer = _ADMITTED.get()
        nested = outer is not None and outer.open and outer.gate is self
        if self.stopping and not nested:
            raise EngineStopping(STOPPING)
        mine = _Admission(self)
        token = _ADMITTED.set(mine)
        self._open += 1
        try:
            yield
        finally:
            mine.open = False
            _ADMITTED.reset(token)
            self._open -= 1
            if not self._open and self._over is not None:
                self._over.set()

    async def close(self, wait: float = ADMISSION_WAIT) -> None:
        """Take no new message; wait up to `wait` seconds for those being taken in."""
        self.stopping = True
        if not self._open:
            return
        self._over = asyncio.Event()
        try:
            async with asyncio.timeout(wait):
                await self._over.wait()
        except TimeoutError:
            log.warning("stopping with %d message(s) still being taken in", self._open)
