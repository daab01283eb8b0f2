#!/usr/bin/env python3
"""Cold-load estimates for the seeds' checkpoints on real Sparks, with the arithmetic, by the
same figures `check`'s load row uses (launcher/facts/load_path.py): every rank reads the whole
checkpoint; NFS at LINE_EFFICIENCY of the port's line rate, the local NVMe at LOCAL_DISK_BYTES_S.

    python scripts/load_estimate.py [GB ...]     (default: 258 308, the seeds' range, issue 15)

The ranks share the NFS server's port, taken as fast as theirs: four ranks on one 10G port get
a quarter of it each. scripts/bench_boot.py prints the same rows beside its sandbox figures."""

import sys

from launcher.facts.load_path import LINE_EFFICIENCY, LOCAL_DISK_BYTES_S, MARGIN, minutes

SEEDS_GB = (258.0, 308.0)
WAIT_S = 900  # `up --timeout`'s default


def paths() -> list[tuple[str, float, str]]:
    """(the read path, bytes/s per rank, how that rate is made)."""
    return [("NFS, server's 10G port, 4 ranks", 10_000 * 1e6 / 8 * LINE_EFFICIENCY / 4,
             f"10 Gb/s / 8 × {LINE_EFFICIENCY:g} / 4 ranks"),
            ("NFS, server's 200G port, 4 ranks", 200_000 * 1e6 / 8 * LINE_EFFICIENCY / 4,
             f"200 Gb/s / 8 × {LINE_EFFICIENCY:g} / 4 ranks"),
            ("local NVMe (staged)", LOCAL_DISK_BYTES_S, "assumed")]


def lines(sizes) -> list[str]:
    out = []
    for gb in sizes:
        out.append(f"checkpoint {gb:g} GB, read whole by every rank:")
        for what, rate, how in paths():
            seconds = gb * 1e9 / rate
            out.append(f"  {what:34s} {gb:g} GB / {rate / 1e9:.2f} GB/s ({how}) = {seconds:6.0f} s "
                       f"(~{minutes(seconds)}); `up` waits {max(WAIT_S, seconds * MARGIN):.0f} s")
    return out


def main(args: list[str]) -> None:
    print("\n".join(lines([float(a) for a in args] or SEEDS_GB)))


if __name__ == "__main__":
    main(sys.argv[1:])
