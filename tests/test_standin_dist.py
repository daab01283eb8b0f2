"""The stand-in's NCCL/Gloo rules (launcher/sandbox/standins/standin_dist.py) on the sandbox's own sysfs
fixture trees: which HCAs and GIDs NCCL would use, which peers it connects, and a failed
connection reported on every rank with the pair named."""

from __future__ import annotations

import importlib.util
import json
import re
import threading
from pathlib import Path

import pytest

from launcher.sandbox import fabric_fixture as fabric
from test_standin_vllm import ROOT, free_port

spec = importlib.util.spec_from_file_location("standin_dist", ROOT / "launcher/sandbox/standins/standin_dist.py")
dist = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dist)


@pytest.fixture
def rank0_sysfs(tmp_path, monkeypatch):
    """spark1's fixture tree in a ring: port 0 addressed (GID 3), its twin unaddressed."""
    fabric.write_tree(tmp_path, fabric.sysfs_tree(0, 4))
    monkeypatch.setenv("SANDBOX_SYSFS_ROOT", str(tmp_path))
    return tmp_path


def test_socket_ifname_rules():
    names = ["lo", "eth0", "docker0", "enP7s7", "enp1s0f0np0", "enp1s0f0np0x"]
    assert dist.nccl_ifname_match(None, names) == ["eth0", "enP7s7", "enp1s0f0np0", "enp1s0f0np0x"]
    assert dist.nccl_ifname_match("=enp1s0f0np0", names) == ["enp1s0f0np0"]
    assert dist.nccl_ifname_match("enp1s0f0np0", names) == ["enp1s0f0np0", "enp1s0f0np0x"]
    assert dist.nccl_ifname_match("^en", names) == ["lo", "eth0", "docker0"]


def test_hca_rules():
    names = ["rocep1s0f0", "roceP2p1s0f0", "rocep1s0f1", "roceP2p1s0f1"]
    assert dist.selected_hcas("=rocep1s0f0,rocep1s0f1:1", names) == ["rocep1s0f0", "rocep1s0f1"]
    assert dist.selected_hcas("^=roceP2p1s0f0,roceP2p1s0f1", names) == ["rocep1s0f0", "rocep1s0f1"]
    assert dist.selected_hcas("roceP2", names) == ["roceP2p1s0f0", "roceP2p1s0f1"]
    assert dist.selected_hcas(None, names) == sorted(names)


def test_gid_nccl_picks_is_the_ipv4_roce_v2_entry(rank0_sysfs):
    hca = rank0_sysfs / "class" / "infiniband" / "rocep1s0f0"
    truth = fabric.fabric_truth(0, 4)
    assert dist.nccl_gid_index(hca, {}) == truth["gid_index"] == 3
    assert dist.ipv4_of_gid(dist.gid_entry(hca, 3)[0]) == truth["fabric_ip"]
    assert dist.nccl_gid_index(hca, {"NCCL_IB_GID_INDEX": "1"}) == 1


def test_an_unaddressed_twin_runs_on_link_local_roce_v1_and_fails(rank0_sysfs):
    found, problems = dist.rdma_endpoints({"NCCL_IB_HCA": "=rocep1s0f0,roceP2p1s0f0"})
    assert [f["hca"] for f in found] == ["rocep1s0f0"]
    assert len(problems) == 1 and problems[0].startswith("NET/IB : roceP2p1s0f0:1 GID index 0 is fe80:")
    assert "IB/RoCE v1, not an IPv4 RoCE v2 entry: ibv_modify_qp failed with 22" in problems[0]


def test_a_pinned_link_local_index_fails(rank0_sysfs):
    found, problems = dist.rdma_endpoints({"NCCL_IB_HCA": "=rocep1s0f0", "NCCL_IB_GID_INDEX": "1"})
    assert found == [] and "GID index 1 is fe80:" in problems[0] and "RoCE v2, not an IPv4" in problems[0]
    _, empty = dist.rdma_endpoints({"NCCL_IB_HCA": "=rocep1s0f0", "NCCL_IB_GID_INDEX": "7"})
    assert "GID index 7 is an empty entry" in empty[0]


def test_a_port_that_is_down_is_skipped(tmp_path, monkeypatch):
    fabric.write_tree(tmp_path, fabric.sysfs_tree(0, 4, unplugged=frozenset({0})))
    monkeypatch.setenv("SANDBOX_SYSFS_ROOT", str(tmp_path))
    found, problems = dist.rdma_endpoints({"NCCL_IB_HCA": "=rocep1s0f0,rocep1s0f1"})
    assert [f["hca"] for f in found] == ["rocep1s0f1"] and problems == []


