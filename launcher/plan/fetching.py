"""`sparkstack fetch`'s plan (issue 35), pure: from the Hub's file listing (each file's size, git
blob id and, for an LFS file, the publisher's sha256), what the destination already holds, and its
free space, which files move and how many bytes, or why nothing may start.

A file is `verified` when a previous fetch checked it against the listing and it still has that
size and mtime; `present` when it has the listed size but was not checked (it is hashed before
it counts); `partial` when `.NAME.partial` holds its first bytes (the rest moves); `missing`
otherwise. Nothing moves when the free space is short of the bytes to move plus a margin.
"""

from __future__ import annotations

import fnmatch
from dataclasses import asdict, dataclass, field

MARGIN_BYTES = 1 << 30  # kept free beyond the bytes to move: the filesystem, logs, the next file
PARTIAL = ".{}.partial"  # the file in flight, beside its final name (as `stage` keeps it)


@dataclass(frozen=True)
class HubFile:
    name: str  # relative to the repository's root
    size: int
    blob_id: str  # git's object id: the file's sha1 as a blob, or its LFS pointer's
    sha256: str | None = None  # the LFS object's sha256 (None: a small file kept in git itself)


@dataclass(frozen=True)
class Listing:
    repo: str
    revision: str  # as asked: a branch, a tag or a commit
    commit: str  # what it resolved to: every file is fetched at this commit
    gated: bool
    files: tuple[HubFile, ...]

    @property
    def total(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class Have:
    """What the destination holds of one file."""

    size: int | None = None  # the final name's size, None: absent
    partial: int = 0  # bytes in .NAME.partial
    verified: bool = False  # checked against the listing before, size and mtime unchanged


@dataclass(frozen=True)
class Step:
    name: str
    size: int
    state: str  # verified | present | partial | missing
    have: int  # bytes already there (a partial's; a present file's before it is hashed)

    @property
    def to_move(self) -> int:
        return 0 if self.state in ("verified", "present") else self.size - self.have


@dataclass(frozen=True)
class FetchPlan:
    listing: Listing
    dest: str
    steps: tuple[Step, ...]
    free: int | None  # bytes free at dest (None: not known)
    dest_why: str = ""  # why this directory (the NFS export here, --to, model.path)
    assumed: tuple[str, ...] = field(default=())

    @property
    def to_move(self) -> int:
        return sum(s.to_move for s in self.steps)

    @property
    def need(self) -> int:
        return self.to_move + (MARGIN_BYTES if self.to_move else 0)

    def refusals(self) -> list[str]:
        if self.free is not None and self.to_move and self.free < self.need:
            return [f"{self.dest}: {gb(self.free)} free, the fetch needs {gb(self.need)} ({gb(self.to_move)} to move "
                    f"+ {gb(MARGIN_BYTES)} kept free): free {gb(self.need - self.free)} there (or fetch elsewhere "
                    "with --to), then run `sparkstack fetch` again; nothing was downloaded"]
        return []

    def to_json(self) -> dict:
        return {"repo": self.listing.repo, "revision": self.listing.revision, "commit": self.listing.commit,
                "gated": self.listing.gated, "dest": self.dest, "dest_why": self.dest_why, "free": self.free,
                "total": self.listing.total, "to_move": self.to_move, "need": self.need,
                "files": [asdict(s) for s in self.steps], "refusals": self.refusals()}


def gb(n: int) -> str:
    if n >= 1e8:
        return f"{n / 1e9:,.2f} GB"
    return f"{n / 1e6:,.1f} MB" if n >= 1e5 else f"{n / 1e3:,.1f} kB"


def select(files: tuple[HubFile, ...], include: tuple[str, ...] = ()) -> tuple[HubFile, ...]:
    """The listed files `include`'s globs name (all when none)."""
    if not include:
        return files
    return tuple(f for f in files if any(fnmatch.fnmatch(f.name, g) for g in include))


def make_plan(listing: Listing, dest: str, have: dict[str, Have], free: int | None, dest_why: str = "") -> FetchPlan:
    steps = []
    for f in listing.files:
        h = have.get(f.name, Have())
        if h.size == f.size and h.verified:
            steps.append(Step(f.name, f.size, "verified", f.size))
        elif h.size == f.size:
            steps.append(Step(f.name, f.size, "present", f.size))
        elif 0 < h.partial <= f.size:
            steps.append(Step(f.name, f.size, "partial", h.partial))
        else:
            steps.append(Step(f.name, f.size, "missing", 0))
    return FetchPlan(listing, dest, tuple(steps), free, dest_why)


def destination(model_path: str, nfs_server: str | None, nfs_export: str | None, to: str | None,
                here: set[str], rank0: str) -> tuple[str, str]:
    """Where the files go and why: --to; else the NFS export's directory when this host is its
    server; else model.path when this host is rank 0 (no NFS: rank 0's own disk). Raises
    ValueError saying where to run it instead."""
    if to:
        return to, "--to"
    if nfs_server and nfs_export:
        if nfs_server in here:
            return nfs_export, f"model.nfs.export: this host is the NFS server {nfs_server}"
        raise ValueError(f"the checkpoint's NFS export is on {nfs_server} (model.nfs), not this host: run "
                         f"`sparkstack fetch` there (it writes {nfs_export}), or give --to a directory "
                         "of that export as this host mounts it read-write")
    if rank0 in here:
        return model_path, "model.path on rank 0 (this host; no model.nfs)"
    raise ValueError(f"no model.nfs in cluster.yaml: the checkpoint goes to rank 0's {model_path}; run "
                     f"`sparkstack fetch` on rank 0 ({rank0}), or give --to a directory here")


def lines(plan: FetchPlan) -> list[str]:
    """The plan as --dry-run prints it."""
    l = plan.listing
    out = [f"{l.repo} at {l.revision} (commit {l.commit}){', gated' if l.gated else ''}: "
           f"{len(l.files)} files, {gb(l.total)}",
           f"to {plan.dest} ({plan.dest_why})" if plan.dest_why else f"to {plan.dest}",
           f"free there: {gb(plan.free)}" if plan.free is not None else "free there: not known"]
    for s in plan.steps:
        what = {"verified": "verified before", "present": "present (hashed against the Hub's digest)",
                "partial": f"partial: {gb(s.have)} there, {gb(s.to_move)} to move",
                "missing": f"missing: {gb(s.size)} to move"}[s.state]
        out.append(f"  {s.name}  {what}")
    out.append(f"to move: {gb(plan.to_move)} of {gb(l.total)}")
    out += [f"refused: {r}" for r in plan.refusals()]
    return out
