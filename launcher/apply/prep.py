"""`sparkstack prep`: put every rank in the state serving needs after a boot, idempotently.

Plan, then apply. `plan_rank` is pure (the config and the rank's facts in, the steps out): the
sysctls of launcher/inputs/node_settings.py that differ from what the rank reads now, swap off
when the profile or config says no swap and the rank has some (seed 001), the checkpoint
mount when the config names an NFS export and the model path is not a mount (on the NFS
server's own node a bind mount of the export: seed 000's gotcha), the GPU clock lock of
`gpu_clock` (`nvidia-smi -lgc`, recorded in node_settings.GPU_CLOCK_FILE), and dropping page caches
(always: the page cache is what squeezes a unified-memory GB10). `apply` runs each rank's
root steps as ONE sudo command and the drop through node_settings' narrow sudoers rule, all
ranks in parallel; `wait_for_memory` then polls until every rank's MemAvailable is back above
what the plan needs (plan.memory_need), with progress and a timeout.

A step already in place is reported as such and not run again, so a second `prep` changes
nothing but the (harmless) cache drop.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from ..errors import SparkstackError
from ..facts import remote as rank_facts
from ..facts.memory import Memory, parse_meminfo
from ..facts.parts import FactError
from ..facts.record import Facts
from ..inputs import node_settings
from ..inputs.config import Loaded, no_swap
from ..plan.kv import gib
from ..transport.remote import Connection, Group

WAIT_TIMEOUT_S = 120.0
POLL_S = 0.5
# mount(8) refuses fstab-only options on the command line
_FSTAB_ONLY = {"nofail", "_netdev", "auto", "noauto", "defaults"}


class PrepError(SparkstackError):
    """A rank could not be prepared; the message names the rank, the cause and the fix."""


@dataclass(frozen=True)
class Step:
    name: str  # "vm.swappiness=1", "mount /models/x", "drop caches"
    command: str
    needed: bool  # False: already in place, nothing to run
    detail: str  # what was found
    root: bool = True  # run through sudo (the drop uses its own narrow rule instead)


@dataclass
class RankPrep:
    rank: int
    host: str
    steps: list[Step]
    changed: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    mem_available: int | None = None
    error: str | None = None

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("steps")
        return d


# --- the plan (pure) ---------------------------------------------------------------------------

def sysctl_steps(loaded: Loaded, f: Facts) -> list[Step]:
    steps = []
    for name, value in node_settings.sysctls(loaded.cluster).items():
        now = f.sysctls.get(name)
        steps.append(Step(f"{name}={value}", f"sysctl -q -w {shlex.quote(f'{name}={value}')}",
                          now != str(value), f"was {now if now is not None else 'unreadable'}"))
    return steps


def mount_step(loaded: Loaded, r: int, f: Facts) -> Step | None:
    """The checkpoint mount from node_settings' fstab line (the same one Ansible writes)."""
    entry = node_settings.fstab_entry(loaded.cluster, r)
    if entry is None:
        return None
    source, target, fstype, options = entry.split()[:4]
    mounted = f.model_mount is not None and f.model_mount.target.rstrip("/") == target.rstrip("/")
    opts = [o for o in options.split(",") if o not in _FSTAB_ONLY]
    q = shlex.quote
    if fstype == "none" and "bind" in opts:
        command = f"mkdir -p {q(target)} && mount --bind {q(source)} {q(target)}"
        what = f"bind {source}"
    else:
        command = f"mkdir -p {q(target)} && mount -t {q(fstype)} -o {q(','.join(opts))} {q(source)} {q(target)}"
        what = f"{fstype} {source}"
    found = (f"{f.model_mount.source} ({f.model_mount.fstype}) on {f.model_mount.target}"
             if f.model_mount else "not mounted")
    return Step(f"mount {target} ({what})", command, not mounted, found)


def swap_step(loaded: Loaded, f: Facts) -> Step | None:
    """Swap off now and after reboots, when the profile or the config says no swap (seed 001)."""
    if not no_swap(loaded):
        return None
    m = f.memory
    found = "unreadable" if m is None else (f"{gib(m.swap_total)} swap" if m.swap_total else "no swap")
    return Step("swap off", node_settings.swap_off_command(), m is None or m.swap_total > 0, found)


def gpu_clock_step(loaded: Loaded, f: Facts) -> Step | None:
    """The GPU clock lock cluster.yaml's gpu_clock asks for; without one, the reset of a lock an
    earlier prep (or the Ansible unit) recorded, so removing the setting undoes it."""
    want = node_settings.gpu_clock_range(loaded.cluster)
    locked = f.gpu_clocks.locked if f.gpu_clocks else None
    found = f"locked {locked[0]},{locked[1]} MHz" if locked else "no lock recorded"
    if want is None:
        return Step("gpu clock reset", node_settings.gpu_clock_reset_command(), True, found) if locked else None
    return Step(f"gpu clock {want[0]},{want[1]} MHz", node_settings.gpu_clock_command(*want), locked != want, found)


