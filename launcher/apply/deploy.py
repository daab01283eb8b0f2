"""`up` and `down`: the whole re-deploy after a boot, and taking it all away again.

up = the API key (generated the first time, launcher/inputs/apikey.py) → prepare the nodes →
gather (launcher/gather/) → plan → judge (`check`'s rows over the same gathered value and the
plan's figures: any failure stops here, nothing started) → build and ship only if a rank lacks
the profile's image → start (workers, then the head) → wait until the API answers → verify
(the caller's callable, `up`'s being the quick form of `sparkstack verify`, apply/verify.py: a
model that answers wrong is not serving, so every rank is stopped and the figures said) →
record in the deploy history (apply/history.py). A cluster already running as planned is left
alone (`restart` forces a new start), verified again unless the history's last entry is this
very deploy, verified.
Interrupted (Ctrl+C, SIGTERM, SIGHUP): what is in flight is cancelled, the containers this run
started are stopped, and the message says whether every rank confirmed it; a second interrupt
exits without waiting for that stop.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from . import history, last_good, load_progress, memguard, prep, serve, servguard, steady
from .cluster_lock import LockLost, ensure_held
from ..check.report import CheckFailed, evaluate, refuse
from ..errors import Interrupted, SparkstackError
from ..gather import cluster, here, ranks
from ..images import build, local_docker, ship
from ..inputs import apikey
from ..inputs.config import Loaded, cluster_name
from ..plan import cluster_plan as planning
from ..status import Status
from ..transport import api
from ..transport.remote import Group

START_ALLOWANCE_S = 300  # the watchers' lifetime beyond the API wait: images, start
GUARD_GRACE_S = 3  # a rank found dead: how long its watcher's report may still be on its way


@dataclass
class UpReport:
    steps: list[str] = field(default_factory=list)
    changed: bool = False
    starting: bool = False  # this run has begun (re)starting the serving containers
    seconds: float = 0.0
    memory: list[memguard.RankMemory] = field(default_factory=list)  # the guard's, while loading
    since: last_good.Since | None = None  # what changed since the last good start, as gathered
    verify: dict = field(default_factory=dict)  # history.verdict of the verification, once run
    entry: history.Entry | None = None  # what was recorded in the deploy history
    plan: planning.Plan | None = None
    gathered: object = None
    image_ids: dict[int, str] | None = None  # each rank's serving image ID once images are settled
    start_s: float = 0.0  # of `seconds`: the containers' start (`docker run` on every rank)
    waited_s: float = 0.0  # of `seconds`: the wait for the API (the engines' own start)
    verify_s: float = 0.0  # of `seconds`: the verification

    def to_json(self) -> dict:
        return {"changed": self.changed, "steps": self.steps, "seconds": round(self.seconds, 2),
                "start_s": round(self.start_s, 2), "waited_s": round(self.waited_s, 2),
                "verify_s": round(self.verify_s, 2),
                "memory": [m.to_json() for m in self.memory], "verify": self.verify,
                "history_entry": self.entry.id if self.entry else None}


class VerifyFailed(SparkstackError):
    """The engines started and the API answers, but what it serves failed verification."""


def group_for(loaded: Loaded, trust_new: bool = False, say=print) -> Group:
    """Connections for `up`/`down`/`status`: retried, since a rank may still be booting."""
    return Group.for_cluster(loaded.cluster, trust_new=trust_new, say=say)


def up(loaded: Loaded, group: Group, *, restart: bool = False, wait_timeout: float = 900,
       say=print, verify=None, image: str | None = None, how: str = "up",
       record: bool = True, report: UpReport | None = None, ahead: steady.Ahead | None = None) -> UpReport:
    """prep → gather → plan → judge (a failed row starts nothing) → images → start → wait
    → verify → record (module docstring). `verify(loaded)`: the verification (apply/verify.py
    `quick`), a result with `.ok` that history.verdict keeps; None: none available, recorded as
    such; False: skipped on purpose (`--no-verify`), recorded as that. One that fails stops every
    rank and raises VerifyFailed. `image`: serve this ref, already on every rank (rollback),
    instead of the profile's (nothing built or shipped). `record`: add the deploy to the history.
    `report`: filled as it goes (the caller keeps what was planned when it raises). `ahead`: the
    probe and API question begun before the cluster lock was taken (gather/ahead.py)."""
    report = report or UpReport()
    try:
        _up(loaded, group, report, restart, wait_timeout, say, image, verify, ahead)
    except KeyboardInterrupt:
        raise Interrupted(_after_interrupt(group, report, say)) from None
    except SparkstackError as e:
        if report.since and report.since.changes and not isinstance(e, (Interrupted, LockLost)):
            e.message = last_good.said(e.message, report.since)  # what changed on a rank, said last
            e.args, e.since = (e.message,), report.since
        raise
    if record:
        try:
            _record(loaded, group, report, how)
        except (SparkstackError, OSError) as e:  # serving all the same: the history is not the cluster
            say(f"WARN: this deploy was not recorded in the history: {getattr(e, 'message', e)}")
    return report


def _verify(loaded: Loaded, group: Group, report: UpReport, verify, say) -> None:
    """The seam where the served model's verification enters (up's `verify`): none given is
    recorded as not available, False as skipped; a failure, or one that cannot run, leaves
    nothing serving, started now or before (nothing half-started)."""
    if report.verify:  # the steady path kept the history's verdict: nothing started since
        report.steps.append("verified (when it started)")
        return
    if verify is None:
        report.verify = history.verdict(None)
        return
    if verify is False:
        report.verify = dict(history.SKIPPED)
        say("not verified (--no-verify): nothing has checked that the model answers right")
        return
    say("verifying the served model (the quick form of `sparkstack verify`; --no-verify skips it)")
    report.starting = True  # Ctrl+C while verifying stops every rank too
    started = time.monotonic()
    try:
        result = verify(loaded)
    except SparkstackError as e:  # could not verify: not called serving either
        raise VerifyFailed(f"the verification could not run: {e.message}\nthe model is not serving: "
                           f"{serve.stop_and_say(group)}") from None
    report.verify_s = time.monotonic() - started
    report.verify = history.verdict(result)
    if hasattr(result, "summary"):
        say("  " + result.summary())
    if not result.ok:
        stopped = serve.stop_and_say(group)
        fix = getattr(result, "fix", "") or "fix the image or profile and run `sparkstack up` again"
        raise VerifyFailed(f"rank 0 ({group.connections[0].target.name}) answers, but what it serves failed "
                           f"verification, so it is not serving: {report.verify['message'] or report.verify['figures']}"
                           f"\n{stopped}\nfix: {fix}; or go back to a deploy that verified (`sparkstack rollback`)")
    report.steps.append("verified")


def _record(loaded: Loaded, group: Group, report: UpReport, how: str) -> None:
    """A good deploy into the history, unless the last entry is this very deploy (an `up` that
    found it running as planned, or a restart of it after a boot or by the supervisor, adds
    nothing: the history is of what changed)."""
    entry = deployed_entry(loaded, group, report.plan, report.gathered, how, verify=report.verify,
                           listed=_listed(group, report))
    path = history.path_for(loaded)
    entries = history.load(path)
    last = entries[-1] if entries else None
    if last is not None and last.outcome == history.SERVING and last.same_deploy(entry):
        report.entry = last
        return
    report.entry = history.add(path, entry)


def _listed(group: Group, report: UpReport) -> dict[int, dict[str, str]]:
    """Each rank's serving image ID as this command knows it, asked at most once: the images
    step's (a start), else the probe's listing (nothing started or shipped), else the ranks'."""
    image = report.plan.image
    if report.image_ids is None and not report.changed:
        seen = _images_seen(report.gathered, image)
        if seen is not None:
            report.image_ids = {r: have.get(image) for r, have in seen.items()}
    if report.image_ids is None:
        report.image_ids = {t.rank: (have or {}).get(image) for t, have, _why in ranks.image_ids(group, [image])}
    return {r: {image: i} if i else {} for r, i in report.image_ids.items()}


