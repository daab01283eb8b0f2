#!/usr/bin/env python3
"""Every row of issue 34's table of the everyday commands, in one run (a benchmark, not a test).

Each row is the real command line, a fresh process (interpreter start included), on the sandbox:
  check            `sparkstack check --json`, 4 ranks; its CPU (user+sys of the process) and the
                   kit's CPU per rank beyond the interpreter's start (`python -c pass`'s CPU)
  ansible          `ansible all -m setup` against the same ranks (the ratio check is measured by)
  up, serving      `sparkstack up` on a cluster already serving as planned
  up after down    `sparkstack down`, then `sparkstack up --json`: the kit's part (the wall less the
                   wait for the API, the engines' own start, and less the verification)
  build, no-op     `sparkstack build --json` with nothing changed
  --version        `sparkstack --version`
  gather           check's gather in-process (connections already open), rank 0 alone and all ranks
                   at once: the share of check's wall that is the sandbox's ranks sharing this host
Holds the sandbox lock (/tmp/sparkstack-sandbox.lock) while it runs, and leaves the sandbox
serving or not as it found it. --bin: the directory of another checkout's `sparkstack` (its
.venv/bin), to measure that checkout (e.g. main) the same way.
Run: .venv/bin/python scripts/bench_cli.py [--runs 3] [--bin DIR]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launcher.inputs import config  # noqa: E402
from launcher.plan import inventory  # noqa: E402

LOCK = "/tmp/sparkstack-sandbox.lock"
GOALS = {"check": 1.0, "up, serving": 1.0, "up after down": 2.5, "build, no-op": 0.3, "--version": 0.15}


def timed(argv: list[str], env=None) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall and CPU seconds (user + sys of the child) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc


def rows_of(label: str, argv: list[str], runs: int, env=None, before=None) -> tuple[float, float]:
    walls, cpus = [], []
    for _ in range(runs):
        if before:
            before()
        wall, cpu, proc = timed(argv, env)
        if proc.returncode != 0:
            sys.exit(f"{' '.join(argv)} failed (exit {proc.returncode}):\n{proc.stdout[-800:]}{proc.stderr[-800:]}")
        walls.append(wall)
        cpus.append(cpu)
    med, cpu = statistics.median(walls), statistics.median(cpus)
    goal = GOALS.get(label)
    verdict = "" if goal is None else f"   goal <= {goal:.2f} s: {'met' if med <= goal else 'NOT met'}"
    print(f"  {label:<16} median {med:6.2f} s  (runs {', '.join(f'{w:.2f}' for w in walls)}), "
          f"CPU {cpu:.2f} s{verdict}", flush=True)
    return med, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--bin", type=Path, default=Path(sys.executable).parent)
    args = ap.parse_args()
    kit = str(args.bin / "sparkstack")
    status = json.loads(subprocess.run([kit, "sandbox", "status", "--json"], capture_output=True, text=True).stdout)
    cfg = status["config"]
    env = {**os.environ, "SPARKSTACK_CONFIG": cfg}
    loaded = config.load(Path(cfg))
    n = len(loaded.cluster.ranks)
    print(f"{kit} on the sandbox ({n} ranks); load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        serving = json.loads(subprocess.run([kit, "status", "--json"], capture_output=True, text=True, env=env).stdout or "{}")
        was_up = "running" in json.dumps(serving)
        try:
            measure(args, kit, env, loaded, n)
        finally:
            subprocess.run([kit, "up" if was_up else "down"], capture_output=True, env=env)
    print(f"load average after: {os.getloadavg()[0]:.2f}; the sandbox left {'serving' if was_up else 'down'}, as found")
    return 0


def measure(args, kit: str, env: dict, loaded, n: int) -> None:
    py = str(args.bin / "python")
    _, start_cpu, _ = timed([py, "-c", "pass"])
    subprocess.run([kit, "check", "--json"], capture_output=True, env=env)  # warm
    check, check_cpu = rows_of("check", [kit, "check", "--json"], args.runs, env)
    print(f"  {'':16} its CPU beyond the interpreter's start ({start_cpu:.2f} s), imports included, "
          f"over {n} ranks: {(check_cpu - start_cpu) / n * 1000:.0f} ms a rank (the growth per rank: "
          "the gather row below)")
    with tempfile.TemporaryDirectory() as tmp:
        inv = Path(tmp) / "inventory.ini"
        inv.write_text(inventory.render(loaded.cluster, "ini"))
        aenv = {**env, "ANSIBLE_HOST_KEY_CHECKING": "True", "ANSIBLE_STDOUT_CALLBACK": "json",
                "ANSIBLE_LOCALHOST_WARNING": "False", "ANSIBLE_PYTHON_INTERPRETER": "/usr/bin/python3"}
        ansible_bin = Path(sys.executable).parent / "ansible"
        ansible, _ = rows_of("ansible", [str(ansible_bin), "all", "-i", str(inv), "-m", "setup", "-f", str(n)],
                             args.runs, aenv)
    print(f"  {'':16} ansible / check = {ansible / check:.1f}x (goal >= 5x)")
    subprocess.run([kit, "up"], capture_output=True, env=env)  # serving as planned: the next row's start
    rows_of("up, serving", [kit, "up"], args.runs, env)
    up_after_down(kit, env, args.runs)
    subprocess.run([kit, "build", "--json"], capture_output=True, env=env)  # built: the next row's start
    rows_of("build, no-op", [kit, "build", "--json"], args.runs, env)
    rows_of("--version", [kit, "--version"], args.runs, env)
    contention(loaded, args.runs)


def up_after_down(kit: str, env: dict, runs: int) -> None:
    """`up --json` after `down`; the goal is on the kit's part: the wall less the wait for the API
    (the engines' own start) and the verification (--no-verify skips it), both from its JSON."""
    walls, kits, waits, verifies, starts = [], [], [], [], []
    for _ in range(runs):
        subprocess.run([kit, "down"], capture_output=True, env=env)
        wall, _, proc = timed([kit, "up", "--json"], env)
        if proc.returncode != 0:
            sys.exit(f"up failed (exit {proc.returncode}):\n{proc.stdout[-800:]}{proc.stderr[-800:]}")
        report = json.loads(proc.stdout)
        walls.append(wall)
        waits.append(report["waited_s"])
        verifies.append(report["verify_s"])
        starts.append(report["start_s"])
        kits.append(wall - report["waited_s"] - report["verify_s"])
    med = statistics.median(kits)
    print(f"  {'up after down':<16} median {statistics.median(walls):6.2f} s  (runs {', '.join(f'{w:.2f}' for w in walls)}): "
          f"the engines' start {statistics.median(waits):.2f} s, verification {statistics.median(verifies):.2f} s, "
          f"the kit {med:.2f} s (runs {', '.join(f'{k:.2f}' for k in kits)})   goal <= {GOALS['up after down']:.2f} s "
          f"plus the engine's start: {'met' if med <= GOALS['up after down'] else 'NOT met'}", flush=True)
    print(f"  {'':16} of the kit's part, `docker run` of the containers (workers, then the head): "
          f"{statistics.median(starts):.2f} s", flush=True)


def contention(loaded, runs: int) -> None:
    """Why the sandbox's probe costs more than a Spark's: its four ranks share this host's cores.
    check's gather (probe, pings) in-process, for rank 0 alone and for all ranks at once."""
    from launcher.gather import cluster, probe

    def once(only: list[int]) -> tuple[float, float]:
        with probe.open_group(loaded) as group:
            group.connections = [c for c in group.connections if c.target.rank in only]
            for c in group.connections:
                c.open()
            started, cpu = time.monotonic(), time.process_time()
            cluster.gather(loaded, group)
            return time.monotonic() - started, time.process_time() - cpu

    n = len(loaded.cluster.ranks)
    alone = [once([0]) for _ in range(runs)]
    together = [once(list(range(n))) for _ in range(runs)]
    wall1, wall_n = statistics.median(w for w, _ in alone), statistics.median(w for w, _ in together)
    cpu1, cpu_n = statistics.median(c for _, c in alone), statistics.median(c for _, c in together)
    print(f"  {'gather':<16} rank 0 alone {wall1:.2f} s, all {n} at once {wall_n:.2f} s "
          f"({wall_n / wall1:.1f}x: the ranks share this host's {os.cpu_count()} CPUs; "
          f"a Spark probes on its own)", flush=True)
    print(f"  {'':16} the kit's CPU: {cpu1 * 1000:.0f} ms for 1 rank, {cpu_n * 1000:.0f} ms for {n}: "
          f"{(cpu_n - cpu1) / (n - 1) * 1000:.0f} ms per rank more (goal <= 30 ms)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
