"""The clock row: every rank's clock within CLOCK_TOLERANCE_S of the ranks' median.
"""

from __future__ import annotations

import statistics

from ...facts.record import Facts
from ...status import Status
from . import row
from .case import Case, RankReport


CLOCK_TOLERANCE_S = 1.0


@row("clock", order=250, reads=("clock",))
def _check_clock(inp: Case, r: int, f: Facts, rr: RankReport) -> None:
    offsets = {p: x.clock.offset for p, x in inp.facts.items() if x.clock.offset is not None}
    if r not in offsets:
        rr.add("clock", Status.WARN, "not measured", "re-run check")
        return
    median = statistics.median(offsets.values())
    delta, unc = offsets[r] - median, f.clock.uncertainty or 0.0
    shown = f"{delta:+.2f} s from the ranks' median (±{unc:.2f}; {offsets[r]:+.2f} s from this host)"
    if abs(delta) - unc > CLOCK_TOLERANCE_S:
        rr.add("clock", Status.FAIL, shown, "enable NTP on every rank: sudo timedatectl set-ntp true")
    else:
        rr.add("clock", Status.PASS, shown)
