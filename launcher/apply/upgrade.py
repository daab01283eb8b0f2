"""`upgrade` and `rollback`: change what serves, and go back.

rollback: to a history entry (launcher/apply/history.py), with its profile and the image ID every
rank still holds (nothing built or shipped: a rank that no longer has it is named, with the fix):
old down, the entry's deploy up, verified, recorded.

upgrade: the new deploy is prepared while the old one serves -- the image built here and shipped
to the ranks that lack it, the checkpoint staged where the config stages (both capped at
`bwlimit`; the staged copy kept out of the page cache, which on a GB10 is the GPU's memory) --
then swapped: old down, new up, verified. A new start that fails, trips a guard or fails
verification is recorded as failed and the last good deploy is rolled back to by itself; both
are reported. The downtime (the old API stopped -> the new one verified) is measured.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from . import deploy, history, serve
from .cluster_lock import LockLost
from ..errors import Interrupted, SparkstackError
from ..inputs import config as config_mod
from ..inputs.config import Loaded
from ..transport.remote import Group


class RolledBack(SparkstackError):
    """The upgrade failed and the last good deploy serves again."""


# --- rollback -----------------------------------------------------------------------------------

@dataclass
class RollbackPlan:
    target: history.Entry
    current: history.Entry | None
    problems: list[str] = field(default_factory=list)  # one per rank that lacks the image

    def lines(self) -> list[str]:
        now = f"entry {self.current.id} ({self.current.profile})" if self.current else "what runs now"
        out = [f"roll back from {now} to entry {self.target.id}: profile {self.target.profile}, "
               f"recorded {self.target.at}",
               f"  image {self.target.image}, on every rank by image ID:"]
        out += [f"    rank {r.rank} {r.host}: {history.short(r.image_id)}" for r in self.target.ranks]
        out += ["  steps: stop every rank's engine, start the entry's deploy (nothing built or shipped), "
                "wait for the API, verify, record"]
        out += [f"  refused: {p}" for p in self.problems]
        return out

    def to_json(self) -> dict:
        return {"target": self.target.to_json(), "current": self.current.id if self.current else None,
                "problems": self.problems}


def image_problems(entry: history.Entry, found: list[tuple]) -> list[str]:
    """Per rank, why it cannot serve `entry` again (pure: `found` is ranks.image_ids' answer)."""
    want = entry.image_ids
    fix = (f"if this host still has it, `sparkstack ship --profile {entry.profile}` puts it back; "
           "else roll back to another entry (`sparkstack history`)")
    out = []
    for target, have, why in found:
        wanted = want.get(target.rank)
        if have is None:
            out.append(f"{target.name}: cannot list its images ({why})")
        elif wanted is None:
            out.append(f"{target.name}: entry {entry.id} recorded no image ID for it")
        elif have.get(entry.image) != wanted:
            now = f"{entry.image} is {history.short(have[entry.image])} there" if entry.image in have else \
                f"it no longer has {entry.image}"
            out.append(f"{target.name}: no longer has image {history.short(wanted)} of "
                       f"entry {entry.id} ({now}); fix: {fix}")
    return out


def refuse(plan: RollbackPlan) -> None:
    if plan.problems:
        raise SparkstackError("cannot roll back, nothing was changed:\n" + "\n".join(plan.problems))


def running_hashes(group: Group) -> dict[int, str | None]:
    return {s.rank: (s.plan_hash if s.state == "running" else None) for s in serve.states(group)}


def plan_rollback(loaded: Loaded, group: Group, wanted: str | None = None) -> RollbackPlan:
    from ..gather import ranks

    entries = history.load(history.path_for(loaded))
    running = running_hashes(group)
    target = history.pick(entries, running, wanted)
    found = ranks.image_ids(group, [target.image])
    return RollbackPlan(target, history.current(entries, running), image_problems(target, found))


def rollback(loaded: Loaded, group: Group, plan: RollbackPlan, *, verify=None, wait_timeout: float = 900,
             say=print, note: str | None = None) -> deploy.UpReport:
    """The plan's entry serves again: every rank stopped, its deploy started from the image each
    rank holds, verified, recorded (how: rollback)."""
    refuse(plan)
    target = plan.target
    again = config_mod.load(config_for(target, loaded), target.profile)
    say(f"rolling back to entry {target.id} ({target.profile}, {target.image})")
    deploy.down(again, group, say=say)
    report = deploy.up(again, group, restart=True, wait_timeout=wait_timeout, say=say, verify=verify,
                       image=target.image, how="rollback")
    changed = plan_changes(target, report.entry)
    if changed:
        say(f"note: {changed}")
    if report.entry is not None:
        _annotate(loaded, report.entry.id, note=note or f"rolled back to entry {target.id}")
    return report


def config_for(target: history.Entry, loaded: Loaded) -> Path:
    """The cluster.yaml the entry was planned from, when it is still there; else this one."""
    was = Path(target.config) if target.config else None
    return was if was is not None and was.is_file() else loaded.path


def plan_changes(target: history.Entry, now: history.Entry | None) -> str | None:
    """Which ranks' plans differ from the entry's (the config or profile changed since): said,
    since a rollback re-plans the entry's profile with its image, not its exact argv."""
    if now is None:
        return None
    was = {r.rank: r.plan_hash for r in target.ranks}
    differ = [r.rank for r in now.ranks if was.get(r.rank) != r.plan_hash]
    if not differ:
        return None
    return (f"rank {', '.join(map(str, differ))}: the plan differs from entry {target.id}'s (the config or the "
            f"profile changed since); serving entry {target.id}'s image with today's plan of {target.profile}")


# --- upgrade ------------------------------------------------------------------------------------

@dataclass
class UpgradeReport:
    old: history.Entry | None
    new: history.Entry | None = None
    downtime_s: float | None = None
    prepared_s: float = 0.0
    steps: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"old": self.old.id if self.old else None, "new": self.new.id if self.new else None,
                "downtime_s": self.downtime_s, "prepared_s": round(self.prepared_s, 2), "steps": self.steps}


