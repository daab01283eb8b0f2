"""THE status vocabulary: what every command reports for a check row, a rank's part of an action
or a whole run, one enum instead of a set of strings per module; and THE verdict type, `Finding`
(a check row, a fabric finding, a bandwidth or a hashes result alike).

A `StrEnum`: each member is its plain string (`Status.PASS == "pass"`, `json.dumps` and f-strings
give "pass"), so JSON output and comparisons with strings read back from it stay as they were.
Top level, beside errors.py, because facts/ (fabric's findings) needs it and sits beneath
transport/; the per-rank result that goes with it is launcher.transport.outcome.RankOutcome.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Status(StrEnum):
    # a check row's verdict (check, check --bandwidth, fabric's findings)
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    # a rank's part of an action (ship, build --on-ranks)
    PLANNED = "planned"
    SHIPPED = "shipped"
    BUILT = "built"
    UP_TO_DATE = "up-to-date"
    FAILED = "failed"
    # a whole run (bench)
    RUNNING = "running"
    COMPLETE = "complete"
    INTERRUPTED = "interrupted"


@dataclass(frozen=True)
class Finding:
    """One verdict: what was judged (a check row's name), pass / warn / fail, the measured value,
    and for a non-pass the fix in one line. `check --json` writes each as these four fields."""

    name: str
    status: Status
    value: str
    fix: str = ""
