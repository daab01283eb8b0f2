"""A DGX Spark's /proc/meminfo for each sandbox rank (GB10: ~121.7 GiB of unified memory), and
the host's handle on it for tests.

Four ranks on one small host would otherwise all report the host's memory (e.g. 24 GiB), and
every real profile's plan would refuse to start. Each rank's init bind-mounts its file over
/proc/meminfo (the way lxcfs does) and starts the rank's memory daemon
(standins/standin_mem.py, `/usr/local/sbin/sandbox-meminfo`), which recomputes the file ten
times a second from the rank's memory state directory: base use, memory held by live processes
(the stand-in engine's weights, KV pool and graphs while it loads), page cache filled by reads
and dropped by `sysctl -w vm.drop_caches=3`, and a test's squeeze. Both live on the host at
``<state dir>/ranks/sparkN/meminfo`` and ``<state dir>/ranks/sparkN/mem/``.
``SPARKSTACK_SANDBOX_MEMINFO=host`` turns this off (ranks then see the host's real file, and
no daemon runs).

The functions below take the sandbox's state dir and a rank's name ("spark3"); sizes in bytes.
Each change waits until the daemon has shown it in meminfo (SandboxError if it does not answer).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .errors import SandboxError
from .standins import standin_mem as model

MEMTOTAL_KB = model.MEMTOTAL_KB


def enabled() -> bool:
    return os.environ.get("SPARKSTACK_SANDBOX_MEMINFO", "gb10") != "host"


def meminfo(rank: int, page_cache_kb: int = model.BOOT_CACHE_KB) -> str:
    """/proc/meminfo text of a freshly booted Spark; MemAvailable differs a little per rank."""
    cfg = model.boot_config(rank)
    cap = min(page_cache_kb, model.cache_cap_kb(cfg, 0, 0))
    return model.render(model.figures(cfg, 0, 0, cap))


def write_boot_state(rank_dir: Path, rank: int) -> None:
    """The rank's memory state directory as a freshly booted Spark's (config.json, empty
    holders and reads); a running daemon keeps its page cache and live holders."""
    mem = rank_dir / "mem"
    for sub in ("held", "reads"):
        (mem / sub).mkdir(parents=True, exist_ok=True)
    text = json.dumps(model.boot_config(rank), sort_keys=True) + "\n"
    if not (mem / "config.json").exists() or (mem / "config.json").read_text() != text:
        model.write_atomically(str(mem / "config.json"), text)


def mem_dir(state_dir, rank: str) -> Path:
    return Path(state_dir) / "ranks" / rank / "mem"


def read(state_dir, rank: str) -> dict[str, int]:
    """The rank's /proc/meminfo now, as {field: kB}."""
    return model.parse((Path(state_dir) / "ranks" / rank / "meminfo").read_text())


def settle(state_dir, rank: str, timeout: float = 5.0) -> None:
    """Wait until the rank's daemon has taken in every change made so far."""
    if not model.settle(str(mem_dir(state_dir, rank)), timeout=timeout):
        raise SandboxError(f"{rank}: the sandbox memory daemon (sandbox-meminfo) does not answer",
                           f"check `ps aux | grep sandbox-meminfo` and /var/log/sandbox-meminfo.log on {rank}, "
                           "or `sparkstack sandbox up` again")


def squeeze(state_dir, rank: str, nbytes: int) -> None:
    """Take `nbytes` of the rank's memory for "something else" (never reclaimed) until unsqueeze."""
    model.write_atomically(str(mem_dir(state_dir, rank) / "pinned"), str(int(nbytes)))
    settle(state_dir, rank)


def unsqueeze(state_dir, rank: str) -> None:
    squeeze(state_dir, rank, 0)


def squeeze_available(state_dir, rank: str, available: int) -> int:
    """Squeeze until the rank's MemAvailable is `available` (to the kB); returns the squeeze."""
    pinned = model.read_int(str(mem_dir(state_dir, rank) / "pinned"))
    for _ in range(3):  # the page cache may give way as the squeeze grows
        pinned = max(0, pinned + read(state_dir, rank)["MemAvailable"] * 1024 - int(available))
        squeeze(state_dir, rank, pinned)
        if read(state_dir, rank)["MemAvailable"] * 1024 == int(available) // 1024 * 1024:
            break
    return pinned


def fill_page_cache(state_dir, rank: str, nbytes: int) -> None:
    """As if the rank read `nbytes` of files: the page cache grows (up to what is free)."""
    model.report_read(str(mem_dir(state_dir, rank)), nbytes)
    settle(state_dir, rank)


def set_swap(state_dir, rank: str, total: int, free: int) -> None:
    """The rank's SwapTotal and SwapFree (0, 0: no swap, as a Spark boots)."""
    path = mem_dir(state_dir, rank) / "config.json"
    cfg = {**json.loads(path.read_text()), "swap_total_kb": total // 1024, "swap_free_kb": free // 1024}
    model.write_atomically(str(path), json.dumps(cfg, sort_keys=True) + "\n")
    settle(state_dir, rank)


def events(state_dir, rank: str, since: float = 0.0) -> list[tuple[float, str, str]]:
    """The rank's logged sysctl writes at or after `since` (unix time): (time, name, value)."""
    path = mem_dir(state_dir, rank) / "events"
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        stamp, name, value = line.split(maxsplit=2)
        if float(stamp) >= since:
            out.append((float(stamp), name, value))
    return out


def wait_for(state_dir, rank: str, test, timeout: float = 10.0, poll: float = 0.1) -> dict[str, int]:
    """Poll the rank's meminfo until `test(fields)` holds; the last fields either way."""
    deadline = time.monotonic() + timeout
    fields = read(state_dir, rank)
    while not test(fields) and time.monotonic() < deadline:
        time.sleep(poll)
        fields = read(state_dir, rank)
    return fields
