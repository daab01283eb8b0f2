"""The load-time memory guard on the sandbox, through the real CLI: a rank whose user may drop
caches but not compact memory makes `up` refuse before anything starts; (with the sandbox's
memory model) an engine whose load fills the page cache is kept alive by the cache drops, and
one whose load exhausts the rank's memory stops the whole cluster, nothing left running."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import yaml

from launcher.inputs import node_settings
from launcher.sandbox import meminfo
from serving import cli, rank_user, states

OLD_RULE_USER = "sparkstack-olddrop"


@pytest.fixture
def cfg(sandbox):
    path = str(sandbox.config)
    yield path
    assert cli("down", "-c", path).exit_code == 0


@pytest.fixture
def old_rule_on_spark3(sandbox):
    """A user on spark3 with the narrow rule as it was before the guard: drop caches, no compaction."""
    rule = f"{OLD_RULE_USER} ALL=(root) NOPASSWD: {node_settings.DROP_CACHES_SUDO}"
    with rank_user(sandbox, "spark3", OLD_RULE_USER, rule, groups="docker") as user:
        yield user


def test_up_refuses_a_rank_that_cannot_compact_memory(sandbox, cfg, old_rule_on_spark3, tmp_path):
    """prep's drop works for that user (the old rule), the guard's compaction does not: `up`
    exits 1 before shipping or starting anything, naming spark3, sudo's words and the fix."""
    assert cli("prep", "-c", cfg).exit_code == 0  # every root setting in place: up's prep needs no sudo
    doc = yaml.safe_load(Path(cfg).read_text())
    doc["ranks"][2]["user"] = old_rule_on_spark3
    changed = tmp_path / "cluster.yaml"
    changed.write_text(yaml.safe_dump(doc))
    assert sandbox.run("spark3", node_settings.drop_caches_command(old_rule_on_spark3), user=old_rule_on_spark3)[0] == 0
    result = cli("up", "-c", str(changed), "--restart")
    text = " ".join(result.output.split())
    assert result.exit_code == 1, result.output
    assert "the load-time memory guard cannot relieve memory on rank 2 (spark3)" in text
    assert "nothing was started" in text and "Fix: install the narrow sudoers rule" in text
    assert f"`sudo -n` does not allow `{node_settings.DROP_CACHES_SUDO}` and `{node_settings.COMPACT_MEMORY_SUDO}`" in text
    assert "rank 1 (spark2)" not in text.split("Fix:")[0]  # only the rank that lacks it
    assert set(states(cfg).values()) == {"absent"}


# -- the guard's two paths, on the sandbox's GB10 memory model ---------------------------------

def loading_config(sandbox, tmp_path, weights_gib: float, load_s: float, **guard) -> str:
    """The sandbox's config with engines that take `weights_gib` each over `load_s` seconds
    (read through the page cache, as weights streaming in over NFS are), and a guard that
    looks four times a second."""
    data = yaml.safe_load(Path(sandbox.config).read_text())
    data.setdefault("overrides", {}).setdefault("env", {}).update(
        SANDBOX_VLLM_LOAD_S=str(load_s), SANDBOX_VLLM_WEIGHTS_GIB=str(weights_gib))
    data["memory_guard"] = {"interval_s": 0.25, "cooldown_s": 1, **guard}
    path = tmp_path / "loading.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.fixture
def clean_memory(sandbox):
    if not meminfo.enabled():
        pytest.fail("the sandbox runs without its memory model (SPARKSTACK_SANDBOX_MEMINFO=host)")
    yield
    for name in sandbox.names:
        meminfo.unsqueeze(sandbox.state_dir, name)


def test_cache_drops_keep_a_cold_load_alive(sandbox, cfg, clean_memory, tmp_path):
    """64 GiB of weights per rank read through the page cache: without drops the cache eats
    MemFree and the engine dies with NV_ERR_NO_MEMORY (first run, guard off); with the guard,
    every rank drops and compacts below the soft floor and the cluster serves."""
    unguarded = loading_config(sandbox, tmp_path, 64, 12, enabled=False)
    died = cli("up", "-c", unguarded)
    assert died.exit_code == 1, died.output
    assert "NV_ERR_NO_MEMORY" in died.output
    assert set(states(cfg).values()) == {"absent"}

    since = time.time()
    guarded = loading_config(sandbox, tmp_path, 64, 12, soft_free_gib=20)
    result = cli("up", "-c", guarded, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [m["host"] for m in report["memory"]] == [f"rank {i} ({n})" for i, n in enumerate(sandbox.names)]
    for m in report["memory"]:
        assert m["reliefs"] and all(r["rc"] == 0 for r in m["reliefs"]), m["host"]
        assert m["timeline"] and m["lowest_available_bytes"] == min(s["available_bytes"] for s in m["timeline"])
        assert m["hard_floor"] is None and m["error"] is None
    for name in sandbox.names:
        happened = [e[1:] for e in meminfo.events(sandbox.state_dir, name, since)]
        assert ("drop_caches", "3") in happened and ("compact_memory", "1") in happened, name
    assert set(states(cfg).values()) == {"running"}
    assert "memory while loading: rank 0 (spark1): lowest MemAvailable" in result.stderr


def test_the_hard_floor_stops_the_whole_cluster(sandbox, cfg, clean_memory, tmp_path):
    """While the engines load, something else takes spark3's memory until MemAvailable is 2 GiB:
    its watcher kills its engine, `up` stops every rank, exits 1 and says which rank, when, and
    what each rank had; nothing is left running."""
    slow = loading_config(sandbox, tmp_path, 8, 60)
    outcome = {}
    runner = threading.Thread(target=lambda: outcome.update(result=cli("up", "-c", slow)))
    runner.start()
    try:
        meminfo.wait_for(sandbox.state_dir, "spark3", lambda f: f["AnonPages"] > 2 * 1024 ** 2, timeout=300)
        meminfo.squeeze_available(sandbox.state_dir, "spark3", 2 * 1024 ** 3)
        runner.join(timeout=120)
    finally:
        meminfo.unsqueeze(sandbox.state_dir, "spark3")
    assert not runner.is_alive(), "up did not end after the hard floor"
    result = outcome["result"]
    text = " ".join(result.output.split())
    assert result.exit_code == 1, result.output
    assert "rank 2 (spark3): MemAvailable fell to 2.0 GiB, under the hard floor of 3 GiB" in text
    assert "the memory guard stopped its engine" in text and "every rank's container was stopped" in text
    assert "memory on each rank while loading:" in text, result.output
    assert "rank 2 (spark3): lowest MemAvailable 2.0 GiB" in text
    assert "rank 0 (spark1): lowest MemAvailable 11" in text  # the others never came near
    assert "Fix: plan less memory" in text
    assert set(states(cfg).values()) == {"absent"}
