"""mypy as a ratchet: the errors of mypy-baseline.txt are tolerated, any other fails.

    python tools/mypy_ratchet.py            # `make test`: fail on an error not in the baseline
    python tools/mypy_ratchet.py --update   # `make mypy-baseline`: the baseline := today's errors

mypy's own settings (what it checks, how strictly) are in pyproject.toml's [tool.mypy]. An error is
compared without its line number (file, message and code), counted, so that editing a file above
an old error does not make it a new one. When errors of the baseline are gone, the check rewrites
the baseline without them (the list only ever shrinks here): commit that file with the fix.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / "mypy-baseline.txt"
HEADER = ("# mypy errors tolerated by `make test` (tools/mypy_ratchet.py): file, message, code; no line\n"
          "# numbers. Fix one and the check drops it; regenerate with `make mypy-baseline`.\n")
# "aiops/x.py:12: error: Message  [code]" (mypy's default output; notes and the summary are skipped)
_ERROR = re.compile(r"^(?P<path>[^:\n]+):\d+(?::\d+)?: error: (?P<message>.*?)(?:  \[(?P<code>[a-z0-9-]+)\])?$")


def run_mypy() -> tuple[list[tuple[str, str]], str]:
    """(key, mypy's line) for every error, and mypy's whole output."""
    proc = subprocess.run([sys.executable, "-m", "mypy", "--no-pretty", "--no-error-summary"], cwd=ROOT,
                          capture_output=True, text=True)
    output = proc.stdout + proc.stderr
    if proc.returncode not in (0, 1):  # 2: mypy itself failed (bad config, a crash), not a type error
        raise SystemExit(f"mypy failed (exit status {proc.returncode}):\n{output}")
    errors = []
    for line in proc.stdout.splitlines():
        m = _ERROR.match(line)
        if m:
            key = f"{m['path'].replace(chr(92), '/')}: {m['message']}  [{m['code'] or 'misc'}]"
            errors.append((key, line))
    if proc.returncode == 1 and not errors:
        raise SystemExit(f"mypy reported errors this check could not read:\n{output}")
    return errors, output


def read_baseline() -> Counter[str]:
    if not BASELINE.exists():
        return Counter()
    return Counter(line for line in BASELINE.read_text(encoding="utf-8").splitlines()
                   if line.strip() and not line.startswith("#"))


def write_baseline(keys: Counter[str]) -> None:
    BASELINE.write_text(HEADER + "".join(f"{k}\n" for k in sorted(keys.elements())), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="write today's errors as the baseline")
    args = parser.parse_args(argv)
    errors, _ = run_mypy()
    current = Counter(key for key, _ in errors)
    if args.update:
        write_baseline(current)
        print(f"mypy: {sum(current.values())} error(s) written to {BASELINE.name}")
        return 0
    baseline = read_baseline()
    new = current - baseline
    fixed = baseline - current
    if new:
        # Every line of a key that occurs more often than the baseline allows is shown: which of
        # them is the new one, mypy cannot say.
        print(f"mypy: {sum(new.values())} new error(s) (not in {BASELINE.name}):")
        for key, line in errors:
            if key in new:
                print(f"  {line}")
        print("Fix them (or, for an error that is not worth fixing, a `# type: ignore[code]` saying why).")
        return 1
    if fixed:
        write_baseline(baseline - fixed)
        print(f"mypy: {sum(fixed.values())} error(s) of the baseline fixed; {BASELINE.name} shrunk "
              f"to {sum(current.values())} (commit it)")
    else:
        print(f"mypy: no new errors ({sum(current.values())} in the baseline)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
