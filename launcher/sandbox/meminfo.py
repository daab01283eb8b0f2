"""A DGX Spark's /proc/meminfo for each sandbox rank (GB10: ~121.7 GiB of unified memory).

Four ranks on one small host would otherwise all report the host's memory (e.g. 24 GiB), and
every real profile's plan would refuse to start. Each rank's init bind-mounts its file over
/proc/meminfo (the way lxcfs does); the file lives on the host at
``<state dir>/ranks/sparkN/meminfo``, so a test can simulate a memory squeeze by rewriting it
*in place* (open with "r+"/truncate, not rename: a bind mount follows the inode).
``SPARKSTACK_SANDBOX_MEMINFO=host`` turns this off (ranks then see the host's real file).
"""

from __future__ import annotations

import os

MEMTOTAL_KB = 127_600_000  # DESIGN.md: MemTotal on a GB10 is about 127,600,000 kB


def enabled() -> bool:
    return os.environ.get("SPARKSTACK_SANDBOX_MEMINFO", "gb10") != "host"


def meminfo(rank: int, page_cache_kb: int = 2_100_000) -> str:
    """/proc/meminfo text of a freshly booted Spark; MemAvailable differs a little per rank."""
    used = 3_900_000 + 150_000 * rank  # kernel, services, the rank's dockerd
    free = MEMTOTAL_KB - used - page_cache_kb
    available = free + page_cache_kb - 250_000
    fields = [
        ("MemTotal", MEMTOTAL_KB), ("MemFree", free), ("MemAvailable", available),
        ("Buffers", 48_212), ("Cached", page_cache_kb), ("SwapCached", 0),
        ("Active", 1_402_116 + page_cache_kb // 3), ("Inactive", 612_048 + page_cache_kb // 2),
        ("Active(anon)", 902_344), ("Inactive(anon)", 0),
        ("Active(file)", 499_772 + page_cache_kb // 3), ("Inactive(file)", 612_048 + page_cache_kb // 2),
        ("Unevictable", 28_672), ("Mlocked", 28_672),
        ("SwapTotal", 0), ("SwapFree", 0), ("Zswap", 0), ("Zswapped", 0),
        ("Dirty", 412), ("Writeback", 0), ("AnonPages", 931_016), ("Mapped", 402_884),
        ("Shmem", 61_440), ("KReclaimable", 210_332), ("Slab", 498_120),
        ("SReclaimable", 210_332), ("SUnreclaim", 287_788), ("KernelStack", 21_376),
        ("PageTables", 18_944), ("SecPageTables", 0), ("NFS_Unstable", 0), ("Bounce", 0),
        ("WritebackTmp", 0), ("CommitLimit", MEMTOTAL_KB // 2), ("Committed_AS", 5_812_404),
        ("VmallocTotal", 133_141_626_880), ("VmallocUsed", 98_304), ("VmallocChunk", 0),
        ("Percpu", 11_520), ("HardwareCorrupted", 0), ("AnonHugePages", 0),
        ("ShmemHugePages", 0), ("ShmemPmdMapped", 0), ("FileHugePages", 0),
        ("FilePmdMapped", 0), ("CmaTotal", 0), ("CmaFree", 0),
    ]
    lines = [f"{name + ':':<16}{value:>8} kB" for name, value in fields]
    lines += [f"{'HugePages_Total:':<16}{0:>8}", f"{'HugePages_Free:':<16}{0:>8}",
              f"{'HugePages_Rsvd:':<16}{0:>8}", f"{'HugePages_Surp:':<16}{0:>8}",
              f"{'Hugepagesize:':<16}{2048:>8} kB", f"{'Hugetlb:':<16}{0:>8} kB"]
    return "\n".join(lines) + "\n"
