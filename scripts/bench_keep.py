#!/usr/bin/env python3
"""Time from a killed engine (issue #17) or a wedged one (issue #29) to the API answering again
under `up --keep`, on the sandbox. Prints figures, asserts nothing.

Runs `sparkstack up --keep` on the sandbox's config with the given check interval and backoff,
kills one worker's engine (`docker kill` on that rank) N times, and per kill prints: detection
(kill -> the supervisor's "failure" event), re-deploy (failure -> "serving" event: backoff, `down`
on every rank, `up`), and kill -> /health answering 200 again as a client sees it.
With `--fault wedge`, rank 0's engine is wedged instead (the stand-in's SIGUSR1: /health still
answers, no token comes): detection is then liveness's (keep.liveness: a probe and rank 0's
/metrics every --interval, --stalled checks in a row after --grace), and "answers" means a
completion answers again (its /health never stopped).
The stand-in engine opens its port at once, so these figures are the kit's own share; a real
GLM-5.3 load adds its cold load (~10 min from NFS).

Then (issue 29) it squeezes that rank's memory N times (the sandbox's memory model: MemAvailable
set 1 GiB under the serving guard's hard floor, as a runaway prefill would) and per squeeze prints
squeeze -> the rank's engine stopped by the rank's own memory guard (the box kept: it still answers
SSH), and squeeze -> the API answering again (the supervisor waits for memory, which the bench
gives back once the engine is stopped, then re-deploys). The guard looks every
memory_guard.serving.interval_s (1 s, the default).

Usage: .venv/bin/python scripts/bench_keep.py [--kills 3] [--squeezes 3] [--interval 2] [--backoff 1] [--rank spark3]
                                              [--fault kill|wedge] [--grace 2] [--stalled 3]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SPARKSTACK = str(Path(sys.executable).parent / "sparkstack")

from launcher.inputs import apikey, config  # noqa: E402
from launcher.sandbox import meminfo  # noqa: E402
from launcher.transport import api  # noqa: E402

GIB = 1 << 30


def sandbox_config() -> Path:
    out = subprocess.run([SPARKSTACK, "sandbox", "up", "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"sandbox up failed:\n{out.stdout}{out.stderr}")
    return Path(json.loads(out.stdout)["config"])


def events(log_dir: Path) -> list[dict]:
    return [json.loads(line) for p in log_dir.glob("*.jsonl") for line in p.read_text().splitlines()]


def wait_event(log_dir: Path, kind: str, count: int, limit_s: float = 300) -> float:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if [e["event"] for e in events(log_dir)].count(kind) >= count:
            return time.monotonic()
        time.sleep(0.05)
    sys.exit(f"no {count}th {kind!r} event within {limit_s} s")


def healthy(endpoint) -> bool:
    try:
        return httpx.get(f"{endpoint.url}/health", headers=endpoint.headers, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def completes(endpoint) -> bool:
    body = {"model": endpoint.model, "max_tokens": 1, "messages": [{"role": "user", "content": "ping"}]}
    try:
        return httpx.post(f"{endpoint.url}/v1/chat/completions", json=body, headers=endpoint.headers,
                          timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def engine_running(rank: str) -> bool:
    out = subprocess.run(["docker", "exec", f"sparkstack-{rank}", "docker", "ps", "-q", "--filter",
                          "name=^sparkstack-engine$"], capture_output=True, text=True)
    return bool(out.stdout.strip())


def answers_ssh(rank: str) -> bool:
    return subprocess.run(["docker", "exec", f"sparkstack-{rank}", "true"]).returncode == 0


def squeeze_once(state: Path, rank: str, hard_gib: float, endpoint, log_dir: Path,
                 served_before: int) -> tuple[float, float]:
    """(squeeze -> engine stopped, squeeze -> API answers again) in seconds; `state`: the sandbox's
    state dir (its memory model)."""
    squeezed = time.monotonic()
    meminfo.squeeze_available(state, rank, int((hard_gib - 1) * GIB))
    while engine_running(rank):
        if time.monotonic() - squeezed > 60:
            meminfo.unsqueeze(state, rank)
            sys.exit(f"{rank}'s guard did not stop its engine within 60 s")
        time.sleep(0.05)
    stopped = time.monotonic()
    if not answers_ssh(rank):
        sys.exit(f"{rank} does not answer after its engine was stopped")
    meminfo.unsqueeze(state, rank)  # memory back: the supervisor may re-deploy
    wait_event(log_dir, "serving", served_before + 1)
    while not healthy(endpoint):
        time.sleep(0.05)
    return stopped - squeezed, time.monotonic() - squeezed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--squeezes", type=int, default=3, help="memory squeezes past the hard floor")
    parser.add_argument("--interval", type=float, default=2.0, help="keep.check_interval_s")
    parser.add_argument("--backoff", type=float, default=1.0, help="keep.backoff_s (and its max)")
    parser.add_argument("--rank", default="spark3", help="whose engine is killed (a wedge: rank 0's)")
    parser.add_argument("--fault", choices=("kill", "wedge"), default="kill")
    parser.add_argument("--grace", type=float, default=2.0, help="keep.liveness.grace_s")
    parser.add_argument("--stalled", type=int, default=3, help="keep.liveness.stalled_checks")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-keep-"))
    os.environ["XDG_STATE_HOME"] = str(work / "state")  # its own log and API key
    sandbox_cfg = sandbox_config()
    data = yaml.safe_load(sandbox_cfg.read_text())
    data["keep"] = {"check_interval_s": args.interval, "api_failures": 2, "backoff_s": args.backoff,
                    "backoff_max_s": args.backoff, "max_restarts_per_hour": args.kills + args.squeezes + 1,
                    "liveness": {"interval_s": args.interval, "grace_s": args.grace,
                                 "stalled_checks": args.stalled}}
    if args.fault == "wedge":
        args.rank = data["ranks"][0].get("name") or "spark1"  # the API's engine
    cfg = work / "cluster.yaml"
    cfg.write_text(yaml.safe_dump(data))
    endpoint = api.endpoint(config.load(cfg))
    log_dir = apikey.state_dir() / "keep"
    keep = subprocess.Popen([SPARKSTACK, "up", "--keep", "-c", str(cfg)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    rows, squeezes = [], []
    try:
        wait_event(log_dir, "serving", 1, limit_s=900)
        endpoint = api.endpoint(config.load(cfg))  # the key exists now
        for i in range(1, args.kills + 1):
            time.sleep(args.interval)  # a settled cluster, not one just back
            killed = time.monotonic()
            signal_flag = ["-s", "USR1"] if args.fault == "wedge" else []
            subprocess.run(["docker", "exec", f"sparkstack-{args.rank}", "docker", "kill", *signal_flag,
                            "sparkstack-engine"], check=True, capture_output=True)
            failed = wait_event(log_dir, "failure", i)
            served = wait_event(log_dir, "serving", i + 1)
            while not (completes(endpoint) if args.fault == "wedge" else healthy(endpoint)):
                time.sleep(0.05)
            answered = time.monotonic()
            rows.append((failed - killed, served - failed, answered - killed))
        hard_gib = config.load(cfg).cluster.memory_guard.serving.hard_available_gib
        for i in range(1, args.squeezes + 1):
            time.sleep(args.interval)
            served = [e["event"] for e in events(log_dir)].count("serving")
            squeezes.append(squeeze_once(sandbox_cfg.parent, args.rank, hard_gib, endpoint, log_dir, served))
    finally:
        keep.send_signal(signal.SIGTERM)
        keep.wait(timeout=60)
        subprocess.run([SPARKSTACK, "down", "-c", str(cfg)], capture_output=True)
    what = ("killed" if args.fault == "kill" else
            f"wedged (liveness: {args.stalled} stalled checks after {args.grace:g} s)")
    print(f"up --keep on the sandbox: check every {args.interval:g} s, backoff {args.backoff:g} s, "
          f"{args.rank}'s engine {what} {args.kills} times")
    print(f"{args.fault:>4}  {'detected (s)':>12}  {'re-deployed (s)':>15}  {args.fault + ' -> API answers (s)':>23}")
    for i, (detect, redeploy, total) in enumerate(rows, 1):
        print(f"{i:>4}  {detect:>12.1f}  {redeploy:>15.1f}  {total:>23.1f}")
    if rows:
        print(f"mean  {sum(r[0] for r in rows) / len(rows):>12.1f}  {sum(r[1] for r in rows) / len(rows):>15.1f}  "
              f"{sum(r[2] for r in rows) / len(rows):>23.1f}")
    if squeezes:
        print(f"\n{args.rank}'s MemAvailable squeezed under the serving guard's hard floor {len(squeezes)} times "
              "(the guard on the rank itself, every 1 s)")
        print(f"{'squeeze':>7}  {'-> engine stopped, box kept (s)':>31}  {'-> API answers again (s)':>24}")
        for i, (stop, back) in enumerate(squeezes, 1):
            print(f"{i:>7}  {stop:>31.2f}  {back:>24.1f}")
        print(f"{'mean':>7}  {sum(q[0] for q in squeezes) / len(squeezes):>31.2f}  "
              f"{sum(q[1] for q in squeezes) / len(squeezes):>24.1f}")


if __name__ == "__main__":
    main()
