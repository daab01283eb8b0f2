"""One line of a rank's sampler (launcher/onrank/sampler.py) as a typed sample, and the fabric
rates between two of them: pure, tested as data (tests/facts_cases/rank_sample_*.json).

Units as the hardware gives them: /proc/meminfo in kB; `nvidia-smi --format=csv,nounits` in %,
MHz, W and degrees C ("[N/A]" / "[Not Supported]" where the GB10 has no figure); the InfiniBand
port counters `port_xmit_data` and `port_rcv_data` count 4-byte words (the IBA's PortXmitData /
PortRcvData "divided by 4"; mlx5 reports RoCE ports the same way), the others events.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .memory import Memory, parse_meminfo
from .parts import FactError

# ports/1/counters: the data counters and the link's error counters (IBA PortCounters)
DATA_WORDS = ("port_xmit_data", "port_rcv_data")
COUNTERS = DATA_WORDS + ("port_xmit_packets", "port_rcv_packets", "link_downed", "symbol_error",
                         "port_rcv_errors", "link_error_recovery", "port_xmit_discards")
# ports/1/hw_counters (mlx5): RoCE transport errors and retries that precede NCCL's failures
HW_COUNTERS = ("out_of_sequence", "local_ack_timeout_err", "packet_seq_err", "rnr_nak_retry_err",
               "implied_nak_seq_err", "roce_adp_retrans")
ERROR_COUNTERS = tuple(c for c in COUNTERS + HW_COUNTERS
                       if c not in DATA_WORDS and not c.endswith("_packets"))
WORD_BYTES = 4

NOT_MEASURED = "not measured"


@dataclass(frozen=True)
class Engine:
    """The engine container: Docker's state ("running", "exited", ..., "absent"), its memory
    (the cgroup's usage less inactive file pages, as `docker stats` shows it)."""

    state: str  # "unknown" when Docker could not be asked (error says why)
    container_id: str | None = None
    memory: int | None = None
    error: str | None = None

    @property
    def running(self) -> bool:
        return self.state == "running"


@dataclass(frozen=True)
class GpuReading:
    """nvidia-smi's utilization (%), SM clock (MHz), power (W), temperature (C); each None where
    the GPU has no figure; `not_measured` says why there is none at all (no nvidia-smi)."""

    utilization: float | None = None
    sm_clock_mhz: float | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    not_measured: str | None = None


@dataclass(frozen=True)
class RankSample:
    t: float  # s since the sampler started
    at: float  # the rank's unix time
    cpu_s: float  # the sampler's own CPU seconds so far
    memory: Memory | None
    memory_error: str | None
    engine: Engine
    gpu: GpuReading
    fabric: dict[str, dict[str, int]]  # hca -> counter name -> raw value
    guard: tuple[dict, ...]  # the memory guard's events since the last sample


def _number(record: dict, name: str) -> float:
    value = record.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise FactError(f"sampler line: no number {name!r}")
    return float(value)


def parse_engine(raw) -> Engine:
    if not isinstance(raw, dict):
        return Engine("unknown", error="no engine field")
    if "error" in raw:
        return Engine("unknown", error=str(raw["error"]))
    memory = raw.get("memory")
    inactive = raw.get("inactive_file")
    if isinstance(memory, int) and isinstance(inactive, int) and inactive <= memory:
        memory -= inactive
    return Engine(str(raw.get("state", "unknown")), raw.get("id"),
                  memory if isinstance(memory, int) else None)


def _gpu_value(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"
    return value if math.isfinite(value) else None


def parse_gpu_reading(raw) -> GpuReading:
    """`nvidia-smi --query-gpu=utilization.gpu,clocks.sm,power.draw,temperature.gpu
    --format=csv,noheader,nounits`'s line, or the sampler's reason there is none."""
    if not isinstance(raw, dict) or not isinstance(raw.get("line"), str):
        why = raw.get("error") if isinstance(raw, dict) else None
        return GpuReading(not_measured=f"{NOT_MEASURED} ({why})" if why else NOT_MEASURED)
    cols = [c.strip() for c in raw["line"].split(",")]
    if len(cols) != 4:
        return GpuReading(not_measured=f"{NOT_MEASURED} (nvidia-smi printed {raw['line'][:80]!r})")
    return GpuReading(*(_gpu_value(c) for c in cols))


def parse_fabric(raw) -> dict[str, dict[str, int]]:
    if not isinstance(raw, dict):
        return {}
    return {str(hca): {str(k): v for k, v in counters.items() if isinstance(v, int) and not isinstance(v, bool)}
            for hca, counters in sorted(raw.items()) if isinstance(counters, dict)}


def parse_rank_sample(record: dict) -> RankSample:
    """One JSON line of the sampler, decoded; FactError when it is not a sample."""
    if not isinstance(record, dict):
        raise FactError(f"sampler line: not a JSON object but {type(record).__name__}")
    memory, memory_error = None, None
    raw_mem = record.get("meminfo")
    if isinstance(raw_mem, str):
        try:
            memory = parse_meminfo(raw_mem)
        except FactError as e:
            memory_error = str(e)
    else:
        memory_error = str(raw_mem.get("error")) if isinstance(raw_mem, dict) else "no meminfo"
    guard = record.get("guard")
    return RankSample(_number(record, "t"), _number(record, "at"), _number(record, "cpu_s"),
                      memory, memory_error, parse_engine(record.get("engine")),
                      parse_gpu_reading(record.get("gpu")), parse_fabric(record.get("rdma")),
                      tuple(e for e in guard if isinstance(e, dict)) if isinstance(guard, list) else ())


@dataclass(frozen=True)
class FabricRate:
    """One HCA's bytes per second between two samples, and its error counters' increase."""

    transmit_bytes_s: float | None
    receive_bytes_s: float | None
    errors: dict[str, int]  # counter -> increase since the previous sample (only those that rose)


def data_bytes(counters: dict[str, int], name: str) -> int | None:
    """A data counter in bytes (the counter counts 4-byte words)."""
    value = counters.get(name)
    return None if value is None else value * WORD_BYTES


def fabric_rates(before: RankSample, after: RankSample) -> dict[str, FabricRate]:
    """Per HCA present in both samples. A counter that went back (a driver reload, a reset
    counter) gives no rate rather than a negative one."""
    dt = after.t - before.t
    out = {}
    for hca, now in after.fabric.items():
        then = before.fabric.get(hca)
        if then is None or dt <= 0:
            continue

        def rate(name: str) -> float | None:
            a, b = data_bytes(then, name), data_bytes(now, name)
            return None if a is None or b is None or b < a else (b - a) / dt

        rose = {c: now[c] - then[c] for c in ERROR_COUNTERS if c in now and c in then and now[c] > then[c]}
        out[hca] = FabricRate(rate("port_xmit_data"), rate("port_rcv_data"), rose)
    return out