def drop_step(loaded: Loaded, r: int, f: Facts) -> Step:
    user = loaded.cluster.ranks[r].user
    cached = f"{gib(f.memory.cached)} page cache" if f.memory else "page cache"
    return Step("drop caches", node_settings.drop_caches_command(user), True, cached, root=False)


def plan_rank(loaded: Loaded, r: int, f: Facts, drop: bool = True) -> list[Step]:
    """The rank's steps in order: sysctls, swap off (when asked), the mount, the GPU clock
    (when asked, or to undo), then the drop (after the mount: the checkpoint is then on its
    final filesystem)."""
    steps = sysctl_steps(loaded, f)
    swap = swap_step(loaded, f)
    if swap:
        steps.append(swap)
    for step in (mount_step(loaded, r, f), gpu_clock_step(loaded, f)):
        if step:
            steps.append(step)
    if drop:
        steps.append(drop_step(loaded, r, f))
    return steps


# --- applying ----------------------------------------------------------------------------------

def root_script(steps: list[Step]) -> str:
    """One shell script running every needed root step; prints `OK <i>` or `FAIL <i> <why>`."""
    lines = []
    for i, s in enumerate(steps):
        lines.append(f"if out=$( ({s.command}) 2>&1); then echo 'OK {i}'; "
                     f"else echo \"FAIL {i} $(printf %s \"$out\" | tail -n1)\"; fi")
    return "\n".join(lines)


def _sudo_refused(result) -> bool:
    text = (result.stderr + result.stdout).lower()
    return result.exit_status not in (0, None) and "sudo" in text and (
        "password" in text or "not in the sudoers" in text or "not allowed" in text)


def apply_rank(conn: Connection, prep: RankPrep, timeout: float = 60.0) -> RankPrep:
    """Run the rank's needed steps; fills changed / already / failed / error."""
    t = conn.target
    prep.already = [s.name for s in prep.steps if not s.needed]
    root = [s for s in prep.steps if s.needed and s.root]
    if root:
        result = conn.run(root_script(root), timeout=timeout, sudo=True)
        if result.error:
            prep.error = result.error
            return prep
        if _sudo_refused(result):
            prep.error = (f"{t.name}: prep needs root and `sudo -n` was refused for {t.user} "
                          f"({result.stderr.strip().splitlines()[-1] if result.stderr.strip() else 'no sudo'}). "
                          f"Fix: give {t.user} passwordless sudo, or connect as root (ranks[{t.rank}].user)")
            return prep
        _record(prep, root, result.stdout)
    for s in (s for s in prep.steps if s.needed and not s.root):
        result = conn.run(s.command, timeout=timeout)
        if result.ok:
            prep.changed.append(s.name)
        elif result.error:
            prep.error = result.error
        else:
            prep.failed.append(f"{s.name}: {result.why()}" + (
                f" -- install the narrow sudoers rule ({node_settings.SUDOERS_FILE}, Ansible role "
                "spark_node) or give the user sudo" if "sudo" in (result.stderr + result.stdout) else ""))
    return prep


def _record(prep: RankPrep, steps: list[Step], stdout: str) -> None:
    seen = set()
    for line in stdout.splitlines():
        m = re.match(r"^(OK|FAIL) (\d+) ?(.*)$", line)
        if not m or int(m[2]) >= len(steps):
            continue
        step = steps[int(m[2])]
        seen.add(int(m[2]))
        if m[1] == "OK":
            prep.changed.append(step.name)
        else:
            prep.failed.append(f"{step.name}: {m[3] or 'failed'}")
    prep.failed += [f"{s.name}: no result" for i, s in enumerate(steps) if i not in seen]


def apply(group: Group, preps: dict[int, RankPrep]) -> dict[int, RankPrep]:
    """Every rank's steps at once; a rank whose apply raised keeps that as its error."""
    live = [c for c in group.connections if c.target.rank in preps]
    for o in Group(live).gather(lambda c: apply_rank(c, preps[c.target.rank])):
        if not o.ok:
            preps[o.rank].error = o.why()
    return preps


# --- waiting for memory ------------------------------------------------------------------------

def read_mem_available(group: Group, ranks: list[int]) -> dict[int, int | str]:
    """MemAvailable in bytes per rank, or the error that kept it from being read."""
    return {r: m.available if isinstance(m, Memory) else m for r, m in read_memory(group, ranks).items()}


def read_memory(group: Group, ranks: list[int]) -> dict[int, Memory | str]:
    """Each rank's /proc/meminfo, or the error that kept it from being read."""
    conns = [c for c in group.connections if c.target.rank in ranks]

    def one(c: Connection) -> Memory | str:
        res = c.run(rank_facts.MEMINFO_COMMAND, timeout=10)
        try:
            return parse_meminfo(res.stdout) if res.ok else res.why()
        except FactError:
            return f"{c.target.name}: /proc/meminfo unreadable"

    return {o.rank: o.value if o.ok else o.why() for o in Group(conns).gather(one)}


