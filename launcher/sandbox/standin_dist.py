"""SANDBOX STAND-IN helper: what torch.distributed / NCCL / Gloo do at start across the ranks.

TODO: PLACEHOLDER, replaced by the lead's implementation at merge. It implements only the
single-rank case (nothing to connect); every multi-rank call is refused, so nothing in this branch
can pass for a cluster that never formed. Standard library only: it is installed beside the
stand-ins in the sandbox's serving image (site-packages/standin_dist.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping


def form_cluster(*, node_rank: int, nnodes: int, master_addr: str, master_port: int,
                 env: Mapping[str, str], timeout_s: float, stop: threading.Event,
                 log: Callable[[str], None]) -> str | None:
    """What torch.distributed / NCCL / Gloo do at start across `nnodes` ranks, over the real
    network: returns None when every connection the real stack makes succeeded, else the real
    stack's error message naming the pair. nnodes == 1 returns None at once."""
    if nnodes == 1:
        return None
    return (f"standin_dist placeholder: rank {node_rank} of {nnodes} cannot reach "
            f"{master_addr}:{master_port}: multi-rank rendezvous is not implemented in this build")
