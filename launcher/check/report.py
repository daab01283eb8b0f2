"""`sparkstack check`: one row per rank and check, each pass / warn / fail with the measured
value and, for every non-pass, the fix in one line.

`evaluate` is pure: one gathered value in (launcher/gather/: the facts of all ranks, the loaded
config, the peers' ping answers, this host's inputs), the report out; it is what the tests feed
fixtures to. The rows are declared in launcher/check/rows/, one module per subject, and run in
their declared order; the plan's own figures they judge (the memory need, vLLM's guard, the KV
pool) come through `Case` (rows/case.py). `apply/preflight.run` gathers and calls it.

Rows a healthy sandbox shows as non-pass, honestly (tests/test_check.py documents them):
image (until the profile's chain is built and shipped), ulimits (warn: the host's hard limits
cap the ranks at nofile 20000 / memlock 8 MiB), roce (warn: the sandbox leaves each port's twin
unaddressed, so NCCL_IB_HCA leaves it out), driver, nvidia runtime and gpu clock (warn, "not
measured": a sandbox rank has no NVIDIA driver).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..errors import SparkstackError
from ..gather.value import Gathered
from ..plan.cluster_plan import Plan
from ..status import Status
from .rows import declared
from .rows.case import Case, RankReport

ORDER = tuple(d.name for d in declared() if not d.sometimes)  # the rows of every rank reached (api key: rank 0's)
OPTIONAL = ("bandwidth", "hashes")  # rows only on request, after the declared: `check --bandwidth`, `--deep`
SHOWN = (*(d.name for d in declared()), *OPTIONAL)  # the table's order


@dataclass
class Report:
    ranks: list[RankReport]
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not any(c.status == Status.FAIL for r in self.ranks for c in r.checks)

    def to_json(self) -> dict:
        return {"ok": self.ok, "ranks": [{"rank": r.rank, "host": r.host,
                                          "checks": [asdict(c) for c in r.checks]} for r in self.ranks]}


def evaluate(gathered: Gathered, plan: Plan | None = None) -> Report:
    """The whole table. An unreachable rank gets one failed `ssh` row; the cross-rank checks
    (image IDs, MTU, checkpoint fingerprint, clocks) compare the ranks that answered. `plan`: the
    plan made from `gathered` (`up` has it), whose figures the memory rows judge; by default
    made here."""
    inp = Case(gathered, plan)
    cluster = inp.loaded.cluster
    report = Report([])
    for r, rank in enumerate(cluster.ranks):
        g = gathered.ranks.get(r)
        rr = RankReport(r, rank.label)
        report.ranks.append(rr)
        if g is None or g.facts is None:
            rr.add("ssh", Status.FAIL, (g.error if g else "not probed") or "no answer",
                   f"check the rank is up and `ssh -p {rank.port} {rank.user}@{rank.address}` works")
            continue
        for d in declared():  # the folder's, in order (a row added since is judged too)
            d.judge(inp, r, g.facts, rr)
    return report


class CheckFailed(SparkstackError):
    """The preflight found failures; the message lists each with its rank and fix."""


def refuse(report: Report, tolerate: tuple[str, ...] = ("image",)) -> None:
    """What `up` does with its preflight's report: a failed row raises CheckFailed (nothing is
    started), each failure named with its rank and fix. Rows in `tolerate` do not stop it: by
    default the image, which `up` builds and ships after this."""
    failed = [(r, c) for r in report.ranks for c in r.checks if c.status == Status.FAIL and c.name not in tolerate]
    if failed:
        raise CheckFailed("check failed; nothing was started:\n" + "\n".join(
            f"rank {r.rank} ({r.host}) {c.name}: {c.value} -- fix: {c.fix}" for r, c in failed))
