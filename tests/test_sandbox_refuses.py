"""The sandbox refuses what real Sparks refuse (issue: the kit's old ring, memory-guard and GID
outputs passed it). Each test starts the planned cluster with ONE thing put back the way the kit
used to write it, and the stand-in stops it with the real stack's message, naming the rank or
the pair; the plan as it is now serves (tests/test_serve.py)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from launcher.transport import api
from launcher.inputs import config
from launcher.apply import serve
from launcher.transport.remote import Group


@pytest.fixture(scope="module")
def loaded(sandbox):
    return config.load(sandbox.config)


@pytest.fixture(scope="module")
def ranks(loaded, sandbox):
    with Group.for_cluster(loaded.cluster) as g:
        yield g


@pytest.fixture(scope="module")
def planned(loaded, ranks):
    """The plan `up` would start (prep and ship are test_serve's business: the image is made
    present here by one `up`, then stopped)."""
    from launcher.apply import deploy

    deploy.up(loaded, ranks, say=lambda _m: None)
    serve.stop(ranks)
    return deploy.preflight(loaded, ranks)


def start_expecting_failure(loaded, ranks, plan) -> str:
    """Start `plan` the way `up` does; the StartFailed text (every rank stopped)."""
    try:
        serve.start(plan, ranks, say=lambda _m: None)
        api.wait_ready(api.endpoint(loaded), 90, say=lambda _m: None, watch=lambda: serve.watch(ranks))
    except serve.StartFailed as e:
        assert {s.state for s in serve.states(ranks)} == {"absent"}, "a half-started cluster"
        return str(e)
    serve.stop(ranks)
    raise AssertionError("the cluster started")


def with_env(plan, change) -> object:
    """The plan with each rank's env changed by change(rank, env) (a copy)."""
    ranks = []
    for rp in plan.ranks:
        env = dict(rp.env)
        change(rp.rank, env)
        ranks.append(dataclasses.replace(rp, env=env))
    return dataclasses.replace(plan, ranks=ranks)


def test_the_default_gpu_memory_utilization_is_refused(loaded, ranks, planned):
    """What the keys profiles planned before: an explicit KV size and no utilisation. vLLM
    0.33's guard (0.92 of MemTotal) refuses it on every rank."""
    def drop_util(rp):
        argv = list(rp.engine)
        i = argv.index("--gpu-memory-utilization")
        del argv[i:i + 2]
        return dataclasses.replace(rp, engine=argv)

    old = dataclasses.replace(planned, ranks=[drop_util(rp) for rp in planned.ranks])
    text = start_expecting_failure(loaded, ranks, old)
    assert "on startup is less than desired GPU memory utilization (0.92, 111.95 GiB)" in text
    assert "ValueError: Free memory on device cuda:0 (" in text


def test_the_old_ring_socket_env_cannot_bootstrap(loaded, ranks, planned, sandbox):
    """NCCL's bootstrap and Gloo on the fabric netdev, as the kit once wrote for a ring: rank 0's
    bootstrap listener is on its fabric IP, the end of the cable to rank 1; rank 2 shares no
    cable with rank 0 and rank 3's cable reaches rank 0's other port, so both fail to connect.
    The message is the first rank to exit, which is either of them."""
    def old_ring(r, env):
        netdev = sandbox.truth[sandbox.names[r]]["netdev"]
        env.update(NCCL_SOCKET_IFNAME="=" + netdev, GLOO_SOCKET_IFNAME=netdev)

    text = start_expecting_failure(loaded, ranks, with_env(planned, old_ring))
    failed = re.search(r"NCCL WARN Bootstrap \(rank (\d+) -> rank 0\): connect to 192\.168\.177\.1<", text)
    assert failed and failed.group(1) in ("2", "3"), text
    assert "failed : Network is unreachable" in text or "No route to host" in text


def test_nccl_algo_unset_in_a_ring_connects_non_neighbours(loaded, ranks, planned):
    """Trees pair ranks that share no cable (0-2, 1-3 in the ring); each rank names its own
    first failed pair, and the message is the first rank to exit, so either pair may show."""
    def no_algo(_r, env):
        env.pop("NCCL_ALGO", None)

    text = start_expecting_failure(loaded, ranks, with_env(planned, no_algo))
    pairs = {frozenset(map(int, m)) for m in re.findall(
        r"IBV_WC_RETRY_EXC_ERR\(12\): rank (\d) \([^)]*\) cannot reach rank (\d) \(", text)}
    assert pairs and pairs <= {frozenset({0, 2}), frozenset({1, 3})}, text
    assert "ncclTransportTreeConnect" in text


def test_a_link_local_gid_index_fails_like_ibv_modify_qp(loaded, ranks, planned):
    def pin_link_local(_r, env):
        env["NCCL_IB_GID_INDEX"] = "1"

    text = start_expecting_failure(loaded, ranks, with_env(planned, pin_link_local))
    assert "GID index 1 is fe80:" in text and "ibv_modify_qp failed with 22 Invalid argument" in text


def test_an_unaddressed_twin_in_nccl_ib_hca_fails(loaded, ranks, planned, sandbox):
    """Both twins listed while only the first holds an address: NCCL would run the twin on its
    link-local RoCE v1 entry."""
    def both_twins(r, env):
        env["NCCL_IB_HCA"] = "=" + ",".join(sandbox.truth[sandbox.names[r]]["hca_twins"])

    text = start_expecting_failure(loaded, ranks, with_env(planned, both_twins))
    assert "roceP2p1s0f" in text and "IB/RoCE v1, not an IPv4 RoCE v2 entry" in text
