"""Every rank's sampler (launcher/onrank/sampler.py), each on ONE SSH channel of the rank's one
connection, read for as long as the exporter or `top` runs: the newest sample per rank, the fabric
rates between its last two, and the memory guard's events counted since the start.

Nothing opens an SSH session per scrape: a scrape reads what the streams last delivered. A
stream that ends (the rank rebooted, the connection broke) is started again after
RESTART_AFTER_S on the same connection object (which reconnects); `sessions_opened` counts every
channel opened, so a benchmark can show that none are opened after the first.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

import paramiko

from .. import onrank
from ..facts.parts import FactError
from ..facts.sample import COUNTERS, HW_COUNTERS, FabricRate, RankSample, fabric_rates, parse_rank_sample
from ..inputs.config import Loaded
from ..plan.cluster_plan import CONTAINER_NAME
from ..transport.remote import Connection, Group

RESTART_AFTER_S = 5.0
# The serving memory guard's event file on each rank (the guard writes it; $HOME of the SSH user)
GUARD_EVENTS = "~/.cache/sparkstack/memguard/events.jsonl"


def sampler_args(loaded: Loaded, rank: int, interval: float) -> dict:
    return {"interval": interval, "sysfs_root": loaded.cluster.ranks[rank].sysfs_root,
            "container": CONTAINER_NAME, "guard_events": GUARD_EVENTS,
            "counters": list(COUNTERS), "hw_counters": list(HW_COUNTERS), "max_s": 0}


@dataclass
class RankState:
    """What one rank's stream delivered."""

    rank: int
    host: str
    sample: RankSample | None = None
    received: float = 0.0  # monotonic time of the newest sample here
    rates: dict[str, FabricRate] = field(default_factory=dict)
    guard_counts: dict[str, int] = field(default_factory=dict)
    guard_last: dict | None = None
    error: str | None = None  # why the stream is not delivering now
    sessions_opened: int = 0

    def add(self, sample: RankSample, now: float) -> None:
        if self.sample is not None and sample.t > self.sample.t:
            self.rates = fabric_rates(self.sample, sample)
        self.sample, self.received, self.error = sample, now, None
        for event in sample.guard:
            kind = str(event.get("event"))
            self.guard_counts[kind] = self.guard_counts.get(kind, 0) + 1
            self.guard_last = event

    def age(self, now: float) -> float | None:
        return None if self.sample is None else now - self.received


class Sampling:
    """A context manager: entering starts a sampler on every rank, leaving closes the channels
    (each sampler ends on its next write)."""

    def __init__(self, loaded: Loaded, group: Group, interval: float = 1.0, clock=time.monotonic):
        self.loaded, self.group, self.interval, self.clock = loaded, group, interval, clock
        self.ranks = {c.target.rank: RankState(c.target.rank, loaded.cluster.ranks[c.target.rank].label)
                      for c in group.connections}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._channels: dict[int, paramiko.Channel] = {}
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> "Sampling":
        for conn in self.group.connections:
            thread = threading.Thread(target=self._keep_reading, args=(conn,), daemon=True,
                                      name=f"sampler {conn.target.name}")
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            channels = list(self._channels.values())
        for channel in channels:
            channel.close()
        for thread in self._threads:
            thread.join(timeout=5)

    @property
    def sessions_opened(self) -> int:
        return sum(s.sessions_opened for s in self.ranks.values())

    def snapshot(self) -> list[RankState]:
        """Every rank's state now, rank order (copies: the readers go on)."""
        with self._lock:
            return [RankState(**{**vars(s), "rates": dict(s.rates), "guard_counts": dict(s.guard_counts)})
                    for _r, s in sorted(self.ranks.items())]

    def wait_for_samples(self, timeout: float) -> bool:
        """True once every rank delivered a sample (False when `timeout` passed first)."""
        deadline = self.clock() + timeout
        while self.clock() < deadline:
            if all(s.sample is not None for s in self.snapshot()):
                return True
            time.sleep(0.05)
        return False

    # -- one rank ---------------------------------------------------------------------------------
    def _keep_reading(self, conn: Connection) -> None:
        state = self.ranks[conn.target.rank]
        while not self._stop.is_set():
            why = self._read_once(conn, state)
            with self._lock:
                state.error = why
            self._stop.wait(RESTART_AFTER_S)

    def _read_once(self, conn: Connection, state: RankState) -> str:
        """Start the rank's sampler and read it until its stream ends: why it ended."""
        command, script = onrank.invocation("sampler", sampler_args(self.loaded, conn.target.rank, self.interval))
        try:
            channel = conn.spawn(command, script, None)
        except Exception as e:  # noqa: BLE001 -- an unreachable rank is a state to show, not a crash
            return f"cannot start the sampler: {getattr(e, 'message', None) or e}"
        with self._lock:
            state.sessions_opened += 1
            self._channels[state.rank] = channel
        try:
            for raw in channel.makefile("rb"):
                line = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
                try:
                    sample = parse_rank_sample(json.loads(line))
                except (ValueError, FactError) as e:
                    with self._lock:
                        state.error = f"the sampler printed {line.strip()[:120]!r} ({e})"
                    continue
                with self._lock:
                    state.add(sample, self.clock())
        except (OSError, EOFError, paramiko.SSHException) as e:
            return f"the sampler's connection ended ({e})"
        if self._stop.is_set():
            return "stopped"
        said = channel.makefile_stderr("rb").read().decode(errors="replace").strip().splitlines()
        return f"the sampler ended (exit {channel.recv_exit_status()})" + (f": {said[-1]}" if said else "")
