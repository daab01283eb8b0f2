#!/usr/bin/env python3
"""Time the sandbox: cold `up` (no cached images), `down`, warm `up` (images cached), `up` again
(already running), and the final `down`.

    python scripts/bench_sandbox.py [--dir PATH] [--keep] [--skip-cold] [--json]

Cold removes every sandbox image first (the Debian root filesystems are rebuilt with
mmdebstrap, which downloads the packages again) and the saved stand-in image tar.
Targets (issue 3, on a 2-core machine): cold <= 600 s, warm <= 30 s, down <= 15 s.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from launcher.sandbox import cluster, debian_image  # noqa: E402

TARGETS = {"cold_up": 600, "warm_up": 30, "down": 15}


def timed(fn, *args, **kwargs) -> float:
    t0 = time.monotonic()
    fn(*args, **kwargs)
    return round(time.monotonic() - t0, 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=None, help="sandbox state dir")
    ap.add_argument("--keep", action="store_true", help="leave the sandbox up at the end")
    ap.add_argument("--skip-cold", action="store_true", help="do not rebuild the images")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    state_dir = args.dir or cluster.state_dir_default()
    quiet = (lambda msg: None) if args.json else (lambda msg: print(f"  {msg}", file=sys.stderr))
    client = cluster.connect()
    results: dict[str, float] = {}

    cluster.down(state_dir)
    if not args.skip_cold:
        debian_image.remove_cached_images(client)
        shutil.rmtree(cluster.paths(Path(state_dir))["images"], ignore_errors=True)
        results["cold_up"] = timed(cluster.up, state_dir, progress=quiet)
        results["down"] = timed(cluster.down, state_dir)
    results["warm_up"] = timed(cluster.up, state_dir, progress=quiet)
    results["up_again"] = timed(cluster.up, state_dir, progress=quiet)
    if not args.keep:
        results["down_after_warm"] = timed(cluster.down, state_dir)
    results.setdefault("down", results.get("down_after_warm", 0.0))

    if args.json:
        print(json.dumps(results))
    else:
        for k, v in results.items():
            target = TARGETS.get(k)
            verdict = "" if target is None else ("  ok" if v <= target else f"  OVER {target} s")
            print(f"{k:16s} {v:7.1f} s{verdict}")
    return 0 if all(results.get(k, 0) <= t for k, t in TARGETS.items()) else 1


if __name__ == "__main__":
    sys.exit(main())
