"""The memory guard while serving: one watcher per rank (launcher/onrank/memwatch.py in its
serving mode) from the moment the API answers for as long as that rank's engine container runs.

A GB10 that runs out of unified memory during a long prefill hard-resets or wedges, and vLLM's
own profiling is skipped when --kv-cache-memory-bytes is given (issue 29), so nothing else
catches it. The load-time guard (memguard.py) ends with the SSH channel `up` reads it through;
this one must not depend on the control host at all -- it may sleep, reboot or lose the network
while the model serves. Hence, chosen over the alternatives:

- a process on the rank itself, started with `setsid nohup` as the SSH user: its own session (no
  SIGHUP when the channel that started it closes), its output in a file, the standard library
  only (a rank promises python3 and nothing more; no systemd unit to install, no root);
- not a sidecar container: dropping caches needs the host's /proc/sys/vm (the narrow sudoers
  rule prep installs), which a container has only when privileged;
- it watches the engine container by ID and ends when that container stops or is replaced, and
  a newer guard (the next `up`) takes over through the pid file: at most one per rank.

Below the soft floor (MemFree) it drops page caches and compacts memory; below the hard floor
(MemAvailable) it kills that rank's engine container (the box stays up and answers SSH; `up
--keep` then re-deploys every rank, once their memory is back). Every event goes, with the
memory figures, to GUARD_DIR/events.jsonl on the rank (JSON lines): `status`, `logs --guard` and
the supervisor read it from there.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from datetime import datetime, timezone

from . import serve
from .. import onrank
from ..inputs import node_settings
from ..inputs.config import Loaded, ServingGuardSettings
from ..plan.cluster_plan import CONTAINER_NAME
from ..transport.remote import Connection, Group

GIB = 1024 ** 3
# On every rank, the SSH user's: the name the kit's own files have on the control host
# (~/.cache/sparkstack: spool, registry); on disk, not /tmp, so the record outlives a reset.
from ..facts.remote import GUARD_DIR, GUARD_PIDFILE as PIDFILE  # noqa: E402 -- the probe reads it too
EVENTS, SCRIPT = "events.jsonl", "memwatch.py"
CHECK_S = 5  # how often the watcher asks Docker whether its container still runs
START_WAIT_S = 5
READ_LINES = 200  # the events read back from a rank (the newest)
_SHOWN = ("relief", "hard", "killed")  # the events worth a line (start and end are bookkeeping)


def watcher_args(settings: ServingGuardSettings, user: str, container_id: str) -> dict:
    return {"soft_free": int(settings.soft_free_gib * GIB),
            "hard_available": int(settings.hard_available_gib * GIB),
            "interval": settings.interval_s, "cooldown": settings.cooldown_s,
            "relief": node_settings.memory_relief_command(user), "container": CONTAINER_NAME,
            "container_id": container_id, "max_s": 0, "check_s": CHECK_S,
            "log": EVENTS, "pidfile": PIDFILE}


def start_script(args: dict) -> str:
    """The rank's shell: nothing when a live guard already watches this container; else the
    script (stdin) saved beside its log and started detached, its pid file awaited."""
    cid, q = args["container_id"], shlex.quote
    return (f'd="{GUARD_DIR}"; mkdir -p "$d" && cd "$d" || exit 1\n'
            f"if pid=$(cat {PIDFILE} 2>/dev/null) && tr '\\0' ' ' </proc/$pid/cmdline 2>/dev/null "
            f"| grep -q -- {q(cid)}; then echo \"watching $pid\"; exit 0; fi\n"
            f"rm -f {PIDFILE}; cat > {SCRIPT}.new && mv {SCRIPT}.new {SCRIPT} || exit 1\n"
            f"setsid nohup python3 {SCRIPT} {q(json.dumps(args, sort_keys=True))} </dev/null >>guard.err 2>&1 &\n"
            f"for i in $(seq {START_WAIT_S * 10}); do pid=$(cat {PIDFILE} 2>/dev/null) && kill -0 \"$pid\" "
            f"2>/dev/null && {{ echo \"started $pid\"; exit 0; }}; sleep 0.1; done\n"
            "echo 'the guard did not start:' >&2; tail -n 3 guard.err >&2; exit 1")


def start(loaded: Loaded, group: Group, say=print, watched: bool = False) -> bool:
    """A guard on every rank for its running engine container (idempotent); True when every
    rank has one. A rank where none could start is said with why; the cluster serves on.
    `watched`: this command's probe saw every rank's guard watching its container already."""
    settings = loaded.cluster.memory_guard.serving
    if not settings.enabled:
        return False
    failed = [] if watched else _start_each(group, settings)
    if not failed:
        say(f"memory guard on every rank while serving: MemFree < {settings.soft_free_gib:g} GiB drops "
            f"caches, MemAvailable < {settings.hard_available_gib:g} GiB stops that rank's engine")
    for line in failed:
        say(f"the memory guard could not start on {line}")
    return not failed


def _start_each(group: Group, settings: ServingGuardSettings) -> list[str]:
    def one(conn: Connection):
        found = conn.run(f"docker inspect -f '{{{{.Id}}}}' {CONTAINER_NAME}", timeout=30)
        if not found.ok or not found.stdout.strip():
            return found
        args = watcher_args(settings, conn.target.user, found.stdout.strip())
        return conn.run(start_script(args), stdin=onrank.source("memwatch"), timeout=START_WAIT_S + 30)

    return [f"{r.target.name}: {r.why()}" for r in group.each(one).results if not r.ok]


# -- what the guards recorded ---------------------------------------------------------------------

@dataclass
class RankGuard:
    """One rank's guard as read back: whether it runs, the engine container now, its events."""

    rank: int
    host: str
    watching: bool = False
    container_id: str | None = None
    events: list[dict] = field(default_factory=list)
    error: str | None = None

    def stopped_engine(self) -> dict | None:
        """The hard floor's event for the container there now, when the guard stopped it."""
        return next((e for e in reversed(self.events) if e.get("event") == "hard"
                     and e.get("container_id") == self.container_id), None)

    def to_json(self) -> dict:
        return {"rank": self.rank, "host": self.host, "watching": self.watching, "error": self.error,
                "events": [e for e in self.events if e.get("event") in _SHOWN]}


