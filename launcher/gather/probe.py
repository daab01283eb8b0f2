"""The probe: run the ONE probe on every rank in parallel and parse what came back.

`check`, `prep`, `plan` and `up` all start here (`check` and `up` through cluster.gather). The
result is per rank, a Facts or the reason there is none (unreachable, the probe failed, its
output unreadable), never an exception:
one dead rank must not hide the others' facts. The Group stays open so the caller's next
commands (pings, sudo steps) reuse the same SSH connections.
"""

from __future__ import annotations

import dataclasses
import json
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..facts import record as facts_mod
from ..facts.parts import FactError
from ..facts.record import Facts
from ..inputs import node_settings
from ..inputs.config import Loaded
from ..transport.outcome import RankOutcome
from ..transport.remote import Connection, Group

PROBE_TIMEOUT_S = 20.0  # the probe's own commands stop at 5 s each; this bounds the whole
EXTRA_SYSCTLS = ("fs.nr_open",)  # the kernel's ceiling for nofile, for the ulimits check


@dataclass(frozen=True)
class RankFacts:
    """One rank's answer: facts, or why there are none."""

    rank: int
    host: str  # the label the config gives (name, else address)
    facts: Facts | None
    error: str | None
    seconds: float
    container: dict | None = None  # the serving container as the probe read it, when asked (raw)

    @property
    def ok(self) -> bool:
        return self.facts is not None


def open_group(loaded: Loaded, *, trust_new: bool = False, attempts: int = 1,
               connect_timeout: float | None = None, say: Callable[[str], None] | None = None) -> Group:
    """Connections to every rank, not yet opened. One attempt by default: a preflight reports
    an unreachable rank within the connect timeout instead of waiting for it to boot."""
    timeout = connect_timeout or float(loaded.cluster.ssh.connect_timeout_s)
    return Group.for_cluster(loaded.cluster, trust_new=trust_new, timeout=timeout, attempts=attempts,
                             say=say or (lambda line: None))


def probe_args(loaded: Loaded, rank_index: int, model_dir: str | None = None) -> dict:
    """What the probe reads on this rank: its sysfs, the checkpoint the engine reads (the staged
    copy when model.local_path is set; `model_dir` another), every managed sysctl."""
    cluster = loaded.cluster
    sysctls = tuple(node_settings.sysctls(cluster)) + EXTRA_SYSCTLS
    return facts_mod.probe_args(cluster.ranks[rank_index].sysfs_root, model_dir or cluster.model.serving_path,
                                sysctls=sysctls,
                                nccl_lib=cluster.nccl.host_lib)


def probe_rank(conn: Connection, loaded: Loaded, timeout: float = PROBE_TIMEOUT_S,
               model_dir: str | None = None, container: dict | None = None) -> RankFacts:
    """`container`: {"name", "watcher_pidfile"} of the serving container to read as well
    (`up`: whether the cluster already serves as planned, in the same round trip)."""
    t = conn.target
    args = probe_args(loaded, t.rank, model_dir)
    if container:
        args["container"] = container
    command, stdin = facts_mod.invocation(args)
    sent = time.time()
    result = conn.run(command, stdin=stdin, timeout=timeout)
    received = time.time()
    if not result.ok:
        return RankFacts(t.rank, t.label, None, _why(result), result.seconds)
    try:
        raw = json.loads(result.stdout)
    except (ValueError, RecursionError) as e:
        return RankFacts(t.rank, t.label, None, f"{t.name}: the probe's output is unreadable ({e}); "
                         "is python3 (3.8+) installed on the rank?", result.seconds)
    try:
        parsed = facts_mod.parse_facts(raw, sent, received)
    except FactError as e:  # a part in a shape the probe never prints: this rank alone fails
        return RankFacts(t.rank, t.label, None, f"{t.name}: the probe's output cannot be used: {e}",
                         result.seconds)
    return RankFacts(t.rank, t.label, by_content(parsed), None, result.seconds, raw.get("container"))


def by_content(facts: Facts) -> Facts:
    """On containerd's image store a rank's image IDs are manifest digests: each becomes the
    config digest it stands for where this host knows the manifest (launcher/images/manifests.py),
    so every row compares images by content, whichever store a rank runs."""
    from ..images import manifests, spool

    docker = facts.docker
    if docker is None or not docker.containerd_store:
        return facts
    known = manifests.known(spool.SPOOL)
    images = tuple(dataclasses.replace(i, id=manifests.content_id(i.id, known)) for i in docker.images)
    return dataclasses.replace(facts, docker=dataclasses.replace(docker, images=images))


def _why(result) -> str:
    if result.error:
        return result.error
    if result.exit_status == 127:
        return f"{result.target.name}: python3 is not installed on the rank; install it (apt install python3)"
    return f"{result.target.name}: the probe {result.why()}"


def gather(group: Group, loaded: Loaded, timeout: float = PROBE_TIMEOUT_S,
           model_dir: str | None = None, container: dict | None = None) -> dict[int, RankFacts]:
    """Every rank's facts, probed in parallel: {rank index: RankFacts}; a rank whose probe
    raised has none, and the error, like a rank that did not answer. `model_dir`: the
    checkpoint to read instead of the one the engine reads (`manifest` hashes model.path)."""
    return {o.rank: o.value if o.ok else failed(o)
            for o in group.gather(lambda c: probe_rank(c, loaded, timeout, model_dir, container))}


def failed(outcome: RankOutcome) -> RankFacts:
    """The RankFacts of a rank whose probe (or more, check's pings) raised."""
    return RankFacts(outcome.rank, outcome.target.label, None, outcome.why(), 0.0)


def facts_of(gathered: dict[int, RankFacts]) -> dict[int, Facts]:
    """Only the ranks that answered."""
    return {r: g.facts for r, g in gathered.items() if g.facts is not None}


def gather_config(path: Path | None = None, loaded: Loaded | None = None, **kw) -> dict[int, RankFacts]:
    """Convenience for scripts: load, connect, probe, close."""
    from ..inputs import config

    loaded = loaded or config.load(path)
    with open_group(loaded, **kw) as group:
        return gather(group, loaded)


def in_background(fn, *args, **kw) -> Future:
    """`fn(*args, **kw)` begun in a thread of its own now; the Future gives its result (or raises
    what it raised). For reads begun ahead of the step that needs them (ahead.py, cluster.py)."""
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        return pool.submit(fn, *args, **kw)
    finally:
        pool.shutdown(wait=False)
