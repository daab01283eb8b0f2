"""The load-time memory guard on the sandbox, through the real CLI: a rank whose user may drop
caches but not compact memory makes `up` refuse before anything starts; (with the sandbox's
memory model) an engine whose load fills the page cache is kept alive by the cache drops, and
one whose load exhausts the rank's memory stops the whole cluster, nothing left running."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from launcher.inputs import node_settings
from serving import cli

OLD_RULE_USER = "sparkstack-olddrop"


@pytest.fixture
def cfg(sandbox):
    path = str(sandbox.config)
    yield path
    assert cli("down", "-c", path).exit_code == 0


def states(cfg) -> dict[int, str]:
    return {r["rank"]: r["state"] for r in json.loads(cli("status", "-c", cfg, "--json").stdout)["ranks"]}


@pytest.fixture
def old_rule_on_spark3(sandbox):
    """A user on spark3 with the narrow rule as it was before the guard: drop caches, no compaction."""
    rule = f"/etc/sudoers.d/{OLD_RULE_USER}"

    def drop():
        sandbox.run("spark3", f"sudo pkill -KILL -u {OLD_RULE_USER}; sudo userdel -r {OLD_RULE_USER} 2>/dev/null; "
                              f"sudo rm -f {rule}; true")

    drop()
    make = (f"sudo useradd -m -s /bin/sh -p '*' -G docker {OLD_RULE_USER} && "
            f"sudo install -d -m 0700 -o {OLD_RULE_USER} -g {OLD_RULE_USER} /home/{OLD_RULE_USER}/.ssh && "
            f"sudo install -m 0600 -o {OLD_RULE_USER} -g {OLD_RULE_USER} /home/spark/.ssh/authorized_keys "
            f"/home/{OLD_RULE_USER}/.ssh/ && "
            f"echo '{OLD_RULE_USER} ALL=(root) NOPASSWD: {node_settings.DROP_CACHES_SUDO}' | sudo tee {rule} >/dev/null && "
            f"sudo chmod 0440 {rule}")
    try:
        rc, out, err = sandbox.run("spark3", make)
        assert rc == 0, err or out
        yield OLD_RULE_USER
    finally:
        drop()


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
