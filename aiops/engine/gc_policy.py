"""How the long-running processes (`aiops serve`, the console) use Python's cyclic garbage collector.

Python's defaults suit short scripts. A server that has imported the openai and google SDKs,
pydantic, aiohttp (and Textual) holds a few hundred thousand long-lived objects from start-up, and
every request allocates and frees thousands more. Measured under the proxy benchmark (12,600
requests at concurrency 32, docs/PERFORMANCE.md), the defaults ran 2,300 young collections and
18 full ones; the full ones walked every object each time, took 2 s in all and up to 177 ms each,
which is where the p99 latency came from.

`settle()`, called once start-up is over, moves everything alive then into the permanent
generation (`gc.freeze`: imports, schemas, configuration; never freed anyway) so later full
collections do not walk it, and raises the young-generation threshold so a burst of requests does
not trigger a collection every few of them. Reference counting still frees almost everything at
once; the collector only finds cycles, and the larger threshold lets at most that many more
container objects wait for it.
"""

from __future__ import annotations

import gc

# Net container allocations between young collections (Python's default: 700).
YOUNG_THRESHOLD = 50_000


def settle() -> None:
    """Call once the process has started (imports done, engine and server up)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(max(YOUNG_THRESHOLD, gc.get_threshold()[0]), older, oldest)
