#!/usr/bin/env python3
"""Boot to API-ready on the sandbox (issue 15), side by side, then the estimate for the seeds'
checkpoints on real Sparks. Prints, asserts nothing.

Each figure is the wall time of one `sparkstack up` after a `down` (as after a reboot: the
engine containers are gone; `up` prepares the nodes, drops caches, checks, starts the engines
and waits until the API answers a completion), on the sandbox's four ranks:

- NFS path, cold compile cache: `down --purge-caches` first, so the stand-in "compiles"
  (SANDBOX_VLLM_COMPILE_S) after reading every shard over the sandbox's NFS link (its speed:
  --nfs-mbps, in the ranks' sysfs fixtures, launcher/sandbox/nfs_link.py);
- NFS path, warm compile cache: the same after a plain `down` (the compile caches kept);
- staged local path, cold and warm: `sparkstack stage` copies the checkpoint to each rank's own
  disk (model.local_path, STAGED_PATH; the copy's time printed apart), then the same two `up`s:
  the stand-in reads a checkpoint off the NFS path unthrottled, as a local NVMe read would be.

Beside each: the engine's own "Loading weights took" (rank 0) and `check`'s cold-load estimate.
Then scripts/load_estimate.py's rows for the seeds' 258 and 308 GB (10G vs 200G vs local NVMe).
Timings on a shared 2-core host are noisy: --repeat N gives the median of N.

Usage: .venv/bin/python scripts/bench_boot.py [--nfs-mbps 40] [--compile-s 10] [--repeat 1]
(brings the sandbox up if needed; puts the NFS link's speed back to the default at the end)
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from launcher.sandbox import cluster, nfs_link  # noqa: E402
import load_estimate  # noqa: E402

SPARKSTACK = str(Path(sys.executable).parent / "sparkstack")
STAGED_PATH = "/home/spark/staged/bench-boot"  # on each rank's own disk (its container's)


def run(*args: str, check: bool = True) -> tuple[float, str]:
    started = time.monotonic()
    proc = subprocess.run([SPARKSTACK, *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        sys.exit(f"sparkstack {' '.join(args)} failed:\n{proc.stdout}{proc.stderr}")
    return time.monotonic() - started, proc.stdout


def estimate_s() -> float | None:
    """`check`'s cold-load estimate, the slowest rank's."""
    _, out = run("check", "--json", check=False)
    found = []
    for r in json.loads(out)["ranks"]:
        row = next((c for c in r["checks"] if c["name"] == "load"), None)
        m = re.search(r"~([\d.]+) (s|min) cold", row["value"]) if row else None
        if m:
            found.append(float(m.group(1)) * (60 if m.group(2) == "min" else 1))
    return max(found, default=None)


def weights_s(rank0: str) -> float | None:
    """The engine's own "Loading weights took" on rank 0 (its container, over docker exec)."""
    proc = subprocess.run(["docker", "exec", rank0, "docker", "logs", "sparkstack-engine"],
                          capture_output=True, text=True)
    m = re.search(r"Loading weights took ([\d.]+) seconds", proc.stdout + proc.stderr)
    return float(m.group(1)) if m else None


def write_config(data: dict) -> str:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(data, f)
    return f.name


def boot(purge: bool, repeat: int, rank0: str) -> tuple[float, float | None]:
    walls, loads = [], []
    for _ in range(repeat):
        run("down", *(["--purge-caches"] if purge else []))
        walls.append(run("up")[0])
        loads.append(weights_s(rank0))
    return statistics.median(walls), (statistics.median(x for x in loads if x is not None)
                                      if any(x is not None for x in loads) else None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nfs-mbps", type=int, default=40, help="the sandbox NFS link's speed (Mb/s)")
    ap.add_argument("--compile-s", type=float, default=10, help="the stand-in's compile on an empty cache (s)")
    ap.add_argument("--repeat", type=int, default=1, help="median of this many `up`s per column")
    a = ap.parse_args()
    run("sandbox", "up")
    _, out = run("sandbox", "status", "--json")
    status = json.loads(out)
    state = Path(status["config"]).parent  # the sandbox's state dir holds its cluster.yaml
    data = yaml.safe_load(open(status["config"]))
    data.setdefault("overrides", {}).setdefault("env", {})["SANDBOX_VLLM_COMPILE_S"] = str(a.compile_s)
    nfs_config = write_config(data)
    data["model"]["local_path"] = STAGED_PATH
    staged_config = write_config(data)
    os.environ["SPARKSTACK_CONFIG"] = nfs_config
    ranks_dir = cluster.paths(state)["ranks"]
    size = sum(p.stat().st_size for p in cluster.paths(state)["model"].glob("*.safetensors"))
    rank0 = cluster.container_name(cluster.rank_names(len(data["ranks"]))[0])
    nfs_link.set_speed(state, ranks_dir, a.nfs_mbps)
    try:
        est = estimate_s()
        cold = boot(True, a.repeat, rank0)
        warm = boot(False, a.repeat, rank0)
        run("down")
        os.environ["SPARKSTACK_CONFIG"] = staged_config
        stage_s = run("stage", "--from", "nfs")[0]
        staged_est = estimate_s()
        staged_cold = boot(True, a.repeat, rank0)
        staged_warm = boot(False, a.repeat, rank0)
    finally:
        run("down", check=False)
        for name in cluster.rank_names(len(data["ranks"])):
            subprocess.run(["docker", "exec", cluster.container_name(name), "rm", "-rf", STAGED_PATH])
        nfs_link.set_speed(state, ranks_dir, None)
        os.unlink(nfs_config)
        os.unlink(staged_config)
    print(f"boot to API-ready on the sandbox ({len(data['ranks'])} ranks, {size / 1e6:.1f} MB checkpoint read "
          f"whole by each over a {a.nfs_mbps} Mb/s NFS link shared by all; compile {a.compile_s:g} s "
          f"on an empty cache; median of {a.repeat}; a shared 2-core host: noisy):")
    head = ("", "NFS, cold cache", "NFS, warm cache", "staged, cold cache", "staged, warm cache")
    runs = (cold, warm, staged_cold, staged_warm)
    ests = (est, est, staged_est, staged_est)
    rows = [("`up` wall (s)", *(f"{r[0]:.1f}" for r in runs)),
            ("engine's weight load (s)", *(f"{r[1]:.2f}" if r[1] is not None else "?" for r in runs)),
            ("check's cold-load estimate (s)", *(f"{e:.1f}" if e is not None else "?" for e in ests))]
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
    for r in (head, *rows):
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)))
    print(f"  (`stage --from nfs` beforehand, once: {stage_s:.1f} s)")
    print("\nreal Sparks, the seeds' checkpoints (scripts/load_estimate.py):")
    print("\n".join(load_estimate.lines(load_estimate.SEEDS_GB)))


if __name__ == "__main__":
    main()
