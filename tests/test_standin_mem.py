"""The sandbox's GB10 memory model (launcher/sandbox/standins/standin_mem.py, each rank's
`sandbox-meminfo` daemon), run here against temporary files: the computation, holders that die,
the page cache that reads fill and a drop empties; then the stand-in engine loading against it
(held memory growing, the page cache filling, NV_ERR_NO_MEMORY when the cache eats MemFree)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from launcher.facts.memory import parse_meminfo
from launcher.inputs import vllm_flags
from launcher.sandbox import meminfo
from launcher.sandbox.standins import standin_mem as mem
from standin_env import model_dir

GIB = 1 << 30
KB_PER_GIB = 1 << 20
STANDIN = Path(mem.__file__).with_name("standin_vllm.py")


@pytest.fixture
def rank(tmp_path):
    """A rank's files as the host lays them out, its vm sysctls, and a daemon object (stepped by
    hand: each step() is one pass of the real loop)."""
    rdir = tmp_path / "ranks" / "spark2"
    rdir.mkdir(parents=True)
    (rdir / "meminfo").write_text(meminfo.meminfo(1))
    meminfo.write_boot_state(rdir, 1)
    vm = tmp_path / "vm"
    vm.mkdir()
    for name in ("drop_caches", "compact_memory"):
        (vm / name).write_text("0\n")
    clock = iter(range(1_000_000, 2_000_000))
    daemon = mem.Daemon(str(rdir / "mem"), str(rdir / "meminfo"), str(vm), clock=lambda: next(clock))
    return daemon, tmp_path, vm


def shown(tmp_path) -> dict:
    return meminfo.read(tmp_path, "spark2")


def sysctl_write(vm: Path, name: str, value: str) -> None:
    """As `sysctl -w` writes: truncate, then the value (a new mtime even for the same value)."""
    path = vm / name
    before = path.stat().st_mtime_ns
    path.write_text(value + "\n")
    if path.stat().st_mtime_ns == before:  # a coarse clock: make the write visible
        os.utime(path, ns=(before + 1, before + 1))


def test_a_booted_rank_shows_the_gb10_figures_every_rank_its_own():
    for r in range(4):
        fields = mem.parse(meminfo.meminfo(r))
        assert fields["MemTotal"] == 127_600_000
        assert fields["MemFree"] == 127_600_000 - 3_900_000 - 150_000 * r - 2_100_000
        assert fields["MemAvailable"] == fields["MemFree"] + 2_100_000 - 250_000
        assert parse_meminfo(meminfo.meminfo(r)).total == 127_600_000 * 1024


def test_the_file_keeps_its_length_whatever_the_figures():
    """An in-place rewrite never leaves a stale tail for a reader of /proc/meminfo."""
    cfg = mem.boot_config(0)
    small = mem.render(mem.figures(cfg, 0, 0, 0))
    big = mem.render(mem.figures(cfg, 100 * KB_PER_GIB, 10 * KB_PER_GIB, 5_000))
    assert len(small) == len(big)


def test_page_cache_caps_at_free_memory_and_counts_as_available():
    cfg = mem.boot_config(0)
    cap = mem.cache_cap_kb(cfg, 60 * KB_PER_GIB, 0)
    fig = mem.figures(cfg, 60 * KB_PER_GIB, 0, cap)
    assert fig["MemFree"] == mem.LOW_WMARK_KB  # reads filled what was free
    assert fig["MemAvailable"] == fig["MemFree"] + cap - mem.LOW_WMARK_KB


def test_reads_fill_the_cache_and_a_drop_empties_it(rank):
    daemon, tmp, vm = rank
    before = daemon.step()
    mem.report_read(daemon.mem_dir, 50 * GIB)
    filled = daemon.step()
    assert filled["Cached"] == before["Cached"] + 50 * KB_PER_GIB
    assert filled["MemFree"] == before["MemFree"] - 50 * KB_PER_GIB
    assert shown(tmp)["MemFree"] == filled["MemFree"]  # what /proc/meminfo shows
    assert os.listdir(Path(daemon.mem_dir) / "reads") == []  # consumed once
    sysctl_write(vm, "drop_caches", "3")
    dropped = daemon.step()
    assert dropped["Cached"] == mem.DROP_RESIDUAL_KB
    assert dropped["MemFree"] > filled["MemFree"] + 50 * KB_PER_GIB
    assert dropped["MemAvailable"] > filled["MemAvailable"]
    assert meminfo.events(tmp, "spark2") == [(1_000_000.0, "drop_caches", "3")]


def test_drop_caches_2_and_compact_memory_are_logged_but_keep_the_page_cache(rank):
    daemon, tmp, vm = rank
    mem.report_read(daemon.mem_dir, 10 * GIB)
    filled = daemon.step()
    sysctl_write(vm, "drop_caches", "2")
    sysctl_write(vm, "compact_memory", "1")
    assert daemon.step()["Cached"] == filled["Cached"]
    assert [e[1:] for e in meminfo.events(tmp, "spark2")] == [("drop_caches", "2"), ("compact_memory", "1")]
    assert daemon.step()["Cached"] == filled["Cached"]  # no write, no new event
    assert len(meminfo.events(tmp, "spark2")) == 2


def test_a_write_caught_half_done_counts_once_it_is_whole(rank):
    daemon, tmp, vm = rank
    mem.report_read(daemon.mem_dir, 10 * GIB)
    daemon.step()
    (vm / "drop_caches").write_text("")  # sysctl's truncate, its write still to come
    os.utime(vm / "drop_caches", ns=(1, 1))
    daemon.step()
    assert meminfo.events(tmp, "spark2") == []
    sysctl_write(vm, "drop_caches", "1")
    assert daemon.step()["Cached"] == mem.DROP_RESIDUAL_KB
    assert [e[1:] for e in meminfo.events(tmp, "spark2")] == [("drop_caches", "1")]


def test_a_squeeze_takes_memory_and_the_page_cache_gives_way(rank):
    daemon, tmp, vm = rank
    mem.report_read(daemon.mem_dir, 200 * GIB)  # more than there is: the cache fills what is free
    full = daemon.step()
    assert full["MemFree"] == mem.LOW_WMARK_KB
    (Path(daemon.mem_dir) / "pinned").write_text(str(100 * GIB))
    squeezed = daemon.step()
    assert squeezed["Cached"] == full["Cached"] - 100 * KB_PER_GIB
    assert squeezed["MemAvailable"] == full["MemAvailable"] - 100 * KB_PER_GIB


def test_swap_figures_come_from_the_config(rank):
    daemon, tmp, vm = rank
    cfg = json.loads((Path(daemon.mem_dir) / "config.json").read_text())
    mem.write_atomically(str(Path(daemon.mem_dir) / "config.json"),
                         json.dumps({**cfg, "swap_total_kb": 8 * KB_PER_GIB, "swap_free_kb": 6 * KB_PER_GIB}))
    daemon.step()
    assert (shown(tmp)["SwapTotal"], shown(tmp)["SwapFree"]) == (8 * KB_PER_GIB, 6 * KB_PER_GIB)


HOLD = """
import sys, time
sys.path.insert(0, sys.argv[1])
import standin_mem
h = standin_mem.Holder(sys.argv[2], "test")
h.hold(int(sys.argv[3]))
print("held", flush=True)
time.sleep(60)
"""


def test_memory_a_process_holds_is_freed_when_it_dies(rank):
    """The holder keeps its file locked; killed (as `docker kill` kills an engine), the lock is
    gone and the daemon frees its memory and removes its file."""
    daemon, tmp, vm = rank
    before = daemon.step()
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(STANDIN.parent), daemon.mem_dir, str(30 * GIB)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "held\n"
        holding = daemon.step()
        assert holding["Held"] == 30 * KB_PER_GIB
        assert holding["MemFree"] == before["MemFree"] - 30 * KB_PER_GIB
        assert daemon.step()["Held"] == 30 * KB_PER_GIB  # still alive: still held
    finally:
        proc.kill()
        proc.wait()
    freed = daemon.step()
    assert freed["Held"] == 0 and freed["MemFree"] == before["MemFree"]
    assert os.listdir(Path(daemon.mem_dir) / "held") == []


# --- the stand-in engine loading against a running daemon --------------------------------------

@pytest.fixture
def running(rank):
    """The daemon's real loop in a thread (ten passes a second, as in a rank)."""
    daemon, tmp, vm = rank
    stop = threading.Event()

    def loop():
        while not stop.wait(mem.TICK_S):
            daemon.step()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    yield daemon, tmp, vm
    stop.set()
    thread.join()


