"""The plan of `sparkstack stage` (issue 15): per rank, which checkpoint files its local copy
(model.local_path) lacks, the bytes to copy, and whether its disk can take them. Pure: it reads
what each rank's listing (launcher/onrank/stage.py `list`) said, and nothing else.

A file is `ok` when the local copy has the source's size and mtime (whole seconds; the copy is
given the source's mtime once complete), `partial` when an interrupted copy left its temp file
(`.NAME.partial`: the copy resumes from its end), `differs` when a file of that name is there with
another size or mtime (copied again), else `missing`. Every rank reads its own model.path.
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
        return f"{size(self.to_copy)} to copy ({shown or 'no files'}){free}"

    def to_json(self) -> dict:
        return {**asdict(self), "to_copy": self.to_copy}


@dataclass
class StagePlan:
    source: str  # model.path
    dest: str  # model.local_path
    ranks: list[RankStage]
    manifest: dict[str, str] | None = None  # name -> sha256 (`sparkstack manifest`), when made

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
                "to_copy": self.to_copy, "ranks": [r.to_json() for r in self.ranks]}


def size(n: int) -> str:
    """Bytes as MB, or GB from 10 GB on (a checkpoint is hundreds of them)."""
    return f"{n / 1e9:,.1f} GB" if n >= 10**10 else f"{n / 1e6:,.1f} MB"


def file_state(name: str, src: list[int], dst: dict, partial: dict) -> FileStep:
    size, mtime = src
    there = dst.get(name)
    if there == [size, mtime]:
        return FileStep(name, size, OK)
    have = partial.get(name, 0)
    if 0 < have <= size:
        return FileStep(name, size, PARTIAL, have)
    return FileStep(name, size, DIFFERS if there else MISSING)


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


def lines(plan: StagePlan) -> list[str]:
    """What --dry-run prints: per rank its summary and the files it lacks."""
    out = [f"stage {plan.source} -> {plan.dest} on every rank"
           + ("" if plan.manifest else " (no manifest: copies are size-checked only; `sparkstack manifest` makes one)")]
    for r in plan.ranks:
        out.append(f"rank {r.rank} {r.host}: {r.summary()}")
        for f in r.todo:
            have = f", {f.have:,} B already there" if f.have else ""
            out.append(f"  {f.state:<8} {f.name} ({f.size:,} B{have})")
    return out
