"""The kernel row: the same kernel and page size on every rank.
"""

from __future__ import annotations

from ...facts.record import Facts
from . import row
from .case import Case, RankReport
from .drift import drift_row


@row("kernel", order=80, reads=("kernel", "page_size"))
def _check_kernel(inp: Case, r: int, f: Facts, rr: RankReport) -> None:
    """The kernel and its page size: the same everywhere (a 64k-page kernel beside 4k ones, or
    another kernel's RDMA and NVIDIA modules, are what an update on one box brings)."""
    values = {p: _kernel_text(x) for p, x in inp.facts.items()}
    drift_row(rr, "kernel", values, r, _kernel_text(f),
               "boot every rank into the same kernel (`uname -r`; DGX OS: `sudo apt full-upgrade`, "
               "then reboot each): a 64k-page kernel does not mix with 4k ones")


def _kernel_text(f: Facts) -> str:
    page = f"{f.page_size // 1024} KiB pages" if f.page_size else "page size unknown"
    return f"{f.kernel or '?'}, {page}"
