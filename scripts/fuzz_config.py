#!/usr/bin/env python3
"""Figures for issue #19, printed (not a test): N generated cluster.yaml documents (default 5000,
tests/config_fuzz.py's strategies) through `sparkstack plan --offline --json` in-process. Prints
the count, the exit-code histogram, every traceback or unclean end found (0 expected; the first
few in full) and the elapsed time. Exit 1 when any was found.

    .venv/bin/python scripts/fuzz_config.py [-n 5000] [--seed 0]
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

from config_fuzz import documents, run_plan  # noqa: E402

SHOWN = 3  # problems printed in full


def cause_of(problem: str) -> str:
    """A traceback as its exception type and the last frame in launcher/, e.g.
    "ZeroDivisionError at launcher/inputs/config.py:243"; other problems by their first line."""
    lines = problem.strip().splitlines()
    frames = re.findall(r'File ".*/(launcher/[^"]+)", line (\d+)', problem)
    if not lines[0].startswith("traceback") or not frames:
        return lines[0][:100]
    return f"{lines[-1].split(':')[0]} at {frames[-1][0]}:{frames[-1][1]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--runs", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    codes: collections.Counter[int] = collections.Counter()
    problems: list[tuple[bytes, str]] = []

    # generation only: a problem is recorded, not shrunk, and the run goes on
    @seed(args.seed)
    @settings(max_examples=args.runs, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(documents())
    def one(data: bytes) -> None:
        outcome = run_plan(data)
        codes[outcome.exit_code] += 1
        if outcome.problem:
            problems.append((data, outcome.problem))

    started = time.monotonic()
    one()
    elapsed = time.monotonic() - started
    runs = sum(codes.values())
    print(f"runs: {runs} generated documents (seed {args.seed}), plan --offline --json in-process")
    print("exit codes: " + ", ".join(f"{code}: {n}" for code, n in sorted(codes.items())))
    print(f"tracebacks or unclean ends: {len(problems)}")
    for cause, n in collections.Counter(cause_of(problem) for _, problem in problems).most_common():
        print(f"  {n:5d}  {cause}")
    for data, problem in problems[:SHOWN]:
        print(f"--- input {data[:400]!r}\n{problem}")
    print(f"elapsed: {elapsed:.1f} s ({1000 * elapsed / max(runs, 1):.1f} ms a run)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