def deployed_entry(loaded: Loaded, group: Group, the_plan: planning.Plan, gathered, how: str,
                   listed: dict[int, dict[str, str]] | None = None, **kw) -> history.Entry:
    """A history entry for `the_plan`: the image's ID as each rank has it (`listed`: as this
    command's probe listed them, else the ranks are asked), the checkpoint's fingerprint as each
    rank's probe read it."""
    if listed is None:
        listed = {t.rank: have or {} for t, have, _why in ranks.image_ids(group, [the_plan.image])}
    ids = {r: have.get(the_plan.image) for r, have in listed.items()}
    prints = {r: (f.checkpoint.fingerprint if f and f.checkpoint else None)
              for r, f in (gathered.facts if gathered else {}).items()}
    return history.entry_for(loaded.profile.name, the_plan, ids, prints, how=how, config=str(loaded.path), **kw)


def _after_interrupt(group: Group, report: UpReport, say) -> str:
    """Stop what this run started; a second interrupt gives up on that at once."""
    if not report.starting:
        return "interrupted; nothing was started"
    say("interrupted: stopping the serving containers this run started (interrupt again to exit now)")
    try:
        return f"interrupted; {serve.stop_and_say(group)}"
    except KeyboardInterrupt:
        names = ", ".join(c.target.name for c in group.connections)
        return (f"interrupted twice: exited without waiting for the stop; a serving container may "
                f"still run on {names}: run `sparkstack down`")


