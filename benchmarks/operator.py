"""The operator's side of `make bench` (issue 27): start-up, a busy console, gates, tokens, memory.

Targets: `aiops chat` and the console's start-up (benchmarks.startup); keypress → screen p99 ≤ 50 ms
in the input and in the sessions list with 50 sessions streaming, and a gate's row in the console's
inbox ≤ 20 ms p99 after the model's tool call, idle and busy (benchmarks.busy_console); the added
delay per token (benchmarks.feel).

    python -m benchmarks.operator [--quick] [--skip startup,console,feel] [--json FILE]

Runs benchmarks.startup, benchmarks.busy_console and benchmarks.feel in turn (each also runs on its
own; see their docstrings) and writes every number to one JSON file, by default
benchmarks/results/operator-<UTC date and time>.json. `--quick` (1,000 stored sessions of 20
messages, fewer rounds) takes about a minute; the default (10,000 stored sessions of 100 messages,
the history built once and cached in the temp dir) a few minutes. Exit status 1 if a target of
issue 27 is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import busy_console, feel, startup
from benchmarks.run import machine

RESULTS = Path(__file__).parent / "results"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.operator", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller history, fewer rounds (about a minute)")
    p.add_argument("--sessions", type=int, default=10_000, help="stored sessions (default 10,000)")
    p.add_argument("--messages", type=int, default=100, help="messages per stored session (default 100)")
    p.add_argument("--skip", default="", help="comma-separated: startup, console, feel")
    p.add_argument("--json", type=Path, help="where to write the numbers (default benchmarks/results/operator-<date>.json)")
    startup.add_arguments(p, history=False)
    feel.add_arguments(p)
    busy_console.add_arguments(p)
    args = p.parse_args(argv)
    # A SIGTERM (a stopped make) unwinds like ctrl+c, so each case stops its processes and tmux server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.quick:
        args.sessions, args.messages = min(args.sessions, 1000), min(args.messages, 20)
        startup.quick(args)
        feel.quick(args)
        busy_console.quick(args)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    started = datetime.now(UTC)
    out: dict[str, Any] = {"date": started.isoformat(timespec="seconds"), "machine": machine(),
                           "command": "python -m benchmarks.operator " + " ".join(argv if argv is not None
                                                                                   else sys.argv[1:]),
                           "stored_history": {"sessions": args.sessions, "messages": args.messages},
                           # Start-up runs with aiops's .pyc files kept (as installed) unless told otherwise.
                           "cached_bytecode": args.cached_bytecode,
                           # The machine is shared: its load says how far to trust the hour's figures.
                           "load_average_at_start": os.getloadavg()}
    targets: list[dict[str, Any]] = []
    if "startup" not in skip:
        print(f"\n== start-up ({args.runs} runs per case; stored history {args.sessions:,} × {args.messages})",
              flush=True)
        rows = startup.measure(args)
        out["startup"] = rows
        targets += startup.targets(rows, args.sessions)
    if "console" not in skip:
        print(f"\n== a busy console ({args.console_streams} sessions streaming, {args.sessions:,} stored)", flush=True)
        out["busy_console"] = busy_console.measure(args)
        targets += out["busy_console"].get("targets", [])
    if "feel" not in skip:
        print("\n== tokens, gates, memory", flush=True)
        out["feel"] = feel.measure(args)
        targets += out["feel"]["targets"]
    out["targets"] = targets
    out["load_average_at_end"] = os.getloadavg()
    print("\n== targets (issue 27)")
    for t in targets:
        print(f"  {'met   ' if t['met'] else 'MISSED'} {json.dumps({k: v for k, v in t.items() if k != 'met'})}")
    path = args.json or RESULTS / f"operator-{started.strftime('%Y%m%d-%H%M')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nwritten: {path}")
    return 0 if all(t["met"] for t in targets) else 1


if __name__ == "__main__":
    sys.exit(main())
