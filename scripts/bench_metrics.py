#!/usr/bin/env python3
"""The metrics path's costs on the sandbox (issue 31), while it serves. Prints, asserts nothing:

- each rank's sampler CPU at a 1 s interval, as a share of one core (goal <= 1 %): the sampler's
  own CPU seconds (it reports os.times() in every line) over a minute of samples;
- the exporter's scrape time for the four ranks (goal <= 50 ms): GET /metrics of `metrics serve`
  on loopback, rank 0's vLLM /metrics read and relabelled inside each scrape, median and max;
- SSH channels opened per minute after the first ones (goal: none).

Usage: .venv/bin/python scripts/bench_metrics.py [--seconds 60] [--scrapes 30]
(starts the sandbox's engines with `sparkstack up` when they are not serving, and stops them
again at the end in that case)
"""

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launcher.apply import deploy, exporter  # noqa: E402
from launcher.inputs import config  # noqa: E402
from launcher.sandbox import cluster as sandbox  # noqa: E402
from launcher.transport import api  # noqa: E402
from click.testing import CliRunner  # noqa: E402
from launcher.cli.commands import main as cli  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--scrapes", type=int, default=30)
    a = ap.parse_args()
    state = sandbox.state_dir_default()
    sandbox.up(state, progress=lambda line: None)
    cfg = state / "cluster.yaml"
    loaded = config.load(cfg)
    started_engines = not api.health(api.endpoint(loaded))
    if started_engines:
        result = CliRunner().invoke(cli, ["up", "-c", str(cfg)])
        assert result.exit_code == 0, result.output
    got, stop = {}, threading.Event()
    group = deploy.group_for(loaded, say=lambda line: None)
    thread = threading.Thread(target=exporter.serve, daemon=True, kwargs=dict(
        loaded=loaded, group=group, listen="127.0.0.1:0", interval=1.0, supervisor_log=None,
        say=lambda line: None, ready=lambda s, p: got.update(sampling=s, port=p), stop=stop))
    thread.start()
    try:
        while "port" not in got:
            time.sleep(0.05)
        sampling = got["sampling"]
        sampling.wait_for_samples(30)
        first = {s.rank: (s.sample.t, s.sample.cpu_s) for s in sampling.snapshot()}
        opened = sampling.sessions_opened
        url = f"http://127.0.0.1:{got['port']}/metrics"
        times = []
        gap = a.seconds / a.scrapes
        for _ in range(a.scrapes):
            t0 = time.perf_counter()
            r = httpx.get(url, timeout=10)
            times.append((time.perf_counter() - t0) * 1000)
            assert r.status_code == 200
            time.sleep(max(0.0, gap - times[-1] / 1000))
        last = sampling.snapshot()
        print(f"sampler CPU at 1 s (goal <= 1 % of a core), over {a.seconds:.0f} s:")
        for s in last:
            t0, c0 = first[s.rank]
            share = (s.sample.cpu_s - c0) / (s.sample.t - t0)
            print(f"  rank {s.rank} {s.host}: {100 * share:.2f} % of a core")
        print(f"exporter scrape, {len(last)} ranks + rank 0's vLLM /metrics (goal <= 50 ms): median "
              f"{statistics.median(times):.1f} ms, max {max(times):.1f} ms over {len(times)} scrapes "
              f"({len(r.content)} bytes)")
        minutes = a.seconds / 60
        extra = sampling.sessions_opened - opened
        print(f"SSH channels opened after the first {opened}: {extra} in {a.seconds:.0f} s "
              f"({extra / minutes:.1f} per minute; goal 0)")
    finally:
        stop.set()
        thread.join(timeout=10)
        group.close()
        if started_engines:
            CliRunner().invoke(cli, ["down", "-c", str(cfg)])


if __name__ == "__main__":
    main()
