"""The bench's arithmetic, pure: seed 000's decode rate, percentiles, vLLM's Prometheus text read
into sums, and the speculative-decoding counters (accepted tokens per step = 1 + Δaccepted / Δdrafts)."""

from __future__ import annotations

from dataclasses import dataclass

from ..transport.engine_metrics import ACCEPTED, DRAFTS
from ..transport.engine_metrics import parse as parse_prometheus  # noqa: F401  (the bench's reader)


def decode_rate(completion_tokens: int, wall_s: float, ttft_s: float | None) -> float | None:
    """The seeds' decode tok/s; None when there was no decode phase to time."""
    if ttft_s is None or completion_tokens < 2 or wall_s <= ttft_s:
        return None
    return completion_tokens / (wall_s - ttft_s)


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@dataclass(frozen=True)
class SpecCounters:
    accepted: float
    drafts: float

    @classmethod
    def from_metrics(cls, metrics: dict[str, float] | None) -> SpecCounters | None:
        if not metrics or ACCEPTED not in metrics or DRAFTS not in metrics:
            return None
        return cls(metrics[ACCEPTED], metrics[DRAFTS])


def spec_delta(before: SpecCounters | None, after: SpecCounters | None) -> SpecCounters | None:
    """The counters' growth over a cell; None if unknown or they went back (a server restart)."""
    if before is None or after is None:
        return None
    delta = SpecCounters(after.accepted - before.accepted, after.drafts - before.drafts)
    return None if delta.accepted < 0 or delta.drafts < 0 else delta


def accepted_per_step(deltas: list[SpecCounters | None]) -> float | None:
    """1 + Δaccepted / Δdrafts over the deltas (each step emits one token plus those accepted)."""
    known = [d for d in deltas if d is not None]
    drafts = sum(d.drafts for d in known)
    if not known or drafts <= 0:
        return None
    return 1 + sum(d.accepted for d in known) / drafts
