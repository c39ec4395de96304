"""What a streamed answer's draws cost the console's loop, in-process: the layout frames and the
appends while an answer of N repeats of `prose` (benchmarks/timed_upstream.py) is drawn.

    python -m benchmarks.answer_frames [--repeats 12] [--step 25] [--profile FILE]

The console's own App (120×40, Pilot, its fake model unused), one assistant message mounted in the
chat and appended `--step` chunks at a time, as the console draws a stream (at 50 tokens/s and the
typing pace, a draw every 0.5 s is ~25 chunks). Each layout of the screen (`Screen._refresh_layout`,
its render included) and each append is timed; `--profile` writes a cProfile of the layouts of the
second half (the answer long by then). The collector is tuned as the console tunes it once up
(`gc_policy.settle`; `--python-gc` keeps Python's own thresholds, whose collections then land in
the layouts: a median ~5 ms higher, maxima of 170-230 ms). For an A/B, run it with another tree
first on PYTHONPATH (`git archive REF | tar -x -C DIR`). Not a target of its own: it says what a layout of the chat
costs as an answer grows (docs/PERFORMANCE.md, issue 27).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.timed_upstream import PROSE_CHUNKS


def _summary(xs: list[float]) -> str:
    return f"n {len(xs):3d}, median {statistics.median(xs):6.1f} ms, max {max(xs):6.1f} ms"


async def _run(repeats: int, step: int, profile: Path | None, settle_gc: bool = True) -> dict[str, list[float]]:
    from aiops.engine import gc_policy
    from aiops.tui.app import AiopsApp
    from aiops.tui.widgets.chat import AssistantMessage
    from tests.fakes.openai_server import FakeOpenAI
    from tests.tui.conftest import NotesPlugin, console_config, ready

    out: dict[str, list[float]] = {"layout": [], "layout, second half": [], "append": []}
    prof = cProfile.Profile()
    with FakeOpenAI() as fake:
        cfg = console_config(Path(tempfile.mkdtemp(prefix="aiops-bench-answer-")), fake)
        app = AiopsApp(cfg, plugins=[NotesPlugin()], discover_plugins=False, server=False, port=0)
        async with app.run_test(size=(120, 40)) as pilot:
            await ready(pilot)
            if settle_gc:  # as the console does once it is up (a test's App does not)
                gc_policy.settle()
            message = AssistantMessage(status="streaming")
            await app.chat.mount(message)
            await pilot.pause()
            screen = app.screen
            refresh_layout = screen._refresh_layout
            second_half = False

            def timed(*args: Any, **kw: Any) -> None:  # observed, not changed
                if second_half and profile is not None:
                    prof.enable()
                t0 = time.perf_counter()
                refresh_layout(*args, **kw)
                ms = (time.perf_counter() - t0) * 1000
                if second_half and profile is not None:
                    prof.disable()
                out["layout"].append(ms)
                if second_half:
                    out["layout, second half"].append(ms)

            screen._refresh_layout = timed  # type: ignore[method-assign]
            chunks = PROSE_CHUNKS * repeats
            for i in range(0, len(chunks), step):
                second_half = i > len(chunks) // 2
                t0 = time.perf_counter()
                await message.markdown.append("".join(chunks[i:i + step]))
                out["append"].append((time.perf_counter() - t0) * 1000)
                await pilot.pause(0.05)
            widgets = len(list(message.markdown.walk_children()))
            print(f"  the answer: {len(message.markdown.children)} blocks, {widgets} widgets")
    if profile is not None:
        prof.dump_stats(profile)
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.answer_frames", description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=12, help="repeats of the prose answer (default 12: ~60 blocks)")
    p.add_argument("--step", type=int, default=25, help="chunks per draw (default 25)")
    p.add_argument("--profile", type=Path, help="write a cProfile of the second half's layouts here")
    p.add_argument("--python-gc", dest="settle_gc", action="store_false",
                   help="keep Python's collector thresholds (the console raises them once up: gc_policy)")
    args = p.parse_args()
    out = asyncio.run(_run(args.repeats, args.step, args.profile, args.settle_gc))
    for name, xs in out.items():
        print(f"  {name:22s} {_summary(xs)}")


if __name__ == "__main__":
    main()
