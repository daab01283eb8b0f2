#!/usr/bin/env python3
"""Numbers for issue 6, printed (not a test): `check` on the sandbox's 4 ranks, `ansible -m setup`
on the same ranks, and the 16-rank scaling -- measured with the sandbox up
(`sparkstack sandbox up`).

    .venv/bin/python scripts/bench_check.py [--runs 5] [--config PATH]

- check, in-process: `launcher.check.run` (connect, probe, pings, judge), wall time per run.
- check, CLI: `sparkstack check --json` as a fresh process (adds Python's start and imports).
- ansible: `ansible all -m setup` with an inventory from `launcher.inventory` (fact gathering,
  the comparable job), as a fresh process.
- 16 ranks: the sandbox has exactly 4 ranks (launcher/sandbox/cluster.py N_RANKS), so the proxy
  is the same 4 ranks listed 4 times (16 connections, 16 probes and 16 ping rounds in parallel,
  4 per rank container). Said so in the output.
The host's load average is printed with the numbers: the sandbox shares this host's CPUs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launcher import check, config, inventory  # noqa: E402
from launcher.sandbox import cluster as sandbox_cluster  # noqa: E402


def timed(fn, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        started = time.monotonic()
        fn()
        out.append(time.monotonic() - started)
    return out


def show(label: str, times: list[float]) -> float:
    med = statistics.median(times)
    print(f"{label:<44} median {med:6.2f} s  min {min(times):6.2f} s  "
          f"runs {', '.join(f'{t:.2f}' for t in times)}")
    return med


def replicated(loaded, times: int):
    """The config's ranks listed `times` times: the sandbox cannot make more rank containers.
    model_copy skips the validators (which would refuse repeated addresses) on purpose."""
    ranks = list(loaded.cluster.ranks) * times
    return loaded.model_copy(update={"cluster": loaded.cluster.model_copy(update={"ranks": ranks})})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--config", type=Path,
                    default=sandbox_cluster.paths(sandbox_cluster.state_dir_default())["config"])
    args = ap.parse_args()
    loaded = config.load(args.config)
    n = len(loaded.cluster.ranks)
    print(f"config {args.config} ({n} ranks); load average before: {os.getloadavg()[0]:.2f} "
          f"on {os.cpu_count()} CPUs")
    check.run(loaded)  # warm: page cache, the ranks' docker CLIs

    four = show(f"check, in-process, {n} ranks", timed(lambda: check.run(loaded), args.runs))
    report = check.run(loaded)
    probe = [c for r in report.ranks for c in r.checks if c.name == "ssh"]
    print(f"  (per-rank probe inside it: {', '.join(c.value.rsplit('probe ', 1)[-1] for c in probe)})")
    cli = [str(ROOT / ".venv/bin/sparkstack"), "check", "-c", str(args.config), "--json"]
    show(f"check, CLI process, {n} ranks",
         timed(lambda: subprocess.run(cli, capture_output=True), args.runs))

    with tempfile.TemporaryDirectory() as tmp:
        inv = Path(tmp) / "inventory.ini"
        inv.write_text(inventory.render(loaded.cluster, "ini"))
        env = {**os.environ, "ANSIBLE_HOST_KEY_CHECKING": "True", "ANSIBLE_STDOUT_CALLBACK": "json",
               "ANSIBLE_LOCALHOST_WARNING": "False", "ANSIBLE_PYTHON_INTERPRETER": "/usr/bin/python3"}
        argv = [str(ROOT / ".venv/bin/ansible"), "all", "-i", str(inv), "-m", "setup", "-f", str(n)]
        first = subprocess.run(argv, capture_output=True, text=True, env=env)
        if first.returncode != 0:
            print(f"ansible -m setup failed (exit {first.returncode}): {first.stdout[-400:]}{first.stderr[-400:]}")
            ansible = None
        else:
            ansible = show(f"ansible all -m setup, {n} ranks",
                           timed(lambda: subprocess.run(argv, capture_output=True, env=env), max(3, args.runs // 2)))
    if ansible:
        print(f"  check is {ansible / four:.1f}x faster than ansible -m setup (goal >= 5x)")

    big = replicated(loaded, 4)
    sixteen = show(f"check, in-process, {n} ranks x 4 = {4 * n} probes (proxy)",
                   timed(lambda: check.run(big), args.runs))
    print(f"  {4 * n}-probe / {n}-rank = {sixteen / four:.2f} (goal <= 1.5); the sandbox has only "
          f"{n} rank containers, so this is {n} ranks probed 4x in parallel, not {4 * n} ranks")
    print(f"goal check <= 1.0 s on {n} ranks: {'met' if four <= 1.0 else 'NOT met'} ({four:.2f} s)")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
