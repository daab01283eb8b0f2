#!/usr/bin/env python3
"""Cold-load estimates for the seeds' checkpoints on real Sparks, with the arithmetic, by the
same figures `check`'s load row uses (launcher/facts/load_path.py): every rank reads the whole
checkpoint; NFS at LINE_EFFICIENCY of the port's line rate, the local NVMe at LOCAL_DISK_BYTES_S.

    python scripts/load_estimate.py [GB ...]     (default: 258 308, the seeds' range, issue 15)

The ranks share the NFS server's port, taken as fast as theirs: four ranks on one 10G port get
a quarter of it each."""

import sys

from launcher.facts.load_path import LINE_EFFICIENCY, LOCAL_DISK_BYTES_S, MARGIN, minutes


def main(args: list[str]) -> None:
    sizes = [float(a) for a in args] or [258.0, 308.0]
    paths = [("NFS, server's 10G port, 4 ranks", 10_000 * 1e6 / 8 * LINE_EFFICIENCY / 4,
              f"10 Gb/s / 8 × {LINE_EFFICIENCY:g} / 4 ranks"),
             ("NFS, server's 200G port, 4 ranks", 200_000 * 1e6 / 8 * LINE_EFFICIENCY / 4,
              f"200 Gb/s / 8 × {LINE_EFFICIENCY:g} / 4 ranks"),
             ("local NVMe (staged)", LOCAL_DISK_BYTES_S, "assumed")]
    for gb in sizes:
        print(f"checkpoint {gb:g} GB, read whole by every rank:")
        for what, rate, how in paths:
            seconds = gb * 1e9 / rate
            print(f"  {what:34s} {gb:g} GB / {rate / 1e9:.2f} GB/s ({how}) = {seconds:6.0f} s "
                  f"(~{minutes(seconds)}); `up` waits {max(900, seconds * MARGIN):.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
