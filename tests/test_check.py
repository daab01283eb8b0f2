"""`sparkstack check`: the pure judgement on fixture facts, then the real thing on the sandbox.

Rows a HEALTHY sandbox honestly does not pass (asserted in test_healthy_sandbox):
- image: fails until the profile's chain is built and shipped (`sparkstack build && ship`);
  the sandbox test therefore checks a ref every rank has (the stand-in base image);
- ulimits: warn -- the host's hard limits (nofile 20000, memlock 8 MiB) cap the ranks' dockerd,
  which has no CAP_SYS_RESOURCE, below the seeds' 1048576 / unlimited;
- roce: warn -- the sandbox leaves each QSFP port's twin unaddressed, so NCCL_IB_HCA leaves it out;
- driver, nvidia runtime, gpu clock: warn, "not measured" -- a sandbox rank has no NVIDIA driver.
The ring's cables are real (veth pairs, MTU 9000, launcher/sandbox/links.py): peers and jumbo
pass when every ring link answers both ways; the ranks beyond the neighbours are not pinged.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from local_probe import coverage_env, local_command, run_probe, sandbox_rank_facts
from launcher.apply import preflight
from launcher.check import report as check
from launcher.check.rows import drift
from planned import build_plan
from launcher.sandbox import fabric_fixture as sfabric
from launcher.inputs import config
from launcher.facts import record as facts
from launcher.gather import extras, here, probe as gather
from launcher.gather.value import Gathered
from launcher.inputs import apikey
from launcher.cli.commands import main
from launcher.apply import deploy
from launcher.facts.checkpoint_dir import Checkpoint
from launcher.facts.clock import Clock
from launcher.facts.docker import Docker, Image
from launcher.facts.gpu import CdiSpec, Driver, Gpu, GpuClocks
from launcher.facts.limits import DockerUlimits, Limit, Ulimits
from launcher.facts.memory import Memory
from launcher.facts.mounts import Mount
from launcher.facts.nccl_lib import NcclLib
from launcher.facts.rdma import Gid
from launcher.status import Finding

GIB = 1 << 30
IMAGE = "sparkstack/keys:0123456789abcdef"
IMAGE_ID = "sha256:" + "ab" * 32
DRIVER = "580.95.05"


# --- fixture facts: the sandbox's sysfs through the real probe, the rest set here ---------------

def sandbox_cluster(directory: Path, **changes) -> config.Loaded:
    """The sandbox's cluster.yaml as `sandbox up` writes it (no sandbox needed), with `changes`."""
    from launcher.sandbox import cluster, fabric_fixture as sfabric

    ranks = [{"name": f"spark{i + 1}", "address": f"172.31.240.{11 + i}", "user": "spark",
              "fabric_ips": [sfabric.fabric_truth(i)["fabric_ip"]], "sysfs_root": "/sandbox/sysfs"}
             for i in range(4)]
    doc = {"profile": "sandbox", "topology": "ring", "ranks": ranks,
           "model": {"path": cluster.MODEL_PATH},
           "container": {"gpus": None, "devices": []}}  # the seeds' nofile and memlock
    doc.update(changes)
    path = directory / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc))
    return config.load(path)


@pytest.fixture(scope="module")
def sandbox_config(tmp_path_factory):
    return sandbox_cluster(tmp_path_factory.mktemp("cfg"))


@pytest.fixture(scope="module")
def fabric_facts(tmp_path_factory):
    """Each sandbox rank's Facts from its fixture sysfs, probed locally."""
    return {r: sandbox_rank_facts(tmp_path_factory.mktemp(f"spark{r + 1}"), r) for r in range(4)}


def addressed_twins(f: facts.Facts) -> facts.Facts:
    """The rank with each addressed port's twin addressed too, on a subnet of its own
    (192.168.178.x beside 192.168.177.x), as NVIDIA's playbooks do: its IPv4 RoCE v2 GIDs follow."""
    ifaces = {i.name: i for i in f.interfaces}
    devices = []
    for d in f.rdma:
        primary = ifaces.get(d.netdevs[0].replace("enP2p", "enp")) if d.name.startswith("roceP2") else None
        if primary and primary.ipv4:
            netdev = d.netdevs[0]
            addr = primary.ipv4[0].replace("192.168.177.", "192.168.178.")
            ifaces[netdev] = dataclasses.replace(ifaces[netdev], ipv4=(addr,))
            a, b, c, e = (int(x) for x in addr.split("/")[0].split("."))
            port, mapped = d.ports[0], f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{e:02x}"
            gids = tuple(Gid(len(port.gids) + i, mapped, t, netdev) for i, t in enumerate(("IB/RoCE v1", "RoCE v2")))
            d = dataclasses.replace(d, ports=(dataclasses.replace(port, gids=port.gids + gids),))
        devices.append(d)
    return dataclasses.replace(f, interfaces=tuple(ifaces.values()), rdma=tuple(devices))


