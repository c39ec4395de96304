"""Start-up as the operator feels it, each case beside Python's own floors in the same run.

    python -m benchmarks.startup [--runs N] [--sessions N --messages M] [--quick] [--json FILE]

Cases, each run `--runs` times from a fresh process (wall time from `Popen` to the moment named):
- floors: `python -c pass`, `python -c "import aiohttp"` (to exit);
- `aiops --help` (to exit);
- `aiops chat "hi"` against a local fake model (tests.fakes.openai_server, echo replies): to its
  first token on stdout, and to exit; and the CPU time (user + system) the process used;
- the same through a running aiops: an `aiops serve` started once on the same config and data dir,
  then `aiops chat hi` runs that find it by the data dir's run file (to first token, to exit, CPU;
  the first chat after the server's start, which waits for its warm-up, reported apart);
- `aiops serve --port 0`: to its ready line, and to the first `/api/v1/health` answer after it;
- the console in a tmux pane (a real terminal; skipped without tmux): to first paint (the footer's
  "Palette" is on screen), and to interactive (a key typed then is on screen);
each with an empty data dir and with the stored history of benchmarks.history (10,000 sessions of
100 messages by default). The median and the worst of the runs are reported; `--json` writes all.

Bytecode: aiops's own modules are compiled from source on every run when PYTHONDONTWRITEBYTECODE is
set (it is on some machines, in CI images, and on the machines of this project's sessions); an installed
aiops has its .pyc files. So by default (`--cached-bytecode`, since 2026-11-28) the children cache
bytecode under a temporary PYTHONPYCACHEPREFIX, warmed by one run of each command first (the console's
trees compiled); `--no-cached-bytecode` lets the environment decide, as the runs before that date did.

For an A/B of the console: `--console-only` runs the floors and the console cases alone, `--no-empty`
only with the stored history, and `--compare-ref REF` runs each console case also with the code of
commit REF (exported with git archive, put first on PYTHONPATH), interleaved run by run with this one's, so
both see the same minutes of a loaded machine. The console's CPU seconds at interactive (user +
system, all its threads, from /proc) are reported beside the wall times: they move less with the
machine's load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import history

AIOPS = [sys.executable, "-m", "aiops.cli"]
TARGET_CHAT_S = 0.9  # in-process `aiops chat` to its first token (issue 27)
TARGET_REMOTE_CHAT_S = 0.3  # `aiops chat` through a running aiops to its first token (issue 27)
REMOTE_CHAT = "aiops chat hi (through aiops serve)"
TARGET_CONSOLE_S = 1.0  # console interactive with 10,000 sessions (issue 27)


_pycache: Path | None = None  # --cached-bytecode: where the children keep their .pyc files


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOPS_")}
    if _pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(_pycache)
    return env


def _cpu() -> float:
    """CPU seconds (user + system) of the children waited for so far."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def write_config(root: Path, base_url: str, model_id: str = "fake-model") -> Path:
    cfg = root / "config"
    cfg.mkdir(parents=True, exist_ok=True)
    (cfg / "models.toml").write_text(
        f'default_model = "bench"\n\n[models.bench]\ntype = "openai"\nmodel_id = "{model_id}"\n'
        f'base_url = "{base_url}"\ntimeout = 30\n')
    (cfg / "aiops.toml").write_text('[server]\nhost = "127.0.0.1"\nport = 0\n\n[auth.tokens]\n')
    (cfg / "plugins.toml").write_text("[mysql]\nenabled = false\n")
    return cfg


# ---- one run of each case (seconds) -------------------------------------------------------------------------


def to_exit(cmd: list[str], cwd: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=_env(), cwd=cwd,
                   timeout=120)
    return time.perf_counter() - t0


