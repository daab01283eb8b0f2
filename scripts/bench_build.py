#!/usr/bin/env python3
"""Figures for `sparkstack build` on the local Docker engine (a benchmark, not a test).

Over the tests' tiny stand-in base (a static busybox and a fake site-packages, imported, nothing
pulled) and the sandbox profile's four-stage chain dcp → mul1 → v145 → keys, it times the real
command line (`sparkstack build --json`, interpreter start-up included):

  full     the whole chain from nothing (a fresh base, so Docker's cache cannot help)
  no-op    the same again, nothing changed (goal: ≤ 1 s wall)
  top      one patch file of the top stage (keys) changed: that stage alone is rebuilt

and prints the ratio of the top-stage rebuild to the full build. Every image it made is removed
at the end. Run: .venv/bin/python scripts/bench_build.py [--noop-runs N]
It times the `sparkstack` beside that python; the stand-in base and patch files come from the
package (launcher/sandbox/chain_fixture.py, shared with tests/test_build.py), not from tests/.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from launcher.images import build as build_mod  # noqa: E402
from launcher.sandbox.chain_fixture import (PATCH_FILES, make_test_base, remove_test_images,  # noqa: E402
                                            session_id, write_patches)

SPARKSTACK = Path(sys.executable).parent / "sparkstack"  # the one installed beside this python
EXAMPLE_CONFIG = ROOT / "env" / "cluster.example.yaml"


CPU: list[float] = []  # CPU seconds (user + sys) of each `sparkstack build` run


def child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_build(config: Path) -> tuple[float, list[dict]]:
    start, cpu = time.monotonic(), child_cpu()
    done = subprocess.run([str(SPARKSTACK), "build", "-c", str(config), "--json"],
                          capture_output=True, text=True)
    wall = time.monotonic() - start
    CPU.append(child_cpu() - cpu)
    if done.returncode:
        sys.exit(f"sparkstack build failed:\n{done.stdout}{done.stderr}")
    return wall, json.loads(done.stdout)["stages"]


def timed(argv: list[str]) -> float:
    start = time.monotonic()
    subprocess.run(argv, check=True, capture_output=True)
    return time.monotonic() - start


def in_process_noop(config: Path, runs: int) -> float:
    """The no-op's own work, without interpreter start-up: config, render, tags, lookups."""
    from launcher.inputs import config as config_mod
    from launcher.images import chain as images

    times = []
    for _ in range(runs):
        start = time.monotonic()
        loaded = config_mod.load(config)
        engine = build_mod.connect()
        chain = images.chain_for(loaded, engine.image_id(images.base_name(loaded)))
        assert not any(r.built for r in build_mod.build_chain(engine, chain))
        times.append(time.monotonic() - start)
    return statistics.median(times)


def built(stages: list[dict]) -> str:
    return ", ".join(s["name"] for s in stages if s["built"]) or "nothing"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--noop-runs", type=int, default=5)
    runs = parser.parse_args().noop_runs
    client = build_mod.connect()
    session = session_id()
    try:
        with tempfile.TemporaryDirectory(prefix="sparkstack-bench-") as tmp:
            base = make_test_base(client, session)
            patches = write_patches(Path(tmp) / "patches")
            data = yaml.safe_load(EXAMPLE_CONFIG.read_text())
            data.update(profile="sandbox", images={"base": base, "patches_dir": str(patches)})
            config = Path(tmp) / "cluster.yaml"
            config.write_text(yaml.safe_dump(data, sort_keys=False))

            full, stages = run_build(config)
            print(f"full chain build      {full:6.2f} s wall  (built: {built(stages)}; per stage "
                  + ", ".join(f"{s['name']} {s['seconds']:.2f}s" for s in stages) + ")")
            noop = []
            CPU.clear()
            for _ in range(runs):
                wall, stages = run_build(config)
                assert not any(s["built"] for s in stages), stages
                noop.append(wall)
            noop_cpu = statistics.median(CPU)
            floor = statistics.median(timed([str(SPARKSTACK), "--version"]) for _ in range(runs))
            print(f"no-op build           {statistics.median(noop):6.2f} s wall median of {runs} "
                  f"(min {min(noop):.2f}, max {max(noop):.2f}; goal ≤ 1 s)")
            print(f"  its CPU time        {noop_cpu:6.2f} s user+sys median (less sensitive to other load)")
            print(f"  start-up floor      {floor:6.2f} s wall (`sparkstack --version`, any command pays it)")
            print(f"  in-process no-op    {in_process_noop(config, runs):6.2f} s (load, render, tag, 4+1 lookups)")
            (patches / "sparse_attn_indexer.py").write_text(PATCH_FILES["sparse_attn_indexer.py"] + "# edit\n")
            top, stages = run_build(config)
            print(f"top stage (keys) edit {top:6.2f} s wall  (built: {built(stages)}; keys "
                  f"{stages[-1]['seconds']:.2f}s)")
            print(f"ratio top / full      {top / full:6.2f}  (one stage of four)")
            print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end")
    finally:
        remove_test_images(client, session)


if __name__ == "__main__":
    main()
