"""An upgrade's image load is capped while the old deploy serves: ship's per-rank stream keeps its
average under `bwlimit` (launcher/images/ship.py, Progress.count)."""

from __future__ import annotations

import time

from launcher.images.ship import Progress

MB = 1_000_000


def moved_in(bwlimit: int) -> float:
    chunks = [b"x" * MB] * 6
    started = time.monotonic()
    assert sum(map(len, Progress("rank 0 (spark1)", lambda: 6 * MB, lambda line: None, bwlimit).count(chunks))) == 6 * MB
    return time.monotonic() - started


def test_the_load_stream_keeps_under_the_cap():
    assert moved_in(0) < 0.2  # uncapped: as fast as it comes
    assert 0.55 <= moved_in(10 * MB) < 1.5  # 6 MB at 10 MB/s: the last chunk is let through at 0.6 s