def test_peers_ring_only_with_nccl_algo_ring():
    assert dist.rdma_peers(0, 4, {"NCCL_ALGO": "Ring"}) == [1, 3]
    assert dist.rdma_peers(2, 4, {"NCCL_ALGO": "ring"}) == [1, 3]
    assert dist.rdma_peers(0, 4, {}) == [1, 2, 3]  # trees and PAT connect non-neighbours
    assert dist.rdma_peers(0, 4, {"NCCL_ALGO": "Ring,Tree"}) == [1, 2, 3]


def test_no_usable_hca_with_nccl_net_ib_fails_loudly():
    me = {"rank": 0, "rdma": []}
    assert dist.data_connections(me, {0: me, 1: me}, {"NCCL_NET": "IB"}) == \
        ["NCCL WARN Failed to initialize any NET plugin"]
    assert dist.data_connections(me, {0: me, 1: me}, {}) == []  # NCCL falls back to sockets


def run_pair(env0: dict, env1: dict, timeout_s: float = 10) -> list[str | None]:
    """Two ranks on loopback, each in a thread, with their own environment. free_port's port can
    be taken by another process before rank 0 listens on it (the test's race, not the stand-in's):
    then the pair runs again on another port, three times at most."""
    for _attempt in range(3):
        out = _run_pair_once(env0, env1, timeout_s)
        if not any(m and "failed to listen" in m and "Address already in use" in m for m in out):
            return out
    return out


