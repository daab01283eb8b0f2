"""The nccl row: the host NCCL build (nccl.host_lib) on every rank, the same everywhere.
"""

from __future__ import annotations

from ...facts.record import Facts
from ...status import Status
from . import row
from .case import Case, RankReport
from .drift import compare


@row("nccl", order=210, reads=("nccl_lib",))
def _check_nccl(inp: Case, r: int, f: Facts, rr: RankReport) -> None:
    """The host NCCL build (nccl.host_lib): on every rank, and the same build everywhere."""
    lib = inp.loaded.cluster.nccl.host_lib
    if not lib:
        rr.add("nccl", Status.PASS, "the image's own (nccl.host_lib not set)")
        return
    mine = f.nccl_lib
    if mine is None or not mine.present:
        rr.add("nccl", Status.FAIL, (mine.problem if mine else None) or f"{lib}: not looked for",
               f"install the same NCCL build at {lib} on every rank, or remove nccl.host_lib from cluster.yaml")
        return
    builds = {p: _build_text(_build(x.nccl_lib)) for p, x in inp.facts.items() if x.nccl_lib and x.nccl_lib.present}
    shown = f"{lib} ({mine.realpath}): {builds[r]}"
    odd, said = compare(builds, r)
    if odd:
        rr.add("nccl", Status.FAIL, f"{shown}: {said}",
               f"install the same NCCL build at {lib} on every rank (ranks with different builds "
               "cannot form one communicator)")
    elif mine.problem or mine.version is None:
        rr.add("nccl", Status.WARN, f"{shown}; {mine.problem or 'no NCCL version string in the file'}",
               f"is it an NCCL library? `strings {lib} | grep 'NCCL version'`")
    else:
        rr.add("nccl", Status.PASS, shown + (f", {said}" if said else ""))


def _build(lib) -> tuple[str | None, int | None]:
    return lib.version, lib.size


def _build_text(build: tuple[str | None, int | None]) -> str:
    version, size = build
    return f"NCCL {version or '(version unknown)'}, {size:,} B" if size is not None else f"NCCL {version}"
