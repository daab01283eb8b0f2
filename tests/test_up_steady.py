"""`up` on a sandbox cluster already serving as planned: one probe per rank, nothing changed;
a node setting off, or a rank's engine stopped, still takes the full path (launcher/apply/steady.py)."""

import json
from collections import Counter

import pytest

from launcher.transport import remote
from serving import cli


def status(cfg):
    return json.loads(cli("status", "-c", cfg, "--json").stdout)


@pytest.fixture(scope="module")
def cfg(sandbox):
    """The sandbox serving; left serving or not as it was found."""
    path = str(sandbox.config)
    was_serving = {r["state"] for r in status(path)["ranks"]} == {"running"}
    result = cli("up", "-c", path)
    assert result.exit_code == 0, result.output
    yield path
    if not was_serving:
        cli("down", "-c", path)


@pytest.fixture
def commands(monkeypatch):
    """Every command `up` runs on a rank, counted per rank (run, stream, spawn)."""
    seen = Counter()
    for name in ("run", "stream", "spawn"):
        real = getattr(remote.Connection, name)

        def counted(self, *a, _real=real, _name=name, **kw):
            seen[(self.target.rank, _name)] += 1
            return _real(self, *a, **kw)

        monkeypatch.setattr(remote.Connection, name, counted)
    return seen


def started_at(cfg):
    return [r["started_at"] for r in status(cfg)["ranks"]]


def test_serving_cluster_up_is_one_probe_per_rank(cfg, commands):
    before = started_at(cfg)
    commands.clear()
    again = cli("up", "-c", cfg, "--json")
    assert again.exit_code == 0, again.output
    # the probe, the container and its guard read with it; rank 0 also holds the cluster's lock
    # (issue 33: a process spawned there for as long as `up` runs)
    assert dict(commands) == {(0, "spawn"): 1, **{(r, "run"): 1 for r in range(4)}}
    report = json.loads(again.stdout)
    assert report["changed"] is False and "prepared the nodes" not in report["steps"]
    assert started_at(cfg) == before


def test_serving_cluster_up_says_nothing_changed_and_drops_no_cache(cfg):
    again = cli("up", "-c", cfg)
    assert again.exit_code == 0, again.output
    assert "already running as planned: nothing to change" in again.output
    assert "preparing the nodes" not in again.output and "not as planned" not in again.output


def test_a_changed_sysctl_takes_the_full_path_without_a_drop(sandbox, cfg):
    before = started_at(cfg)
    sandbox.run("spark3", "sudo sysctl -q -w vm.swappiness=60")
    try:
        again = cli("up", "-c", cfg)
        assert again.exit_code == 0, again.output
        assert "not as planned: rank 2 (spark3): vm.swappiness=1 (was 60)" in again.output
        # the containers run as planned: their memory is the engine's, no drop, no memory wait
        assert "preparing the nodes (sysctls, checkpoint mount)\n" in again.output
        assert "already running as planned" in again.output
        rc, out, _ = sandbox.run("spark3", "cat /proc/sys/vm/swappiness")
        assert out.strip() == "1"
        assert started_at(cfg) == before
    finally:
        sandbox.run("spark3", "sudo sysctl -q -w vm.swappiness=1")


def test_a_stopped_rank_takes_the_full_path_and_serves_again(sandbox, cfg):
    rc, _, err = sandbox.run("spark2", "docker stop -t 1 sparkstack-engine")
    assert rc == 0, err
    again = cli("up", "-c", cfg)
    assert again.exit_code == 0, again.output
    assert "not as planned: rank 1 (spark2): sparkstack-engine exited with code" in again.output
    assert "preparing the nodes (sysctls, checkpoint mount, page caches)" in again.output
    assert "already running as planned" not in again.output
    assert {r["state"] for r in status(cfg)["ranks"]} == {"running"}