def _up(loaded: Loaded, group: Group, report: UpReport, restart: bool, wait_timeout: float,
        say, image: str | None = None, verify=None, ahead: steady.Ahead | None = None) -> UpReport:
    started = time.monotonic()
    apikey.resolve(loaded, create=True)  # made once, before anything runs; the plan reads it
    # ONE probe per rank: serving as planned already?
    seen = steady.look(loaded, group, image, ahead.probed() if ahead is not None and image is None else None)
    if seen.as_planned and not restart and steady.answers(loaded, say, ahead):
        say("already running as planned: nothing to change (--restart forces a new start)")
        gathered = report.gathered = seen.gathered
        report.plan = seen.plan
        report.since = last_good.since_gathered(loaded, gathered, set(seen.probed))  # every rank serves
        _keep_verdict(loaded, group, report, verify, say)
        _serving(loaded, group, report, gathered, say, seen.watched, verify)
        report.seconds = time.monotonic() - started
        return report
    if seen.why_not and not restart:
        say(f"not as planned: {seen.why_not}")
    drop = restart or not seen.current  # serving as planned: the memory is the engine's, no drop
    say("preparing the nodes (sysctls, checkpoint mount" + (", page caches)" if drop else ")"))
    prepared = prep.prepare(loaded, group, say=say, probed=seen.probed, drop=drop)
    prepared.raise_for_failures()
    report.steps.append("prepared the nodes")
    ensure_held()  # between steps: a command whose lock lapsed stops here (issue 33)
    say("checking every rank")
    current = seen.states or serve.states(group)  # prep leaves the containers as the look read them
    gathered = report.gathered = cluster.gather(loaded, group, image, prepared.probed)
    report.since = last_good.since_gathered(loaded, gathered, {s.rank for s in current if s.state == "running"})
    the_plan = report.plan = judged(loaded, gathered)  # the image row is settled below
    longer = load_progress.extended(the_plan.load, wait_timeout)
    if longer:
        say(longer)
    wait_timeout = the_plan.wait_timeout(wait_timeout)  # a slow checkpoint link waits longer (issue 15)
    report.steps.append("checked every rank")
    if serve.is_current(current, the_plan) and not restart:
        say("already running as planned: nothing to change (--restart forces a new start)")
        _wait(loaded, group, report, wait_timeout, say, None, the_plan.load)
    else:
        report.changed = True
        _refuse_foreign(current, loaded, say)
        guard = memguard.MemoryGuard(group, loaded.cluster.memory_guard, wait_timeout + START_ALLOWANCE_S, say)
        if guard.settings.enabled:
            memguard.require_relief(group)  # before a byte is shipped or an engine started
        ensure_held()
        seen_ids = _images_seen(gathered, the_plan.image)
        if image is None:  # a pinned image (rollback) is on every rank already: checked before
            report.image_ids = _ensure_images(loaded, the_plan.image, group, report, say, seen=seen_ids)
        elif seen_ids is not None:
            report.image_ids = {r: have.get(the_plan.image) for r, have in seen_ids.items()}
        ensure_held()
        # Ray's head starts first; native vLLM and TensorFold (as its recipe does): ranks > 0 first
        engine = loaded.engine
        rank0_id = (report.image_ids or {}).get(0)
        for need in engine.image_needs(len(the_plan.ranks)):
            serve.require_image(group.connections[0], the_plan.image, need, rank0_id)
        _engine_takes_the_argv(loaded, group, the_plan, report, say, rank0_id)
        say(f"starting {loaded.profile.name} on {len(the_plan.ranks)} ranks"
            + (f" ({engine.shown_as})" if engine.shown_as else ""))
        report.starting = True
        absent = bool(current) and all(s.state == "absent" for s in current)  # as the probe read them
        try:
            _start_guarded(loaded, group, the_plan, report, wait_timeout, say, guard, engine.head_first,
                           clear=not absent)
        except memguard.MemoryFloor as e:
            raise memguard.MemoryFloor(f"{e.message}\n{serve.stop_and_say(group)}") from None
    _serving(loaded, group, report, gathered, say, seen.watched, verify)
    report.seconds = time.monotonic() - started
    return report


