"""The serving containers on the ranks: start (workers, then the head), stop, state, logs.

All or nothing: if any rank's container fails to start or exits while the cluster comes up,
every rank's container is stopped and each failed rank is reported with its exit code (an OOM
kill said plainly) and its last log lines. Never a half-started cluster.

Each container carries a label with the hash of its rank's plan (env, docker run, engine argv),
so `up` on a cluster already running as planned changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import asdict, dataclass

from ..engines import ImageNeed
from ..errors import SparkstackError
from ..facts import remote as rank_facts
from ..facts.parts import FactError
from ..inputs import answers
from ..plan import caches
from ..plan.cluster_plan import CONTAINER_NAME, Plan, RankPlan, env_file
from ..transport.remote import Connection, Group, Result

PLAN_LABEL = "org.sparkstack.plan"
PROFILE_LABEL, CLUSTER_LABEL = "org.sparkstack.profile", "org.sparkstack.cluster"  # set by the plan
LOG_TAIL = 30


class StartFailed(SparkstackError):
    pass


@dataclass
class RankState:
    """One rank's serving container as Docker reports it."""

    rank: int
    host: str
    state: str                 # running | exited | created | absent | unreachable | unknown
    exit_code: int | None = None
    oom_killed: bool = False
    started_at: str | None = None
    image: str | None = None
    plan_hash: str | None = None
    error: str | None = None
    profile: str | None = None  # the container's labels: which profile, which cluster started it
    cluster: str | None = None

    def to_json(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        if self.state in ("unreachable", "unknown"):
            return self.error or self.state
        if self.oom_killed:
            return f"killed by the kernel's OOM killer (exit {self.exit_code}): the rank ran out of memory"
        if self.state == "exited":
            return f"exited with code {self.exit_code}"
        return self.state


def plan_hash(rank: RankPlan) -> str:
    blob = json.dumps([rank.env, rank.docker_run, rank.engine], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def run_command(rank: RankPlan) -> tuple[str, bytes]:
    """The rank's `docker run` command line, labelled with its plan's hash, and its environment,
    which travels on stdin (`--env-file /dev/stdin`) so no value -- the API key included -- is
    ever on a command line. With a compile cache mounted, the kit's marker goes into it once the
    container runs (caches.mark_command: `down --purge-caches` removes only marked directories)."""
    argv = list(rank.docker_run)
    at = argv.index("-d") + 1
    argv[at:at] = ["--label", f"{PLAN_LABEL}={plan_hash(rank)}"]
    command = shlex.join(argv + rank.engine)
    if any(a.endswith(f":{caches.IN_CONTAINER}") for a in rank.docker_run):
        command += " && " + caches.mark_command(argv[argv.index("--name") + 1])
    return command, env_file(rank.env, f"rank {rank.rank}")


_INSPECT = rank_facts.container_state_command(CONTAINER_NAME, PLAN_LABEL, (PROFILE_LABEL, CLUSTER_LABEL))


def _parse_state(result: Result) -> RankState:
    t = result.target
    if result.error or result.exit_status != 0:
        return RankState(t.rank, t.address, "unreachable", error=result.why())
    try:
        found = rank_facts.parse_container_state(result.stdout, extra=2)
    except FactError as e:
        return RankState(t.rank, t.address, "unknown", error=f"{t.name}: {e}")
    return _state_of(t.rank, t.address, found)


def _state_of(rank: int, host: str, found: rank_facts.ContainerState | None) -> RankState:
    if found is None:
        return RankState(rank, host, "absent")
    profile, cluster = (found.extra + (None, None))[:2]
    return RankState(rank, host, found.status, found.exit_code, found.oom_killed, found.started_at,
                     found.image, found.label, profile=profile, cluster=cluster)


def probed_state(rank: int, host: str, raw: dict | None) -> RankState:
    """A rank's container as its probe read it (gather.probe's `container`)."""
    if raw is None:
        return RankState(rank, host, "unknown", error=f"rank {rank} ({host}): the probe did not read the container")
    try:
        found = rank_facts.parse_probed_container(raw, PLAN_LABEL, (PROFILE_LABEL, CLUSTER_LABEL))
    except FactError as e:
        return RankState(rank, host, "unknown", error=f"rank {rank} ({host}): {e}")
    return _state_of(rank, host, found)


def states(group: Group) -> list[RankState]:
    return [_parse_state(r) for r in group.run(_INSPECT, timeout=20).results]


def foreign(current: list[RankState], cluster: str) -> list[RankState]:
    """The ranks whose engine container another cluster started (by its label)."""
    return [s for s in current if s.cluster and s.cluster != cluster]


def is_current(current: list[RankState], plan: Plan) -> bool:
    """Every rank runs a container made from this very plan."""
    wanted = {r.rank: plan_hash(r) for r in plan.ranks}
    return all(s.state == "running" and s.plan_hash == wanted[s.rank] for s in current)


STOP_TRIES = 15  # seconds of retrying removal
SETTLE_S = 2  # after a start was cut short: absent this many seconds in a row counts as gone


def stop(group: Group, settle_s: int = 0) -> list[Result]:
    """Remove the serving container on every rank; nothing there is fine. A rank counts as
    stopped only when its Docker answers that no such container is left (a missing CLI or a
    daemon that does not answer is a failure, not an absence). A `docker run` cut short (Ctrl+C
    during `up`) can still create its container after the first `rm -f`: removal is retried,
    and with `settle_s` the container must stay absent that many seconds before it counts."""
    results = group.run(f"quiet=0; for try in $(seq {STOP_TRIES}); do "
                        f"docker rm -f {CONTAINER_NAME} >/dev/null 2>&1; "
                        f"left=$(docker ps -aq --filter name=^{CONTAINER_NAME}$) || exit; "
                        f"if [ -n \"$left\" ]; then quiet=0; "
                        f"elif [ $quiet -ge {settle_s} ]; then exit 0; else quiet=$((quiet+1)); fi; "
                        f"sleep 1; done; echo '{CONTAINER_NAME} is still there' >&2; exit 1",
                        timeout=60 + STOP_TRIES).results
    return [r for r in results if not r.ok]


def stop_and_say(group: Group) -> str:
    """Stop every rank's container and say so only as far as every rank confirmed it. Called
    when a start failed or was interrupted, so a start still in flight is waited out."""
    failed = stop(group, settle_s=SETTLE_S)
    if not failed:
        return "every rank's container was stopped"
    return ("the container could not be stopped on " + "; ".join(f"{r.target.name} ({r.why()})" for r in failed)
            + ": run `sparkstack down` once it answers")


def require_image(conn: Connection, image: str, need: ImageNeed, image_id: str | None = None) -> None:
    """Refuse, before anything starts, an image without what the engine needs (engines.ImageNeed).
    `image_id`: the image's ID on the rank, when known: an image by ID never changes, so a need
    it met once is met (kept on this host, launcher/inputs/answers.py) and not asked again
    (a `docker run`, ~0.5 s of every start)."""
    key = answers.key("image-need", image_id, list(need.argv), need.min_version) if image_id else None
    if key and answers.known(key) is not None:
        return
    r = conn.run(f"docker run --rm --network none {shlex.quote(image)} {shlex.join(need.argv)}", timeout=300)
    _judge_need(conn, image, need, r)
    if key:
        answers.keep(key, {"image": image, "stdout": r.stdout[-200:]})


def _judge_need(conn: Connection, image: str, need: ImageNeed, r: Result) -> None:
    if need.min_version is None:
        if not r.ok:
            raise StartFailed(need.missing.format(host=conn.target.name, image=image, why=r.why()))
        return
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", r.stdout) if r.ok else None
    if match is None:
        raise StartFailed(need.missing.format(host=conn.target.name, image=image, why=r.why()))
    version = tuple(int(x) for x in match.groups())
    if version < need.min_version:
        raise StartFailed(need.too_old.format(host=conn.target.name, image=image,
                                              version=".".join(map(str, version)),
                                              need=".".join(map(str, need.min_version))))


def start(plan: Plan, group: Group, say=print, head_first: bool = False, clear: bool = True) -> list[RankState]:
    """Workers first (ranks 1..n-1, headless), then the head (rank 0) -- or, for Ray
    (`head_first`), the head and then the workers that join it. Any failure stops every rank
    and raises StartFailed with each failed rank's diagnosis. A rank that dies later, while the
    model loads, is caught by `watch` (called while waiting for the API). `clear`: remove the old
    containers first (False: the caller's probe, under the cluster lock, found none; one there
    after all fails its rank's `docker run` on the name, and every rank is stopped)."""
    by_rank = {c.target.rank: c for c in group.connections}
    leftovers = stop(group) if clear else []
    if leftovers:
        raise StartFailed("cannot clear the old serving containers:\n"
                          + "\n".join(f"{r.target.name}: {r.why()}" for r in leftovers))
    workers = [r for r in plan.ranks if r.rank != 0]
    head = [r for r in plan.ranks if r.rank == 0]
    order = ((head, "head"), (workers, "workers")) if head_first else ((workers, "workers"), (head, "head"))
    for batch, what in order:
        if not batch:
            continue
        say(f"starting {what}: " + ", ".join(by_rank[r.rank].target.name for r in batch))
        results = Group([by_rank[r.rank] for r in batch]).each(lambda c: _start_one(plan, c)).results
        failed = [res for res in results if not res.ok]
        if failed:
            _abort(group, [f"{r.target.name}: docker run failed: {r.why()}" for r in failed])
    return watch(group)


def _start_one(plan: Plan, conn: Connection) -> Result:
    command, env_file = run_command(plan.ranks[conn.target.rank])
    return conn.run(command, stdin=env_file, timeout=120)


def watch(group: Group) -> list[RankState]:
    """Every rank's container must be running; if one is not, stop all and say why."""
    current = states(group)
    dead = [s for s in current if s.state != "running"]
    if dead:
        _abort(group, [diagnose(group, s) for s in dead])
    return current


def diagnose(group: Group, state: RankState) -> str:
    """A failed rank in one block: what happened and its last log lines."""
    conn = next(c for c in group.connections if c.target.rank == state.rank)
    lines = [f"{conn.target.name}: {state.describe()}"]
    if state.state != "unreachable":
        tail = conn.run(f"docker logs --tail {LOG_TAIL} {CONTAINER_NAME} 2>&1", timeout=30)
        lines += [f"  | {line}" for line in tail.stdout.rstrip().splitlines()[-LOG_TAIL:]]
    return "\n".join(lines)


def _abort(group: Group, problems: list[str]) -> None:
    raise StartFailed(f"the cluster did not start; {stop_and_say(group)}.\n" + "\n".join(problems))
