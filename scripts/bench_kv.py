#!/usr/bin/env python3
"""Figures for issue 14, printed (not a test): for every profile, at a GB10's offline figures
(no ranks probed), the KV pool the plan passes, the tokens it holds, and the memory each rank
keeps free while serving, beside the seed figure the profile's target comes from.

    .venv/bin/python scripts/bench_kv.py [--config env/cluster.example.yaml] [--policy target|max]

Each profile is planned as `sparkstack plan --offline --json --profile NAME` (the sparkstack
beside this interpreter), the example config's 4 ranks, so the numbers are what a user sees.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SPARKSTACK = Path(sys.executable).parent / "sparkstack"
GIB = 1 << 30


def plan(config: Path, profile: str) -> dict | str:
    run = subprocess.run([str(SPARKSTACK), "plan", "--offline", "--json", "-c", str(config),
                          "--profile", profile], capture_output=True, text=True)
    if run.returncode != 0:
        return (run.stderr.strip() or run.stdout.strip()).splitlines()[-1]
    return json.loads(run.stdout)


def row(profile: str, data: dict | str) -> str:
    if isinstance(data, str):
        return f"{profile:<16} refused: {data}"
    kv = data["kv"]
    free = [r["free_while_serving"] / GIB for r in kv["per_rank"]]
    pool = kv["kv_cache_memory_bytes"]
    shown = f"{pool / GIB:6.1f} GiB {kv['max_tokens']:>10,} tok" if pool else f"{'(engine sizes its own)':>25}"
    free_txt = f"{min(free):5.1f}" if free else "    -"
    source = (kv["target"] or {}).get("source", "no target: all that fits")
    return f"{profile:<16} {kv['policy'] or '-':<15} {shown}  {free_txt} GiB free  {source}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=ROOT / "env" / "cluster.example.yaml")
    ap.add_argument("--policy", choices=("target", "max"), default="target")
    args = ap.parse_args()
    doc = yaml.safe_load(args.config.read_text())
    doc.setdefault("overrides", {})["kv_policy"] = args.policy
    profiles = sorted(p.stem for p in (ROOT / "env" / "profiles").glob("*.yaml"))
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "cluster.yaml"
        config.write_text(yaml.safe_dump(doc, sort_keys=False))
        print(f"kv_policy {args.policy}; free = MemAvailable − weights − runtime − KV (the seeds keep ~9–15 GB)")
        print(f"{'profile':<16} {'policy':<15} {'KV pool, tokens':>25}  {'least free':>14}  target's source")
        for profile in profiles:
            print(row(profile, plan(config, profile)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
