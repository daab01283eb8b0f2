"""The plan of `sparkstack stage` (issue 15): per rank, which checkpoint files its local copy
(model.local_path) lacks, the bytes to copy, and whether its disk can take them. Pure: it reads
what each rank's listing (launcher/onrank/stage.py `list`) said, and nothing else.

A file is `ok` when the local copy has the source's size and mtime (whole seconds; the copy is
given the source's mtime once complete), `partial` when an interrupted copy left its temp file
(`.NAME.partial`: the copy resumes from its end), `differs` when a file of that name is there with
another size or mtime (copied again), else `missing`.

The source (`--from`): `nfs`, every rank reads its own model.path at once; `peer`, one rank (a
complete copy if there is one, else the lowest) reads model.path, then the others copy from a rank
that has it, over the fabric (a far end of their cables, or any fabric IP on a switch), phase by
phase: in a ring of four, rank 0 first, then its two neighbours from it, then the last from one of
them; model.path is read once. A rank no copy reaches reads model.path in the first phase. `auto`
takes the one with the shorter estimate (`seconds`), nfs when either is not known.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

OK, MISSING, PARTIAL, DIFFERS = "ok", "missing", "partial", "differs"


@dataclass(frozen=True)
class FileStep:
    name: str
    size: int
    state: str
    have: int = 0  # bytes already in its temp file (partial)
    mtime: int = 0  # the source's, whole seconds (a copy from a peer is given it)

    @property
    def to_copy(self) -> int:
        return 0 if self.state == OK else self.size - self.have


@dataclass
class RankStage:
    rank: int
    host: str
    files: list[FileStep] = field(default_factory=list)
    free: int | None = None  # bytes free where model.local_path is (or would be)
    free_at: str | None = None
    error: str | None = None  # why this rank cannot be planned (its source unreadable, ...)
    extra: list[str] = field(default_factory=list)  # files in the copy that model.path lacks (kept)
    peer: int | None = None  # the rank it copies from (None: its own model.path)
    peer_address: str | None = None  # that rank's fabric address it reaches
    phase: int = 0  # copies once every rank of the phases before is done

    @property
    def to_copy(self) -> int:
        return sum(f.to_copy for f in self.files)

    @property
    def todo(self) -> list[FileStep]:
        return [f for f in self.files if f.state != OK]

    @property
    def short(self) -> bool:
        """The disk cannot take what is to be copied."""
        return self.free is not None and self.free < self.to_copy

    def summary(self) -> str:
        if self.error:
            return self.error
        counts = {s: sum(1 for f in self.files if f.state == s) for s in (MISSING, PARTIAL, DIFFERS, OK)}
        shown = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        free = f"; {size(self.free)} free at {self.free_at}" if self.free is not None else ""
        source = (f", from rank {self.peer} ({self.peer_address}) in phase {self.phase}" if self.peer is not None
                  else ", from model.path" if self.todo else "")
        return f"{size(self.to_copy)} to copy ({shown or 'no files'}){source}{free}"

    def to_json(self) -> dict:
        return {**asdict(self), "to_copy": self.to_copy}


@dataclass
class StagePlan:
    source: str  # model.path
    dest: str  # model.local_path
    ranks: list[RankStage]
    manifest: dict[str, str] | None = None  # name -> sha256 (`sparkstack manifest`), when made
    via: str = "nfs"  # "nfs" | "peer"
    estimates: dict[str, float | None] = field(default_factory=dict)  # seconds per source, when known

    @property
    def phases(self) -> list[list[RankStage]]:
        """The ranks with something to copy, phase by phase."""
        todo = [r for r in self.ranks if r.todo and not r.error]
        return [p for p in ([r for r in todo if r.phase == k] for k in range(max((r.phase for r in todo), default=-1) + 1)) if p]

    @property
    def to_copy(self) -> int:
        return sum(r.to_copy for r in self.ranks)

    def refusals(self) -> list[str]:
        """Why nothing may be copied, one line per rank: a rank not planned, or short of disk."""
        out = [f"rank {r.rank} ({r.host}): {r.error}" for r in self.ranks if r.error]
        out += [f"rank {r.rank} ({r.host}): {self.dest} needs {size(r.to_copy)} but only "
                f"{size(r.free)} are free at {r.free_at}; free space there, or set "
                "model.local_path to a disk with room" for r in self.ranks if not r.error and r.short]
        return out

    def sha256(self, name: str) -> str | None:
        return (self.manifest or {}).get(name)

    def to_json(self) -> dict:
        return {"source": self.source, "dest": self.dest, "manifest": self.manifest is not None,
                "via": self.via, "estimates": self.estimates, "to_copy": self.to_copy,
                "ranks": [r.to_json() for r in self.ranks]}


def size(n: int) -> str:
    """Bytes as MB, or GB from 10 GB on (a checkpoint is hundreds of them)."""
    return f"{n / 1e9:,.1f} GB" if n >= 10**10 else f"{n / 1e6:,.1f} MB"


def file_state(name: str, src: list[int], dst: dict, partial: dict) -> FileStep:
    size, mtime = src
    there = dst.get(name)
    if there == [size, mtime]:
        return FileStep(name, size, OK, mtime=mtime)
    have = partial.get(name, 0)
    if 0 < have <= size:
        return FileStep(name, size, PARTIAL, have, mtime)
    return FileStep(name, size, DIFFERS if there else MISSING, mtime=mtime)


def rank_stage(rank: int, host: str, listing: dict, source: str, dest: str) -> RankStage:
    """One rank's plan from its listing (onrank/stage.py `list`)."""
    src, dst = listing.get("src", {}), listing.get("dst", {})
    stage = RankStage(rank, host, free=listing.get("free"), free_at=listing.get("free_at"))
    if "error" in src:
        stage.error = (f"cannot read model.path {source} ({src['error']}): mount the checkpoint there "
                       "(`sparkstack prep`)")
    elif not src.get("files"):
        stage.error = f"model.path {source} holds no files: nothing to stage from"
    elif "error" in dst:
        stage.error = f"cannot read model.local_path {dest} ({dst['error']}): make it readable by the SSH user"
    else:
        files, partial = dst.get("files", {}), dst.get("partial", {})
        stage.files = [file_state(n, v, files, partial) for n, v in sorted(src["files"].items())]
        stage.extra = sorted(set(files) - set(src["files"]))
    return stage