def _run_pair_once(env0: dict, env1: dict, timeout_s: float) -> list[str | None]:
    port = free_port()
    out: list[str | None] = [None, None]

    def one(rank: int, env: dict) -> None:
        out[rank] = dist.form_cluster(node_rank=rank, nnodes=2, master_addr="127.0.0.1",
                                      master_port=port, env=env, timeout_s=timeout_s,
                                      stop=threading.Event(), log=lambda _m: None)

    threads = [threading.Thread(target=one, args=(r, e)) for r, e in enumerate((env0, env1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


LOOPBACK = {"NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo", "VLLM_HOST_IP": "127.0.0.1"}


def test_two_ranks_on_loopback_meet(tmp_path, monkeypatch):
    monkeypatch.setenv("SANDBOX_SYSFS_ROOT", str(tmp_path / "none"))
    assert run_pair(LOOPBACK, LOOPBACK) == [None, None]


def test_a_rank_without_its_gloo_interface_fails_both(tmp_path, monkeypatch):
    monkeypatch.setenv("SANDBOX_SYSFS_ROOT", str(tmp_path / "none"))
    out = run_pair(LOOPBACK, {**LOOPBACK, "GLOO_SOCKET_IFNAME": "enp9s9"})
    for message in out:
        assert message.startswith("torch.distributed.DistBackendError: NCCL error")
        assert "rank 1: RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/" \
               "device.cc:83] ifa != nullptr. Unable to find address for: enp9s9" in message


def test_vllm_host_ip_not_on_the_rank_fails(tmp_path, monkeypatch):
    monkeypatch.setenv("SANDBOX_SYSFS_ROOT", str(tmp_path / "none"))
    out = run_pair({**LOOPBACK, "VLLM_HOST_IP": "192.0.2.1"}, LOOPBACK)
    assert "rank 0: mq: cannot bind 192.0.2.1" in out[1]
    assert "VLLM_HOST_IP=192.0.2.1 is not an address of this rank" in out[0]


# --- real NCCL's words: the stand-in against what real NCCL 2.28.9 / torch 2.11 said on a GPU ----
# tests/fixtures/nccl/messages.json: scripts/record_nccl_messages.py on the device tool's H200,
# the kit's own probe (launcher/onrank/nccl_allreduce.py) under each wrong environment.
RECORDED = json.loads((Path(__file__).parent / "fixtures" / "nccl" / "messages.json").read_text())


def recorded(case: str, rank: str = "0") -> dict:
    return RECORDED["cases"][case]["ranks"][rank]


def folded(text: str) -> str:
    return " ".join(text.split())


def standin_as_probe_says(message: str) -> str:
    """The stand-in's message as the probe reports an exception: type name without its module,
    whitespace folded (nccl_allreduce._one_line)."""
    return folded(message.removeprefix("torch.distributed."))


def test_the_recording_is_of_the_versions_the_standin_names():
    assert RECORDED["recorded_with"]["nccl"] == dist.NCCL_VERSION
    assert RECORDED["recorded_with"]["torch"].startswith("2.11")


@pytest.mark.parametrize("case, env", [
    ("net_ib_without_rdma", {"NCCL_NET": "IB"}),
    ("ib_hca_missing", {"NCCL_NET": "IB", "NCCL_IB_HCA": "=rocep9s0f9"}),
])
def test_nccl_net_ib_without_a_device_fails_as_real_nccl_does(tmp_path, monkeypatch, case, env):
    monkeypatch.setenv("SANDBOX_SYSFS_ROOT", str(tmp_path / "none"))
    real = recorded(case)
    assert RECORDED["cases"][case]["env"] == env
    warn = dist.data_connections({"rank": 0, "rdma": []}, {}, env)
    assert [w.split("] ", 1)[-1].split(" NCCL WARN ")[-1] for w in real["nccl_warn"]] == \
        [w.removeprefix("NCCL WARN ") for w in warn]
    out = run_pair({**LOOPBACK, **env}, {**LOOPBACK, **env})
    assert standin_as_probe_says(out[0]) == real["result"]["error"]
    assert real["result"]["stage"] == "nccl_init" and real["rc"] != 0


def test_nccl_socket_ifname_matching_nothing_fails_as_real_nccl_does(tmp_path, monkeypatch):
    monkeypatch.setenv("SANDBOX_SYSFS_ROOT", str(tmp_path / "none"))
    real = recorded("socket_ifname_missing")
    env = RECORDED["cases"]["socket_ifname_missing"]["env"]
    out = run_pair({**LOOPBACK, **env}, LOOPBACK)
    assert standin_as_probe_says(out[0]) == real["result"]["error"]
    assert real["nccl_warn"][0].endswith("NCCL WARN " + dist.NO_SOCKET_INTERFACE)


def test_an_nccl_ib_hca_naming_nothing_without_nccl_net_falls_back_as_real_nccl_does(tmp_path, monkeypatch):
    monkeypatch.setenv("SANDBOX_SYSFS_ROOT", str(tmp_path / "none"))
    assert recorded("ib_hca_missing_no_net")["rc"] == 0  # real NCCL ran on sockets
    env = RECORDED["cases"]["ib_hca_missing_no_net"]["env"]
    assert run_pair({**LOOPBACK, **env}, {**LOOPBACK, **env}) == [None, None]


def shape(message: str) -> str:
    """A message with its figures (seconds, ports, addresses) as N: what must match exactly."""
    return re.sub(r"\d+", "N", standin_as_probe_says(message))


def alone(rank: int, port: int) -> str | None:
    return dist.form_cluster(node_rank=rank, nnodes=2, master_addr="127.0.0.1", master_port=port,
                             env=LOOPBACK, timeout_s=1, stop=threading.Event(), log=lambda _m: None)


def test_a_rank_that_never_joins_times_out_in_torch_words(tmp_path, monkeypatch):
    monkeypatch.setenv("SANDBOX_SYSFS_ROOT", str(tmp_path / "none"))
    real = recorded("rank_never_joins")["result"]["error"]  # "tcp://...: DistStoreError: ..."
    assert shape(alone(0, free_port())) == shape(real.split("): ", 1)[1])


def test_a_closed_master_port_times_out_in_torch_words(tmp_path, monkeypatch):
    monkeypatch.setenv("SANDBOX_SYSFS_ROOT", str(tmp_path / "none"))
    real = recorded("master_port_closed", "1")["result"]["error"]
    assert shape(alone(1, free_port())) == shape(real.split("): ", 1)[1])


def test_vllm_meets_the_same_failure_through_its_own_nccl_communicator():
    torch_words = recorded("net_ib_without_rdma")["result"]["error"]
    # ncclGetErrorString's words are the ones torch embeds; vLLM's pynccl adds NCCL's last error
    assert "invalid usage (run with NCCL_DEBUG=WARN for details)" in torch_words
    assert dist.as_pynccl(dist.invalid_usage(dist.NO_NET_PLUGIN)) == (
        "RuntimeError: NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details)\n"
        "Last error:\nFailed to initialize any NET plugin")
    assert dist.as_pynccl("torch.distributed.DistStoreError: x") == "torch.distributed.DistStoreError: x"
    assert dist.as_pynccl(None) is None
