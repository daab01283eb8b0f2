#!/usr/bin/env python3
"""Re-deploy figures on the sandbox (issue: serve lifecycle). Prints, asserts nothing.

- `up` on a running, unchanged cluster (the kit's whole overhead: nothing should change);
- `up` after `down` with the images present (kit overhead = wall − the engine's own start,
  which the stand-in makes near zero: it opens its port at once);
- image bytes moved in both (from `ship --dry-run --json`: what the ranks lack before `up`).

Usage: .venv/bin/python scripts/bench_up.py   (brings the sandbox up if needed)
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPARKSTACK = str(Path(sys.executable).parent / "sparkstack")


def run(*args: str) -> tuple[float, str]:
    started = time.monotonic()
    proc = subprocess.run([SPARKSTACK, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"sparkstack {' '.join(args)} failed:\n{proc.stdout}{proc.stderr}")
    return time.monotonic() - started, proc.stdout


def lacking() -> int:
    _, out = run("ship", "--dry-run", "--json")
    return sum(len(r["images"]) for r in json.loads(out)["ranks"])


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()  # --help runs nothing
    _, out = run("sandbox", "status", "--json")
    os.environ["SPARKSTACK_CONFIG"] = json.loads(out)["config"]
    run("sandbox", "up")
    run("up")  # a known starting point: running as planned
    unchanged = [run("up")[0] for _ in range(3)]
    print(f"up, running and unchanged: {statistics.median(unchanged):.2f} s median of 3 "
          f"({', '.join(f'{s:.2f}' for s in unchanged)}); images lacking before: {lacking()}")
    after_down = []
    for _ in range(3):
        run("down")
        missing = lacking()
        after_down.append(run("up")[0])
    print(f"up after down, images present: {statistics.median(after_down):.2f} s median of 3 "
          f"({', '.join(f'{s:.2f}' for s in after_down)}); images lacking before: {missing}")
    print("the stand-in engine opens its port at once: these walls are the kit's own overhead "
          "(prep and check probe every rank, docker run on 4 ranks, the API wait with a rank watch)")


if __name__ == "__main__":
    main()
