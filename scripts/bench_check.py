#!/usr/bin/env python3
"""Numbers for issue 6, printed (not a test): `check` on the sandbox's 4 ranks, `ansible -m setup`
on the same ranks, and the 16-rank scaling -- measured with the sandbox up
(`sparkstack sandbox up`).

    .venv/bin/python scripts/bench_check.py [--runs 5] [--config PATH]

- check, in-process: `launcher.apply.preflight.run` (connect, probe, pings, judge), wall time per run.
- check, CLI: `sparkstack check --json` as a fresh process (adds Python's start and imports).
- ansible: `ansible all -m setup` with an inventory from `launcher.plan.inventory` (fact gathering,
  the comparable job), as a fresh process.
- 16 ranks: `sandbox up --ranks 16` (16 rank containers, each its own sshd and dockerd, an
  16-ring of veth cables), check on all 16 and on the first 4 of them; then back to 4 ranks.
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

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launcher.apply import preflight as check  # noqa: E402
from launcher.inputs import config  # noqa: E402
from launcher.plan import inventory  # noqa: E402
from launcher.sandbox import cluster as sandbox_cluster  # noqa: E402

BIN = Path(sys.executable).parent  # the sparkstack and ansible installed beside this python


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


def idle_share(seconds: float = 1.0) -> float:
    """The share of this host's CPU time that was idle over the next `seconds` (/proc/stat)."""
    def sample():
        f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return f[3] + f[4], sum(f)
    i0, t0 = sample()
    time.sleep(seconds)
    i1, t1 = sample()
    return (i1 - i0) / max(1, t1 - t0)


def settle(limit_s: float = 180) -> float:
    """Wait until the new ranks are done starting (the host >= 80% idle), at most limit_s."""
    deadline = time.monotonic() + limit_s
    share = idle_share()
    while share < 0.8 and time.monotonic() < deadline:
        share = idle_share()
    return share


def first(loaded, n: int):
    """The config's first n ranks (model_copy: the rank count validators are beside the point)."""
    ranks = list(loaded.cluster.ranks)[:n]
    return loaded.model_copy(update={"cluster": loaded.cluster.model_copy(update={"ranks": ranks})})


def scale(args, loaded4, four: float) -> None:
    """`sandbox up --ranks N` (N rank containers, each with its own sshd and dockerd, cabled as
    an N-ring), check on all N and on the first 4 of them, then the sandbox back to 4 ranks."""
    big = args.big
    print(f"sandbox up --ranks {big} ...", flush=True)
    started = time.monotonic()
    sandbox_cluster.up(progress=lambda m: None, ranks=big)
    print(f"  ({time.monotonic() - started:.0f} s); host idle {settle():.0%} before measuring")
    try:
        # the sandbox profile is TP 4: the N-rank config asks for TP N so that it validates
        doc = yaml.safe_load(args.config.read_text())
        doc.setdefault("overrides", {})["engine_args"] = [f"--tensor-parallel-size {big}"]
        wide = Path(tempfile.mkdtemp()) / f"cluster-{big}.yaml"
        wide.write_text(yaml.safe_dump(doc))
        loaded = config.load(wide)
        assert len(loaded.cluster.ranks) == big
        check.run(loaded)  # warm
        n_big = show(f"check, in-process, {big} ranks", timed(lambda: check.run(loaded), args.runs))
        n_four = show(f"check, in-process, 4 of the {big} ranks", timed(lambda: check.run(first(loaded, 4)), args.runs))
        print(f"  {big}-rank / 4-rank = {n_big / n_four:.2f} with {big} containers up "
              f"({n_big / four:.2f} against the 4-rank sandbox); goal <= 1.5")
        print(f"  load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs: the {big} ranks' probes and "
              "this host's SSH handshakes share them")
    finally:
        sandbox_cluster.up(progress=lambda m: None, ranks=len(loaded4.cluster.ranks))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--big", type=int, default=16, metavar="N",
                    help="also measure an N-rank sandbox (0: skip); it is put back to 4 ranks after")
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
    cli = [str(BIN / "sparkstack"), "check", "-c", str(args.config), "--json"]
    cli_med = show(f"check, CLI process, {n} ranks",
                   timed(lambda: subprocess.run(cli, capture_output=True), args.runs))

    with tempfile.TemporaryDirectory() as tmp:
        inv = Path(tmp) / "inventory.ini"
        inv.write_text(inventory.render(loaded.cluster, "ini"))
        env = {**os.environ, "ANSIBLE_HOST_KEY_CHECKING": "True", "ANSIBLE_STDOUT_CALLBACK": "json",
               "ANSIBLE_LOCALHOST_WARNING": "False", "ANSIBLE_PYTHON_INTERPRETER": "/usr/bin/python3"}
        argv = [str(BIN / "ansible"), "all", "-i", str(inv), "-m", "setup", "-f", str(n)]
        first = subprocess.run(argv, capture_output=True, text=True, env=env)
        if first.returncode != 0:
            print(f"ansible -m setup failed (exit {first.returncode}): {first.stdout[-400:]}{first.stderr[-400:]}")
            ansible = None
        else:
            ansible = show(f"ansible all -m setup, {n} ranks",
                           timed(lambda: subprocess.run(argv, capture_output=True, env=env), max(3, args.runs // 2)))
    if ansible:
        print(f"  check is {ansible / four:.1f}x faster than ansible -m setup (goal >= 5x), in-process check")

    if ansible:
        print(f"  CLI vs CLI (both fresh processes): {ansible / cli_med:.1f}x")
    if args.big:
        scale(args, loaded, four)
    print(f"goal check <= 1.0 s on {n} ranks: {'met' if four <= 1.0 else 'NOT met'} ({four:.2f} s)")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
