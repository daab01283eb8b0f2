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

Usage: .venv/bin/python scripts/bench_keep.py [--kills 3] [--interval 2] [--backoff 1] [--rank spark3]
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
from launcher.transport import api  # noqa: E402


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--interval", type=float, default=2.0, help="keep.check_interval_s")
    parser.add_argument("--backoff", type=float, default=1.0, help="keep.backoff_s (and its max)")
    parser.add_argument("--rank", default="spark3", help="whose engine is killed (a wedge: rank 0's)")
    parser.add_argument("--fault", choices=("kill", "wedge"), default="kill")
    parser.add_argument("--grace", type=float, default=2.0, help="keep.liveness.grace_s")
    parser.add_argument("--stalled", type=int, default=3, help="keep.liveness.stalled_checks")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-keep-"))
    os.environ["XDG_STATE_HOME"] = str(work / "state")  # its own log and API key
    data = yaml.safe_load(sandbox_config().read_text())
    data["keep"] = {"check_interval_s": args.interval, "api_failures": 2, "backoff_s": args.backoff,
                    "backoff_max_s": args.backoff, "max_restarts_per_hour": args.kills + 1,
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
    rows = []
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


if __name__ == "__main__":
    main()
