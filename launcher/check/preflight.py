"""The whole `sparkstack check`: connect, gather (launcher/gather/), judge (report.evaluate), and
on request the measurements that are rows of their own: the NCCL all-reduce (bandwidth) and the
checkpoint's hashes (hashes), over the same open Group.
"""

from __future__ import annotations

import time

from ..gather import cluster, probe
from ..gather.value import Gathered
from ..inputs.config import Loaded
from .report import Report, evaluate


def add_bandwidth(report: Report, inp: Gathered, group) -> None:
    """`check --bandwidth`: one more row per rank that answered, an NCCL all-reduce across all
    ranks in the serving image (launcher/check/bandwidth.py), over the same open Group."""
    from . import bandwidth

    found = bandwidth.check(inp.loaded, group, image=inp.known_image, facts=inp.facts,
                            image_error=inp.image_error).findings
    for rr in report.ranks:
        if rr.rank in found:
            f = found[rr.rank]
            rr.add(f.name, f.status, f.value, f.fix)


def add_hashes(report: Report, inp: Gathered, group) -> None:
    """`check --deep`: every rank hashes its checkpoint files (launcher/check/hashes.py)."""
    from . import hashes

    found = hashes.verify(inp.loaded, group, inp.facts)
    for rr in report.ranks:
        if rr.rank in found:
            f = found[rr.rank]
            rr.add(f.name, f.status, f.value, f.fix)


def run(loaded: Loaded, *, trust_new: bool = False, image: str | None = None, say=None,
        bandwidth: bool = False, deep: bool = False) -> Report:
    """The whole `check`: connect (one attempt each, the config's connect timeout), gather,
    evaluate; with `bandwidth`, the all-reduce row too; with `deep`, the checkpoint's hashes."""
    started = time.monotonic()
    with probe.open_group(loaded, trust_new=trust_new, say=say) as group:
        inp = cluster.gather(loaded, group, image)
        report = evaluate(inp)
        if bandwidth:
            add_bandwidth(report, inp, group)
        if deep:
            add_hashes(report, inp, group)
    report.seconds = time.monotonic() - started
    return report
