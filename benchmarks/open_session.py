"""What opening a session whose history holds a long Markdown answer costs, in-process: from the
sessions list's pick to the frame that shows the answer's end.

    python -m benchmarks.open_session [--repeats 60] [--opens 6] [--profile FILE]

The console's own App (120×40, Pilot, its fake model unused) on a data dir holding one session of
a question and an answer of `--repeats` times `prose` (benchmarks/timed_upstream.py: a heading,
paragraphs, a list, a code block; 60 repeats is ~40 KB, 300 blocks). The session is picked as the
sessions list picks it (`SessionsList.Picked`), then the console's own session again, `--opens`
times each. Timed per open: the history read (the adapter's `load_history`), the chat's `show`,
and the first frame drawn after it whose chat shows the answer's last words; the widgets in the
chat once shown, and the RSS before and after the opens (the collector frozen, as in the console).
`--profile` writes a cProfile of the long session's opens. The collector is tuned
as the console tunes it once up (`gc_policy.settle`). For an A/B, run it with another tree first on
PYTHONPATH (`git archive REF | tar -x -C DIR`). Not a target of its own (docs/PERFORMANCE.md, issue
27: the console interactive within a second).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.timed_upstream import PROSE

LAST_WORDS = "the replica first. (end)"


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _summary(xs: list[float]) -> str:
    return f"n {len(xs):3d}, median {statistics.median(xs):7.1f} ms, max {max(xs):7.1f} ms"


async def _run(repeats: int, opens: int, profile: Path | None) -> dict[str, list[float]]:
    from aiops.engine import gc_policy
    from aiops.engine.types import Message
    from aiops.tui.app import AiopsApp
    from aiops.tui.widgets.sessions import SessionsList
    from tests.fakes.openai_server import FakeOpenAI
    from tests.tui.conftest import NotesPlugin, chat_text, console_config, ready

    out: dict[str, list[float]] = {"history read": [], "show": [], "pick to frame": [],
                                   "small: pick to frame": []}
    prof = cProfile.Profile()
    answer = PROSE * repeats
    answer = answer.rstrip() + " (end)\n"
    with FakeOpenAI() as fake:
        cfg = console_config(Path(tempfile.mkdtemp(prefix="aiops-bench-open-")), fake)
        app = AiopsApp(cfg, plugins=[NotesPlugin()], discover_plugins=False, server=False, port=0)
        async with app.run_test(size=(120, 40)) as pilot:
            await ready(pilot)
            gc_policy.settle()
            small = app.selected
            assert small is not None
            store = app.adapter.engine.store
            await store.create_session("long-1", "api", None)
            await store.add_message("long-1", Message("user", "write the runbook"))
            await store.add_message("long-1", Message("assistant", answer))
            adapter = app.adapter
            load_history = adapter.load_history
            chat = app.chat
            show = chat.show
            marks: dict[str, float] = {}

            async def timed_load(*args: Any, **kw: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return await load_history(*args, **kw)
                finally:
                    marks["read"] = (time.perf_counter() - t0) * 1000

            async def timed_show(*args: Any, **kw: Any) -> None:
                t0 = time.perf_counter()
                try:
                    await show(*args, **kw)
                finally:
                    marks["show"] = (time.perf_counter() - t0) * 1000
                    marks["shown_at"] = time.perf_counter()

            adapter.load_history = timed_load  # type: ignore[method-assign]
            chat.show = timed_show  # type: ignore[method-assign]
            display = app._display
            frames: list[float] = []

            def timed_display(*args: Any, **kw: Any) -> None:
                display(*args, **kw)
                frames.append(time.perf_counter())

            app._display = timed_display  # type: ignore[method-assign]

            async def open_(sid: str, words: str, long: bool) -> float:
                marks.clear()
                frames.clear()
                if long and profile is not None:
                    prof.enable()
                t0 = time.perf_counter()
                app.post_message(SessionsList.Picked(sid))
                while True:
                    await asyncio.sleep(0.002)
                    if chat.session_id == sid and "shown_at" in marks and frames and frames[-1] > marks["shown_at"]:
                        if words in chat_text(app):
                            break
                    if time.perf_counter() - t0 > 30:
                        raise AssertionError(f"{words!r} never shown")
                # The first frame after `show` that shows them (checked after it was drawn).
                ms = (frames[-1] - t0) * 1000
                if long and profile is not None:
                    prof.disable()
                await pilot.pause(0.3)
                return ms

            rss0 = _rss_mb()
            for _ in range(opens):
                ms = await open_("long-1", LAST_WORDS, True)
                out["history read"].append(marks["read"])
                out["show"].append(marks["show"])
                out["pick to frame"].append(ms)
                widgets = len(list(chat.walk_children()))
                out["small: pick to frame"].append(await open_(small, "New session.", False))
            print(f"  the long session: {len(answer)} chars, {widgets} widgets in the chat once shown; "
                  f"RSS {rss0:.0f} → {_rss_mb():.0f} MB over the {opens} opens of each")
    if profile is not None:
        prof.dump_stats(profile)
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.open_session", description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=60, help="repeats of the prose answer (default 60: ~40 KB)")
    p.add_argument("--opens", type=int, default=6, help="opens of each session (default 6)")
    p.add_argument("--profile", type=Path, help="write a cProfile of the long session's opens here")
    args = p.parse_args()
    out = asyncio.run(_run(args.repeats, args.opens, args.profile))
    for name, xs in out.items():
        print(f"  {name:22s} {_summary(xs)}")


if __name__ == "__main__":
    main()
