#!/usr/bin/python3
"""SANDBOX STAND-IN for a GB10's memory accounting (sparkstack sandbox): the kernel's view of one
rank's 128 GB of unified memory, as /proc/meminfo shows it. Not a kernel: a small daemon
(`/usr/local/sbin/sandbox-meminfo` in each rank, started by the rank's init) that owns the rank's
meminfo file (bind-mounted over /proc/meminfo in the rank and in every container it starts) and
recomputes it ten times a second. Standard library only (Debian's python3: trixie's on the ranks,
bookworm's in the stand-in image).

The model, in kB:
  MemFree      = MemTotal - base - held - pinned - page cache
  MemAvailable = MemFree + page cache - min(page cache / 2, LOW_WMARK_KB)
                 (the kernel's si_mem_available: clean page cache counts as available)
  base         the kernel, services and the rank's dockerd (config.json, by rank)
  held         what live processes hold (a vLLM worker's weights, KV pool, CUDA graphs)
  pinned       a squeeze a test sets (memory taken by "something else"; never reclaimed)
  page cache   grows by the bytes processes report reading; when memory runs short it is
               reclaimed only down to MemFree = LOW_WMARK_KB (a reader can fill memory with
               it). A GPU allocation on unified memory needs real MemFree: the page cache is
               NOT reclaimed for it (the field failure: NVRM NV_ERR_NO_MEMORY while 75 GiB of
               weights stream in over NFS). Dropping caches is what frees it.

Writing 1 or 3 to the rank's vm.drop_caches (the rank's own copy of /proc/sys/vm, a tmpfs)
drops the page cache to DROP_RESIDUAL_KB (pages still mapped by running programs); 2 drops slab
only (no page cache change). Every write to vm.drop_caches or vm.compact_memory is logged.

The state directory (/sandbox/mem in the rank and, rw, in each of its containers; on the host
<state dir>/ranks/sparkN/mem):
  config.json  {"total_kb", "base_kb", "cache_kb" (at boot), "swap_total_kb", "swap_free_kb"},
               written by the host (launcher/sandbox/meminfo.py); re-read when it changes
  held/NAME    the bytes one live process holds, as text. The holder keeps the file flock'ed
               (Holder below); when it dies -- its container killed -- the lock goes and the
               daemon releases that memory and deletes the file, as the kernel frees a dead
               process's memory. Names starting with "." are ignored (a holder's file before
               it is locked and renamed into place).
  reads/NAME   bytes a process read from files (report_read): added to the page cache, then
               deleted by the daemon
  pinned       the bytes of a test's squeeze, as text (no lock; 0 or absent: none)
  events       what the daemon saw written, one line each: "<unix time, 3 decimals> <sysctl>
               <value>", e.g. "1764585108.123 drop_caches 3", "1764585108.456 compact_memory 1"
  state.json   the daemon's figures in kB and its tick count (settle() waits on it)
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
import uuid

MEMTOTAL_KB = 127_600_000  # docs/architecture.md, "The GB10's memory": MemTotal is about 127,600,000 kB
BOOT_CACHE_KB = 2_100_000  # page cache of a freshly booted Spark
LOW_WMARK_KB = 250_000  # the low watermark: reclaim keeps this much free; not "available"
DROP_RESIDUAL_KB = 310_000  # page cache a drop leaves: pages mapped by running programs
TICK_S = 0.1
MEM_DIR = "/sandbox/mem"


def base_kb(rank: int) -> int:
    """Kernel, services and the rank's dockerd: a little more on each rank, so ranks differ."""
    return 3_900_000 + 150_000 * rank


def boot_config(rank: int) -> dict:
    return {"total_kb": MEMTOTAL_KB, "base_kb": base_kb(rank), "cache_kb": BOOT_CACHE_KB,
            "swap_total_kb": 0, "swap_free_kb": 0}


# ---------------------------------------------------------------- the computation (pure)

def cache_cap_kb(cfg: dict, held_kb: int, pinned_kb: int) -> int:
    """The most page cache there can be: reclaim keeps MemFree at the low watermark."""
    return max(0, cfg["total_kb"] - cfg["base_kb"] - held_kb - pinned_kb - LOW_WMARK_KB)