def chat(cfg: Path, data: Path) -> dict[str, float]:
    """`aiops chat hi`: seconds to the first byte on stdout (the first token) and to exit, and the
    CPU seconds it used (a child reaped here: nothing else is waited for meanwhile)."""
    cpu0 = _cpu()
    t0 = time.perf_counter()
    proc = subprocess.Popen([*AIOPS, "--config-dir", str(cfg), "--data-dir", str(data), "chat", "hi"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            env=_env(), cwd=data.parent, bufsize=0)  # unbuffered: communicate() reads the rest
    assert proc.stdout is not None
    first = proc.stdout.read(1)
    t_first = time.perf_counter() - t0
    rest, err = proc.communicate(timeout=120)
    t_exit = time.perf_counter() - t0
    if proc.returncode != 0 or not (first + rest).decode().strip().startswith("echo: hi"):
        raise SystemExit(f"startup: aiops chat failed ({proc.returncode}): {(first + rest).decode()}"
                         f"{err.decode()}")
    return {"first_token": t_first, "exit": t_exit, "cpu": _cpu() - cpu0}


def remote_chats(cfg: Path, data: Path, runs: int) -> tuple[dict[str, float], list[dict[str, float]]]:
    """`aiops chat hi` through one `aiops serve` on the same config and data dir (found by the run
    file, as a user's second terminal finds it), each as `chat` measures it: the first right after
    the server is ready (it waits for the server's own warm-up: the model SDK's import), then
    `runs` more (an aiops that has been running: the case of the target)."""
    proc = subprocess.Popen([*AIOPS, "--config-dir", str(cfg), "--data-dir", str(data), "serve", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(),
                            cwd=data.parent)
    assert proc.stdout is not None
    try:
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("aiops serving on "):
                break
        else:
            raise SystemExit(f"startup: aiops serve did not start: {''.join(seen)}")
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # (its pipe must not fill)
        first = chat(cfg, data)
        samples = [chat(cfg, data) for _ in range(runs)]
        if not _went_through(data):
            raise SystemExit("startup: aiops chat did not go through the running aiops")
        return first, samples
    finally:
        proc.terminate()
        proc.wait(30)


def _went_through(data: Path) -> bool:
    """Whether the chats reached the server: their sessions (`chat-…`, the remote path's ids) are in its store."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(data / history.DB_NAME)) as db:
        return bool(db.execute("SELECT count(*) FROM sessions WHERE id LIKE 'chat-%'").fetchone()[0])


def serve(cfg: Path, data: Path) -> dict[str, float]:
    """`aiops serve`: seconds to its ready line and to the first health answer after it."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([*AIOPS, "--config-dir", str(cfg), "--data-dir", str(data), "serve", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(),
                            cwd=data.parent)
    assert proc.stdout is not None
    try:
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("aiops serving on "):
                break
        else:
            raise SystemExit(f"startup: aiops serve did not start: {''.join(seen)}")
        t_ready = time.perf_counter() - t0
        url = line.split()[3]
        with urllib.request.urlopen(url + "/api/v1/health", timeout=30) as resp:
            resp.read()
        t_health = time.perf_counter() - t0
    finally:
        proc.terminate()
        proc.wait(30)
    return {"ready_line": t_ready, "health": t_health}


def _child_pid(pid: int) -> int | None:
    """The first child of process `pid` (the console under the pane's shell), from /proc."""
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(kids[0]) if kids else None


def _cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of process `pid` so far, all its threads (None if unknown)."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def console(cfg: Path, data: Path, code: Path | None = None) -> dict[str, float] | None:
    """The console in a tmux pane: seconds to first paint and to interactive, and its CPU seconds at
    interactive (None without tmux). `code`: a checkout whose aiops runs instead (on PYTHONPATH)."""
    exe = shutil.which("tmux")
    if exe is None:
        return None
    sock = f"aiops-bench-{uuid.uuid4().hex[:8]}"

    def tmux(*args: str) -> str:
        return subprocess.run([exe, "-L", sock, *args], capture_output=True, text=True, timeout=20).stdout

    env = {**_env(), "TERM": "xterm-256color", "COLORTERM": "truecolor"}
    env.pop("TMUX", None)
    if code is not None:
        env["PYTHONPATH"] = str(code)
    aiops = " ".join([*AIOPS, "--config-dir", str(cfg), "--data-dir", str(data), "console", "--port", "0"])
    t0 = time.perf_counter()
    subprocess.run([exe, "-L", sock, "new-session", "-d", "-s", "b", "-x", "120", "-y", "40", "sh", "-c",
                    aiops + "; sleep 60"], check=True, env=env, cwd=data.parent, timeout=20)
    try:
        def until(check: Callable[[str], bool], what: str) -> float:
            deadline = time.perf_counter() + 60
            while time.perf_counter() < deadline:
                if check(tmux("capture-pane", "-p", "-t", "b")):
                    return time.perf_counter() - t0
                time.sleep(0.01)  # polling a condition with a deadline
            raise SystemExit(f"startup: the console did not reach {what}:\n"
                             f"{tmux('capture-pane', '-p', '-t', 'b')}")

        paint = until(lambda s: "Palette" in s, "its first paint")
        tmux("send-keys", "-t", "b", "-l", "qzx")
        interactive = until(lambda s: "qzx" in s, "interactive (a typed key shown)")
        shell = tmux("display-message", "-p", "-t", "b", "#{pane_pid}").strip()
        cpu = _cpu_seconds(_child_pid(int(shell))) if shell.isdigit() else None
        out = {"first_paint": paint, "interactive": interactive}
        if cpu is not None:
            out["cpu_at_interactive"] = cpu
        return out
    finally:
        subprocess.run([exe, "-L", sock, "kill-server"], capture_output=True, timeout=20)


def _compile(tree: Path) -> None:
    """Bytecode for the aiops of `tree` (a checkout), written where the children look for it (the
    PYTHONPYCACHEPREFIX of --cached-bytecode): the console's first run pays no compilation."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "aiops")], check=True, env=_env(),
                   stdout=subprocess.DEVNULL, timeout=300)


# ---- the run -----------------------------------------------------------------------------------------------


def _stats(values: list[float]) -> dict[str, float]:
    return {"median_s": round(statistics.median(values), 4), "max_s": round(max(values), 4),
            "runs": len(values)}


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    from tests.fakes.openai_server import FakeOpenAI

    rows: list[dict[str, Any]] = []
    root = Path(tempfile.mkdtemp(prefix="aiops-bench-startup-"))
    try:
        with FakeOpenAI() as fake:
            cfg = write_config(root, fake.url)

            def add(case: str, stored: int, samples: list[dict[str, float]] | list[float]) -> None:
                if samples and isinstance(samples[0], dict):
                    for key in samples[0]:  # type: ignore[union-attr]
                        what = "CPU s at interactive" if key == "cpu_at_interactive" else f"to {key.replace('_', ' ')}"
                        add(f"{case}: {what}", stored,
                            [s[key] for s in samples])  # type: ignore[index]
                    return
                row = {"case": case.replace(": to cpu", ": CPU (user+sys)"), "stored_sessions": stored,
                       **_stats(samples)}  # type: ignore[arg-type]
                rows.append(row)
                print(f"  {row['case']:<76} {stored:>6} stored: median {row['median_s'] * 1000:7.0f} ms, "
                      f"max {row['max_s'] * 1000:7.0f} ms", flush=True)

            n = args.runs
            other: Path | None = None  # the tree of --compare-ref, once exported
            global _pycache
            if getattr(args, "cached_bytecode", False):
                _pycache = root / "pycache"
                if not args.console_only:
                    warm = history.data_dir(root / "warm", 0, 0)
                    chat(cfg, warm)  # compiles what the in-process chat imports (the rest: the remote one)
                    remote_chats(cfg, warm, 1)
                    to_exit([*AIOPS, "--help"], root)
            add("python -c pass (floor)", 0, [to_exit([sys.executable, "-c", "pass"], root) for _ in range(n)])
            add("python -c 'import aiohttp' (floor)", 0,
                [to_exit([sys.executable, "-c", "import aiohttp"], root) for _ in range(n)])
            if not args.console_only:
                add("aiops --help", 0, [to_exit([*AIOPS, "--help"], root) for _ in range(n)])
            storeds = (args.sessions,) if args.no_empty else (0, args.sessions)

            def fresh(i: int, stored: int) -> Path:
                return history.data_dir(root / f"data-{stored}-{i}-{uuid.uuid4().hex[:6]}", stored,
                                        args.messages)

            chats: dict[int, list[dict[str, float]]] = {stored: [] for stored in storeds}
            if not args.console_only:
                # Run by run, with and without the stored history in turn: the machine's speed drifts
                # over minutes, and in a block each the drift came out as the history's cost (0.66 s
                # empty against 0.95 s with 10,000 stored in one run; 0.94 against 0.98 in turn).
                for i in range(n):
                    for stored in storeds:
                        chats[stored].append(chat(cfg, fresh(i, stored)))
            for stored in storeds:
                if not args.console_only:
                    add("aiops chat hi", stored, chats[stored])
                    first, samples = remote_chats(cfg, fresh(0, stored), n)
                    add(REMOTE_CHAT, stored, samples)
                    add(f"{REMOTE_CHAT}, the first after its start", stored, [first])
                    add("aiops serve", stored, [serve(cfg, fresh(i, stored)) for i in range(n)])
                if not args.no_console:
                    # With --compare, this code and the other alternate run by run (same minutes).
                    codes: list[tuple[str, Path | None]] = [("console (tmux)", None)]
                    if args.compare_ref:
                        if other is None:
                            from benchmarks.run import _export

                            other = _export(args.compare_ref, root / "compare-tree")
                        codes.append((f"console (tmux) [{args.compare_ref}]", other))
                    if _pycache is not None:  # --cached-bytecode: both trees compiled before the first run
                        for _, code in codes:
                            _compile(code or Path(__file__).resolve().parents[1])
                            console(cfg, fresh(n, stored), code)  # and what they import (Textual...), not measured
                    runs: dict[str, list[dict[str, float]]] = {label: [] for label, _ in codes}
                    for i in range(n):
                        for label, code in (codes if i % 2 == 0 else codes[::-1]):
                            if (c := console(cfg, fresh(i, stored), code)) is not None:
                                runs[label].append(c)
                    for label, samples in runs.items():
                        if samples:
                            add(label, stored, samples)
                for d in root.glob(f"data-{stored}-*"):
                    shutil.rmtree(d, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows


def targets(rows: list[dict[str, Any]], sessions: int) -> list[dict[str, Any]]:
    out = []
    for case, limit in (("aiops chat hi: to first token", TARGET_CHAT_S),
                        (f"{REMOTE_CHAT}: to first token", TARGET_REMOTE_CHAT_S),
                        ("console (tmux): to interactive", TARGET_CONSOLE_S)):
        for r in rows:
            if r["case"] == case and (r["stored_sessions"] == sessions or case.startswith("aiops chat")):
                out.append({"case": case, "stored_sessions": r["stored_sessions"], "target_s": limit,
                            "median_s": r["median_s"], "met": r["median_s"] <= limit})
    return out


def add_arguments(p: argparse.ArgumentParser, *, history: bool = True) -> None:
    p.add_argument("--runs", type=int, default=5, help="fresh processes per case (default 5)")
    if history:
        p.add_argument("--sessions", type=int, default=10_000, help="stored sessions (default 10,000)")
        p.add_argument("--messages", type=int, default=100, help="messages per stored session (default 100)")
    p.add_argument("--no-console", action="store_true", help="skip the console cases (tmux)")
    p.add_argument("--cached-bytecode", action=argparse.BooleanOptionalAction, default=True,
                   help="children keep .pyc files, as an installed aiops has them, even where "
                        "PYTHONDONTWRITEBYTECODE is set; warmed by one run of each command (the default: "
                        "what an operator's machine does; --no-cached-bytecode lets the environment decide)")
    p.add_argument("--console-only", action="store_true", help="only the floors and the console cases")
    p.add_argument("--no-empty", action="store_true", help="only with the stored history, not the empty data dir")
    p.add_argument("--compare-ref", metavar="REF",
                   help="run each console case also with the aiops of commit REF, interleaved run by run")


def quick(args: argparse.Namespace) -> None:
    args.runs = min(args.runs, 2)
    args.sessions = min(args.sessions, 1000)
    args.messages = min(args.messages, 20)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.startup", description=__doc__.splitlines()[0])
    add_arguments(p)
    p.add_argument("--quick", action="store_true", help="2 runs, 1,000 sessions of 20 messages")
    p.add_argument("--json", type=Path, help="also write the numbers to this file")
    args = p.parse_args(argv)
    if args.quick:
        quick(args)
    print(f"start-up: {args.runs} runs per case; stored history {args.sessions:,} × {args.messages}", flush=True)
    rows = measure(args)
    goals = targets(rows, args.sessions)
    for g in goals:
        print(f"  target {g['case']} ({g['stored_sessions']} stored) ≤ {g['target_s']} s: "
              f"{'met' if g['met'] else 'MISSED'} ({g['median_s']:.2f} s)")
    if args.json:
        args.json.write_text(json.dumps({"startup": rows, "targets": goals}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