def _keep_verdict(loaded: Loaded, group: Group, report: UpReport, verify, say) -> None:
    """The steady path's verification: none when the history's last entry is this very deploy,
    serving and verified (nothing was started since, so there is nothing new to verify; ~2.4 s of
    an `up` that changes nothing): its verdict goes into `report`, which _verify keeps. Else
    `verify` runs as on a start. `sparkstack verify` asks again on demand."""
    if not callable(verify):
        return
    entries = history.load(history.path_for(loaded))
    last = entries[-1] if entries else None
    if last is None or last.outcome != history.SERVING or last.verify.get("status") != "passed":
        return
    if not last.same_deploy(deployed_entry(loaded, group, report.plan, report.gathered, "up",
                                           listed=_listed(group, report))):
        return
    say(f"verified when it started (history entry {last.id}, {last.at}); not again: nothing was started "
        "since (`sparkstack verify` asks now)")
    report.verify = dict(last.verify)  # _verify keeps it


def _serving(loaded: Loaded, group: Group, report: UpReport, gathered, say, watched: bool, verify) -> None:
    """The API answers: verified, the serving guard on every rank (`watched`: the look saw each
    one at its container already), and the last good start kept."""
    report.steps.append("the API answers")
    watched = watched and not report.changed  # a container started now has no guard yet
    # the rank's own guard from now on (issue 29), started while the verification runs: it
    # watches the engines through the verification's load too, and a failed one stops them
    # (the guard ends with its container)
    said: list[str] = []
    with ThreadPoolExecutor(max_workers=1) as pool:
        guarded = pool.submit(servguard.start, loaded, group, say=said.append, watched=watched)
        _verify(loaded, group, report, verify, say)  # before anything counts this start as a good one
    for line in said:
        say(line)
    if guarded.result():
        report.steps.append("the memory guard watches every rank")
    if report.changed or last_good.load(loaded) is None:  # a cluster left alone keeps its last start
        # the image's ID here when it is here: what was shipped to a rank that lacked it
        last_good.record(loaded, gathered, _serving_memory(group, report), build.local_base_id(gathered.image))


def _serving_memory(group: Group, report: UpReport) -> dict[int, int]:
    """Each rank's MemAvailable now it serves: the guard's last sample, else the probe's when
    nothing was started (it read the engines serving), else read (guard off)."""
    seen = {m.rank: m.samples[-1][1] for m in report.memory if m.samples}
    if not report.changed and report.gathered is not None:
        seen = {**{r: f.memory.available for r, f in report.gathered.facts.items() if f and f.memory}, **seen}
    unseen = [c.target.rank for c in group.connections if c.target.rank not in seen]
    read = prep.read_mem_available(group, unseen) if unseen else {}
    return {**seen, **{r: v for r, v in read.items() if isinstance(v, int)}}


