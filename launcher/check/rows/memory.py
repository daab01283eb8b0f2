"""The memory rows: MemAvailable against the plan's need, vLLM's startup guard at the plan's
utilisation, what stays free while serving (the plan's KV pool), swap.
"""

from __future__ import annotations

from ...errors import SparkstackError
from ...facts.record import Facts
from ...inputs.config import no_swap
from ...plan import cluster_plan as planning
from ...plan.kv import GIB, gib
from ...status import Status
from . import row
from .case import Case, RankReport


# vLLM's startup guard counts page cache as used (docs/architecture.md, "The GB10's memory")
PAGE_CACHE_WARN = 8 * GIB
SWAP_USED_WARN = 256 << 20


@row("memory", order=90, reads=("memory",))
def _check_memory(inp: Case, r: int, f: Facts, rr: RankReport) -> None:
    if f.memory is None:
        rr.add("memory", Status.FAIL, "/proc/meminfo unreadable", "check the rank's /proc")
        return
    if inp.need is None:
        rr.add("memory", Status.FAIL, f"MemAvailable {gib(f.memory.available)}; the plan's need is "
               f"unknown: {inp.need_error}", "fix the config or profile (see `sparkstack plan`)")
        return
    avail, need = f.memory.available, inp.need
    shown = f"MemAvailable {gib(avail)}, needs {gib(need.total)} = {need.explain()}"
    largest = max(x.memory.available for x in inp.facts.values() if x.memory)
    if avail < need.total:
        rr.add("memory", Status.FAIL, shown.replace(", needs", " < needs"),
               "sparkstack prep (drops page caches); stop what else holds memory "
               "(`docker ps`, `ps aux --sort=-rss | head`); or lower --max-model-len / headroom_gib")
    elif f.memory.cached > PAGE_CACHE_WARN:
        rr.add("memory", Status.WARN, f"{shown}; {gib(f.memory.cached)} is page cache, which vLLM "
               "counts as used", "sparkstack prep (drops page caches)")
    elif largest - avail > need.headroom:
        rr.add("memory", Status.WARN, f"{shown}; {gib(largest - avail)} less than the fullest rank: "
               "every rank's KV cache is sized to this one", "free memory on this rank "
               "(`ps aux --sort=-rss | head`), then sparkstack prep")
    else:
        rr.add("memory", Status.PASS, f"{shown}; margin {gib(avail - need.total)}")


@row("vllm guard", order=100, reads=("memory",))
def _check_vllm_guard(inp: Case, r: int, f: Facts, rr: RankReport) -> None:
    """vLLM refuses to start when free memory < MemTotal × --gpu-memory-utilization
    (launcher/inputs/vllm_guard.py); the fix names the utilisation every rank clears with the margin."""
    name, engine = "vllm guard", inp.loaded.profile.engine
    if engine != "vllm":
        rr.add(name, Status.PASS, f"not vLLM ({engine}): no startup memory guard")
        return
    if f.memory is None:
        rr.add(name, Status.FAIL, "/proc/meminfo unreadable", "check the rank's /proc")
        return
    try:
        guard = inp.guard()
    except SparkstackError as e:
        rr.add(name, Status.FAIL, e.message, "fix the config or profile (see `sparkstack plan`)")
        return
    g = next(x for x in guard.ranks if x.rank == r)
    free_more = ("free memory on this rank: sparkstack prep (drops page caches), stop what else "
                 "holds memory (`ps aux --sort=-rss | head`)")
    if g.highest <= 0:
        rr.add(name, Status.FAIL, f"no --gpu-memory-utilization clears vLLM's guard: free {gib(g.free)} "
               f"(MemAvailable {gib(g.mem_available)} − runtime {gib(g.runtime_overhead)}) of "
               f"MemTotal {gib(g.mem_total)}", free_more)
        return
    util, whose = guard.utilization, {"plan": "planned", "profile": "the profile's",
                                      "config": "cluster.yaml's"}[guard.source]
    if util is None:  # another rank clears nothing: its row fails
        rr.add(name, Status.PASS, f"clears up to {g.highest} with margin {g.margin}")
        return
    shown = f"--gpu-memory-utilization {util} ({whose}): {g.explain()}"
    use = (f"set --gpu-memory-utilization {guard.highest} or less in cluster.yaml "
           "overrides.engine_args (or drop it: the plan picks one)")
    if g.refusal:
        rr.add(name, Status.FAIL, f"{shown}; vLLM refuses: ValueError: {g.refusal}",
               use if guard.highest > 0 else free_more)
    elif util > g.highest:
        rr.add(name, Status.WARN, f"{shown}; less than the margin {g.margin} to spare: MemAvailable "
               "moves before the worker measures", use)
    else:
        rr.add(name, Status.PASS, f"{shown}; clears up to {g.highest} with margin {g.margin}")


@row("free while serving", order=110, reads=("memory",))
def _check_free_while_serving(inp: Case, r: int, f: Facts, rr: RankReport) -> None:
    """The memory this rank keeps free once the engine holds its weights, runtime and KV pool,
    from its measured MemAvailable (plan shows the same from the config's figures): the seeds
    keep ~9-15 GB free on every Spark; below overrides.free_floor_gib a GB10 freezes, not OOMs."""
    name, floor = "free while serving", int(inp.loaded.cluster.overrides.free_floor_gib * GIB)
    if f.memory is None or inp.need is None:
        why = "/proc/meminfo unreadable" if f.memory is None else f"the plan's need is unknown: {inp.need_error}"
        rr.add(name, Status.FAIL, why, "fix the memory row first")
        return
    sizing = inp.kv()
    if isinstance(sizing, str):
        rr.add(name, Status.FAIL, f"no KV pool fits: {sizing}", "see `sparkstack plan`")
        return
    free = sizing.free_while_serving(f.memory.available)
    shown = f"{gib(free)} = {planning.explain_free(sizing, f.memory.available)}"
    if free < floor:
        rr.add(name, Status.FAIL, f"{shown} < overrides.free_floor_gib {gib(floor)}",
               planning.free_floor_fix(inp.loaded))
    else:
        rr.add(name, Status.PASS, f"{shown}; floor {gib(floor)} (the seeds keep ~9-15 GB)")


@row("swap", order=120, reads=("memory",))
def _check_swap(inp: Case, r: int, f: Facts, rr: RankReport) -> None:
    m = f.memory
    if m is None or m.swap_total == 0:
        rr.add("swap", Status.PASS, "none")
        return
    used = m.swap_total - m.swap_free
    if no_swap(inp.loaded):
        where = ("overrides.no_swap" if inp.loaded.cluster.overrides.no_swap is not None
                 else f"profile {inp.loaded.profile.name}")
        rr.add("swap", Status.FAIL, f"{gib(m.swap_total)} on ({gib(used)} used); {where} says no swap",
               "`sparkstack prep` turns it off (swapoff -a, swap lines of /etc/fstab commented out), "
               "or the Ansible role spark_node")
        return
    if used > SWAP_USED_WARN:
        rr.add("swap", Status.WARN, f"{gib(used)} of {gib(m.swap_total)} swapped out: memory was squeezed",
               "find what pushed it out (`ps aux --sort=-rss`); `sudo swapoff -a && sudo swapon -a` empties it")
    else:
        rr.add("swap", Status.PASS, f"{gib(m.swap_total)}, {gib(used)} used")
