"""Gathering facts from every rank in parallel, and `plan` using them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from launcher.inputs import config, node_settings
from launcher.gather import probe as gather
from planned import build_plan
from launcher.apply import serve
from launcher.cli.commands import main


@pytest.fixture
def loaded(sandbox):
    return config.load(sandbox.config)


def closed_port_config(sandbox, tmp_path, rank: int = 1) -> Path:
    doc = yaml.safe_load(Path(sandbox.config).read_text())
    doc["ranks"][rank]["port"] = 1  # nothing listens: refused at once
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_probe_args_read_every_managed_sysctl(write_config):
    loaded = config.load(write_config())
    args = gather.probe_args(loaded, 2)
    assert set(node_settings.sysctls(loaded.cluster)) <= set(args["sysctls"])
    assert "fs.nr_open" in args["sysctls"]
    assert args["model_dir"] == loaded.cluster.model.path


def test_every_rank_answers_in_parallel(sandbox, loaded):
    with gather.open_group(loaded) as group:
        started = time.monotonic()
        found = gather.gather(group, loaded)
        wall = time.monotonic() - started
    assert list(found) == [0, 1, 2, 3]
    assert [g.facts.hostname for g in found.values()] == sandbox.names
    assert all(g.ok and g.error is None for g in found.values())
    assert found[2].facts.memory.total == 127_600_000 * 1024  # the GB10 meminfo of the sandbox
    # in parallel: the wall time is near the slowest rank, not the sum
    assert wall < sum(g.seconds for g in found.values()), (wall, [g.seconds for g in found.values()])


def test_unreachable_rank_is_an_error_not_an_exception(sandbox, tmp_path):
    loaded = config.load(closed_port_config(sandbox, tmp_path))
    started = time.monotonic()
    found = gather.gather_config(loaded=loaded)
    assert time.monotonic() - started < 15
    assert found[1].facts is None and "rank 1 (spark2)" in found[1].error and "unreachable" in found[1].error
    assert [r for r, g in found.items() if g.ok] == [0, 2, 3]
    assert set(gather.facts_of(found)) == {0, 2, 3}


# --- plan with facts ----------------------------------------------------------------------------

def test_plan_with_facts_uses_memory_and_each_ranks_fabric(sandbox, loaded):
    found = gather.facts_of(gather.gather_config(loaded=loaded))
    offline = build_plan(loaded)
    live = build_plan(loaded, found)
    smallest = min(f.memory.available for f in found.values())
    assert live.kv.budget.mem_available == smallest != offline.kv.budget.mem_available
    assert not any(a.startswith(("MemAvailable", "fabric environment")) for a in live.assumed)
    for r, rank in enumerate(live.ranks):
        truth = sandbox.truth[sandbox.names[r]]
        address = loaded.cluster.ranks[r].address
        mgmt = next(i.name for i in found[r].interfaces if any(a.startswith(address + "/") for a in i.ipv4))
        # a ring: the sockets on the management interface holding the rank's address
        assert rank.env["NCCL_SOCKET_IFNAME"] == "=" + mgmt != "=" + truth["netdev"]
        assert rank.env["VLLM_HOST_IP"] == address
        # RDMA on each port's addressed HCA (the sandbox leaves the twins unaddressed)
        assert rank.env["NCCL_IB_HCA"] == "=" + ",".join(port["hcas"][0] for port in truth["ports"])
        assert f"NCCL_SOCKET_IFNAME=={mgmt}\n".encode() in serve.run_command(rank)[1]  # its env file
    # the offline plan is unchanged by this: still says what it did not know
    assert any(a.startswith("fabric environment") for a in offline.assumed)


def test_plan_without_one_ranks_facts_says_so(sandbox, loaded):
    found = gather.facts_of(gather.gather_config(loaded=loaded))
    del found[3]
    p = build_plan(loaded, found)
    assert any(a.startswith("fabric environment") and "rank 3 (spark4): not probed" in a for a in p.assumed)
    assert any(a.startswith("MemAvailable") for a in p.assumed)
    assert "NCCL_IB_HCA" not in p.ranks[3].env and "NCCL_IB_HCA" in p.ranks[2].env


def test_cli_plan_probes_and_offline_does_not(sandbox):
    live = json.loads(CliRunner().invoke(main, ["plan", "-c", str(sandbox.config), "--json"]).output)
    offline = json.loads(CliRunner().invoke(main, ["plan", "-c", str(sandbox.config), "--json",
                                                   "--offline"]).output)
    assert "NCCL_IB_HCA" in live["ranks"][0]["env"] and "NCCL_IB_HCA" not in offline["ranks"][0]["env"]
    assert not any(a.startswith("ranks not probed") for a in live["assumed"] + offline["assumed"])


def test_cli_plan_falls_back_when_a_rank_is_unreachable(sandbox, tmp_path):
    result = CliRunner().invoke(main, ["plan", "-c", str(closed_port_config(sandbox, tmp_path)), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert any(a.startswith("ranks not probed") and "rank 1 (spark2)" in a for a in data["assumed"])
    assert "NCCL_IB_HCA" in data["ranks"][0]["env"] and "NCCL_IB_HCA" not in data["ranks"][1]["env"]


def test_ship_plans_from_the_ranks_image_ids_as_gathered():
    """ship takes the ranks' image state as a value (launcher/gather/ranks.py asks for it): a rank
    that has the image under this host's ID is up to date, one without it (or another ID) is to
    ship, one that could not say is failed with why."""
    from launcher.images import ship
    from launcher.status import Status
    from launcher.transport.remote import Target

    ids = {"img:a": "sha256:" + "a" * 64}
    found = [(Target(0, "spark1", "10.0.0.1"), {"img:a": ids["img:a"]}, None),
             (Target(1, "spark2", "10.0.0.2"), {"img:a": "sha256:" + "b" * 64}, None),
             (Target(2, "spark3", "10.0.0.3"), None, "spark3: Docker daemon not running")]
    plan = ship.plan_for(ids, found)
    assert [(r.rank, r.status, r.images, r.error) for r in plan.ranks] == [
        (0, Status.UP_TO_DATE, [], None), (1, Status.PLANNED, ["img:a"], None),
        (2, Status.FAILED, [], "spark3: Docker daemon not running")]