def _engine_takes_the_argv(loaded: Loaded, group: Group, the_plan: planning.Plan, report: UpReport, say,
                           rank0_id: str | None = None) -> None:
    """check's engine config row, asked now that the image is on rank 0: the image's own engine
    configures the planned argv (seconds, no weights); its refusal stops `up` before anything starts.
    `rank0_id`: the image's ID on rank 0, when known: a yes to this very question (the same ID,
    argv, env and config.json) is then given back as `check` remembered it, not asked again."""
    from .preflight import ask_rank0
    from ..check.rows.engine_config import fix_for

    f0 = report.gathered.facts.get(0) if report.gathered is not None else None
    sha = f0.checkpoint.config_sha256 if f0 is not None and f0.checkpoint is not None else None
    answer = ask_rank0(group, the_plan, (rank0_id, sha) if rank0_id and sha else None)
    if answer.ok is None:
        say(f"the image's engine was not asked: {answer.error}")
        return
    if answer.asked_at:
        say(f"the image's engine takes the planned argv (as it answered at {answer.asked_at}: "
            "the same image, argv, env and config.json)")
        report.steps.append("the image's engine took the planned argv")
        return
    if not answer.ok:
        raise CheckFailed(f"check failed; nothing was started:\nrank 0 ({group.connections[0].target.name}) "
                          f"engine config: the image's engine refuses the planned argv: {answer.message} "
                          f"-- fix: {fix_for(answer.message)}")
    say(f"the image's engine takes the planned argv ({answer.seconds:.1f} s)")
    report.steps.append("the image's engine took the planned argv")


def preflight(loaded: Loaded, group: Group, image: str | None = None) -> planning.Plan:
    """Gather, plan, judge over the open Group: a failed row raises CheckFailed, nothing is
    started (the image row aside: `up` builds and ships after this); else the plan."""
    return judged(loaded, cluster.gather(loaded, group, image))


def judged(loaded: Loaded, gathered) -> planning.Plan:
    """The plan from what was gathered, judged: a failed row raises CheckFailed."""
    the_plan, refused = _plan(loaded, gathered)
    refuse(evaluate(gathered, the_plan))  # the plan's own figures judged
    if refused:
        raise refused
    return the_plan


def _images_seen(gathered, image: str) -> dict[int, dict[str, str]] | None:
    """Per rank, the serving image's ID as its probe listed it ({} where it has none): what the
    ship plans from without asking the ranks again. None when a rank's Docker was not listed."""
    seen = {}
    for r, g in gathered.ranks.items():
        if g.facts is None or g.facts.docker is None or g.facts.docker.server_version is None:
            return None
        found = g.facts.docker.image(image)
        if found and not (found.id.startswith("sha256:") and len(found.id) == 71):
            return None  # a short ID (`docker images` without inspect): ask the ranks
        seen[r] = {image: found.id} if found else {}
    return seen


def _plan(loaded: Loaded, gathered) -> tuple[planning.Plan | None, SparkstackError | None]:
    """The plan from what was gathered, or why there is none: said after the judging, so that a
    failed row names the cause first."""
    if gathered.model is None:
        return None, SparkstackError(gathered.model_error or "the checkpoint was not read")
    try:
        return planning.build(loaded, gathered), None
    except SparkstackError as e:
        return None, e


def _refuse_foreign(current: list[serve.RankState], loaded: Loaded, say) -> None:
    """Another cluster's engine on a rank is not ours to replace; another profile's is, said."""
    name = cluster_name(loaded)
    foreign = serve.foreign(current, name)
    if foreign:
        raise SparkstackError(
            "\n".join(f"rank {s.rank} ({s.host}): its {serve.CONTAINER_NAME} belongs to cluster {s.cluster!r} "
                      f"(profile {s.profile}), not to this config's {name!r}" for s in foreign)
            + "\nnothing was started. Stop it with that cluster's config (`sparkstack down -c ITS_CONFIG`), "
            "or, if it is this very cluster under another name, set `name:` in this config to it")
    replaced = sorted({s.profile for s in current if s.state != "absent" and s.profile
                       and s.profile != loaded.profile.name})
    if replaced:
        say(f"replacing the engines of profile {', '.join(replaced)} with {loaded.profile.name}")


def _start_guarded(loaded: Loaded, group: Group, the_plan, report: UpReport, wait_timeout: float,
                   say, guard: memguard.MemoryGuard, ray: bool, clear: bool = True) -> None:
    """Start and wait with every rank's memory watched; a rank the guard stopped is reported as
    that (MemoryFloor), not as an engine that merely exited. `clear`: remove old containers first
    (False: this command's probe found none, and the cluster lock kept it so)."""
    with guard:
        try:
            begun = time.monotonic()
            serve.start(the_plan, group, say=say, head_first=ray, clear=clear)
            report.start_s = time.monotonic() - begun
            report.steps.append("started every rank")
            _wait(loaded, group, report, wait_timeout, say, guard, the_plan.load)
        except memguard.MemoryFloor:
            raise
        except SparkstackError:
            guard.check(grace=GUARD_GRACE_S)
            raise
        finally:
            report.memory = guard.report()