def upgrade(loaded: Loaded, group: Group, *, verify=None, bwlimit: int = 0, wait_timeout: float = 900,
            say=print) -> UpgradeReport:
    """Prepare `loaded`'s deploy while the old one serves, then swap (module docstring)."""
    path = history.path_for(loaded)
    entries = history.load(path)
    old = history.current(entries, running_hashes(group))
    report = UpgradeReport(old)
    if old is None:
        say("no deploy of the history serves now: nothing to roll back to if the new one fails")
    started = time.monotonic()
    prepare(loaded, group, bwlimit, say, report)
    report.prepared_s = time.monotonic() - started
    say(f"prepared in {report.prepared_s:.1f} s while the old deploy served; swapping")
    swap_at = time.monotonic()
    up = deploy.UpReport()
    try:
        deploy.down(loaded, group, say=say)  # the old API is gone from here
        deploy.up(loaded, group, restart=True, wait_timeout=wait_timeout, say=say, verify=verify,
                  how="upgrade", report=up)
    except (Interrupted, LockLost):
        raise  # stopped by the operator, or the cluster is another operator's now: not ours to roll back
    except SparkstackError as e:
        failed = _record_failed(loaded, group, up, e)
        raise _roll_back_after(loaded, group, old, failed, e, swap_at, verify, wait_timeout, say) from None
    report.downtime_s = round(time.monotonic() - swap_at, 2)
    report.new = up.entry
    if up.entry is not None:
        _annotate(loaded, up.entry.id, downtime_s=report.downtime_s,
                  note=f"upgraded from entry {old.id}" if old else None)
    return report


def prepare(loaded: Loaded, group: Group, bwlimit: int, say, report: UpgradeReport) -> None:
    """Build and ship the new image, stage the checkpoint where the config stages: the old
    deploy keeps serving (nothing here stops or starts an engine, nor drops caches)."""
    from . import stage as stage_mod
    from ..images import build, local_docker, ship
    from ..gather import ranks

    image, _ = build.serving_image(loaded)
    if not loaded.profile.image.prebuilt:
        say(f"building {image} (while the old deploy serves)")
        build.build_chain(local_docker.connect(), build.local_chain(loaded))
        image, _ = build.serving_image(loaded)
        report.steps.append("built " + image)
    try:
        ids = ship.local_image_ids([image])
    except SparkstackError:
        if loaded.profile.image.prebuilt:
            say(f"{image} is not on this host: `up` asks the ranks for it")
            return
        raise
    shipment = ranks.ship_plan(group, ids)
    if shipment.needed:
        ship.apply(shipment, group, say=say, bwlimit=bwlimit)
        failed = [r.error for r in shipment.ranks if r.error]
        if failed:
            raise SparkstackError("cannot put the new image on every rank; the old deploy still serves:\n"
                                  + "\n".join(failed))
        report.steps.append("shipped " + image)
    if loaded.cluster.model.local_path:
        plan = stage_mod.make_plan(loaded, group, "nfs")
        results = stage_mod.apply(plan, group, say, bwlimit, nocache=True)
        failed = [r.error for r in results if r.error]
        if failed:
            raise SparkstackError("cannot stage the checkpoint; the old deploy still serves:\n" + "\n".join(failed))
        report.steps.append("staged the checkpoint")


def _record_failed(loaded: Loaded, group: Group, up: deploy.UpReport, error: SparkstackError) -> history.Entry:
    path = history.path_for(loaded)
    if up.plan is not None:
        entry = deploy.deployed_entry(loaded, group, up.plan, up.gathered, "upgrade", outcome=history.FAILED,
                                      verify=up.verify or None, error=error.message)
    else:
        entry = history.Entry(0, history.now(), "upgrade", history.FAILED, loaded.profile.name, "", [],
                              error=error.message)
    return history.add(path, entry)


def _roll_back_after(loaded, group, old, failed, error, swap_at, verify, wait_timeout, say) -> SparkstackError:
    """The error to end with: the failure, and the rollback's outcome (both said)."""
    first = f"the upgrade to {loaded.profile.name} failed (history entry {failed.id}):\n{error.message}"
    if old is None:
        return SparkstackError(first + "\nno earlier deploy in the history served: nothing to roll back to")
    say(f"upgrade failed: rolling back by itself to entry {old.id} ({old.profile})")
    try:
        plan = plan_rollback(loaded, group, str(old.id))
        back = rollback(loaded, group, plan, verify=verify, wait_timeout=wait_timeout, say=say,
                        note=f"rolled back by itself to entry {old.id} after entry {failed.id} failed")
    except SparkstackError as e:
        return SparkstackError(f"{first}\nand rolling back to entry {old.id} failed too:\n{e.message}")
    downtime = round(time.monotonic() - swap_at, 2)
    if back.entry is not None:
        _annotate(loaded, back.entry.id, downtime_s=downtime)
    return RolledBack(f"{first}\nrolled back by itself: entry {old.id} ({old.profile}, {old.image}) serves again "
                      f"as entry {back.entry.id if back.entry else '?'} (verify: "
                      f"{back.verify.get('status', '?')}); downtime {downtime:.1f} s")


def _annotate(loaded: Loaded, entry_id: int, **fields) -> None:
    path = history.path_for(loaded)
    entries = history.load(path)
    for e in entries:
        if e.id == entry_id:
            for k, v in fields.items():
                if v is not None:
                    setattr(e, k, v)
    history.write(path, entries)
