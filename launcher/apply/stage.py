"""`sparkstack stage`: copy the checkpoint from model.path to model.local_path on every rank, all
ranks at once, each reading its own model.path (issue 15).

Plan first (launcher/plan/staging.py, from one `list` per rank), refuse before copying anything
when a rank cannot be planned or its disk is short, then every rank copies what it lacks with
launcher/onrank/stage.py: into a temp file per file, resumed from its end after an interruption,
hashed against `sparkstack manifest`'s sha256 when one exists, renamed once complete. Progress
per rank (copied of missing, rate, ETA) at most every PROGRESS_S.
"""

from __future__ import annotations

import select
import time
from dataclasses import dataclass

from .. import onrank
from ..check import staged
from ..images.ship import PROGRESS_S, Progress
from ..inputs.config import Loaded
from ..plan import staging
from ..transport import remote
from ..transport.remote import Connection, Group

COPY_LIFETIME_S = 24 * 3600  # the copy ends on the rank by itself should this host vanish


def make_plan(loaded: Loaded, group: Group) -> staging.StagePlan:
    m = loaded.cluster.model
    listings = {o.target.rank: (o.target.label, o.value if o.ok else o.why())
                for o in group.gather(lambda c: staged.list_rank(c, loaded))}
    return staging.make(m.path, m.local_path, listings, staged.manifest(listings))


@dataclass
class RankResult:
    rank: int
    host: str
    copied: int = 0
    missing: int = 0
    seconds: float = 0.0
    files: int = 0
    error: str | None = None

    def to_json(self) -> dict:
        return dict(self.__dict__)


def apply(plan: staging.StagePlan, group: Group, say=print, bwlimit: int = 0) -> list[RankResult]:
    """Every rank with something to copy copies it, at once; a result per rank (never raises for
    a rank's failure)."""
    by_rank = {r.rank: r for r in plan.ranks}
    todo = Group([c for c in group.connections if by_rank[c.target.rank].todo])
    results = {r.rank: RankResult(r.rank, r.host, missing=r.to_copy) for r in plan.ranks}
    for o in todo.gather(lambda c: _copy_rank(c, plan, by_rank[c.target.rank], results[c.target.rank],
                                              say, bwlimit)):
        if not o.ok:
            results[o.target.rank].error = o.why()
    return [results[r.rank] for r in plan.ranks]


def copy_args(plan: staging.StagePlan, rank: staging.RankStage, bwlimit: int) -> dict:
    return {"mode": "copy", "src": plan.source, "dst": plan.dest, "bwlimit": bwlimit,
            "files": [[f.name, f.size, plan.sha256(f.name)] for f in rank.todo]}


def _copy_rank(conn: Connection, plan: staging.StagePlan, rank: staging.RankStage, result: RankResult,
               say, bwlimit: int) -> None:
    command, stdin = onrank.invocation("stage", copy_args(plan, rank, bwlimit))
    progress = Progress(conn.target.name, lambda: rank.to_copy, say)
    cancel = getattr(remote._cancel, "event", None)
    channel = conn.spawn(command, stdin, COPY_LIFETIME_S)
    errors, buffer = [], b""
    try:
        while not (channel.exit_status_ready() and not channel.recv_ready()):
            if cancel is not None and cancel.is_set():
                return  # closing the channel ends the copy on the rank at its next progress line
            select.select([channel], [], [], 0.5)
            while channel.recv_ready():
                buffer += channel.recv(1 << 16)
            *complete, buffer = buffer.split(b"\n")
            for line in complete:
                _take(line.decode(errors="replace"), progress, result, errors)
            if time.monotonic() - progress.last >= PROGRESS_S:
                progress.last = time.monotonic()
                say(progress.line(progress.last))
        status = channel.recv_exit_status()
        stderr = channel.recv_stderr(1 << 16).decode(errors="replace").strip() if channel.recv_stderr_ready() else ""
    finally:
        channel.close()
        result.copied, result.seconds = progress.moved, time.monotonic() - progress.started
    if errors:
        result.error = f"{conn.target.name}: {errors[0]}" + (f" ({len(errors) - 1} more)" if len(errors) > 1 else "")
    elif status != 0:
        result.error = f"{conn.target.name}: the copy exited {status}" + (f": {stderr.splitlines()[-1]}" if stderr else "")


def _take(line: str, progress: Progress, result: RankResult, errors: list[str]) -> None:
    kind, _, rest = line.partition(" ")
    if kind == "P" and rest.isdigit():
        progress.moved = int(rest)
    elif kind == "D":
        result.files += 1
    elif kind == "E":
        name, _, why = rest.partition(" ")
        errors.append(f"{name}: {why}")