def engine(tmp, daemon, weights_gib: float, kv: int, load_s: float, **env) -> subprocess.Popen:
    model = model_dir(tmp / "ckpt")
    return subprocess.Popen(
        [sys.executable, str(STANDIN), "serve", str(model), "--kv-cache-memory-bytes", str(kv),
         "--gpu-memory-utilization", "0.05", "--port", "0", "--host", "127.0.0.1"],
        env={**os.environ, "SANDBOX_VLLM_MEM_DIR": daemon.mem_dir, "SANDBOX_VLLM_MEMINFO": daemon.meminfo,
             "SANDBOX_VLLM_RECORD": str(tmp / "record.json"),
             "SANDBOX_VLLM_FLAGS": str(vllm_flags.FLAGS_FILE), "SANDBOX_VLLM_HELD_GIB": "0", "SANDBOX_VLLM_LOAD_S": str(load_s),
             "SANDBOX_VLLM_WEIGHTS_GIB": str(weights_gib), "SANDBOX_VLLM_GRAPHS_GIB": "1", **env},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def test_a_loading_engine_holds_more_and_more_and_fills_the_page_cache(running):
    daemon, tmp, vm = running
    before = shown(tmp)
    proc = engine(tmp, daemon, 20, 10 * GIB, load_s=3)
    samples = []
    try:
        while proc.poll() is None and len(samples) < 200:
            fields = shown(tmp)
            samples.append((fields["AnonPages"], fields["Cached"]))
            if fields["AnonPages"] - before["AnonPages"] >= 31 * KB_PER_GIB:
                break
            time.sleep(0.05)
        held = [a - before["AnonPages"] for a, _ in samples]
        assert held == sorted(held) and len(set(held)) >= 5, held  # grows in steps, over time
        assert held[-1] == 31 * KB_PER_GIB  # weights, KV pool, graphs
        assert samples[-1][1] >= before["Cached"] + 20 * KB_PER_GIB  # the checkpoint it read
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
    freed = meminfo.wait_for(tmp, "spark2", lambda f: f["AnonPages"] == before["AnonPages"])
    assert freed["AnonPages"] == before["AnonPages"]


def test_a_load_whose_page_cache_eats_memfree_dies_with_nv_err_no_memory(running):
    """50 GiB of weights read (cache) and held, then a 30 GiB KV pool: 130 GiB on a 121.7 GiB
    box. MemAvailable would say yes; MemFree says no, and that is what the GPU needs."""
    daemon, tmp, vm = running
    proc = engine(tmp, daemon, 50, 30 * GIB, load_s=2)
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 1, err
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 30.00 GiB." in err
    assert "NV_ERR_NO_MEMORY" in err
    freed = meminfo.wait_for(tmp, "spark2", lambda f: f["AnonPages"] < 2 * KB_PER_GIB)
    assert freed["AnonPages"] < 2 * KB_PER_GIB  # its memory went with it


def test_the_same_load_survives_when_caches_are_dropped_while_it_loads(running):
    daemon, tmp, vm = running
    proc = engine(tmp, daemon, 50, 30 * GIB, load_s=2)
    try:
        while proc.poll() is None and not (tmp / "record.json").exists():
            time.sleep(0.05)
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            sysctl_write(vm, "drop_caches", "3")  # what a watcher does below its floor
            if shown(tmp)["AnonPages"] >= 81 * KB_PER_GIB:
                break
            time.sleep(0.15)
        assert proc.poll() is None, proc.stderr.read()
        assert shown(tmp)["AnonPages"] >= 81 * KB_PER_GIB
        assert any(e[1:] == ("drop_caches", "3") for e in meminfo.events(tmp, "spark2"))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
