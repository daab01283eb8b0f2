"""`sparkstack top`'s figures, from the same samples the exporter serves (sampling.py) and rank 0's
vLLM /metrics: per rank memory against the planned floor, GPU, fabric rates, the engine container
and the memory guard's events; for the cluster tokens/s, running and waiting requests, KV cache use
and accepted tokens per step. `view` is pure (tested as data); `Top` polls."""

from __future__ import annotations

import time
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from .exporter import GIB, engine_metrics_text
from .sampling import RankState, Sampling
from ..inputs.config import Loaded, cluster_name
from ..plan.monitoring import ACCEPTED, DRAFTS
from ..transport import api

GENERATED = "vllm:generation_tokens_total"
RUNNING, WAITING, KV = "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"


@dataclass(frozen=True)
class EngineReading:
    at: float  # monotonic
    sums: dict[str, float]  # sample name -> sum over its label sets


def engine_sums(text: str) -> dict[str, float]:
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.value == sample.value:  # not NaN
                sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


def _delta(before: EngineReading | None, after: EngineReading | None, name: str) -> float | None:
    if before is None or after is None or name not in before.sums or name not in after.sums:
        return None
    d = after.sums[name] - before.sums[name]
    return None if d < 0 else d  # a restarted engine: no rate this once


def cluster_view(before: EngineReading | None, after: EngineReading | None, why_not: str = "") -> dict:
    if after is None:
        return {"engine_metrics": why_not or "not read", "tokens_per_s": None, "running": None,
                "waiting": None, "kv_cache_usage": None, "accepted_per_step": None}
    generated = _delta(before, after, GENERATED)
    dt = after.at - before.at if before else 0
    accepted, drafts = _delta(before, after, ACCEPTED), _delta(before, after, DRAFTS)
    return {"engine_metrics": "ok",
            "tokens_per_s": generated / dt if generated is not None and dt > 0 else None,
            "running": after.sums.get(RUNNING), "waiting": after.sums.get(WAITING),
            "kv_cache_usage": after.sums.get(KV),
            "accepted_per_step": 1 + accepted / drafts if accepted is not None and drafts else None}


def rank_view(s: RankState, floor: int, now: float, stale_after: float) -> dict:
    base = {"rank": s.rank, "host": s.host, "floor_bytes": floor, "sampled": False, "error": s.error}
    age = s.age(now)
    if s.sample is None or age is None or age > stale_after:
        return base
    m, e, g = s.sample.memory, s.sample.engine, s.sample.gpu
    fabric = list(s.rates.values())
    return {**base, "sampled": True, "age_s": round(age, 2),
            "memory": None if m is None else {"total_bytes": m.total, "available_bytes": m.available,
                                              "page_cache_bytes": m.cached, "below_floor": m.available < floor},
            "engine": {"state": e.state, "memory_bytes": e.memory, "error": e.error},
            "gpu": {"not_measured": g.not_measured, "utilization_pct": g.utilization, "sm_clock_mhz": g.sm_clock_mhz,
                    "power_w": g.power_w, "temperature_c": g.temperature_c},
            "fabric": {"transmit_bytes_s": sum(r.transmit_bytes_s or 0 for r in fabric),
                       "receive_bytes_s": sum(r.receive_bytes_s or 0 for r in fabric),
                       "errors": {f"{hca} {c}": n for hca, r in s.rates.items() for c, n in r.errors.items()}},
            "guard_events": dict(s.guard_counts)}


def view(cluster: str, states: list[RankState], floor: int, now: float, stale_after: float,
         cluster_part: dict) -> dict:
    sampled = [s.sample.at for s in states if s.sample is not None]
    return {"cluster": cluster, "sampled_at": max(sampled) if sampled else None,
            "ranks": [rank_view(s, floor, now, stale_after) for s in states], "engine": cluster_part}


class Top:
    """Samples every rank (one SSH channel each) and reads rank 0's /metrics at each `read()`."""

    def __init__(self, loaded: Loaded, group, interval: float, fetch=None, clock=time.monotonic):
        self.loaded, self.interval, self.clock = loaded, interval, clock
        self.sampling = Sampling(loaded, group, interval)
        endpoint = api.endpoint(loaded)
        self.fetch = fetch or (lambda: engine_metrics_text(endpoint))
        self.floor = int(loaded.cluster.overrides.free_floor_gib * GIB)
        self.before: EngineReading | None = None

    def __enter__(self) -> "Top":
        self.sampling.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.sampling.close()

    def read(self) -> dict:
        why = ""
        try:
            after = EngineReading(self.clock(), engine_sums(self.fetch()))
        except Exception as e:  # noqa: BLE001 -- an engine that is down is a state to show
            after, why = None, f"rank 0's /metrics: {type(e).__name__}: {e}"
        part = cluster_view(self.before, after, why)
        self.before = after or self.before
        return view(cluster_name(self.loaded), self.sampling.snapshot(), self.floor, self.clock(),
                    3 * self.interval + 2, part)
