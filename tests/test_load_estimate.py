"""The cold-load estimate against a measured load on the sandbox (issue 15): the sandbox's
"NFS" link is made slow (its speed in the ranks' sysfs fixtures, launcher/sandbox/nfs_link.py),
`check` estimates the load from the facts a real rank gives (the mount's server, the route's
interface, its sysfs speed, the ranks sharing the server's port), then `up` starts the stand-in
engines, which read every shard at that link's rate; each rank's measured load must be within
2x of the estimate, and `up` shows the bytes read meanwhile."""

import re
import time

import pytest
import yaml

from launcher.facts import load_path
from launcher.sandbox import cluster, nfs_link
from serving import cli

TARGET_S = 24  # the estimate the link's speed is chosen for: two progress lines, a short test


@pytest.fixture
def slow_link(sandbox, tmp_path):
    ckpt = cluster.paths(sandbox.state_dir)["model"]
    size = sum(f.stat().st_size for f in ckpt.glob("*.safetensors"))
    ranks = len(sandbox.names)
    mbps = max(1, round(size * 8 * ranks / (load_path.LINE_EFFICIENCY * TARGET_S) / 1e6))
    ranks_dir = cluster.paths(sandbox.state_dir)["ranks"]
    nfs_link.set_speed(sandbox.state_dir, ranks_dir, mbps)
    data = yaml.safe_load(open(sandbox.config))
    data.setdefault("overrides", {}).setdefault("env", {})["SANDBOX_VLLM_COMPILE_S"] = "0"
    path = tmp_path / "slow-nfs.yaml"
    path.write_text(yaml.safe_dump(data))
    yield str(path), size, mbps
    cli("down", "-c", str(path))
    nfs_link.set_speed(sandbox.state_dir, ranks_dir, None)


def estimates(cfg) -> dict[int, float]:
    import json

    result = cli("check", "-c", cfg, "--json")
    rows = {r["rank"]: next(c for c in r["checks"] if c["name"] == "load") for r in json.loads(result.stdout)["ranks"]}
    found = {}
    for r, row in rows.items():
        m = re.search(r"~([\d.]+) (s|min) cold", row["value"])
        assert m, row
        found[r] = float(m.group(1)) * (60 if m.group(2) == "min" else 1)
    return found


def test_the_estimate_is_within_2x_of_the_measured_load(sandbox, slow_link):
    cfg, size, mbps = slow_link
    est = estimates(cfg)
    assert set(est) == set(range(len(sandbox.names)))
    started = time.monotonic()
    result = cli("up", "-c", cfg, "--timeout", "30")  # shorter than twice the estimate: up waits longer, and says so
    up_s = time.monotonic() - started
    assert result.exit_code == 0, result.output
    waits = re.search(r"waiting up to (\d+) s for the API \(not --timeout's 30 s\): the cold-load estimate of rank ",
                      result.output)
    assert waits and abs(int(waits.group(1)) - 2 * max(est.values())) <= 2, result.output
    progress = re.findall(r"checkpoint read \(engine read_bytes\): rank 0 ([\d.]+) GB \((\d+)%\)", result.output)
    assert progress and all(int(pct) < 100 for _gb, pct in progress[:1]), result.output  # seen while it read
    measured = {}
    for r, name in enumerate(sandbox.names):
        rc, log, err = sandbox.run(name, "docker logs sparkstack-engine 2>&1")
        measured[r] = float(re.search(r"Loading weights took ([\d.]+) seconds", log).group(1))
        rc, io, err = sandbox.run(name, "docker exec sparkstack-engine sh -c 'cat /proc/[0-9]*/io'")
        assert sum(map(int, re.findall(r"read_bytes: (\d+)", io))) >= size  # every shard, on every rank
    print(f"\nNFS link {mbps} Mb/s, {size / 1e6:.1f} MB per rank: estimate {est}, measured {measured}, up {up_s:.1f} s")
    for r in est:
        assert est[r] / 2 <= measured[r] <= est[r] * 2, (r, est[r], measured[r])
