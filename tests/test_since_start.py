"""What changed since the last good start, as data: tests/since_start_cases/*.json hold the facts
then and now (facts/start_facts.RankStart's kept form) and the lines check/since_start.compare must
say, one case per fact kind. Then the derivation on the sandbox's fixtures, read by the real probe:
a port's MTU back at 1500 and the GID table shifted by a new IPv6 address, named by rank."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from launcher.check import since_start
from launcher.facts import fabric
from launcher.facts.start_facts import RankStart, snapshot
from launcher.sandbox import fabric_fixture as sfabric
from local_probe import sandbox_rank_facts

CASES = sorted((Path(__file__).parent / "since_start_cases").glob("*.json"))


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_each_fact_kind_is_said_as_the_case_says(case):
    data = json.loads(case.read_text())
    then, now = RankStart.from_json(data["then"]), RankStart.from_json(data["now"])
    assert RankStart.from_json(then.to_json()) == then  # the kept form reads back as written
    assert [c.line for c in since_start.compare(then, now)] == data["lines"], data["doc"]


def test_the_cases_cover_every_fact_kind():
    said = {c.fact for case in CASES for c in since_start.compare(
        *(RankStart.from_json(json.loads(case.read_text())[k]) for k in ("then", "now")))}
    assert said == {"link", "mtu", "address", "gid index", "rdma", "driver", "docker", "image", "memory"}


def test_a_rank_whose_box_was_replaced_is_not_compared_and_the_block_names_when():
    then = RankStart(1, "spark2", mem_serving=20 << 30)
    moved = dataclasses.replace(then, host="spark9", mem_serving=1 << 30)
    assert since_start.compare_all({1: then}, {1: moved}) == []
    [change] = since_start.compare_all({1: then}, {1: dataclasses.replace(moved, host="spark2")})
    assert change.to_json()["fact"] == "memory" and change.now == 1 << 30
    assert since_start.block([change], "2026-12-02T01:00:00+00:00") == (
        "since the last good start (2026-12-02T01:00:00+00:00):\n"
        "  rank 1 (spark2): MemAvailable 1.0 GiB with the engine serving, was 20.0 GiB at the last good start")
    assert since_start.block([]) == ""


def test_the_sandbox_fixture_read_then_and_after_a_nic_reset(tmp_path):
    """spark3 as the probe reads it: its two cabled ports, NCCL's GID index 3 on each; after
    a firmware reset (MTU 1500 on the fabric port, GID table shifted by two) both are named."""
    from ipaddress import IPv4Address

    truth = sfabric.fabric_truth(2)
    facts = sandbox_rank_facts(tmp_path / "then", 2)
    rf = fabric.assess(facts, [IPv4Address(truth["fabric_ip"])], "ring", "rank 2 (spark3)")
    then = snapshot(2, "spark3", facts, rf, image=None, engine_running=True)
    assert [x.netdev for x in then.links] == ["enp1s0f0np0", "enp1s0f1np1"]  # unaddressed twins: not NCCL's
    assert then.link("enp1s0f1np1").mtu == 9000 and then.link("enp1s0f1np1").ipv4 == (truth["fabric_ip"] + "/30",)
    assert then.gid_index == {"rocep1s0f0": truth["gid_index"], "rocep1s0f1": truth["gid_index"]}
    assert then.mem_serving == facts.memory.available and then.mem_before is None

    reset = sfabric.sysfs_tree(2, mtu={"enp1s0f1np1": 1500}, extra_ipv6=True)
    facts_now = sandbox_rank_facts(tmp_path / "now", 2, tree=reset)
    rf_now = fabric.assess(facts_now, [IPv4Address(truth["fabric_ip"])], "ring", "rank 2 (spark3)")
    now = snapshot(2, "spark3", facts_now, rf_now, image=None, engine_running=True,
                   netdevs=tuple(x.netdev for x in then.links), hcas=tuple(then.gid_index))
    assert [c.line for c in since_start.compare(then, now)] == [
        "rank 2 (spark3): enp1s0f1np1 MTU 1500, was 9000 at the last good start",
        f"rank 2 (spark3): rocep1s0f0 RoCE v2 GID index {truth['gid_index'] + 2} (NCCL's pick), was "
        f"{truth['gid_index']} at the last good start",
        f"rank 2 (spark3): rocep1s0f1 RoCE v2 GID index {truth['gid_index'] + 2} (NCCL's pick), was "
        f"{truth['gid_index']} at the last good start"]


def test_kept_on_this_host_one_file_per_cluster_and_compared_without_ssh(tmp_path, monkeypatch):
    """`up`'s record from what its gather read (+ MemAvailable while serving), read back; `up`'s
    failure report compares this run's gather with it: spark3's reset named, nobody else."""
    from types import SimpleNamespace

    from launcher.apply import last_good
    from test_check import sandbox_cluster

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    loaded = sandbox_cluster(tmp_path)
    facts = {r: sandbox_rank_facts(tmp_path / f"then{r}", r) for r in range(4)}
    gathered = SimpleNamespace(facts=facts, image="sparkstack/sandbox:abc", local_image_id="sha256:" + "ef" * 32)
    assert last_good.load(loaded) is None and last_good.since_gathered(loaded, gathered, set()) is None
    kept = last_good.record(loaded, gathered, {r: (20 + r) << 30 for r in range(4)})
    assert kept == tmp_path / "state" / "sparkstack" / "last-good" / "172.31.240.11.json"
    assert [p.name for p in kept.parent.iterdir()] == [kept.name]  # the temporary file replaced it
    back = last_good.load(loaded)
    assert [s.mem_serving for s in back.ranks.values()] == [20 << 30, 21 << 30, 22 << 30, 23 << 30]
    assert back.ranks[1].image_id == "sha256:" + "ef" * 32 and back.ranks[2].host == "spark3"
    assert back.ranks[0].mem_before == facts[0].memory.available

    assert last_good.since_gathered(loaded, gathered, set()).changes == []
    reset = sfabric.sysfs_tree(2, mtu={"enp1s0f1np1": 1500})
    now = SimpleNamespace(facts={**facts, 2: sandbox_rank_facts(tmp_path / "now", 2, tree=reset)},
                          image=gathered.image, local_image_id=gathered.local_image_id)
    since = last_good.since_gathered(loaded, now, set())
    assert last_good.said("the cluster did not start", since) == (
        f"the cluster did not start\nsince the last good start ({back.at}):\n"
        "  rank 2 (spark3): enp1s0f1np1 MTU 1500, was 9000 at the last good start")
    rebuilt = last_good.since_gathered(loaded, SimpleNamespace(facts=facts, image=gathered.image,
                                                               local_image_id="sha256:" + "12" * 32), set())
    assert [c.line for c in rebuilt.changes][1] == (
        "rank 1 (spark2): image sparkstack/sandbox:abc is 121212121212, was efefefefefef at the last good start")
    other = last_good.since_gathered(loaded, SimpleNamespace(facts=facts, image="sparkstack/other:1",
                                                             local_image_id=None), set())
    assert [c.line for c in other.changes][3] == (
        "rank 3 (spark4): serves sparkstack/other:1, was sparkstack/sandbox:abc (efefefefefef) at the last good start")
    kept.write_text("{not json")
    assert last_good.load(loaded) is None
