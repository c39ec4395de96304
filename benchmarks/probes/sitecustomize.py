"""What holds an aiops process's event loop: put this directory first on PYTHONPATH and set

- `LOOP_PROBE_STALL_MS=40`: every loop callback longer than that is logged, with the main thread's
  stack sampled every 8 ms (or a quarter of the next setting) once the callback has run 20 ms (innermost frame first);
- `LOOP_PROBE_SAMPLE_MS=20`: how long a callback runs before its stack is sampled (default 20);
- `LOOP_PROBE_GC=1`: every collection of Python's cyclic collector of 1 ms or more.

Lines go to /tmp/loop-probe-<pid>.log, for processes whose command line names aiops (the benchmarks'
consoles and servers inherit the environment; `AIOPS_*` variables are not passed on, hence the names).
Not for production: `asyncio.events.Handle._run` is wrapped. docs/PERFORMANCE.md, "Reproducing a
profile", says how it was used.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
import traceback
from typing import Any

_STALL_MS = float(os.environ.get("LOOP_PROBE_STALL_MS") or 0)
_GC = bool(os.environ.get("LOOP_PROBE_GC"))
_SAMPLE_AFTER = float(os.environ.get("LOOP_PROBE_SAMPLE_MS") or 20) / 1000


def _install() -> None:
    import asyncio.events

    out = open(f"/tmp/loop-probe-{os.getpid()}.log", "a", buffering=1)  # noqa: SIM115 - open for the process's life
    if _GC:
        started: dict[str, float] = {}

        def collected(phase: str, info: dict[str, Any]) -> None:
            if phase == "start":
                started["t"] = time.perf_counter()
                return
            ms = (time.perf_counter() - started.get("t", time.perf_counter())) * 1000
            if ms >= 1:
                out.write(f"GC {time.monotonic():.3f} gen={info['generation']} {ms:.1f}ms "
                          f"collected={info['collected']}\n")

        gc.callbacks.append(collected)
    if not _STALL_MS:
        return
    current: dict[str, Any] = {"t": 0.0, "samples": []}
    main = threading.main_thread().ident
    run = asyncio.events.Handle._run

    def timed_run(self: asyncio.events.Handle) -> None:
        current["samples"] = []
        t0 = current["t"] = time.perf_counter()
        try:
            run(self)
        finally:
            ms = (time.perf_counter() - t0) * 1000
            current["t"] = 0.0
            if ms > _STALL_MS:
                callback = getattr(self, "_callback", None)
                out.write(f"STALL {time.monotonic():.3f} {ms:.1f}ms {callback!r:.150}\n")
                for sample in current["samples"]:
                    out.write(f"  S {sample}\n")

    def sample() -> None:
        while True:
            time.sleep(min(0.008, _SAMPLE_AFTER / 4))
            t0 = current["t"]
            if t0 and time.perf_counter() - t0 > _SAMPLE_AFTER:
                frame = sys._current_frames().get(main)  # noqa: SLF001 - the one way to see another thread's stack
                if frame is not None:
                    names = [f"{os.path.basename(f.filename)}:{f.name}" for f in traceback.extract_stack(frame)[-40:]]
                    current["samples"].append(f"{(time.perf_counter() - t0) * 1000:.0f} " + " < ".join(reversed(names)))

    asyncio.events.Handle._run = timed_run  # type: ignore[method-assign]
    threading.Thread(target=sample, daemon=True, name="loop-probe").start()


if (_STALL_MS or _GC) and "aiops" in " ".join(sys.argv):
    _install()