def healthy(f: facts.Facts, r: int, **changes) -> facts.Facts:
    f = addressed_twins(f)
    base = dict(
        memory=Memory(127_600_000 * 1024, 118 * GIB - r * GIB // 10, 117 * GIB, 2 * GIB, 0, 0, 0),
        sysctls={"vm.swappiness": "1", "vm.compaction_proactiveness": "0", "fs.nr_open": "1048576"},
        docker_ulimits=DockerUlimits({}, Ulimits(Limit(20000, 20000), Limit(8 << 20, 8 << 20))),
        docker=Docker("20.10", "20.10", "/var/lib/docker", 80 * GIB, 250 * GIB,
                      (Image(IMAGE_ID, (IMAGE,), {}, 20 * GIB),)),
        checkpoint=Checkpoint("/models/glm53-sandbox", "c" * 64, "i" * 64, (("a.safetensors", 10),),
                              "f" * 64, 10),
        model_mount=Mount("/models", "/dev/nvme0n1p2", "ext4", "rw,relatime"),
        gpu=Gpu("NVIDIA GB10", DRIVER, None), clock=Clock(1000.0, 1000.1, 1000.0, 1000.1), problems=(),
        driver=Driver(DRIVER, "13.0", DRIVER), gpu_clocks=GpuClocks(208, 3003), nvidia_ctk="1.17.8",
        cdi_specs=(CdiSpec("/etc/cdi/nvidia.yaml", DRIVER),))
    base.update(changes)
    return dataclasses.replace(f, **base)


def inputs(loaded, fabric_facts, overrides=None, **kw) -> Gathered:
    per_rank = {r: healthy(f, r, **(overrides or {}).get(r, {})) for r, f in fabric_facts.items()}
    ranks = {r: gather.RankFacts(r, f"spark{r + 1}", f, None, 0.3) for r, f in per_rank.items()}
    inp = Gathered(loaded, ranks, here.read_model(loaded), IMAGE, apikey.resolve(loaded), **kw)
    inp.targets = extras.ping_targets(loaded, inp.facts)
    inp.extras = {r: extras.Extras({(t.ip, df): extras.PingAnswer(True, "1 received")
                                    for t in ts for df in (False, True)}, dockerd_can_raise=True)
                  for r, ts in inp.targets.items()}
    return inp


def with_container(loaded, **kw):
    """A copy of the loaded config with container settings changed (the models are frozen)."""
    container = loaded.cluster.container.model_copy(update=kw)
    return loaded.model_copy(update={"cluster": loaded.cluster.model_copy(update={"container": container})})


def with_cluster(loaded, **kw):
    """A copy of the loaded config with top-level cluster fields changed."""
    return loaded.model_copy(update={"cluster": loaded.cluster.model_copy(update=kw)})


def row(report: check.Report, rank: int, name: str) -> Finding:
    return next(c for c in report.ranks[rank].checks if c.name == name)


def statuses(report: check.Report) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for r in report.ranks:
        for c in r.checks:
            out.setdefault(c.name, set()).add(c.status)
    return out


# --- pure ---------------------------------------------------------------------------------------

def test_healthy_facts_pass_every_row(sandbox_config, fabric_facts):
    report = check.evaluate(inputs(sandbox_config, fabric_facts))
    assert [c.name for c in report.ranks[0].checks] == list(check.ORDER)
    assert report.ok and all(s == {"pass"} for s in statuses(report).values()), \
        [c for r in report.ranks for c in r.checks if c.status != "pass"]
    assert row(report, 0, "gpu").value.startswith("not required by config")
    assert all(c.fix == "" for r in report.ranks for c in r.checks)


def test_gpu_required_but_missing_fails_with_the_fix(sandbox_config, fabric_facts):
    loaded = with_container(sandbox_config, gpus="all")
    no_gpu = {"gpu": None, "driver": None, "gpu_clocks": None, "problems": ("nvidia-smi: not installed",)}
    report = check.evaluate(inputs(loaded, fabric_facts, {2: no_gpu}))
    gpu = row(report, 2, "gpu")
    assert gpu.status == "fail" and "nvidia-smi: not installed" in gpu.value and "driver" in gpu.fix
    assert not report.ok


def test_low_memory_fails_naming_the_numbers(sandbox_config, fabric_facts):
    low = Memory(127_600_000 * 1024, 10 * GIB, 9 * GIB, 0, 0, 0, 0)
    report = check.evaluate(inputs(sandbox_config, fabric_facts, {1: {"memory": low}}))
    mem = row(report, 1, "memory")
    assert mem.status == "fail" and "MemAvailable 10.0 GiB < needs" in mem.value
    assert "runtime 14.0 GiB" in mem.value and "headroom 8.0 GiB" in mem.value
    assert "sparkstack prep" in mem.fix
    assert row(report, 0, "memory").status == "pass"


def test_page_cache_and_a_lagging_rank_warn(sandbox_config, fabric_facts):
    cached = Memory(127_600_000 * 1024, 110 * GIB, 50 * GIB, 60 * GIB, 0, 0, 0)
    lagging = Memory(127_600_000 * 1024, 90 * GIB, 90 * GIB, 0, 0, 0, 0)
    report = check.evaluate(inputs(sandbox_config, fabric_facts, {0: {"memory": cached}, 3: {"memory": lagging}}))
    assert row(report, 0, "memory").status == "warn" and "page cache" in row(report, 0, "memory").value
    assert row(report, 3, "memory").status == "warn" and "KV cache is sized to this one" in row(report, 3, "memory").value
    assert report.ok


def test_vllm_guard_passes_with_the_arithmetic(sandbox_config, fabric_facts):
    report = check.evaluate(inputs(sandbox_config, fabric_facts))
    # the healthy facts: MemAvailable 118 GiB less 0.1 GiB per rank; rank 3 is the tightest
    assert row(report, 3, "vllm guard") == Finding("vllm guard", "pass", (
        "--gpu-memory-utilization 0.83 (planned): free 103.7 GiB (MemAvailable 117.7 − runtime "
        "14.0) ≥ MemTotal 121.7 GiB × 0.83 = 101.0 GiB; clears up to 0.83 with margin 0.02"))
    assert row(report, 0, "vllm guard").value.startswith("--gpu-memory-utilization 0.83 (planned): "
                                                          "free 104.0 GiB (MemAvailable 118.0 − ")


def test_vllm_guard_fails_a_users_utilization_with_the_number_to_use(tmp_path, fabric_facts):
    loaded = sandbox_cluster(tmp_path, overrides={"engine_args": ["--gpu-memory-utilization 0.9"]})
    report = check.evaluate(inputs(loaded, fabric_facts))
    guard = row(report, 1, "vllm guard")
    assert guard.status == "fail" and guard.value == (
        "--gpu-memory-utilization 0.9 (cluster.yaml's): free 103.9 GiB (MemAvailable 117.9 − "
        "runtime 14.0) < MemTotal 121.7 GiB × 0.9 = 109.5 GiB; vLLM refuses: ValueError: Free "
        "memory on device cuda:0 (103.9/121.69 GiB) on startup is less than desired GPU memory "
        "utilization (0.9, 109.52 GiB). Decrease GPU memory utilization or reduce GPU memory used "
        "by other processes.")
    assert guard.fix == ("set --gpu-memory-utilization 0.83 or less in cluster.yaml "
                         "overrides.engine_args (or drop it: the plan picks one)")
    assert not report.ok


def test_vllm_guard_warns_inside_the_margin_and_follows_the_tightest_rank(tmp_path, sandbox_config,
                                                                           fabric_facts):
    loaded = sandbox_cluster(tmp_path, overrides={"engine_args": ["--gpu-memory-utilization 0.845"]})
    warned = row(check.evaluate(inputs(loaded, fabric_facts)), 0, "vllm guard")
    assert warned.status == "warn" and "less than the margin 0.02 to spare" in warned.value
    assert "--gpu-memory-utilization 0.83 or less" in warned.fix

    # a rank with less memory lowers the planned figure for all: (100 − 14) / 121.69 − 0.02 = 0.6867
    fuller = inputs(sandbox_config, fabric_facts, {2: {"memory": Memory(127_600_000 * 1024, 100 * GIB,
                                                                       99 * GIB, 0, 0, 0, 0)}})
    report = check.evaluate(fuller)
    assert {row(report, r, "vllm guard").status for r in range(4)} == {"pass"}
    assert row(report, 0, "vllm guard").value.startswith("--gpu-memory-utilization 0.68 (planned)")
    built = build_plan(sandbox_config, fuller.facts)
    assert built.guard.utilization == 0.68 and "--gpu-memory-utilization 0.68" in " ".join(built.ranks[3].engine)


def test_vllm_guard_fails_a_rank_nothing_clears(sandbox_config, fabric_facts):
    starved = Memory(127_600_000 * 1024, 15 * GIB, 15 * GIB, 0, 0, 0, 0)
    report = check.evaluate(inputs(sandbox_config, fabric_facts, {1: {"memory": starved}}))
    guard = row(report, 1, "vllm guard")
    assert guard.status == "fail" and guard.value == (
        "no --gpu-memory-utilization clears vLLM's guard: free 1.0 GiB (MemAvailable 15.0 GiB − "
        "runtime 14.0 GiB) of MemTotal 121.7 GiB")
    assert guard.fix.startswith("free memory on this rank: sparkstack prep")
    assert row(report, 0, "vllm guard").status == "pass"


def test_image_missing_or_different_fails_naming_the_rank(sandbox_config, fabric_facts):
    other = Docker("20.10", "20.10", "/var/lib/docker", 80 * GIB, 250 * GIB,
                   (Image("sha256:" + "cd" * 32, (IMAGE,), {}, 1),))
    empty = dataclasses.replace(other, images=())
    report = check.evaluate(inputs(sandbox_config, fabric_facts, {1: {"docker": other}, 2: {"docker": empty}}))
    assert row(report, 1, "image") == Finding(
        "image", "fail", f"{IMAGE} cdcdcdcdcdcd: rank 1 has cdcdcdcdcdcd; ranks 0, 3 have abababababab",
        "sparkstack ship (a rank is re-tagged only once its image ID matches)")
    assert row(report, 2, "image").value == f"{IMAGE} missing on rank 2 (spark3)"
    assert row(report, 2, "image").fix == "sparkstack ship"
    assert row(report, 0, "image").status == "pass"


def test_ulimits_warn_below_the_seeds_and_fail_above_what_dockerd_grants(sandbox_config, fabric_facts):
    loaded = with_container(sandbox_config, nofile=20000, memlock=8 << 20)  # the sandbox's
    inp = inputs(loaded, fabric_facts)
    inp.extras = {r: dataclasses.replace(e, dockerd_can_raise=False) for r, e in inp.extras.items()}
    u = row(check.evaluate(inp), 0, "ulimits")
    assert u.status == "warn" and u.value == ("nofile asks 20000, grantable 20000 (dockerd hard limit); "
                                              "memlock asks 8 MiB, grantable 8 MiB (dockerd hard limit)")
    inp.loaded = with_container(loaded, nofile=1048576)
    u = row(check.evaluate(inp), 0, "ulimits")
    assert u.status == "fail" and "LimitNOFILE" in u.fix
    # a root dockerd with CAP_SYS_RESOURCE (a real Spark) grants up to the kernel's ceiling
    inp = inputs(sandbox_config, fabric_facts)
    assert row(check.evaluate(inp), 0, "ulimits").status == "pass"


def test_fabric_rows_mtu_mismatch_and_unreachable_peers(sandbox_config, fabric_facts):
    f1 = fabric_facts[1]
    small = tuple(dataclasses.replace(i, mtu=1500) if i.name.startswith("en") and "np" in i.name else i
                  for i in f1.interfaces)
    inp = inputs(sandbox_config, fabric_facts, {1: {"interfaces": small}})
    link = inp.targets[0][0]
    assert link.kind == "link" and link.df_size == 8972
    inp.extras[0] = extras.Extras({(link.ip, False): extras.PingAnswer(False, "100% packet loss")})
    report = check.evaluate(inp)
    assert row(report, 1, "mtu").status == "fail" and "MTU 1500, other ranks 9000" in row(report, 1, "mtu").value
    peers = row(report, 0, "peers")
    assert peers.status == "fail" and f"rank {link.peer} {link.ip}: 100% packet loss" in peers.value
    # rank 1's MTU is 1500: no jumbo ping from there
    assert row(report, 1, "jumbo").value.startswith("not measured: the fabric MTU is not 9000")


def test_ring_ping_targets_are_each_cable_far_end_only(sandbox_config, fabric_facts):
    """spark1 (192.168.177.1 on port 0, .14 on port 1; the twins on 192.168.178.x): its cables
    end at spark2 (.2 on both rails) and spark4 (.13); nothing beyond the neighbours is pinged."""
    targets = extras.ping_targets(sandbox_config, {r: healthy(f, r) for r, f in fabric_facts.items()})
    mine = {(t.peer, t.ip, t.kind, t.df_size) for t in targets[0]}
    assert mine == {(1, "192.168.177.2", "link", 8972), (1, "192.168.178.2", "link", 8972),
                    (3, "192.168.177.13", "link", 8972), (3, "192.168.178.13", "link", 8972)}


def test_a_down_ring_port_still_names_its_far_end(sandbox_config, fabric_facts):
    f0 = healthy(fabric_facts[0], 0)
    down = tuple(dataclasses.replace(i, operstate="down") if i.name == "enp1s0f0np0" else i for i in f0.interfaces)
    targets = extras.rank_ping_targets(sandbox_config, 0, dataclasses.replace(f0, interfaces=down))
    assert "192.168.177.2" in {t.ip for t in targets}


def ring_inputs(loaded, fabric_facts, failing: dict[int, set[str]]):
    """Every ping answers but those to the IPs in failing[rank] (plain and DF)."""
    inp = inputs(loaded, fabric_facts)
    for r, ips in failing.items():
        pings = dict(inp.extras[r].pings)
        pings.update({(ip, df): extras.PingAnswer(False, "1 packets transmitted, 0 received, 100% packet loss")
                      for ip in ips for df in (False, True)})
        inp.extras[r] = dataclasses.replace(inp.extras[r], pings=pings)
    return inp


@pytest.mark.parametrize("failing", [{0: {"192.168.177.2"}, 1: {"192.168.177.1"}},  # cut: neither way
                                     {0: {"192.168.177.2"}}],  # one way only: still the link is down
                         ids=["both-ways", "one-way"])
def test_a_ring_link_down_fails_both_ends_naming_each_other(sandbox_config, fabric_facts, failing):
    report = check.evaluate(ring_inputs(sandbox_config, fabric_facts, failing))
    for name in ("peers", "jumbo"):
        near, far = row(report, 0, name), row(report, 1, name)
        assert near.status == far.status == "fail", (near, far)
        assert "ring link to rank 1 unreachable: rank 0 → rank 1 192.168.177.2" in near.value
        assert "ring link to rank 0 unreachable: " in far.value and "rank 0 → rank 1 192.168.177.2" in far.value
        assert near.value.startswith("TP needs every link of the ring: ")
        assert "ring link to rank 3" not in near.value and "ring link to rank 2" not in far.value
    if 1 in failing:
        assert "rank 1 → rank 0 192.168.177.1 (9000 B DF): 1 packets transmitted, 0 received" in row(report, 0, "jumbo").value
    assert "cable between the two ranks" in row(report, 0, "peers").fix
    # spark3 and spark4's links answer: nothing beyond the neighbours is a warning any more
    for r in (2, 3):
        assert row(report, r, "peers").status == "pass", row(report, r, "peers")
    assert row(report, 2, "peers").value.startswith("ring links answer both ways: rank 1 192.168.177.5")
    assert not report.ok


def test_ring_link_to_a_rank_that_did_not_answer_is_not_judged(sandbox_config, fabric_facts):
    inp = inputs(sandbox_config, fabric_facts)
    inp.ranks[1] = gather.RankFacts(1, "spark2", None, "rank 1 (spark2): unreachable", 0.01)
    report = check.evaluate(inp)
    peers = row(report, 0, "peers")
    assert peers.status == "warn" and peers.value == ("links up: rank 3 192.168.177.13, rank 3 192.168.178.13; "
                                                      "not judged: rank 1 did not answer")
    assert row(report, 3, "peers").status == "pass" and not report.ok  # rank 1's ssh row fails


def test_ring_listed_out_of_cable_order_fails_naming_the_missing_link(sandbox_config, fabric_facts):
    order = [0, 2, 1, 3]  # spark1, spark3, spark2, spark4: spark1 has no cable to spark3
    ranks = [sandbox_config.cluster.ranks[i] for i in order]
    loaded = with_cluster(sandbox_config, ranks=ranks)
    report = check.evaluate(inputs(loaded, {r: fabric_facts[i] for r, i in enumerate(order)}))
    peers = row(report, 0, "peers")
    assert peers.status == "fail"
    assert "no addressed cable between rank 0 and rank 1 found (this rank's cables end at rank 2 192.168.177.2" in peers.value
    assert "list the ranks in cable order" in peers.fix


def test_sandbox_twins_unaddressed_warn_in_the_roce_row(sandbox_config, fabric_facts):
    inp = inputs(sandbox_config, fabric_facts)
    inp.ranks = {r: dataclasses.replace(g, facts=dataclasses.replace(g.facts, rdma=fabric_facts[r].rdma,
                                                                         interfaces=fabric_facts[r].interfaces))
                    for r, g in inp.ranks.items()}
    roce = row(check.evaluate(inp), 0, "roce")
    assert roce.status == "warn" and "roceP2p1s0f0 (twin of rocep1s0f0) has no IPv4 address" in roce.value
    assert roce.fix.startswith("address enP2p1s0f0np0 on a subnet of its own")


def test_roce_row_shows_nccls_gid_pick_and_fails_a_wrong_pin(sandbox_config, fabric_facts):
    report = check.evaluate(inputs(sandbox_config, fabric_facts))
    assert "NCCL_IB_GID_INDEX unset: NCCL picks the IPv4 RoCE v2 entry per HCA: rocep1s0f0 5," in row(report, 1, "roce").value
    # spark2 and spark4 carry an extra IPv6 address: their IPv4 entry is at 5, not 3
    pinned = with_cluster(sandbox_config, fabric=sandbox_config.cluster.fabric.model_copy(update={"gid_index": 3}))
    report = check.evaluate(inputs(pinned, fabric_facts))
    assert [row(report, r, "roce").status for r in range(4)] == ["pass", "fail", "pass", "fail"]
    assert "NCCL_IB_GID_INDEX=3 (pinned) is not the IPv4 RoCE v2 entry: rocep1s0f0 index 3 is" in row(report, 1, "roce").value


def test_link_row_shows_the_ring_sockets_network(sandbox_config, fabric_facts):
    report = check.evaluate(inputs(sandbox_config, fabric_facts))
    assert "sockets on eth0 (172.31.240.12): the management network every rank reaches" in row(report, 1, "link").value


NCCL_SO = "/opt/nccl-2.30.7/lib/libnccl.so.2"


def nccl_lib(version="2.30.7+cuda13.0", size=251_234_112, present=True):
    if not present:
        return NcclLib(NCCL_SO, False, problem=f"{NCCL_SO}: no such file")
    return NcclLib(NCCL_SO, True, "/opt/nccl-2.30.7/lib/libnccl.so.2.30.7", size, version)


def test_nccl_row_without_a_host_build(sandbox_config, fabric_facts):
    report = check.evaluate(inputs(sandbox_config, fabric_facts))
    assert row(report, 0, "nccl") == Finding("nccl", "pass", "the image's own (nccl.host_lib not set)")


@pytest.mark.parametrize("odd, status, text", [
    (None, "pass", f"{NCCL_SO} (/opt/nccl-2.30.7/lib/libnccl.so.2.30.7): NCCL 2.30.7+cuda13.0, 251,234,112 B, "
                   "same on all ranks"),
    (nccl_lib(present=False), "fail", f"{NCCL_SO}: no such file"),
    (nccl_lib("2.28.9+cuda13.0"), "fail", f"{NCCL_SO} (/opt/nccl-2.30.7/lib/libnccl.so.2.30.7): NCCL "
     "2.28.9+cuda13.0, 251,234,112 B: rank 2 has NCCL 2.28.9+cuda13.0, 251,234,112 B; ranks 0, 1, 3 have NCCL "
     "2.30.7+cuda13.0, 251,234,112 B"),
    (nccl_lib(size=250_000_000), "fail", "rank 2 has NCCL 2.30.7+cuda13.0, 250,000,000 B; ranks 0, 1, 3 have "
     "NCCL 2.30.7+cuda13.0, 251,234,112 B"),
], ids=["same", "missing", "version", "another-build"])
def test_nccl_row_with_a_host_build(sandbox_config, fabric_facts, odd, status, text):
    loaded = with_cluster(sandbox_config, nccl=sandbox_config.cluster.nccl.model_copy(update={"host_lib": NCCL_SO}))
    libs = {r: {"nccl_lib": nccl_lib()} for r in range(4)}
    if odd:
        libs[2] = {"nccl_lib": odd}
    report = check.evaluate(inputs(loaded, fabric_facts, libs))
    got = row(report, 2, "nccl")
    assert got.status == status and text in got.value, got
    if status == "fail":
        assert NCCL_SO in got.fix and not report.ok
        assert row(report, 0, "nccl").status == "pass"


# --- drift between ranks ------------------------------------------------------------------------

def test_compare_names_the_odd_rank_or_lists_every_rank_without_a_majority():
    assert drift.compare({0: "a", 1: "a", 2: "b", 3: "a"}, 2) == (True, "rank 2 has b; ranks 0, 1, 3 have a")
    assert drift.compare({0: "a", 1: "a", 2: "b", 3: "a"}, 0) == (False, "same on ranks 0, 1, 3 (rank 2 differ)")
    assert drift.compare({0: "a", 1: "b"}, 0) == (True, "ranks differ: rank 0 a, rank 1 b")
    assert drift.compare({0: "a", 1: "a", 2: "b", 3: "b"}, 1) == (True, "ranks differ: rank 0 a, rank 1 a, rank 2 b, rank 3 b")
    assert drift.compare({0: "a", 1: "a", 2: "b", 3: "c"}, 3) == (True, "rank 3 has c; ranks 0, 1 have a")
    assert drift.compare({0: "a", 1: "a"}, 1) == (False, "same on all ranks")
    assert drift.compare({0: "a"}, 0) == (False, "")


DRIVER_FIX = ("install the same NVIDIA driver on every rank (DGX OS: `sudo apt update && sudo apt full-upgrade` "
              "on each, then reboot): ranks on different drivers do not form one TP group")


def test_driver_drift_fails_the_odd_rank_naming_the_others_driver(sandbox_config, fabric_facts):
    old = Driver("580.82.09", "13.0", "580.82.09")
    report = check.evaluate(inputs(sandbox_config, fabric_facts, {1: {"driver": old}}))
    assert row(report, 1, "driver") == Finding(
        "driver", "fail", "580.82.09 (CUDA 13.0): rank 1 has 580.82.09 (CUDA 13.0); ranks 0, 2, 3 have 580.95.05 (CUDA 13.0)",
        DRIVER_FIX)
    assert row(report, 0, "driver") == Finding("driver", "pass", "580.95.05 (CUDA 13.0), same on ranks 0, 2, 3 (rank 1 differ)")
    assert not report.ok


def test_cuda_version_alone_drifting_in_a_tie_fails_every_rank_listing_each_value(sandbox_config, fabric_facts):
    """Two ranks against two (as two ranks against each other): no side is the odd one."""
    older = {"driver": Driver(DRIVER, "12.9", DRIVER)}
    report = check.evaluate(inputs(sandbox_config, fabric_facts, {2: older, 3: older}))
    for r in range(4):
        got = row(report, r, "driver")
        assert got.status == "fail", got
        assert got.value.endswith("ranks differ: rank 0 580.95.05 (CUDA 13.0), rank 1 580.95.05 (CUDA 13.0), "
                                  "rank 2 580.95.05 (CUDA 12.9), rank 3 580.95.05 (CUDA 12.9)"), got


def test_driver_upgraded_without_a_reboot_fails_that_rank(sandbox_config, fabric_facts):
    stale = Driver("580.95.05", "13.0", "580.82.09")
    got = row(check.evaluate(inputs(sandbox_config, fabric_facts, {3: {"driver": stale}})), 3, "driver")
    assert got == Finding("driver", "fail", "the loaded kernel module is 580.82.09, its library 580.95.05 "
                            "(Driver/library version mismatch)",
                            "reboot this rank: the driver was upgraded and the old module is still loaded")


def test_no_driver_is_not_measured_not_passed(sandbox_config, fabric_facts):
    """A sandbox rank: no nvidia-smi. The driver, runtime and clock rows say so and warn."""
    none = {"driver": None, "gpu_clocks": None, "gpu": None, "cdi_specs": (), "nvidia_ctk": None,
            "problems": ("nvidia-smi: not installed",)}
    report = check.evaluate(inputs(sandbox_config, fabric_facts, {r: none for r in range(4)}))
    for name in ("driver", "nvidia runtime", "gpu clock"):
        got = row(report, 2, name)
        assert got.status == "warn" and "not measured: nvidia-smi: not installed" in got.value, got
    assert report.ok


def test_a_stale_cdi_spec_fails_that_rank_with_the_regenerate_fix(sandbox_config, fabric_facts):
    stale = (CdiSpec("/etc/cdi/nvidia.yaml", "570.133.20"),)
    report = check.evaluate(inputs(sandbox_config, fabric_facts, {2: {"cdi_specs": stale}}))
    assert row(report, 2, "nvidia runtime") == Finding(
        "nvidia runtime", "fail", "stale CDI spec: /etc/cdi/nvidia.yaml names driver 570.133.20, the rank runs 580.95.05",
        "sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml")
    assert row(report, 0, "nvidia runtime").status == "pass"
    assert not report.ok


def test_container_toolkit_drift_warns(sandbox_config, fabric_facts):
    report = check.evaluate(inputs(sandbox_config, fabric_facts, {0: {"nvidia_ctk": "1.16.2"}}))
    got = row(report, 0, "nvidia runtime")
    assert got.status == "warn" and got.value.endswith(
        "NVIDIA Container Toolkit rank 0 has 1.16.2; ranks 1, 2, 3 have 1.17.8"), got
    assert row(report, 1, "nvidia runtime").status == "pass" and report.ok


def test_kernel_or_page_size_drift_fails_the_odd_rank(sandbox_config, fabric_facts):
    kernel = fabric_facts[0].kernel
    report = check.evaluate(inputs(sandbox_config, fabric_facts, {3: {"page_size": 65536}}))
    assert row(report, 3, "kernel").value == (f"{kernel}, 64 KiB pages: rank 3 has {kernel}, 64 KiB pages; "
                                              f"ranks 0, 1, 2 have {kernel}, 4 KiB pages")
    assert row(report, 3, "kernel").status == "fail" and "same kernel" in row(report, 3, "kernel").fix
    report = check.evaluate(inputs(sandbox_config, fabric_facts, {1: {"kernel": "6.11.0-1016-nvidia"}}))
    assert row(report, 1, "kernel").status == "fail" and f"ranks 0, 2, 3 have {kernel}, 4 KiB pages" in row(report, 1, "kernel").value
    assert row(report, 2, "kernel").status == "pass"


def with_fw(f: facts.Facts, fw: str | None) -> tuple:
    return tuple(dataclasses.replace(d, fw_ver=fw) for d in f.rdma)


def test_cx7_firmware_drift_fails_the_odd_rank(sandbox_config, fabric_facts):
    report = check.evaluate(inputs(sandbox_config, fabric_facts, {2: {"rdma": with_fw(fabric_facts[2], "28.39.1002")}}))
    got = row(report, 2, "cx7 firmware")
    assert got.status == "fail" and got.value == "fw 28.39.1002: rank 2 has 28.39.1002; ranks 0, 1, 3 have 28.45.1020"
    assert "ConnectX-7 firmware" in got.fix
    assert row(report, 0, "cx7 firmware") == Finding("cx7 firmware", "pass", "fw 28.45.1020, same on ranks 0, 1, 3 (rank 2 differ)")
    unread = check.evaluate(inputs(sandbox_config, fabric_facts, {1: {"rdma": with_fw(fabric_facts[1], None)}}))
    assert row(unread, 1, "cx7 firmware").status == "warn" and "not measured" in row(unread, 1, "cx7 firmware").value


def test_gpu_clock_asked_but_not_applied_fails_with_prep_as_the_fix(tmp_path, fabric_facts):
    loaded = sandbox_cluster(tmp_path, gpu_clock={"max_mhz": 2400})
    report = check.evaluate(inputs(loaded, fabric_facts, {1: {"gpu_clocks": GpuClocks(2405, 3003, (0, 2400))}}))
    assert row(report, 1, "gpu clock") == Finding("gpu clock", "pass", "locked 0,2400 MHz (gpu_clock); now 2405 of max 3003 MHz")
    assert row(report, 0, "gpu clock").status == "fail"
    assert row(report, 0, "gpu clock").value == "gpu_clock asks 0,2400 MHz, the rank has no lock recorded (now 208 of max 3003 MHz)"
    assert row(report, 0, "gpu clock").fix.startswith("sparkstack prep")


def test_gpu_clock_left_locked_after_the_setting_went_warns(sandbox_config, fabric_facts):
    report = check.evaluate(inputs(sandbox_config, fabric_facts, {2: {"gpu_clocks": GpuClocks(2000, 3003, (2000, 2000))}}))
    assert row(report, 2, "gpu clock") == Finding("gpu clock", "warn", "locked 2000,2000 MHz by an earlier prep, but "
                                                    "gpu_clock is unset", "sparkstack prep resets it (nvidia-smi -rgc)")
    assert row(report, 0, "gpu clock") == Finding("gpu clock", "pass", "the driver's (no lock); now 208 of max 3003 MHz")


def test_extras_invocation_and_parse():
    targets = [extras.PingTarget(1, "192.168.177.2", "link", 8972), extras.PingTarget(2, "192.168.177.6", "fabric", None)]
    command, stdin = extras.extras_invocation(targets)
    assert stdin == extras.PINGER_SOURCE.read_bytes()
    args = json.loads(shlex.split(command)[2])
    assert args == {"targets": [[0, "192.168.177.2", None], [1, "192.168.177.2", 8972],
                                [2, "192.168.177.6", None]], "wait_s": 1}
    parsed = extras.parse_extras("0 0 rtt min/avg/max/mdev = 0.1/0.1/0.1/0.0 ms\n"
                                "1 1 ping: local error: message too long, mtu=1400\n"
                                "2 1 1 packets transmitted, 0 received, 100% packet loss, time 0ms\n"
                                "CAPEFF 000001ffffffffff\n", targets)
    assert parsed.pings[("192.168.177.2", False)].ok and not parsed.pings[("192.168.177.2", True)].ok
    assert "message too long" in parsed.pings[("192.168.177.2", True)].detail
    assert parsed.dockerd_can_raise is True
    assert extras.parse_extras("NOPING\nCAPEFF 00000000a80425fb\n", targets) == \
        extras.Extras({}, ping_missing=True, dockerd_can_raise=False)


def test_pinger_answers_unroutable_targets_without_a_ping(tmp_path):
    """The pinger script as it runs on a rank (stdlib only, on stdin): loopback answers, an
    address this host has no route to is answered by the route lookup alone; with no `ping` on
    PATH it says NOPING. A stand-in `ping` on PATH records how it was called."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "calls"
    fake = bindir / "ping"
    fake.write_text(f"#!/bin/sh\necho \"$*\" >> {log}\n"
                    "case \"$*\" in *-M*) echo 'ping: local error: message too long, mtu=1400'; exit 1;; esac\n"
                    "echo '1 packets transmitted, 1 received, 0% packet loss, time 0ms'\n")
    fake.chmod(0o755)
    targets = [extras.PingTarget(1, "127.0.0.2", "link", 8972), extras.PingTarget(2, "0.0.0.1", "fabric", None)]
    command, _ = extras.extras_invocation(targets)

    def run(path):
        # in a network namespace of its own (only loopback, up): nothing else is routed
        script = f"{shutil.which('ip')} link set lo up && " + local_command(command, extras.PINGER_SOURCE)
        done = subprocess.run([shutil.which("unshare"), "-n", "/bin/sh", "-c", script],
                              capture_output=True, env={"PATH": path, **coverage_env()}, timeout=30)
        assert done.returncode == 0, done.stderr
        return extras.parse_extras(done.stdout.decode(), targets)

    got = run(str(bindir))
    assert got.pings[("127.0.0.2", False)].ok
    assert got.pings[("127.0.0.2", True)] == extras.PingAnswer(False, "ping: local error: message too long, mtu=1400")
    unroutable = got.pings[("0.0.0.1", False)]  # no route in the namespace: connect() refuses at once
    assert not unroutable.ok and unroutable.detail.startswith("ping: connect: ")
    # one ping per routable target and size, none for the unroutable one
    assert sorted(log.read_text().splitlines()) == ["-n -c1 -W1 -M do -s 8972 127.0.0.2", "-n -c1 -W1 127.0.0.2"]
    assert run(str(tmp_path / "empty")).ping_missing


def test_checkpoint_and_clock_compare_ranks(sandbox_config, fabric_facts):
    other = Checkpoint("/models/glm53-sandbox", "c" * 64, "i" * 64, (("a.safetensors", 9),), "e" * 64, 9)
    late = Clock(1003.0, 1003.1, 1000.0, 1000.1)
    report = check.evaluate(inputs(sandbox_config, fabric_facts, {2: {"checkpoint": other, "clock": late}}))
    assert row(report, 2, "checkpoint").status == "fail" and "other ranks ffffffffffff" in row(report, 2, "checkpoint").value
    assert row(report, 2, "clock").status == "fail" and "timedatectl" in row(report, 2, "clock").fix
    assert row(report, 0, "clock").status == "pass"


def test_a_model_dir_whose_reads_hang_is_an_nfs_server_not_answering(sandbox_config, fabric_facts, tmp_path):
    """A read that never returns, as from a dead NFS server (here config.json is a FIFO nobody
    writes, whose open() blocks just so): the real probe still answers within its timeout, and
    check says the NFS server does not answer, with where to look."""
    from launcher.onrank import probe

    model = tmp_path / "model"
    model.mkdir()
    (model / "model-00001-of-00001.safetensors").write_bytes(b"")
    os.mkfifo(model / "config.json")
    raw = run_probe({"model_dir": str(model), "timeout_s": 1})
    assert raw["checkpoint"]["dir"] == str(model)
    assert raw["checkpoint"]["error"].startswith(f"{probe.NOT_ANSWERING} within 1s")
    assert str(model) not in raw["disk"]  # its statvfs is part of the bounded read
    hung = facts.parse_facts(raw)
    report = check.evaluate(inputs(sandbox_config, fabric_facts,
                                   {2: {"checkpoint": hung.checkpoint, "problems": hung.problems}}))
    got = row(report, 2, "checkpoint")
    assert got.status == "fail" and got.value.startswith(f"NFS server not answering: checkpoint {model}: ")
    assert "findmnt -o OPTIONS /models/glm53-sandbox` should include soft, timeo=600, retrans=2" in got.fix
    assert row(report, 1, "checkpoint").status == "pass"


def test_unreachable_rank_is_one_failed_ssh_row(sandbox_config, fabric_facts):
    inp = inputs(sandbox_config, fabric_facts)
    inp.ranks[3] = gather.RankFacts(3, "spark4", None, "rank 3 (spark4): unreachable (connection refused)", 0.01)
    report = check.evaluate(inp)
    assert report.ranks[3].checks == [Finding("ssh", "fail", "rank 3 (spark4): unreachable (connection refused)",
                                                "check the rank is up and `ssh -p 22 spark@172.31.240.14` works")]
    assert not report.ok
    assert set(report.to_json()) == {"ok", "ranks"}
    assert set(report.to_json()["ranks"][0]) == {"rank", "host", "checks"}
    assert set(report.to_json()["ranks"][0]["checks"][0]) == {"name", "status", "value", "fix"}


# --- on the sandbox -----------------------------------------------------------------------------

@pytest.fixture
def loaded(sandbox):
    return config.load(sandbox.config)


def test_healthy_sandbox(sandbox, loaded):
    """Everything a sandbox can pass passes; the honest exceptions are listed in the docstring."""
    for name in sandbox.names:  # the state `prep` leaves; another test may have changed it
        sandbox.run(name, "sudo sysctl -q -w vm.swappiness=1 vm.compaction_proactiveness=0")
    report = preflight.run(loaded, image=sandbox.images["vllm"])
    s = statuses(report)
    for name in ("ssh", "docker", "image", "gpu", "kernel", "memory", "vllm guard", "free while serving", "swap",
                 "sysctls", "link", "cx7 firmware",
                 "mtu", "peers", "jumbo", "nccl", "checkpoint", "disk", "clock"):
        assert s[name] == {"pass"}, (name, [row(report, r, name) for r in range(4)])
    assert s["ulimits"] == {"warn"} and s["roce"] == {"warn"}  # the twins are unaddressed
    for name in ("driver", "nvidia runtime", "gpu clock"):  # no NVIDIA driver on a sandbox rank
        assert s[name] == {"warn"} and "not measured: nvidia-smi: not installed" in row(report, 0, name).value
    assert row(report, 0, "cx7 firmware").value == f"fw {sfabric.FW_VER}, same on all ranks"
    assert "(dockerd hard limit)" in row(report, 0, "ulimits").value
    for name in ("peers", "jumbo"):
        for r in range(4):
            c = row(report, r, name)
            # both cable ends answer (at 9000 B, DF, for jumbo); nothing beyond them is pinged
            targets = report_targets(loaded, r)
            assert {t.peer for t in targets} == {(r + 1) % 4, (r - 1) % 4}, targets
            assert all(f"rank {t.peer} {t.ip}" in c.value for t in targets), c
    assert report.ok


def report_targets(loaded, r):
    """Rank r's ping targets as check computes them from its own facts."""
    got = gather.gather_config(loaded=loaded)
    found = gather.facts_of(got)
    return extras.resolve_peers(extras.rank_ping_targets(loaded, r, found[r]), found)


def test_a_cut_cable_fails_both_ends(sandbox, loaded):
    """Pull the cable of ring link 0 (spark1 port 0 <-> spark2 port 1): both ends' peers and jumbo
    rows fail naming the other end; laying it again (what `sandbox up` does) heals it."""
    from launcher.sandbox import cluster

    cluster.cut_cable(0, sandbox.state_dir)
    try:
        report = preflight.run(loaded, image=sandbox.images["vllm"])
        assert not report.ok
        for r, far in ((0, "rank 1 192.168.177.2"), (1, "rank 0 192.168.177.1")):
            for name in ("peers", "jumbo"):
                c = row(report, r, name)
                assert c.status == "fail" and far in c.value.split("unreachable")[1], c
        assert "cable" in row(report, 0, "peers").fix
        assert row(report, 2, "peers").status == "pass"  # spark3's own cables are fine
        # and the kernel's view: spark1's fabric port lost its carrier, so its link row fails
        assert row(report, 0, "link").status == "fail" and "down" in row(report, 0, "link").value
    finally:
        assert cluster.mend_cables(sandbox.state_dir) == [0]
    assert row(preflight.run(loaded, image=sandbox.images["vllm"]), 0, "peers").status == "pass"


def test_cx7_firmware_drift_on_one_rank_is_named(sandbox, loaded):
    """spark3's ConnectX-7 flashed to another firmware (its sysfs fixture's fw_ver): its row
    fails naming it and the others' version; the other ranks pass; put back, all pass."""
    from launcher.sandbox import cluster

    hcas = cluster.paths(sandbox.state_dir)["ranks"] / "spark3" / "sysfs" / "class" / "infiniband"
    files = sorted(hcas.glob("*/fw_ver"))
    assert len(files) == 4
    try:
        for path in files:
            path.write_text("28.39.1002\n")
        report = preflight.run(loaded, image=sandbox.images["vllm"])
        assert row(report, 2, "cx7 firmware") == Finding(
            "cx7 firmware", "fail", f"fw 28.39.1002: rank 2 has 28.39.1002; ranks 0, 1, 3 have {sfabric.FW_VER}",
            "flash the same ConnectX-7 firmware on every rank (`sudo mlxfwmanager --online -u`, or the DGX OS "
            "update that carries it), then reboot it")
        assert [row(report, r, "cx7 firmware").status for r in range(4)] == ["pass", "pass", "fail", "pass"]
        assert not report.ok
    finally:
        for path in files:
            path.write_text(sfabric.FW_VER + "\n")
    assert row(preflight.run(loaded, image=sandbox.images["vllm"]), 2, "cx7 firmware").status == "pass"


def test_a_rank_serving_another_image_is_named(sandbox, loaded):
    """spark4's tag points at another build (a label more: another image ID): its image row
    fails naming it and the ID the other three have."""
    tag = "sparkstack-test/check:drifted"
    base = sandbox.images["vllm"]
    try:
        for name in sandbox.names[:3]:
            assert sandbox.run(name, f"docker tag {base} {tag}")[0] == 0
        rc, out = sandbox.run(sandbox.names[3], f"printf 'FROM {base}\\nLABEL sparkstack-test=drifted\\n' | "
                                                f"docker build -q -t {tag} - 2>&1")[:2]
        assert rc == 0, out
        ids = {name: sandbox.run(name, f"docker image inspect -f '{{{{.Id}}}}' {tag}")[1].strip()
               for name in sandbox.names}
        report = preflight.run(loaded, image=tag)
        mine, theirs = ids["spark4"].removeprefix("sha256:")[:12], ids["spark1"].removeprefix("sha256:")[:12]
        assert mine != theirs
        assert row(report, 3, "image").value == f"{tag} {mine}: rank 3 has {mine}; ranks 0, 1, 2 have {theirs}"
        assert [row(report, r, "image").status for r in range(4)] == ["pass", "pass", "pass", "fail"]
    finally:
        for name in sandbox.names:
            sandbox.run(name, f"docker rmi {tag} >/dev/null 2>&1; true")


def test_image_missing_on_one_rank_is_named(sandbox, loaded):
    tag = "sparkstack-test/check:on-three"
    base = sandbox.images["vllm"]
    try:
        for name in sandbox.names[:3]:
            assert sandbox.run(name, f"docker tag {base} {tag}")[0] == 0
        report = preflight.run(loaded, image=tag)
        assert [row(report, r, "image").status for r in range(4)] == ["pass", "pass", "pass", "fail"]
        assert row(report, 3, "image").value == (f"{tag} missing on rank 3 (spark4) "
                                                 "(its Docker keeps images in containerd's image store)")
        assert not report.ok
    finally:
        for name in sandbox.names:
            sandbox.run(name, f"docker rmi {tag} >/dev/null 2>&1; true")


@pytest.fixture
def squeezed(sandbox):
    """spark2's /proc/meminfo shows 10 GiB available (a squeeze of its sandbox memory); released after."""
    from launcher.sandbox import meminfo

    meminfo.squeeze_available(sandbox.state_dir, "spark2", 10 * (1 << 30))
    try:
        yield
    finally:
        meminfo.unsqueeze(sandbox.state_dir, "spark2")


def test_low_memory_on_one_rank_fails_with_numbers(sandbox, loaded, squeezed):
    result = CliRunner().invoke(main, ["check", "-c", str(sandbox.config), "--json"])
    assert result.exit_code == 1, result.output
    data = json.loads(result.output)
    mem = {r["host"]: next(c for c in r["checks"] if c["name"] == "memory") for r in data["ranks"]}
    assert mem["spark2"]["status"] == "fail"
    assert mem["spark2"]["value"].startswith("MemAvailable 10.0 GiB < needs 22.")
    assert "sparkstack prep" in mem["spark2"]["fix"]
    assert mem["spark1"]["status"] in ("pass", "warn")


def test_trust_new_hosts_shows_every_key_it_trusts(sandbox, tmp_path):
    """`check --trust-new-hosts --json` with no known host: each rank's key is recorded and its
    fingerprint shown on stderr (never trusted silently; stdout stays JSON), every rank connects
    and is checked in full; the next check, without the flag, connects with the recorded keys."""
    doc = yaml.safe_load(Path(sandbox.config).read_text())
    known = tmp_path / "known_hosts"
    doc.setdefault("ssh", {})["known_hosts"] = str(known)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc))

    def checked(*flags):
        result = CliRunner().invoke(main, ["check", "-c", str(path), "--json", *flags])
        data = json.loads(result.stdout)
        assert result.exit_code == (0 if data["ok"] else 1), result.output
        for r in data["ranks"]:  # connected: the ssh row passed and every row was measured
            assert [c["name"] for c in r["checks"] if c["name"] != "engine config"] == [
                n for n in check.ORDER if n != "api key" or r["rank"] == 0], r  # engine config: rank 0, asked
            assert r["checks"][0]["status"] == "pass", r["checks"][0]
        return result, data

    trusting, first = checked("--trust-new-hosts")
    for rank in sandbox.ranks:
        assert f"trusting new host key for {rank['name']} ({rank['address']}:{rank['port']}): " \
            in trusting.stderr, trusting.stderr
    assert trusting.stderr.count(" SHA256:") == len(sandbox.names)
    assert len(known.read_text().splitlines()) == len(sandbox.names)
    again, second = checked()
    assert "trusting" not in again.stderr and known.read_text().count("\n") == len(sandbox.names)
    assert again.exit_code == trusting.exit_code


