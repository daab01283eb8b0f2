"""`sparkstack stage`: copy the checkpoint from model.path to model.local_path on every rank, all
ranks at once, each reading its own model.path (issue 15).

Plan first (launcher/plan/staging.py, from one `list` per rank), refuse before copying anything
when a rank cannot be planned or its disk is short, then every rank copies what it lacks with
launcher/onrank/stage.py: into a temp file per file, resumed from its end after an interruption,
hashed against `sparkstack manifest`'s sha256 when one exists, renamed once complete. Progress
per rank (copied of missing, rate, ETA) at most every PROGRESS_S.

With `--from peer`, each phase's file servers take a token made for that phase (random, on the
servers' and readers' stdin, never on a command line or in output): a host on the fabric that
lacks it gets nothing (issue 33).
"""

from __future__ import annotations

import secrets
import select
import time
from contextlib import contextmanager
from dataclasses import dataclass

from ipaddress import ip_address, ip_interface

from .. import onrank
from ..gather import hashes
from ..facts import load_path
from ..images.ship import PROGRESS_S, Progress
from ..inputs.config import Loaded
from ..plan import staging
from ..gather import extras, probe, staged
from ..transport import remote
from ..transport.remote import Connection, Group
from .cluster_lock import ensure_held

COPY_LIFETIME_S = 24 * 3600  # the copy ends on the rank by itself should this host vanish


def make_plan(loaded: Loaded, group: Group, via: str = "nfs") -> staging.StagePlan:
    """The plan from every rank's listing; with `via` peer or auto, the ranks are probed too
    (model.path's read path, the fabric's far ends) for the peer routes and both estimates."""
    m = loaded.cluster.model
    listings = {o.target.rank: (o.target.label, o.value if o.ok else o.why())
                for o in group.gather(lambda c: staged.list_rank(c, loaded))}
    manifest = hashes.manifest(listings)
    plan = staging.make(m.path, m.local_path, listings, manifest)
    if via == "nfs":
        return plan
    facts = probe.facts_of(probe.gather(group, loaded, model_dir=m.path))
    reach = {r: {t.peer: t.ip for t in targets if t.peer >= 0}
             for r, targets in extras.ping_targets(loaded, facts).items()}
    peer = staging.route_peers(staging.make(m.path, m.local_path, listings, manifest), reach)
    nfs_rate, link_rate = _rates(loaded, facts, reach)
    estimates = {"nfs": staging.seconds(plan, nfs_rate, link_rate), "peer": staging.seconds(peer, nfs_rate, link_rate)}
    faster = estimates["peer"] is not None and estimates["nfs"] is not None and estimates["peer"] < estimates["nfs"]
    chosen = peer if via == "peer" or faster else plan
    chosen.estimates = estimates
    return chosen


def _rates(loaded: Loaded, facts: dict, reach: dict[int, dict[int, str]]) -> tuple[dict, dict]:
    """Bytes/s of each rank's model.path read alone (its load path) and of each fabric link
    (the reader's interface on the peer address's subnet), at the load estimate's line efficiency."""
    nfs = loaded.cluster.model.nfs
    paths = {r: load_path.for_rank(r, f, nfs.server if nfs else None) for r, f in facts.items()}
    nfs_rate = {r: (p.bytes_per_s, p.kind == "network") if p else (None, False) for r, p in paths.items()}
    link_rate = {}
    for r, peers in reach.items():
        for p, address in peers.items():
            speed = next((i.speed for i in facts[r].interfaces for a in i.ipv4
                          if ip_address(address) in ip_interface(a).network), None)
            link_rate[(r, p)] = speed * 1e6 / 8 * load_path.LINE_EFFICIENCY if speed else None
    return nfs_rate, link_rate


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


