"""Drift between ranks: a value every rank must share (driver, kernel, cx7 firmware, image, nccl).
`compare` fails the rank whose value differs from the majority's, naming the others' value; with
no majority, every rank. Shared by the rows that compare ranks (launcher/check/rows/).
"""

from __future__ import annotations

from collections import Counter

from ...facts.record import Facts
from ...status import Status
from .case import RankReport


def compare(values: dict[int, str], r: int) -> tuple[bool, str]:
    """Rank r's value among the measured ranks': (whether rank r is odd, what to say). With a
    majority (the most common value ahead of the next), the ranks that differ from it are odd,
    each named with the value the others have; with no majority (2 ranks, a tie) every rank is
    odd and each rank's value is listed: nothing says which side is right."""
    counts = Counter(values.values()).most_common()
    if len(counts) == 1:
        return False, "same on all ranks" if len(values) > 1 else ""
    if counts[0][1] > counts[1][1]:
        top = counts[0][0]
        same = [p for p, v in values.items() if v == top]
        if values[r] == top:
            odd = ", ".join(f"rank {p}" for p, v in sorted(values.items()) if v != top)
            return False, f"same on ranks {_ranks(same)} ({odd} differ)"
        return True, f"rank {r} has {values[r]}; ranks {_ranks(same)} have {top}"
    return True, "ranks differ: " + ", ".join(f"rank {p} {v}" for p, v in sorted(values.items()))


def _ranks(ranks) -> str:
    return ", ".join(str(p) for p in sorted(ranks))


def drift_row(rr: RankReport, name: str, values: dict[int, str], r: int, shown: str, fix: str) -> None:
    """A row that fails rank r when its value drifts from the others' (`compare`)."""
    odd, said = compare(values, r)
    if odd:
        rr.add(name, Status.FAIL, f"{shown}: {said}", fix)
    else:
        rr.add(name, Status.PASS, f"{shown}, {said}" if said else shown)


def not_measured(f: Facts, what: str) -> str:
    why = next((p for p in f.problems if p.startswith("nvidia-smi")), "nvidia-smi lists no GPU")
    return f"not measured: {why} (no {what} to compare)"


def short_id(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:12]