def test_unreachable_rank_is_a_failed_row_fast(sandbox, tmp_path):
    doc = yaml.safe_load(Path(sandbox.config).read_text())
    doc["ranks"][2]["port"] = 1  # nothing listens there: refused at once
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc))
    started = time.monotonic()
    result = CliRunner().invoke(main, ["check", "-c", str(path), "--json"])
    took = time.monotonic() - started
    assert result.exit_code == 1, result.output
    data = json.loads(result.output)
    assert data["ok"] is False
    spark3 = data["ranks"][2]
    assert [c["name"] for c in spark3["checks"]] == ["ssh"]
    assert spark3["checks"][0]["status"] == "fail" and "unreachable" in spark3["checks"][0]["value"]
    assert len([c for c in data["ranks"][0]["checks"] if c["name"] != "engine config"]) == len(check.ORDER)
    assert took < doc["ssh"].get("connect_timeout_s", 10) + 15, took


def test_cli_table(sandbox, squeezed):
    """`sparkstack check`'s table with spark2 short of memory: its column FAILs, the failure is
    spelled out with its fix, the run is "not ready" and exits 1 (whatever else the ranks lack)."""
    result = CliRunner().invoke(main, ["check", "-c", str(sandbox.config)])
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["check", "0", "spark1", "1", "spark2", "2", "spark3", "3", "spark4"]
    assert next(line for line in lines if line.startswith("memory")).split() == ["memory", "pass", "FAIL", "pass", "pass"]
    assert any(line.startswith("FAIL rank 1 spark2 memory: MemAvailable 10.0 GiB < needs") for line in lines)
    assert lines[-1].startswith("not ready (") and lines[-1].endswith(" s)")