def wait_for_memory(group: Group, ranks: list[int], need: int, *, timeout: float = WAIT_TIMEOUT_S,
                    say: Callable[[str], None] = lambda line: None,
                    poll: float = POLL_S, memory: dict[int, Memory] | None = None) -> dict[int, int]:
    """Poll until every rank's MemAvailable is at least `need`; PrepError naming the ranks
    still short (and by how much) at the timeout. `memory`: filled with each rank's last read."""
    deadline = time.monotonic() + timeout
    names = {c.target.rank: c.target.name for c in group.connections}
    while True:
        read = read_memory(group, ranks)
        seen = {r: m.available if isinstance(m, Memory) else m for r, m in read.items()}
        short = {r: v for r, v in seen.items() if not isinstance(v, int) or v < need}
        if not short:
            if memory is not None:
                memory.update(read)
            return seen
        if time.monotonic() >= deadline:
            lines = [f"{names[r]}: MemAvailable " + (f"{gib(v)} < {gib(need)} needed" if isinstance(v, int)
                     else f"unreadable ({v})") for r, v in short.items()]
            raise PrepError(f"memory did not come back within {timeout:.0f} s:\n" + "\n".join(lines)
                            + "\nfix: stop what holds memory on those ranks (`docker ps`, "
                            "`ps aux --sort=-rss | head`), then `sparkstack prep` again")
        say("waiting for MemAvailable ≥ " + gib(need) + ": " + ", ".join(
            f"{names[r]} {gib(v) if isinstance(v, int) else '?'}" for r, v in short.items()))
        time.sleep(poll)


# --- the whole command -------------------------------------------------------------------------

@dataclass
class PrepReport:
    ranks: list[RankPrep]
    need: int | None
    seconds: float = 0.0
    probed: dict | None = None  # the probe's answers still true after the steps (see prepare)

    @property
    def ok(self) -> bool:
        return all(r.error is None and not r.failed for r in self.ranks)

    def raise_for_failures(self) -> None:
        """PrepError listing each rank that failed, its cause and fix (for `up`)."""
        lines = [r.error or f"rank {r.rank} ({r.host}): " + "; ".join(r.failed)
                 for r in self.ranks if r.error or r.failed]
        if lines:
            raise PrepError(f"prep failed on {len(lines)} of {len(self.ranks)} ranks:\n" + "\n".join(lines))

    def to_json(self) -> dict:
        return {"ok": self.ok, "mem_needed": self.need, "seconds": round(self.seconds, 2),
                "ranks": [r.to_json() for r in self.ranks]}


def prepare(loaded: Loaded, group: Group, *, drop: bool = True, wait_timeout: float = WAIT_TIMEOUT_S,
            say: Callable[[str], None] = lambda line: None, probed: dict | None = None) -> PrepReport:
    """Gather, plan, apply, wait, over an open Group (what `up` calls). Unreachable ranks are
    reported, the others still prepared; the wait raises PrepError at its timeout. `probed`:
    this command's probe answers (not probed again). The report's `probed`: the answers still
    true afterwards, the memory as the wait last read it, for the rest of the command; None
    when a step other than the drop changed a rank (the caller probes again)."""
    from ..gather import here, probe
    from ..plan import cluster_plan as planning
    from .cluster_lock import ensure_held

    started = time.monotonic()
    ensure_held()  # between steps: a command whose lock lapsed stops here (issue 33)
    gathered = probed or probe.gather(group, loaded)
    report = PrepReport([], None)
    preps = {}
    for r, g in gathered.items():
        if g.facts is None:
            report.ranks.append(RankPrep(r, g.host, [], error=g.error))
            continue
        preps[r] = RankPrep(r, g.host, plan_rank(loaded, r, g.facts, drop))
        report.ranks.append(preps[r])
    ensure_held()
    apply(group, preps)
    ready = [r for r, p in preps.items() if p.error is None]
    memory: dict[int, Memory] = {}
    if drop and ready:
        report.need = planning.memory_need(loaded, here.read_model(loaded)).total
        for r, v in wait_for_memory(group, ready, report.need, timeout=wait_timeout, say=say,
                                    memory=memory).items():
            preps[r].mem_available = v
    report.probed = _still_true(gathered, preps, memory)
    report.seconds = time.monotonic() - started
    return report


def _still_true(gathered: dict, preps: dict[int, RankPrep], memory: dict[int, Memory]) -> dict | None:
    """The probe's answers once the steps ran: the drop changed only the memory (refreshed from
    the wait's last read); any other step changed what the probe read, so none are kept."""
    if any(set(p.changed) - {"drop caches"} or p.failed or p.error for p in preps.values()):
        return None
    kept = dict(gathered)
    for r, g in gathered.items():
        if g.facts is not None and "drop caches" in preps[r].changed:
            if r not in memory:
                return None
            kept[r] = dataclasses.replace(g, facts=dataclasses.replace(g.facts, memory=memory[r]))
    return kept


def run(loaded: Loaded, *, trust_new: bool = False, drop: bool = True,
        wait_timeout: float = WAIT_TIMEOUT_S, say: Callable[[str], None] = lambda line: None) -> PrepReport:
    """The whole `prep`: connect (one attempt each), then `prepare`."""
    from ..gather import probe

    with probe.open_group(loaded, trust_new=trust_new, say=say) as group:
        return prepare(loaded, group, drop=drop, wait_timeout=wait_timeout, say=say)