def _wait(loaded: Loaded, group: Group, report: UpReport, wait_timeout: float, say,
          guard: memguard.MemoryGuard | None, load: dict) -> None:
    progress = load_progress.Progress(group, load, say)

    def watch():
        if guard:
            guard.check()
        serve.watch(group)
        progress()

    say("waiting for the API")
    started = time.monotonic()
    try:
        api.wait_ready(api.endpoint(loaded), wait_timeout, say=say, watch=watch)
        report.waited_s = time.monotonic() - started
    except api.NotServing as e:
        problems = [serve.diagnose(group, s) for s in serve.states(group)]  # before the stop
        stopped = f"; {serve.stop_and_say(group)}" if report.changed else ""
        raise SparkstackError(e.message + stopped + "\neach rank as the wait gave up:\n"
                              + "\n".join(problems)) from None


def _ensure_images(loaded: Loaded, image: str, group: Group, report: UpReport, say,
                   seen: dict[int, dict[str, str]] | None = None) -> dict[int, str]:
    """Build and ship only when a rank lacks the serving image (by image ID). `seen`: each
    rank's image IDs as this command's probe listed them (one probe per rank per command);
    else the ranks are asked. Returns each rank's image ID now (a shipped rank is tagged only
    once its ID equals this host's)."""
    try:
        ids = ship.local_image_ids([image])  # Docker's socket: docker-py is not imported
    except SparkstackError:
        if loaded.profile.image.prebuilt:
            found = _on_every_rank(image, group, say)
            if found:
                return {c.target.rank: found for c in group.connections}  # pulled or loaded there
            raise
        say(f"building {image}")
        build.build_chain(local_docker.connect(), build.local_chain(loaded))
        ids = ship.local_image_ids([image])
        report.steps.append("built the image chain")
    if seen is not None and set(seen) == {c.target.rank for c in group.connections}:
        shipment = ship.plan_for(ids, [(c.target, seen[c.target.rank], None) for c in group.connections])
        if shipment.needed:
            ship.plan_layers(shipment, group)
    else:
        shipment = ranks.ship_plan(group, ids)
    if shipment.needed:
        ship.apply(shipment, group, say=say)
        report.steps.append("shipped " + image)
    failed = [r for r in shipment.ranks if r.status == Status.FAILED]
    if failed:
        raise SparkstackError("cannot put the image on every rank, nothing was started:\n"
                              + "\n".join(r.error or f"rank {r.rank}: failed" for r in failed))
    return {r.rank: ids[image] for r in shipment.ranks}


def _on_every_rank(image: str, group: Group, say) -> str | None:
    """A prebuilt image absent here is fine when every rank has it under one image ID: that ID."""
    found = ranks.image_ids(group, [image])
    ids = {have.get(image) if have else None for _t, have, _why in found}
    if len(ids) == 1 and None not in ids:
        image_id = ids.pop()
        say(f"{image} is not on this host, but every rank has it ({image_id.removeprefix('sha256:')[:12]}): "
            "nothing to ship")
        return image_id
    return None


def down(loaded: Loaded, group: Group, say=print, wait_timeout: float = prep.WAIT_TIMEOUT_S) -> list[str]:
    """Stop and remove the serving container on every rank, then wait until each rank's
    MemAvailable is back to what the plan needs. Returns the ranks that failed to stop.
    Another cluster's engine on a rank is stopped too (down empties the ranks), but named."""
    name = cluster_name(loaded)
    for s in serve.foreign(serve.states(group), name):
        say(f"rank {s.rank} ({s.host}): stopping cluster {s.cluster!r}'s engine (profile {s.profile}), "
            f"not this config's {name!r}")
    failed = serve.stop(group)
    for r in failed:
        say(f"{r.target.name}: {r.why()}")
    stopped = [c.target.rank for c in group.connections if c.target.name not in {r.target.name for r in failed}]
    need = planning.memory_need(loaded, here.read_model(loaded)).total
    prep.wait_for_memory(group, stopped, need, timeout=wait_timeout, say=say)
    return [r.target.name for r in failed]