def test_plan_or_refuse_for_up(sandbox, loaded, squeezed):
    """`up`'s preflight: a failed row stops it with every failure named; else the live plan."""
    with gather.open_group(loaded) as group:
        with pytest.raises(check.CheckFailed) as e:
            deploy.preflight(loaded, group, image=sandbox.images["vllm"])
    assert "rank 1 (spark2) memory: MemAvailable 10.0 GiB < needs" in e.value.message
    assert "-- fix: sparkstack prep" in e.value.message


def test_plan_or_refuse_tolerates_a_missing_image_and_returns_the_live_plan(sandbox, loaded):
    with gather.open_group(loaded) as group:
        p = deploy.preflight(loaded, group, image="sparkstack-test/check:nowhere")
    assert "NCCL_IB_HCA" in p.ranks[0].env  # made from the facts: each rank's own fabric env
    assert not any(a.startswith("MemAvailable") for a in p.assumed)


def test_last_times_ping_targets_are_kept_per_rank_and_config(write_config):
    """gather pings a rank's targets of last time beside its probe: kept per config and rank,
    replaced when the probe's facts give others (launcher/gather/extras.py)."""
    from launcher.inputs import config as config_mod

    loaded = config_mod.load(write_config())
    other = config_mod.load(write_config(name="other.yaml"))
    targets = [extras.PingTarget(1, "192.168.177.2", "link", 8972), extras.PingTarget(-1, "192.168.177.6", "fabric", None)]
    assert extras.remembered_targets(loaded, 0) is None
    extras.remember_targets(loaded, 0, targets)
    assert extras.remembered_targets(loaded, 0) == targets
    assert extras.remembered_targets(loaded, 1) is None and extras.remembered_targets(other, 0) is None
    extras.remember_targets(loaded, 0, targets[:1])
    assert extras.remembered_targets(loaded, 0) == targets[:1]