def figures(cfg: dict, held_kb: int, pinned_kb: int, cache_kb: int) -> dict:
    """MemFree, MemAvailable and Cached (kB) of a rank; cache_kb must already be capped."""
    free = max(0, cfg["total_kb"] - cfg["base_kb"] - held_kb - pinned_kb - cache_kb)
    available = max(0, free + cache_kb - min(cache_kb // 2, LOW_WMARK_KB))
    return {"MemTotal": cfg["total_kb"], "MemFree": free, "MemAvailable": available,
            "Cached": cache_kb, "Held": held_kb, "Pinned": pinned_kb}


def render(fig: dict, swap_total_kb: int = 0, swap_free_kb: int = 0) -> str:
    """/proc/meminfo text. Every value but the fixed VmallocTotal has the same width, so the
    file keeps its length and an in-place rewrite never leaves a stale tail for a reader."""
    total, cache, held = fig["MemTotal"], fig["Cached"], fig["Held"] + fig["Pinned"]
    fields = [
        ("MemTotal", total), ("MemFree", fig["MemFree"]), ("MemAvailable", fig["MemAvailable"]),
        ("Buffers", 48_212), ("Cached", cache), ("SwapCached", 0),
        ("Active", 1_402_116 + cache // 3 + held), ("Inactive", 612_048 + cache // 2),
        ("Active(anon)", 902_344 + held), ("Inactive(anon)", 0),
        ("Active(file)", 499_772 + cache // 3), ("Inactive(file)", 612_048 + cache // 2),
        ("Unevictable", 28_672), ("Mlocked", 28_672),
        ("SwapTotal", swap_total_kb), ("SwapFree", swap_free_kb), ("Zswap", 0), ("Zswapped", 0),
        ("Dirty", 412), ("Writeback", 0), ("AnonPages", 931_016 + held), ("Mapped", 402_884),
        ("Shmem", 61_440), ("KReclaimable", 210_332), ("Slab", 498_120),
        ("SReclaimable", 210_332), ("SUnreclaim", 287_788), ("KernelStack", 21_376),
        ("PageTables", 18_944), ("SecPageTables", 0), ("NFS_Unstable", 0), ("Bounce", 0),
        ("WritebackTmp", 0), ("CommitLimit", total // 2), ("Committed_AS", 5_812_404 + held),
        ("VmallocTotal", 133_141_626_880), ("VmallocUsed", 98_304), ("VmallocChunk", 0),
        ("Percpu", 11_520), ("HardwareCorrupted", 0), ("AnonHugePages", 0),
        ("ShmemHugePages", 0), ("ShmemPmdMapped", 0), ("FileHugePages", 0),
        ("FilePmdMapped", 0), ("CmaTotal", 0), ("CmaFree", 0),
    ]
    lines = [f"{name + ':':<15}{value:>9} kB" for name, value in fields]
    lines += [f"{'HugePages_Total:':<16}{0:>8}", f"{'HugePages_Free:':<16}{0:>8}",
              f"{'HugePages_Rsvd:':<16}{0:>8}", f"{'HugePages_Surp:':<16}{0:>8}",
              f"{'Hugepagesize:':<15}{2048:>9} kB", f"{'Hugetlb:':<15}{0:>9} kB"]
    return "\n".join(lines) + "\n"


def parse(text: str) -> dict[str, int]:
    """meminfo text as {field: kB}."""
    out = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        value = rest.split()
        if value and value[0].isdigit():
            out[name] = int(value[0])
    return out


# ---------------------------------------------------------------- files

def read_int(path: str, default: int = 0) -> int:
    try:
        with open(path) as f:
            return int(f.read().strip() or default)
    except (OSError, ValueError):
        return default


def write_atomically(path: str, text: str) -> None:
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{uuid.uuid4().hex}")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_in_place(path: str, text: str) -> None:
    """Keep the inode: the file is bind-mounted over /proc/meminfo."""
    with open(path, "r+" if os.path.exists(path) else "w") as f:
        f.write(text)
        f.truncate()


def report_read(mem_dir: str, nbytes: int) -> None:
    """This process read `nbytes` from files: the page cache grows by as much."""
    os.makedirs(os.path.join(mem_dir, "reads"), exist_ok=True)
    write_atomically(os.path.join(mem_dir, "reads", uuid.uuid4().hex), str(int(nbytes)))


class Holder:
    """Memory this process holds, registered for as long as the process lives: the file stays
    flock'ed through this object's open descriptor, which the kernel closes when we die."""

    def __init__(self, mem_dir: str, name: str):
        held = os.path.join(mem_dir, "held")
        os.makedirs(held, exist_ok=True)
        final = os.path.join(held, f"{name}-{uuid.uuid4().hex[:8]}")
        tmp = os.path.join(held, "." + os.path.basename(final))
        self.f = open(tmp, "w")
        fcntl.flock(self.f, fcntl.LOCK_EX)
        self.hold(0)
        os.rename(tmp, final)  # the lock stays: same inode
        self.path = final

    def hold(self, nbytes: int) -> None:
        self.f.seek(0)
        self.f.write(f"{int(nbytes):>20}")  # fixed width: a reader never sees a half number
        self.f.flush()

    def close(self) -> None:
        self.f.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


def read_state(mem_dir: str) -> dict | None:
    try:
        with open(os.path.join(mem_dir, "state.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def settle(mem_dir: str, ticks: int = 2, timeout: float = 2.0) -> bool:
    """Wait until the daemon has run `ticks` full passes since now (so what this process just
    wrote is in meminfo); False when no daemon answers in time."""
    start = (read_state(mem_dir) or {}).get("tick")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = (read_state(mem_dir) or {}).get("tick")
        if start is not None and now is not None and now >= start + ticks:
            return True
        if start is None:
            start = now
        time.sleep(TICK_S / 4)
    return False


# ---------------------------------------------------------------- the daemon

class Daemon:
    def __init__(self, mem_dir: str, meminfo: str, vm_dir: str, clock=time.time):
        self.mem_dir, self.meminfo, self.vm_dir, self.clock = mem_dir, meminfo, vm_dir, clock
        self.cfg = self.read_config()
        self.cache_kb = self.cfg["cache_kb"]
        self.held: dict[str, int] = {}  # holder file -> kB, the last value read whole
        self.vm_seen = {name: self.vm_stamp(name) for name in ("drop_caches", "compact_memory")}
        self.tick = 0
        for sub in ("held", "reads"):
            os.makedirs(os.path.join(mem_dir, sub), exist_ok=True)

    def read_config(self) -> dict:
        try:
            with open(os.path.join(self.mem_dir, "config.json")) as f:
                return {**boot_config(0), **json.load(f)}
        except (OSError, ValueError):
            return boot_config(0)

    def vm_stamp(self, name: str):
        try:
            return os.stat(os.path.join(self.vm_dir, name)).st_mtime_ns
        except OSError:
            return None

    def scan_holders(self) -> int:
        """kB held by live holders; a holder whose lock is gone is released and removed."""
        held_dir = os.path.join(self.mem_dir, "held")
        live = {}
        for name in os.listdir(held_dir):
            if name.startswith("."):
                continue
            path = os.path.join(held_dir, name)
            try:
                with open(path) as f:
                    try:
                        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:  # locked: its holder lives
                        live[name] = read_int(path, self.held.get(name, 0) * 1024) // 1024
                        continue
                os.unlink(path)  # we got the lock: the holder is dead
            except OSError:
                continue
        self.held = live
        return sum(live.values())

    def consume_reads(self) -> int:
        reads_dir = os.path.join(self.mem_dir, "reads")
        total = 0
        for name in os.listdir(reads_dir):
            if name.startswith("."):
                continue
            path = os.path.join(reads_dir, name)
            total += read_int(path)
            try:
                os.unlink(path)
            except OSError:
                pass
        return total // 1024

    def watch_vm(self) -> None:
        """A write to vm.drop_caches or vm.compact_memory: log it; 1 or 3 drops the page cache."""
        for name, seen in self.vm_seen.items():
            stamp = self.vm_stamp(name)
            if stamp == seen:
                continue
            try:
                with open(os.path.join(self.vm_dir, name)) as f:
                    value = f.read().strip()
            except OSError:
                value = ""
            if not value:  # caught between sysctl's truncate and its write: next tick
                continue
            self.vm_seen[name] = stamp
            self.event(f"{name} {value}")
            if name == "drop_caches" and value in ("1", "3"):
                self.cache_kb = min(self.cache_kb, DROP_RESIDUAL_KB)

    def event(self, what: str) -> None:
        with open(os.path.join(self.mem_dir, "events"), "a") as f:
            f.write(f"{self.clock():.3f} {what}\n")

    def shown(self) -> str | None:
        try:
            with open(self.meminfo) as f:
                return f.read()
        except OSError:
            return None

    def step(self) -> dict:
        """One pass: holders, reads, sysctl writes, then meminfo and state.json."""
        self.cfg = self.read_config()
        held = self.scan_holders()
        pinned = read_int(os.path.join(self.mem_dir, "pinned")) // 1024
        self.cache_kb += self.consume_reads()
        self.watch_vm()
        self.cache_kb = min(self.cache_kb, cache_cap_kb(self.cfg, held, pinned))
        fig = figures(self.cfg, held, pinned, self.cache_kb)
        text = render(fig, self.cfg["swap_total_kb"], self.cfg["swap_free_kb"])
        if text != self.shown():
            write_in_place(self.meminfo, text)
        self.tick += 1
        write_atomically(os.path.join(self.mem_dir, "state.json"),
                         json.dumps({**fig, "tick": self.tick, "holders": self.held}))
        return fig

    def run(self) -> None:
        while True:
            try:
                self.step()
            except OSError as e:  # a file vanished mid-pass: the next pass sees the new state
                print(f"sandbox-meminfo: {e}", file=sys.stderr, flush=True)
            time.sleep(TICK_S)


def main(argv: list[str]) -> int:
    mem_dir = argv[0] if argv else MEM_DIR
    meminfo = argv[1] if len(argv) > 1 else "/sandbox/meminfo"
    vm_dir = argv[2] if len(argv) > 2 else "/proc/sys/vm"
    Daemon(mem_dir, meminfo, vm_dir).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
