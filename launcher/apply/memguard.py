"""The load-time memory guard: one watcher per rank (launcher/onrank/memwatch.py) from just
before `up` starts the engines until the API answers.

A GB10 that runs out of its one shared memory freezes rather than failing cleanly, and the
weights streaming in refill the page cache. Each watcher drops caches and compacts memory below
the soft floor (MemFree) and stops its rank's engine below the hard floor (MemAvailable); `up`
then stops every rank and says which rank, when, and the memory each rank had (all or nothing).
A rank whose user may not run the relief commands makes `up` refuse before anything starts.
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass, field


from .. import onrank
from ..errors import SparkstackError
from ..inputs import node_settings
from ..inputs.config import MemoryGuardSettings
from ..plan.cluster_plan import CONTAINER_NAME
from ..transport.remote import Connection, Group, paramiko  # without invoke: remote._import_paramiko

GIB = 1024 ** 3
CHECK_TIMEOUT_S = 20


class MemoryFloor(SparkstackError):
    """A rank's MemAvailable fell below the hard floor while the model loaded."""


class MemoryGuardLost(MemoryFloor):
    """A rank's watcher stopped reporting while the model loaded: its hard floor is no longer
    watched, which `up` treats as it treats the floor itself (every rank stopped)."""


# The fields each kind of record must carry as finite numbers (memwatch.py's "event"; None: a sample).
_FIELDS = {None: ("t", "avail", "free"), "relief": ("t", "rc", "free"), "hard": ("t", "avail", "free")}


def parse_record(line: str) -> dict:
    """One line of a watcher's output as its record; ValueError saying what is wrong with it (not
    JSON, not an object, a field missing or not a number). Unknown events pass (ignored)."""
    try:
        record = json.loads(line)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    if not isinstance(record, dict):
        raise ValueError(f"not a JSON object but {type(record).__name__}")
    for name in _FIELDS.get(record.get("event"), ()):
        value = record.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"no number {name!r}")
    return record


@dataclass
class RankMemory:
    """What one rank's watcher reported."""

    rank: int
    name: str
    samples: list[tuple[float, int, int]] = field(default_factory=list)  # (s since start, avail, free)
    reliefs: list[dict] = field(default_factory=list)
    hard: dict | None = None
    killed: dict | None = None
    error: str | None = None  # the watcher could not run or stopped reporting

    def lowest(self) -> tuple[float, int] | None:
        """(when, MemAvailable) of the lowest sample."""
        if not self.samples:
            return None
        t, avail, _free = min(self.samples, key=lambda s: s[1])
        return t, avail

    def add(self, record: dict) -> None:
        event = record.get("event")
        if event is None:
            self.samples.append((record["t"], record["avail"], record["free"]))
        elif event == "relief":
            self.reliefs.append(record)
        elif event == "hard":
            self.samples.append((record["t"], record["avail"], record["free"]))
            self.hard = record
        elif event == "killed":
            self.killed = record

    def to_json(self) -> dict:
        low = self.lowest()
        return {"rank": self.rank, "host": self.name,
                "lowest_available_bytes": low[1] if low else None,
                "lowest_at_s": low[0] if low else None,
                "reliefs": [{"t": r["t"], "rc": r["rc"], "free_after_bytes": r["free"]} for r in self.reliefs],
                "hard_floor": self.hard, "error": self.error,
                "timeline": [{"t": t, "available_bytes": a, "free_bytes": f} for t, a, f in self.samples]}

    def summary(self) -> str:
        low = self.lowest()
        if low is None:
            return f"{self.name}: no memory sample" + (f" ({self.error})" if self.error else "")
        drops = f", {len(self.reliefs)} cache drop(s)" if self.reliefs else ""
        return f"{self.name}: lowest MemAvailable {low[1] / GIB:.1f} GiB at {low[0]:.0f} s{drops}"


def watcher_args(settings: MemoryGuardSettings, user: str, lifetime: float) -> dict:
    return {"soft_free": int(settings.soft_free_gib * GIB),
            "hard_available": int(settings.hard_available_gib * GIB),
            "interval": settings.interval_s, "cooldown": settings.cooldown_s,
            "relief": node_settings.memory_relief_command(user),
            "container": CONTAINER_NAME, "max_s": lifetime}


def require_relief(group: Group) -> None:
    """Refuse before anything starts when a rank's user may not drop caches and compact memory
    without a password: its watcher could not relieve memory, only watch it freeze."""
    def check(conn: Connection):
        return conn.run(node_settings.relief_sudo_check_command(conn.target.user), timeout=CHECK_TIMEOUT_S)

    refused = [r for r in group.each(check).results if not r.ok]
    if refused:
        raise SparkstackError(
            "the load-time memory guard cannot relieve memory on "
            + ", ".join(r.target.name for r in refused)
            + f": `sudo -n` does not allow `{node_settings.DROP_CACHES_SUDO}` and "
            f"`{node_settings.COMPACT_MEMORY_SUDO}` for that user; nothing was started.\n"
            + "\n".join(f"  {r.target.name}: {r.why()}" for r in refused)
            + f"\nFix: install the narrow sudoers rule ({node_settings.SUDOERS_FILE}, Ansible role "
            "spark_node: see `sparkstack ansible-inventory --help`), or connect as root; "
            "memory_guard.enabled: false turns the guard off (not advised on a GB10)")