def make(source: str, dest: str, listings: dict[int, tuple[str, dict | str]],
         manifest: dict[str, str] | None = None) -> StagePlan:
    """The whole plan: `listings` {rank: (host, listing, or why there is none)}."""
    ranks = []
    for r, (host, listing) in sorted(listings.items()):
        if isinstance(listing, str):
            ranks.append(RankStage(r, host, error=listing))
        else:
            ranks.append(rank_stage(r, host, listing, source, dest))
    return StagePlan(source, dest, ranks, manifest)


def route_peers(plan: StagePlan, reach: dict[int, dict[int, str]]) -> StagePlan:
    """`plan` copying from peers: `reach` {rank: {peer rank: the peer's address it reaches over
    the fabric}}. Each phase's readers are spread over the ranks that have the copy by then."""
    ranks = {r.rank: r for r in plan.ranks if not r.error}
    if not ranks:
        return plan
    have = {r for r, s in ranks.items() if not s.todo}
    seed = min(have) if have else min(ranks)
    have.add(seed)
    left = sorted(r for r, s in ranks.items() if s.todo and r != seed)
    phase = 1
    while left:
        children: dict[int, int] = {}
        placed = []
        for r in left:
            parents = sorted((children.get(p, 0), p) for p in have if p in reach.get(r, {}))
            if parents:
                p = parents[0][1]
                children[p] = children.get(p, 0) + 1
                ranks[r].peer, ranks[r].peer_address, ranks[r].phase = p, reach[r][p], phase
                placed.append(r)
        if not placed:
            break  # the rest no copy reaches: they read model.path with the seed
        have.update(placed)
        left = [r for r in left if r not in placed]
        phase += 1
    plan.via = "peer"
    return plan


def seconds(plan: StagePlan, nfs_rate: dict[int, tuple[float | None, bool]],
            link_rate: dict[tuple[int, int], float | None]) -> float | None:
    """The plan's copy time: `nfs_rate` {rank: (bytes/s of its model.path read alone, whether
    that is a file server's port the ranks reading at once share)}; `link_rate` {(rank, peer):
    bytes/s of the link}, a peer's readers of one phase at one of its addresses (one cable)
    sharing it. None when a rate is not known."""
    total = 0.0
    for ranks in plan.phases:
        readers = sum(1 for r in ranks if r.peer is None)
        links = [(r.peer, r.peer_address) for r in ranks if r.peer is not None]  # one cable each
        times = []
        for r in ranks:
            if r.peer is None:
                alone, shared = nfs_rate.get(r.rank, (None, False))
                rate = alone / readers if alone and shared else alone
            else:
                rate = link_rate.get((r.rank, r.peer))
                rate = rate / links.count((r.peer, r.peer_address)) if rate else None
            if not rate:
                return None
            times.append(r.to_copy / rate)
        total += max(times)
    return total


def lines(plan: StagePlan) -> list[str]:
    """What --dry-run prints: per rank its summary and the files it lacks."""
    known = {k: v for k, v in plan.estimates.items() if v is not None}
    estimate = f"; estimates: {', '.join(f'{k} ~{v:.3g} s' for k, v in known.items())}" if known else ""
    out = [f"stage {plan.source} -> {plan.dest} on every rank, from {plan.via}{estimate}"
           + ("" if plan.manifest else " (no manifest: copies are size-checked only; `sparkstack manifest` makes one)")]
    for r in plan.ranks:
        out.append(f"rank {r.rank} {r.host}: {r.summary()}")
        for f in r.todo:
            have = f", {f.have:,} B already there" if f.have else ""
            out.append(f"  {f.state:<8} {f.name} ({f.size:,} B{have})")
    return out
