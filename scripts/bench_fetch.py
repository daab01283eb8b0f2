#!/usr/bin/env python3
"""Numbers for issue 35, printed (not a test): `sparkstack fetch` against the sandbox's stand-in
Hub (launcher/sandbox/standins/standin_hub.py) on loopback, through the real client
(huggingface_hub, HF_ENDPOINT). No sandbox needed.

    .venv/bin/python scripts/bench_fetch.py [--size-mb 1024] [--link-mbps 0] [--workers 4]

- the checkpoint: the sandbox's fixture (config, index, three shards) plus synthetic shards up to
  --size-mb (random bytes: the Hub's listing gives their sha256 like any LFS file's);
- full fetch: `sparkstack fetch --json` as a fresh process into an empty directory: wall time, the
  bytes the stand-in sent, the rate (the stand-in's link: --link-mbps caps each connection's send
  rate, 0 = loopback as fast as it goes; every file is also hashed on the way in);
- resume: a fresh directory, the link capped so Ctrl+C (SIGINT) lands at about --cut of the bytes,
  then `fetch` again at full speed: the bytes the stand-in sent on the resume, against what was
  still missing on disk and the whole checkpoint.
The host's load average is printed with the numbers: the stand-in and the client share its CPUs.
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

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launcher.sandbox import model_fixture  # noqa: E402
from launcher.sandbox.standins.standin_hub import Hub, Repo  # noqa: E402

SPARKSTACK = str(Path(sys.executable).parent / "sparkstack")
REPO = "sandbox-org/glm53-bench-EXL3"


def checkpoint(d: Path, size_mb: int) -> int:
    model_fixture.write_checkpoint(d)
    have = sum(f.stat().st_size for f in d.iterdir())
    i = 0
    while have < size_mb * 1e6:
        n = int(min(256e6, size_mb * 1e6 - have))
        with open(d / f"bench-extra-{i:05d}.safetensors", "wb") as f:  # an LFS file by its suffix
            f.write(os.urandom(n))
        have += n
        i += 1
    return have


def environment(work: Path, url: str) -> dict:
    cfg = yaml.safe_load((ROOT / "env" / "cluster.example.yaml").read_text())
    cfg["model"].update(path=str(work / "models" / "glm"), nfs=None)
    (work / "cluster.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=url, HF_HOME=str(work / "hf"), HF_HUB_DISABLE_TELEMETRY="1",
               XDG_STATE_HOME=str(work / "state"), SPARKSTACK_CONFIG=str(work / "cluster.yaml"))
    return env


def fetch(env: dict, dest: Path, workers: int) -> tuple[float, dict]:
    began = time.monotonic()
    done = subprocess.run([SPARKSTACK, "fetch", REPO, "--to", str(dest), "--json", "--workers", str(workers)],
                          env=env, capture_output=True, text=True)
    took = time.monotonic() - began
    if done.returncode:
        sys.exit(f"fetch failed ({done.returncode}):\n{done.stderr}")
    return took, json.loads(done.stdout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=int, default=1024)
    p.add_argument("--link-mbps", type=float, default=0, help="the stand-in's send rate per connection, Mb/s (0: no cap)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--cut", type=float, default=0.4, help="interrupt the second fetch at about this share")
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-fetch-") as tmp:
        work = Path(tmp)
        total = checkpoint(work / "hub", a.size_mb)
        hub = Hub(("127.0.0.1", 0), [Repo(REPO, str(work / "hub"))], rate=a.link_mbps * 1e6 / 8).start()
        env = environment(work, hub.url)
        print(f"stand-in Hub {hub.url}: {REPO}, {len(hub.repos[REPO].files)} files, {total / 1e6:,.1f} MB; "
              f"link {'uncapped (loopback)' if not a.link_mbps else f'{a.link_mbps:,.0f} Mb/s per connection'}; "
              f"{a.workers} workers; load {os.getloadavg()[0]:.2f}")

        took, got = fetch(env, work / "full", a.workers)
        sent = sum(hub.served.values())
        print(f"full fetch: {sent / 1e6:,.1f} MB sent in {took:.2f} s (process wall): {sent / 1e6 / took:,.1f} MB/s "
              f"= {sent * 8 / 1e9 / took:,.2f} Gb/s; the run's own figure {got['result']['rate'] / 1e6:,.1f} MB/s "
              f"over {got['result']['seconds']:.2f} s")

        hub.reset_counts()
        hub.rate = total / 8 / a.workers  # ~8 s in all: SIGINT lands mid-file
        dest = work / "resumed"
        proc = subprocess.Popen([SPARKSTACK, "fetch", REPO, "--to", str(dest), "--workers", str(a.workers)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while proc.poll() is None and (not dest.is_dir() or sum(
                f.stat().st_size for f in dest.iterdir() if f.is_file()) < a.cut * total):  # files and partials
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        proc.wait()
        on_disk = sum(f.stat().st_size for f in dest.iterdir() if f.is_file())
        sent_first = sum(hub.served.values())
        hub.rate, _ = a.link_mbps * 1e6 / 8, hub.reset_counts()
        took, got = fetch(env, dest, a.workers)
        resumed = sum(hub.served.values())
        ranged = sum(1 for _m, _p, r in hub.requests if r and not r.startswith("bytes=0-"))
        print(f"resume: interrupted (exit {proc.returncode}) after {sent_first / 1e6:,.1f} MB sent, "
              f"{on_disk / 1e6:,.1f} MB on disk; the resume moved {resumed / 1e6:,.1f} MB "
              f"(missing: {(total - on_disk) / 1e6:,.1f} MB, whole checkpoint: {total / 1e6:,.1f} MB) "
              f"in {took:.2f} s, {ranged} ranged requests; files intact: "
              f"{all((dest / n).read_bytes() == (work / 'hub' / n).read_bytes() for n in hub.repos[REPO].files)}")
        hub.shutdown()


if __name__ == "__main__":
    main()
