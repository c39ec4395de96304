"""The sessions list's own cost, in-process: what one session coming, one speaking, a repaint and a
cursor key cost the console's loop with N sessions listed.

    python -m benchmarks.sessions_list [--sessions 10000] [--rounds 40]

A Textual app holding only the list (120×40, Pilot), the console's collector settings. Each change is
made as the console makes it (`upsert`, then the redraw), and timed from the call to its return; the
repaint is the list's whole view drawn again with the rows' drawings kept (what a new session's frame
draws). For an A/B, run it with another tree first on PYTHONPATH (`git archive REF | tar -x -C DIR`).
Not a target of its own: it says where a busy console's time goes when many sessions are listed.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from typing import Any

from textual.app import App, ComposeResult
from textual.geometry import Region

from aiops.engine.gc_policy import YOUNG_THRESHOLD
from aiops.tui.widgets.sessions import SessionsList

KINDS = ("console", "cli", "api", "proxy", "slack")


def _session(n: int, kind: str, at: float) -> dict[str, Any]:
    return {"client_id": f"s{n}", "short_id": n, "kind": kind, "title": f"title {n}", "model": "m",
            "state": "idle", "updated_at": at}


class _Pane(App[None]):
    CSS = "#sessions { width: 36; height: 1fr; }"

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0  # the list's clock: advanced past its hold before each change

    def compose(self) -> ComposeResult:
        yield SessionsList(clock=lambda: self.now, id="sessions")


def _summary(xs: list[float]) -> str:
    return f"p50 {statistics.median(xs):6.2f} ms, max {max(xs):6.2f} ms"


async def _run(sessions: int, rounds: int) -> dict[str, list[float]]:
    app = _Pane()
    out: dict[str, list[float]] = {"new session": [], "one speaks": [], "repaint": [], "cursor key": []}
    async with app.run_test(size=(120, 40)) as pilot:
        sl = app.query_one(SessionsList)
        sl.set_sessions([_session(n, KINDS[n % len(KINDS)], float(n)) for n in range(sessions)])
        await pilot.pause()
        gc.collect()
        gc.freeze()
        gc.set_threshold(YOUNG_THRESHOLD, *gc.get_threshold()[1:])
        for k in range(rounds):
            app.now += 5
            t = time.perf_counter()
            sl.upsert(_session(10 * sessions + k, "console", 1e9 + k))
            sl.rebuild_now()
            out["new session"].append((time.perf_counter() - t) * 1000)
            await pilot.pause()
        for k in range(rounds):
            app.now += 5
            t = time.perf_counter()
            sl.upsert({"client_id": f"s{(k * 7919) % sessions}", "updated_at": 2e9 + k})
            sl.rebuild_now()
            out["one speaks"].append((time.perf_counter() - t) * 1000)
            await pilot.pause()
        view = Region(0, 0, sl.size.width, sl.size.height)
        for _ in range(rounds):
            sl._styles_cache.clear()  # (Textual's cache of the widget's lines: drawn again)
            t = time.perf_counter()
            sl.render_lines(view)
            out["repaint"].append((time.perf_counter() - t) * 1000)
        sl.focus()
        for _ in range(rounds):
            app.now += 5
            t = time.perf_counter()
            sl.action_cursor_down()
            out["cursor key"].append((time.perf_counter() - t) * 1000)
            await pilot.pause()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sessions_list", description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=10_000, help="sessions listed (default 10,000)")
    p.add_argument("--rounds", type=int, default=40, help="changes of each kind (default 40)")
    args = p.parse_args(argv)
    out = asyncio.run(_run(args.sessions, args.rounds))
    print(f"sessions list, {args.sessions:,} listed, {args.rounds} of each:")
    for name, xs in out.items():
        print(f"  {name:<12} {_summary(xs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
