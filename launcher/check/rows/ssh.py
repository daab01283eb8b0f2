"""The ssh row: the rank was reached and its probe answered. A rank that was not is one failed
ssh row and nothing else (launcher/check/report.py `evaluate`).
"""

from __future__ import annotations

from ...facts.record import Facts
from ...status import Status
from . import row
from .case import Case, RankReport


@row("ssh", order=10, reads=("probe",))
def _check_ssh(inp: Case, r: int, f: Facts, rr: RankReport) -> None:
    rank, g = inp.loaded.cluster.ranks[r], inp.gathered.ranks[r]
    rr.add("ssh", Status.PASS, f"{rank.user}@{rank.address}:{rank.port}, probe {g.seconds:.2f} s")
