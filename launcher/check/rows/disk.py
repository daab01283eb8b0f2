"""The disk row: room under Docker's root for the image and a new chain stage.
"""

from __future__ import annotations

from ...facts.record import Facts
from ...plan.kv import GIB, gib
from ...status import Status
from . import row
from .case import Case, RankReport


DISK_FLOOR = 20 * GIB  # room for a new chain stage and the logs, beyond any image


@row("disk", order=240, reads=("docker",))
def _check_disk(inp: Case, r: int, f: Facts, rr: RankReport) -> None:
    d = f.docker
    if d is None or d.storage_avail is None:
        rr.add("disk", Status.WARN, "Docker's storage not readable", "fix the docker row first")
        return
    sizes = [img.size for x in inp.facts.values() if x.docker and inp.image
             for img in [x.docker.image(inp.image)] if img and img.size]
    missing = inp.image and d.image(inp.image) is None
    need = (max(sizes) if sizes and missing else 0)
    shown = f"{d.root_dir}: {gib(d.storage_avail)} free" + (f", image needs up to {gib(need)}" if need else "")
    if d.storage_avail < need:
        rr.add("disk", Status.FAIL, shown, f"free space under {d.root_dir} (`docker image prune`)")
    elif d.storage_avail < need + DISK_FLOOR:
        rr.add("disk", Status.WARN, shown, f"keep {gib(DISK_FLOOR)} free beyond the images (`docker image prune`)")
    else:
        rr.add("disk", Status.PASS, shown)
