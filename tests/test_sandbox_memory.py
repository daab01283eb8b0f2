"""The sandbox ranks' GB10 memory, for real: the kit's own drop command over SSH empties a rank's
page cache (each rank's `sandbox-meminfo` daemon, launcher/sandbox/standins/standin_mem.py), and
the stand-in engine loading in a container on a rank holds memory in that rank's meminfo, fills
its page cache, frees it all when killed, and dies with NV_ERR_NO_MEMORY when the page cache eats
MemFree unless caches are dropped while it loads."""

from __future__ import annotations

import threading
import time

import pytest

from launcher.inputs import node_settings
from launcher.sandbox import cluster, meminfo

GIB = 1 << 30
KB_PER_GIB = 1 << 20
RANK = "spark2"
NAME = "sparkstack-memtest"


@pytest.fixture
def rank(sandbox):
    """spark2 with its page cache dropped and no test engine on it, before and after."""
    if not meminfo.enabled():
        pytest.skip("SPARKSTACK_SANDBOX_MEMINFO=host: ranks show the host's memory")

    def clean():
        sandbox.run(RANK, f"docker rm -f {NAME} >/dev/null 2>&1; sudo -n sysctl -q -w vm.drop_caches=3")
        meminfo.unsqueeze(sandbox.state_dir, RANK)

    clean()
    try:
        yield sandbox.state_dir
    finally:
        clean()


def test_the_kits_drop_over_ssh_empties_a_full_page_cache(sandbox, rank):
    meminfo.fill_page_cache(rank, RANK, 200 * GIB)  # reads filled what was free
    full = meminfo.read(rank, RANK)
    assert full["MemFree"] < KB_PER_GIB and full["Cached"] > 100 * KB_PER_GIB
    since = time.time()  # the rank's daemon stamps events with this same clock
    code, out, err = sandbox.run(RANK, node_settings.DROP_CACHES_COMMAND)  # as user spark
    assert code == 0, err
    code, _, err = sandbox.run(RANK, "sudo -n /usr/sbin/sysctl -w vm.compact_memory=1")
    assert code == 0, err
    after = meminfo.wait_for(rank, RANK, lambda f: f["MemFree"] > 100 * KB_PER_GIB)
    assert after["MemFree"] > full["MemFree"] + 100 * KB_PER_GIB
    assert after["MemAvailable"] > full["MemAvailable"]
    assert after["Cached"] < KB_PER_GIB
    meminfo.settle(rank, RANK)
    assert [e[1:] for e in meminfo.events(rank, RANK, since)] == [("drop_caches", "3"), ("compact_memory", "1")]
    code, out, _ = sandbox.run(RANK, "grep -E '^(MemFree|Cached):' /proc/meminfo")  # what the rank sees
    assert code == 0 and int(out.split()[1]) > 100 * KB_PER_GIB


def start_engine(sandbox, weights_gib: int, kv_gib: int, load_s: float) -> None:
    model = cluster.MODEL_PATH
    code, out, err = sandbox.run(RANK, (
        f"docker run -d --name {NAME} -v {model}:{model}:ro -e SANDBOX_VLLM_LOAD_S={load_s} "
        f"-e SANDBOX_VLLM_WEIGHTS_GIB={weights_gib} -e SANDBOX_VLLM_GRAPHS_GIB=1 {sandbox.images['vllm']} "
        f"vllm serve {model} --kv-cache-memory-bytes {kv_gib * GIB} --gpu-memory-utilization 0.05"))
    assert code == 0, err or out


def engine_state(sandbox) -> tuple[str, str]:
    """(status, logs) of the test engine on the rank."""
    status = sandbox.run(RANK, f"docker inspect -f '{{{{.State.Status}}}} {{{{.State.ExitCode}}}}' {NAME}")[1].strip()
    return status, sandbox.run(RANK, f"docker logs {NAME} 2>&1")[1]


def test_a_loading_engine_grows_in_the_ranks_meminfo_and_is_freed_when_killed(sandbox, rank):
    base = meminfo.read(rank, RANK)
    start_engine(sandbox, weights_gib=20, kv_gib=10, load_s=6)
    samples = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        fields = meminfo.read(rank, RANK)
        samples.append((fields["AnonPages"] - base["AnonPages"], fields["Cached"] - base["Cached"]))
        if samples[-1][0] >= 31 * KB_PER_GIB:
            break
        time.sleep(0.2)
    held = [h for h, _ in samples]
    assert held == sorted(held) and len({h for h in held if h}) >= 5, held  # over time, in steps
    assert held[-1] == 31 * KB_PER_GIB, engine_state(sandbox)  # weights, KV pool, graphs
    assert samples[-1][1] >= 20 * KB_PER_GIB  # the page cache of the weights it read
    assert engine_state(sandbox)[0] == "running 0"
    code, _, err = sandbox.run(RANK, f"docker kill {NAME}")
    assert code == 0, err
    freed = meminfo.wait_for(rank, RANK, lambda f: f["AnonPages"] == base["AnonPages"])
    assert freed["AnonPages"] == base["AnonPages"]  # the kernel freed the dead engine's memory


def test_a_load_whose_page_cache_eats_memfree_dies_with_nv_err_no_memory(sandbox, rank):
    """50 GiB of weights read and held, then a 30 GiB KV pool: with the page cache of the read
    still there it does not fit in MemFree, as on a GB10 streaming weights over NFS."""
    start_engine(sandbox, weights_gib=50, kv_gib=30, load_s=4)
    deadline = time.monotonic() + 60
    while engine_state(sandbox)[0].startswith("running") and time.monotonic() < deadline:
        time.sleep(0.5)
    status, logs = engine_state(sandbox)
    assert status == "exited 1", logs
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 30.00 GiB." in logs
    assert "NV_ERR_NO_MEMORY" in logs


def test_the_same_load_lives_when_caches_are_dropped_while_it_loads(sandbox, rank):
    stop = threading.Event()

    def drop_loop():  # what a load-time watcher does below its MemFree floor
        while not stop.is_set():
            sandbox.run(RANK, node_settings.DROP_CACHES_COMMAND)
            stop.wait(0.2)

    since = time.time()
    dropper = threading.Thread(target=drop_loop, daemon=True)
    dropper.start()
    try:
        start_engine(sandbox, weights_gib=50, kv_gib=30, load_s=4)
        loaded = meminfo.wait_for(rank, RANK, lambda f: f["AnonPages"] >= 81 * KB_PER_GIB, timeout=60)
    finally:
        stop.set()
        dropper.join()
    deadline = time.monotonic() + 30
    status, logs = engine_state(sandbox)
    while "Uvicorn running" not in logs and status == "running 0" and time.monotonic() < deadline:
        time.sleep(0.3)
        status, logs = engine_state(sandbox)
    assert status == "running 0", logs
    assert loaded["AnonPages"] >= 81 * KB_PER_GIB
    assert "Model loading took 81.00 GiB" in logs and "Uvicorn running" in logs  # the API opened
    assert any(e[1:] == ("drop_caches", "3") for e in meminfo.events(rank, RANK, since))