class MemoryGuard:
    """Every rank's watcher, read by one thread each; `check()` raises once a rank hit the hard
    floor. A context manager: leaving it closes the channels, which ends the watchers."""

    def __init__(self, group: Group, settings: MemoryGuardSettings, lifetime: float, say=print):
        self.group, self.settings, self.lifetime, self.say = group, settings, lifetime, say
        self.ranks = {c.target.rank: RankMemory(c.target.rank, c.target.name) for c in group.connections}
        self._channels: list[paramiko.Channel] = []
        self._threads: list[threading.Thread] = []
        self._tripped = threading.Event()
        self._closing = False  # set when the guard ends its readers itself
        self._lost: dict[int, str] = {}  # rank: why its reader ended while the guard was open
        self.started = time.monotonic()

    def __enter__(self) -> "MemoryGuard":
        if not self.settings.enabled:
            return self
        for conn in self.group.connections:
            args = watcher_args(self.settings, conn.target.user, self.lifetime)
            command, script = onrank.invocation("memwatch", args)
            try:
                channel = conn.spawn(command, script, self.lifetime)
            except (paramiko.SSHException, OSError, EOFError) as e:
                self.close()
                raise SparkstackError(f"{conn.target.name}: cannot start the memory guard ({e}); "
                                      "nothing was started") from None
            self._channels.append(channel)
            thread = threading.Thread(target=self._read, args=(channel, self.ranks[conn.target.rank]),
                                      daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._closing = True
        for channel in self._channels:
            channel.close()  # the watcher's next write fails and it ends
        for thread in self._threads:
            thread.join(timeout=5)

    def _read(self, channel: paramiko.Channel, memory: RankMemory) -> None:
        """Every line the rank's watcher prints, whatever it is: a line that is no record is
        noted (memory.error) and the next one read. When the output ends while the guard is
        open (the watcher died, its connection broke, this thread failed), the rank is lost:
        check() then fails `up` for it."""
        ended = "its output ended"
        try:
            for raw in channel.makefile("rb"):
                line = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
                try:
                    record = parse_record(line)
                except ValueError as e:
                    memory.error = f"the watcher printed {line.strip()[:120]!r} ({e})"
                    continue
                memory.add(record)
                if record.get("event") == "relief":
                    why = record.get("why")
                    self.say(f"  {memory.name}: MemFree under {self.settings.soft_free_gib:g} GiB: dropped "
                             f"page caches, compacted memory (MemFree now {record['free'] / GIB:.1f} GiB)"
                             + ("" if record["rc"] == 0 else f"; the relief failed: {why}"))
                elif record.get("event") == "hard":
                    self._tripped.set()
        except (OSError, EOFError, paramiko.SSHException) as e:
            ended = f"the watcher's connection ended ({e})"
            memory.error = memory.error or ended
        except Exception as e:  # noqa: BLE001 -- whatever ends this thread must not go unseen
            ended = f"its reader failed ({type(e).__name__}: {e})"
            memory.error = memory.error or ended
        try:
            if not channel.closed and channel.exit_status_ready() and channel.recv_exit_status() not in (0, 3):
                said = channel.makefile_stderr("r").read()
                said = (said.decode(errors="replace") if isinstance(said, bytes) else said).strip().splitlines()
                ended = f"the watcher exited with {channel.recv_exit_status()}" + (f": {said[-1]}" if said else "")
                memory.error = memory.error or ended
        except (OSError, EOFError, paramiko.SSHException) as e:
            ended = f"the watcher's connection ended ({e})"
        if not self._closing:
            self._lost[memory.rank] = ended

    def check(self, grace: float = 0.0) -> None:
        """Raise MemoryFloor when a rank hit the hard floor (waiting up to `grace` seconds for a
        report still on its way, e.g. when its container was just found dead)."""
        if self._tripped.wait(grace):
            raise MemoryFloor(self._floor_message())
        lost = {r: why for r, why in self._lost.items() if not self._closing}
        if lost:
            raise MemoryGuardLost(
                "\n".join(f"{self.ranks[r].name}: the memory guard stopped watching ({why}) while the model "
                          f"loaded; its hard floor of {self.settings.hard_available_gib:g} GiB would go unwatched"
                          for r, why in sorted(lost.items()))
                + "\nmemory on each rank while loading:\n"
                + "\n".join("  " + m.summary() for m in self.ranks.values())
                + "\nFix: see why the watcher stopped (the rank's python3, its SSH connection), then `up` "
                "again; memory_guard.enabled: false turns the guard off (not advised on a GB10)")

    def _floor_message(self) -> str:
        hit = [m for m in self.ranks.values() if m.hard]
        lines = [f"{m.name}: MemAvailable fell to {m.hard['avail'] / GIB:.1f} GiB, under the hard floor of "
                 f"{self.settings.hard_available_gib:g} GiB, {m.hard['t']:.0f} s after the start; "
                 "the memory guard stopped its engine" for m in hit]
        return ("\n".join(lines) + "\nmemory on each rank while loading:\n"
                + "\n".join("  " + m.summary() for m in self.ranks.values())
                + "\nFix: plan less memory (a smaller kv.target or overrides.kv_policy: target, "
                "`sparkstack plan` shows the free memory expected while serving), and stop what "
                "else holds memory on that rank")

    def report(self) -> list[RankMemory]:
        return [self.ranks[r] for r in sorted(self.ranks)]
