"""How far each rank's engine has read its checkpoint, against the cold-load estimate (issue 15).
`up` (while it waits for the API) and `wait` say it every INTERVAL_S.

The counter: the engine's processes' `read_bytes` in /proc/<pid>/io, summed over the serving
container's processes (vLLM's API server and its workers are separate processes). It is the
right one for the real engine because vLLM reads safetensors through mmap (safe_open, then
get_tensor per tensor): its page faults fetch the pages, which the kernel counts in read_bytes
for NFS (nfs_readahead / nfs_read_folio account them) and for a local disk (submit_bio) alike.
`rchar` counts only read()/pread() syscalls, so it stays near zero for an mmap loader; the
container's cgroup io.stat (blkio) counts block devices only, so it misses every NFS byte.
read_bytes counts what was fetched, not what the page cache already held: after `up` dropped the
caches that is the cold load, which is what the estimate is about. It is read from inside the
container (`docker exec`: root there, the engine's own uid) so it needs no sudo on the rank.
"""

from __future__ import annotations

import re
import time

from ..facts import load_path
from ..gather import probe
from ..plan.cluster_plan import CONTAINER_NAME

INTERVAL_S = 10.0
# every process of the serving container; `sh` and `cat` themselves read next to nothing
COMMAND = f"docker exec {CONTAINER_NAME} sh -c 'cat /proc/[0-9]*/io 2>/dev/null'"
_READ_BYTES = re.compile(r"^read_bytes:\s*(\d+)\s*$", re.M)


def parse(stdout: str) -> int | None:
    """The sum of the read_bytes lines; None when there are none (no container, no counters)."""
    found = _READ_BYTES.findall(stdout or "")
    return sum(map(int, found)) if found else None


def read_so_far(group) -> dict[int, int | None]:
    """Per rank, the bytes its engine has read (None: not readable now)."""
    results = group.run(COMMAND, timeout=15).results
    return {r.target.rank: parse(r.stdout) if r.ok else None for r in results}


def estimates(loaded, group) -> dict[int, load_path.LoadPath]:
    """Each rank's read path and cold-load estimate, from a fresh probe (for `wait`, which has no
    plan at hand); the ranks whose probe failed are left out."""
    nfs = loaded.cluster.model.nfs
    return load_path.for_ranks(probe.facts_of(probe.gather(group, loaded)), nfs.server if nfs else None)


def describe(read: dict[int, int | None], paths: dict[int, load_path.LoadPath], elapsed: float) -> str:
    """One line: each rank's bytes read of the bytes it will read, and the time against the estimate."""
    parts = []
    for r in sorted(read):
        got, p = read[r], paths.get(r)
        if got is None:
            parts.append(f"rank {r} ?")
        elif p and p.bytes:
            parts.append(f"rank {r} {min(got, p.bytes) / 1e9:.2f} GB ({min(100, got * 100 // p.bytes)}%)")
        else:
            parts.append(f"rank {r} {got / 1e9:.2f} GB")
    total = max((p.bytes for p in paths.values()), default=0)
    slowest = max((p.seconds for p in paths.values() if p.seconds), default=None)
    of = f" of {total / 1e9:.2f} GB each" if total else ""
    when = f"; {load_path.minutes(elapsed)} of the ~{load_path.minutes(slowest)} cold-load estimate" \
        if slowest else f"; {load_path.minutes(elapsed)} so far (no estimate)"
    return f"  checkpoint read (engine read_bytes): {', '.join(parts)}{of}{when}"


class Progress:
    """A `watch` for api.wait_ready: every INTERVAL_S, one progress line until every rank has
    read what it will read."""

    def __init__(self, group, paths: dict[int, load_path.LoadPath], say, interval: float = INTERVAL_S):
        self.group, self.paths, self.say, self.interval = group, paths, say, interval
        self.started = time.monotonic()
        self.next = self.started + interval
        self.done = False

    def __call__(self) -> None:
        now = time.monotonic()
        if self.done or now < self.next:
            return
        self.next = now + self.interval
        read = read_so_far(self.group)
        self.say(describe(read, self.paths, now - self.started))
        self.done = bool(self.paths) and all(
            read.get(r) is not None and read[r] >= p.bytes for r, p in self.paths.items())


def extended(paths: dict[int, load_path.LoadPath], configured: float) -> str | None:
    """What `up` says when the estimate makes it wait longer than --timeout; None when it does not."""
    waits = load_path.wait_timeout(paths, configured)
    if waits <= configured:
        return None
    r, p = max(((r, p) for r, p in paths.items() if p.seconds), key=lambda rp: rp[1].seconds)
    return (f"waiting up to {load_path.minutes(waits)} for the API (not --timeout's {configured:.0f} s): "
            f"the cold-load estimate of rank {r}, {p.describe()}, times {load_path.MARGIN:g}")
