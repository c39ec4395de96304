"""What a process that died without stopping left open, recorded by the next one on the data dir."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from aiops.engine.lock import DataDirLock
from aiops.engine.store import Store
from aiops.engine.types import Message

log = logging.getLogger(__name__)

INTERRUPTED_NOTICE = ("interrupted: aiops stopped (killed or crashed) before this turn ended; "
                      "it was not resumed")


async def close_left_open(store: Store, record: Callable[[str, Message], Awaitable[Message]],
                          lock: DataDirLock | None) -> tuple[int, int]:
    """When this data dir's last process died without stopping (SIGKILL, a crash: its `lock`
    says so, and when it ran): its turns that never ended get a notice saying so (through
    `record`), its gates left open are recorded as cancelled, then the lock is told. A clean stop
    records both itself. Returns (turns, gates)."""
    span = lock.left_open() if lock is not None else None
    if lock is None or span is None:
        return 0, 0
    turns, gates = await store.left_open(*span)
    at = time.time()
    for gate in gates:
        data = {**gate.data, "resolution": {"decision": "cancelled", "scope": "once", "by": "restart", "at": at}}
        await store.add_audit("gate_resolved", session_id=gate.session_id, gate_id=gate.gate_id,
                              tool=gate.tool, operation=gate.operation, decision="cancelled",
                              scope="once", actor="restart", data=data)
    for session_id, turn_id in turns:
        await record(session_id, Message("notice", INTERRUPTED_NOTICE, turn_id=turn_id,
                                         meta={"kind": "interrupted"}))
    if turns or gates:
        log.warning("aiops did not stop cleanly last time: %d turn(s) recorded as interrupted, "
                    "%d gate(s) left open recorded as cancelled", len(turns), len(gates))
    lock.recovered()
    return len(turns), len(gates)