def _read_command() -> str:
    # "watching" with the guard's command line: a guard still ending (it looks every CHECK_S)
    # watches a container that is gone, and a stale pid file may name another process
    return (f'd="{GUARD_DIR}"; pid=$(cat "$d/{PIDFILE}" 2>/dev/null) && cmd=$(tr "\\0" " " '
            f'</proc/$pid/cmdline 2>/dev/null) && echo "watching $cmd" || echo idle; '
            f"echo \"container $(docker inspect -f '{{{{.Id}}}}' {CONTAINER_NAME} 2>/dev/null)\"; "
            f'tail -n {READ_LINES} "$d/{EVENTS}" 2>/dev/null; true')


def parse(rank: int, host: str, stdout: str) -> RankGuard:
    lines = stdout.splitlines()
    guard = RankGuard(rank, host)
    if len(lines) > 1 and lines[1].startswith("container "):
        guard.container_id = lines[1][len("container "):].strip() or None
    # watching: a live memwatch for the engine container there now
    guard.watching = bool(lines) and lines[0].startswith("watching ") and SCRIPT in lines[0] and (
        guard.container_id is None or guard.container_id in lines[0])
    for line in lines[2:]:
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line cut short by a reset: the others still count
        if isinstance(event, dict) and "event" in event:
            guard.events.append(event)
    return guard


def read(group: Group) -> dict[int, RankGuard]:
    """Every reachable rank's guard; an unreachable one with its error."""
    out = {}
    for r in group.run(_read_command(), timeout=20).results:
        t = r.target
        out[t.rank] = parse(t.rank, t.name, r.stdout) if r.ok else RankGuard(t.rank, t.name, error=r.why())
    return out


def when(event: dict) -> str:
    at = event.get("at")
    return datetime.fromtimestamp(at, timezone.utc).strftime("%H:%M:%S UTC") if isinstance(at, (int, float)) else "?"


def describe(event: dict, settings: ServingGuardSettings | None = None) -> str:
    """One event in words, with its figures (and the floor it crossed when known)."""
    kind = event.get("event")
    avail, free = event.get("avail"), event.get("free")
    figures = (f"MemAvailable {avail / GIB:.1f} GiB, MemFree {free / GIB:.1f} GiB"
               if isinstance(avail, int) and isinstance(free, int) else "no figures")
    floor = event.get("hard_available")
    hard = (f", under the hard floor of {floor / GIB:g} GiB" if isinstance(floor, int) else
            f", under the hard floor of {settings.hard_available_gib:g} GiB" if settings else "")
    if kind == "hard":
        return f"the memory guard stopped its engine at {when(event)}: {figures}{hard}"
    if kind == "killed":
        return f"the engine's kill at {when(event)} exited {event.get('rc')}" + (
            f" ({event.get('why')})" if event.get("rc") else "")
    if kind == "relief":
        before = event.get("free_before")
        was = f"MemFree was {before / GIB:.1f} GiB; " if isinstance(before, int) else ""
        failed = "" if event.get("rc") == 0 else f"; the relief failed: {event.get('why')}"
        return f"dropped page caches and compacted memory at {when(event)} ({was}now {figures}){failed}"
    return f"{kind} at {when(event)}"


def diagnose(group: Group, state: serve.RankState, settings: ServingGuardSettings) -> str:
    """A dead rank's cause for the supervisor: the guard's hard-floor stop first, when that is
    what stopped it (the rank, the floor, the figures), then serve.diagnose's block."""
    conn = next(c for c in group.connections if c.target.rank == state.rank)
    found = conn.run(_read_command(), timeout=20)
    block = serve.diagnose(group, state)
    if not found.ok:
        return block
    hit = parse(state.rank, conn.target.name, found.stdout).stopped_engine()
    if hit is None:
        return block
    return f"{conn.target.name}: {describe(hit, settings)}\n{block}"


@dataclass
class EventFeed:
    """The supervisor's view: each rank's guard events it has not shown yet."""

    group: Group
    settings: ServingGuardSettings
    seen: dict[int, float] = field(default_factory=dict)  # rank: the newest event's time shown

    def new(self) -> list[tuple[str, dict]]:
        """(rank name, event) of each event since the last call (the first call: none older
        than now is news, so only what happens while it watches)."""
        fresh = []
        for r, guard in read(self.group).items():
            times = [e.get("at", 0) for e in guard.events]
            if r not in self.seen:
                self.seen[r] = max(times, default=0)
                continue
            for e in guard.events:
                if e.get("at", 0) > self.seen[r] and e.get("event") in _SHOWN:
                    fresh.append((guard.host, e))
            self.seen[r] = max([self.seen[r], *times])
        return fresh
