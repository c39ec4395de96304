"""The proxy's CPU per request, A/B: another commit's `aiops serve` beside this tree's, interleaved.

    python -m benchmarks.ab --ref main [--rounds 3] [--requests 1000] [--concurrency 32,1]

One upstream, one relay and one SDK relay (benchmarks.relay --sdk: the floor with openai.AsyncOpenAI)
for the whole run; each round measures the two relays, then the two trees'
`aiops serve` (fresh data each, the order alternating between rounds, so a slow spell of a shared
machine does not land on one tree only), streamed, at each concurrency. The ref's tree is exported
with `git archive` and put first on PYTHONPATH (run from this venv). Per round and in the mean: CPU
per request of the process and of its main thread (the event loop), and aiops's CPU as a multiple
of the relay's in the same round (issue 27's figure) and of the SDK relay's (what aiops adds to the
floor, steadier from hour to hour). Prints the load average beside the figures:
on a shared machine they are comparable within a run only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.load import Result, run_load
from benchmarks.run import UPSTREAM_MODEL, _aiops_config, _export, child


async def _measure(url: str, pid: int, *, aiops: bool, conc: int, requests: int, warmup: int) -> Result:
    return await run_load(url, "aiops" if aiops else UPSTREAM_MODEL, target="aiops" if aiops else "relay",
                          stream=True, concurrency=conc, requests=requests, warmup=warmup,
                          session_header=aiops, server_pid=pid)


def _serve(root: Path, upstream: str, label: str, src: Path | None, env: dict[str, str]):  # noqa: ANN202
    home = root / f"{label}-{len(list(root.iterdir()))}"
    cfg = _aiops_config(home, upstream)
    env = dict(env)
    if src is not None:
        env["PYTHONPATH"] = str(src)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    cmd = [sys.executable, "-m", "aiops.cli", "--config-dir", str(cfg), "--data-dir", str(home / "data"), "serve"]
    return child(cmd, r"aiops serving on (http://\S+)", f"aiops serve ({label})", env=env, cwd=home)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ab", description=__doc__.split("\n\n")[0])
    p.add_argument("--ref", default="main", help="the commit to compare this tree with (default main)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=1000, help="measured streamed requests per scenario")
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[32, 1])
    args = p.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="aiops-ab-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOPS_")}
    trees = [(args.ref, _export(args.ref, root / "ref-tree")), ("this tree", None)]
    # (label, concurrency) -> per-round (cpu, loop, x relay)
    rows: dict[tuple[str, int], list[tuple[float, float, float | None]]] = {}
    try:
        with child([sys.executable, "-m", "benchmarks.upstream"], r"upstream on (http://\S+)", "the upstream",
                   env=env) as upstream, \
                child([sys.executable, "-m", "benchmarks.relay", "--upstream", upstream.url], r"relay on (\S+)",
                      "the relay", env=env) as relay, \
                child([sys.executable, "-m", "benchmarks.relay", "--upstream", upstream.url, "--sdk"],
                      r"relay on (\S+)", "the SDK relay", env=env) as sdk:
            for rnd in range(args.rounds):
                order = trees if rnd % 2 == 0 else trees[::-1]
                print(f"round {rnd + 1}, load average {os.getloadavg()[0]:.1f}", flush=True)
                relay_cpu: dict[int, float] = {}
                sdk_cpu: dict[int, float] = {}
                for conc in args.concurrency:
                    r = asyncio.run(_measure(relay.url, relay.pid, aiops=False, conc=conc,
                                             requests=args.requests, warmup=args.warmup))
                    relay_cpu[conc] = r.cpu_ms_per_request or 0.0
                    rows.setdefault(("relay", conc), []).append((relay_cpu[conc], r.loop_cpu_ms_per_request or 0.0, None))
                    print(f"  relay     c={conc:<3} cpu {relay_cpu[conc]:.2f} ms/req", flush=True)
                    r = asyncio.run(_measure(sdk.url, sdk.pid, aiops=False, conc=conc,
                                             requests=args.requests, warmup=args.warmup))
                    sdk_cpu[conc] = r.cpu_ms_per_request or 0.0
                    x = sdk_cpu[conc] / relay_cpu[conc] if relay_cpu[conc] else None
                    rows.setdefault(("SDK relay", conc), []).append((sdk_cpu[conc], r.loop_cpu_ms_per_request or 0.0, x))
                    print(f"  SDK relay c={conc:<3} cpu {sdk_cpu[conc]:.2f} ms/req"
                          f"  {'' if x is None else f'{x:.1f}x relay'}", flush=True)
                for label, src in order:
                    with _serve(root, upstream.url, "ref" if src else "tree", src, env) as aiops:
                        for conc in args.concurrency:
                            r = asyncio.run(_measure(aiops.url, aiops.pid, aiops=True, conc=conc,
                                                     requests=args.requests, warmup=args.warmup))
                            cpu, loop = r.cpu_ms_per_request or 0.0, r.loop_cpu_ms_per_request or 0.0
                            x = cpu / relay_cpu[conc] if relay_cpu[conc] else None
                            rows.setdefault((label, conc), []).append((cpu, loop, x))
                            print(f"  {label:<9} c={conc:<3} cpu {cpu:.2f}  loop {loop:.2f} ms/req"
                                  f"  {'' if x is None else f'{x:.1f}x relay'}"
                                  f"  {'' if not sdk_cpu[conc] else f'{cpu / sdk_cpu[conc]:.2f}x SDK relay'}"
                                  f"  p50 {r.pct(50):.2f} ms  err {r.errors}", flush=True)
                            if r.errors:
                                print(f"    first error: {r.first_error}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")
    print("| tree | conc | CPU ms/req per round | mean | loop mean | × relay per round | × relay of means "
          "| × SDK relay of means |")
    print("|---|---:|---|---:|---:|---|---:|---:|")
    for conc in args.concurrency:
        relay_mean = statistics.mean(c for c, _, _ in rows[("relay", conc)])
        sdk_mean = statistics.mean(c for c, _, _ in rows[("SDK relay", conc)])
        for label in ("relay", "SDK relay", args.ref, "this tree"):
            rs = rows[(label, conc)]
            cpu = statistics.mean(c for c, _, _ in rs)
            print(f"| {label} | {conc} | {' / '.join(f'{c:.2f}' for c, _, _ in rs)} | {cpu:.2f} | "
                  f"{statistics.mean(lp for _, lp, _ in rs):.2f} | "
                  f"{' / '.join('' if x is None else f'{x:.1f}' for _, _, x in rs)} | "
                  f"{'' if label == 'relay' else f'{cpu / relay_mean:.1f}'} | "
                  f"{'' if label in ('relay', 'SDK relay') or not sdk_mean else f'{cpu / sdk_mean:.2f}'} |")
    # Paired, round by round: one process of each tree against the other measured beside it. A
    # process's CPU per request moves by ±20 % from one start to the next on these machines, so
    # a mean of a few rounds can lean either way; the median of the pairs and the count of rounds
    # each way say more (docs/PERFORMANCE.md, "18:00-19:00 UTC").
    print("\n| conc | this tree / ref, per round | median | rounds lower |")
    print("|---:|---|---:|---:|")
    for conc in args.concurrency:
        ratios = [b[0] / a[0] for a, b in zip(rows[(args.ref, conc)], rows[("this tree", conc)], strict=True) if a[0]]
        if ratios:
            print(f"| {conc} | {' / '.join(f'{x:.2f}' for x in ratios)} | {statistics.median(ratios):.2f} | "
                  f"{sum(x < 1 for x in ratios)} of {len(ratios)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
