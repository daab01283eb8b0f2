"""`init` on a cluster that is already addressed: the shared (normal) sandbox, every cable's veth
up with its IPv6 link-local address and the fixture's MAC, the fabric addresses already on the
ports (as NVIDIA's playbooks leave a Spark). init must discover the ring and keep the addresses,
with no option an owner would not pass: the sandbox's ranks declare where their stand-in hardware
is (onrank/probe.py, STANDIN_HARDWARE), as a Spark's is simply /sys."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

pytestmark = pytest.mark.skipif(os.environ.get("SPARKSTACK_NO_SANDBOX") == "1", reason="needs the sandbox")


def test_init_on_the_addressed_sandbox_finds_its_ring_and_keeps_its_addresses(sandbox, tmp_path):
    from launcher.sandbox import cluster

    hosts = [r["address"] for r in sandbox.ranks]
    out = tmp_path / "cluster.yaml"
    res = subprocess.run(
        [sys.executable, "-c", "from launcher.cli.commands import main; main()", "init", *hosts,
         "--user", "spark", "--key", str(sandbox.key), "--known-hosts", str(sandbox.known_hosts), "--yes",
         "--no-ship", "--profile", "sandbox", "--model-path", cluster.MODEL_PATH, "--dry-run", "-o", str(out)],
        capture_output=True, text=True, timeout=300)
    said = res.stdout + res.stderr
    assert res.returncode == 0 and "Traceback" not in said, said
    assert "cabled as: ring" in said and "no cable between" not in said, said
    doc = yaml.safe_load(res.stdout)
    assert doc["topology"] == "ring"
    truth = json.loads(cluster.paths(sandbox.state_dir)["truth"].read_text())
    for rank, name in zip(doc["ranks"], sandbox.names):
        assert rank["sysfs_root"] == cluster.SYSFS_ROOT  # sandbox ranks stay sandbox ranks (ansible)
        assert truth[name]["fabric_ip"] in rank["fabric_ips"], (name, rank)  # kept, not proposed anew
    assert not out.exists()  # a dry run writes nothing