def apply(plan: staging.StagePlan, group: Group, say=print, bwlimit: int = 0,
          nocache: bool = False) -> list[RankResult]:
    """Phase by phase, every rank of a phase copies what it lacks at once, from model.path or
    from its peer (a server on the peer for the phase); a result per rank (never raises for a
    rank's failure). A failed phase leaves the later ones undone (a re-run resumes). `nocache`:
    each rank's copy drops what it read and wrote from the page cache as it goes (an upgrade's
    copy next to a serving engine, onrank/stage.py)."""
    results = {r.rank: RankResult(r.rank, r.host, missing=r.to_copy) for r in plan.ranks}
    conns = {c.target.rank: c for c in group.connections}
    for k, ranks in enumerate(plan.phases):
        if any(results[r].error for r in results):
            for r in ranks:
                results[r.rank].error = f"{r.host}: not copied: an earlier phase failed; re-run `sparkstack stage`"
            continue
        ensure_held()  # between steps: a command whose lock lapsed stops here
        token = secrets.token_hex(16)  # this phase's: its servers serve only who has it
        with _servers(plan, ranks, conns, results, token) as ports:
            todo = Group([conns[r.rank] for r in ranks if not results[r.rank].error])
            for o in todo.gather(lambda c: _copy_rank(c, plan, _rank(plan, c), results[c.target.rank], say,
                                                      bwlimit, ports.get(c.target.rank), token, nocache)):
                if not o.ok:
                    results[o.target.rank].error = o.why()
    return [results[r.rank] for r in plan.ranks]


def _rank(plan: staging.StagePlan, conn: Connection) -> staging.RankStage:
    return next(r for r in plan.ranks if r.rank == conn.target.rank)


@contextmanager
def _servers(plan: staging.StagePlan, ranks: list[staging.RankStage], conns: dict, results: dict,
             token: str):
    """A file server on each peer this phase reads from, at the address its readers reach;
    yields {reader rank: [address, port]}, closes them after (their stdin ends)."""
    wanted: dict[tuple[int, str], list[staging.RankStage]] = {}
    for r in ranks:
        if r.peer is not None:
            wanted.setdefault((r.peer, r.peer_address), []).append(r)
    channels, ports = [], {}
    try:
        for (p, address), readers in wanted.items():
            names = sorted({f.name for r in readers for f in r.todo})
            command, script = onrank.invocation_keeping_stdin(
                "stage", {"mode": "serve", "dir": plan.dest, "bind": address, "names": names})
            channel = conns[p].spawn(command, script + f"{token}\n".encode(), COPY_LIFETIME_S, keep_stdin=True)
            channels.append(channel)
            port = _port(channel)
            for r in readers:
                if port:
                    ports[r.rank] = [address, port]
                else:
                    results[r.rank].error = (f"{r.host}: rank {p} could not serve its copy at {address} "
                                             "(is that address still its own?); `--from nfs` reads model.path instead")
        yield ports
    finally:
        for channel in channels:
            channel.close()


def _port(channel, wait_s: float = 20.0) -> int | None:
    """The server's `PORT n` line, None when it did not come."""
    buffer, deadline = b"", time.monotonic() + wait_s
    while b"\n" not in buffer and time.monotonic() < deadline and not channel.exit_status_ready():
        select.select([channel], [], [], 0.5)
        while channel.recv_ready():
            buffer += channel.recv(1024)
    kind, _, rest = buffer.partition(b"\n")[0].decode(errors="replace").partition(" ")
    return int(rest) if kind == "PORT" and rest.isdigit() else None


def copy_args(plan: staging.StagePlan, rank: staging.RankStage, bwlimit: int, peer: list | None = None,
              nocache: bool = False) -> dict:
    return {"mode": "copy", "src": plan.source, "dst": plan.dest, "bwlimit": bwlimit, "peer": peer,
            **({"nocache": True} if nocache else {}),
            "files": [[f.name, f.size, plan.sha256(f.name), f.mtime] for f in rank.todo]}


def copy_invocation(args: dict, token: str | None = None) -> tuple[str, bytes]:
    """The copy's command line and stdin: the script, then the phase's token (a line; empty
    without a peer), so that no command line holds it."""
    command, script = onrank.invocation_keeping_stdin("stage", args)
    return command, script + f"{token or ''}\n".encode()


def _copy_rank(conn: Connection, plan: staging.StagePlan, rank: staging.RankStage, result: RankResult,
               say, bwlimit: int, peer: list | None = None, token: str | None = None,
               nocache: bool = False) -> None:
    command, stdin = copy_invocation(copy_args(plan, rank, bwlimit, peer, nocache), token)
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
