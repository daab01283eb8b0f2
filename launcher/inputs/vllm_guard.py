"""vLLM 0.33's startup memory guard, and the --gpu-memory-utilization that clears it.

Every vLLM worker, after NCCL and cuBLAS are initialised and whether or not
--kv-cache-memory-bytes is given, runs `request_memory` (vllm/v1/worker/utils.py):

    requested = ceil(total × gpu_memory_utilization)          # default utilisation 0.92
    if free < requested:
        raise ValueError(f"Free memory on device {device} ({free_gib}/{total_gib} GiB) on startup "
                         f"is less than desired GPU memory utilization ({util}, {requested_gib} GiB). "
                         "Decrease GPU memory utilization or reduce GPU memory used by other processes.")

(GiB figures are `round(bytes / 2**30, 2)`.) On a GB10's unified memory, total is /proc/meminfo's
MemTotal and free is MemAvailable less what the worker already holds when it measures (~14 GiB
of CUDA/NCCL state: the config's runtime_overhead_gib). With the KV cache sized explicitly the
utilisation does nothing else, so the plan passes the highest 2-decimal value that leaves a
margin below the guard on every rank:

    utilisation ≤ (MemAvailable − runtime overhead) / MemTotal − margin

Pure and stdlib-only, so the sandbox's stand-in vLLM can mirror `requested_memory` and `refusal`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

DEFAULT_UTILIZATION = 0.92  # vLLM 0.33's CacheConfig.gpu_memory_utilization
MARGIN = 0.02  # below the guard: MemAvailable moves between `check` and the worker's measurement
GIB = 1 << 30


def requested_memory(total: int, utilization: float) -> int:
    """The bytes vLLM wants free at start: ceil(total × utilisation)."""
    return math.ceil(total * utilization)


def refusal(free: int, total: int, utilization: float, device: str = "cuda:0") -> str | None:
    """vLLM's ValueError text when the guard refuses to start, else None."""
    requested = requested_memory(total, utilization)
    if free >= requested:
        return None
    return (f"Free memory on device {device} ({_gib(free)}/{_gib(total)} GiB) on startup is less "
            f"than desired GPU memory utilization ({utilization}, {_gib(requested)} GiB). Decrease "
            "GPU memory utilization or reduce GPU memory used by other processes.")


def highest_utilization(free: int, total: int, margin: float = MARGIN) -> float:
    """The largest utilisation, rounded down to 2 decimals, with free / total − margin above it
    (may be ≤ 0: nothing clears the guard)."""
    margin_bp = round(margin * 10_000)  # in basis points: integer arithmetic, no float drift
    return (free * 10_000 - margin_bp * total) // (total * 100) / 100


def _gib(n: int) -> float:
    return round(n / GIB, 2)


@dataclass(frozen=True)
class RankGuard:
    """The guard on one rank at the chosen utilisation."""

    rank: int
    mem_total: int
    mem_available: int
    runtime_overhead: int
    utilization: float
    margin: float

    @property
    def free(self) -> int:
        """What the worker sees free when it measures."""
        return max(0, self.mem_available - self.runtime_overhead)

    @property
    def need(self) -> int:
        return requested_memory(self.mem_total, self.utilization)

    @property
    def highest(self) -> float:
        return highest_utilization(self.free, self.mem_total, self.margin)

    @property
    def refusal(self) -> str | None:
        return refusal(self.free, self.mem_total, self.utilization)

    def explain(self) -> str:
        sign = "≥" if self.refusal is None else "<"
        return (f"free {self.free / GIB:.1f} GiB (MemAvailable {self.mem_available / GIB:.1f} − "
                f"runtime {self.runtime_overhead / GIB:.1f}) {sign} MemTotal "
                f"{self.mem_total / GIB:.1f} GiB × {self.utilization} = {self.need / GIB:.1f} GiB")

    def to_json(self) -> dict:
        return {"rank": self.rank, "mem_total": self.mem_total, "mem_available": self.mem_available,
                "runtime_overhead": self.runtime_overhead, "free": self.free, "need": self.need,
                "highest": self.highest, "refused": self.refusal is not None}


@dataclass(frozen=True)
class Guard:
    """The utilisation the plan passes, where it came from, and the guard on every rank."""

    utilization: float | None  # None: nothing clears the guard on some rank
    source: str  # "plan", "profile" or "config" (cluster.yaml overrides.engine_args)
    margin: float
    highest: float  # the most every rank clears with the margin
    ranks: tuple[RankGuard, ...]
    note: str = ""

    @property
    def refused(self) -> list[RankGuard]:
        return [g for g in self.ranks if g.refusal is not None]

    def to_json(self) -> dict:
        return {"gpu_memory_utilization": self.utilization, "source": self.source,
                "margin": self.margin, "highest": self.highest, "note": self.note,
                "ranks": [g.to_json() for g in self.ranks]}


def choose(memory: dict[int, tuple[int, int]], runtime_overhead: int, margin: float = MARGIN,
           given: float | None = None, given_by: str = "plan", profile: str = "") -> Guard:
    """The utilisation for ranks with `memory` (rank -> (MemTotal, MemAvailable)).

    A value from the config (`given_by` "config") is the user's: kept as written, even when a
    rank would refuse it (`check` fails that rank). A profile's value is kept when every rank
    clears it with the margin, else lowered to the highest that does, saying why. Otherwise the
    highest that clears every rank with the margin."""
    def at(u: float) -> tuple[RankGuard, ...]:
        return tuple(RankGuard(r, t, a, runtime_overhead, u, margin) for r, (t, a) in sorted(memory.items()))

    at_default = at(DEFAULT_UTILIZATION)  # a rank's `highest` does not depend on the utilisation
    tightest = min(at_default, key=lambda g: g.highest)
    highest = tightest.highest
    why = (f"rank {tightest.rank}: (MemAvailable {tightest.mem_available / GIB:.1f} − runtime "
           f"{runtime_overhead / GIB:.1f}) / MemTotal {tightest.mem_total / GIB:.1f} GiB − margin "
           f"{margin} = {(tightest.free / tightest.mem_total - margin):.4f}")
    if given is not None and given_by == "config":
        guard = Guard(given, "config", margin, highest, at(given))
        if guard.refused:
            bad = ", ".join(str(g.rank) for g in guard.refused)
            use = f"use ≤ {highest}" if highest > 0 else "no value clears it: free memory first"
            return replace(guard, note=f"cluster.yaml's --gpu-memory-utilization {given} is refused "
                           f"by vLLM's guard on rank{'s' * (len(guard.refused) > 1)} {bad} (`check` "
                           f"fails, `up` starts nothing); {use} ({why})")
        return guard
    if given is not None and given <= highest:
        return Guard(given, given_by, margin, highest, at(given))
    if highest <= 0:
        return Guard(None, "plan", margin, highest, at_default,
                     f"no --gpu-memory-utilization clears vLLM's guard: {why}")
    note = (f"profile {profile}'s --gpu-memory-utilization {given} lowered to {highest}: {why}"
            if given is not None else "")
    return Guard(highest, "plan", margin, highest, at(highest), note)
