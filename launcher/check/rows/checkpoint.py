"""The checkpoint rows: the checkpoint every rank reads (the same files everywhere), its staged
copy against its source (with model.local_path), and the link that carries its cold load.
"""

from __future__ import annotations

from collections import Counter

from ...facts import load_path
from ...facts.record import Facts
from ...inputs import node_settings
from ...inputs.config import Loaded
from ...onrank.probe import NOT_ANSWERING
from ...plan import staging
from ...plan.kv import gib
from ...status import Status
from . import row
from .case import Case, RankReport


DEFAULT_WAIT_S = 900  # `up --timeout`: a longer cold load is said on the load row


@row("checkpoint", order=220, reads=("checkpoint", "model_mount", "problems"))
def _check_checkpoint(inp: Case, r: int, f: Facts, rr: RankReport) -> None:
    path = inp.loaded.cluster.model.serving_path  # the staged copy when model.local_path is set
    c = f.checkpoint
    if c is None or not c.shards:
        why = next((p for p in f.problems if p.startswith("checkpoint")), f"no *.safetensors in {path}")
        if NOT_ANSWERING in why:
            rr.add("checkpoint", Status.FAIL, f"NFS server not answering: {why}", _nfs_fix(inp.loaded, f))
            return
        staged = inp.loaded.cluster.model.local_path is not None
        rr.add("checkpoint", Status.FAIL, why, f"copy the checkpoint to {path} on every rank: `sparkstack stage`"
               if staged else f"mount the checkpoint at {path} on every rank (sparkstack prep)")
        return
    prints = Counter(x.checkpoint.fingerprint for x in inp.facts.values() if x.checkpoint and x.checkpoint.shards)
    common = prints.most_common(1)[0][0]
    mount = f" on {f.model_mount.source} ({f.model_mount.fstype})" if f.model_mount else ""
    shown = f"{path}{mount}: {len(c.shards)} shards, {gib(c.total_bytes)}, fingerprint {c.fingerprint[:12]}"
    if len(prints) > 1 and c.fingerprint != common:
        rr.add("checkpoint", Status.FAIL, f"{shown}, other ranks {common[:12]}",
               "every rank must see the same files: mount the one NFS export (a partial copy differs)")
    else:
        rr.add("checkpoint", Status.PASS, shown + (", same on all ranks" if len(prints) == 1 else ""))


@row("staged", order=225, reads=("staged",), sometimes=True)
def _check_staged(inp: Case, r: int, f: Facts, rr: RankReport) -> None:
    """With model.local_path: every file of model.path in the rank's copy, same size and mtime."""
    m = inp.loaded.cluster.model
    if m.local_path is None:
        return
    listing = inp.staged.get(r, "not listed")
    if isinstance(listing, str):
        rr.add("staged", Status.WARN, f"{m.local_path} not compared with {m.path}: {listing}", "re-run check")
        return
    s = staging.rank_stage(r, "", listing, m.path, m.local_path)
    if s.error:
        rr.add("staged", Status.WARN, f"{m.local_path} not compared: {s.error}",
               "the engine reads the local copy; mount model.path to have it compared (`sparkstack prep`)")
    elif s.todo:
        first = s.todo[0]
        rr.add("staged", Status.FAIL, f"{len(s.todo)} of {len(s.files)} files of {m.path} not in place in "
               f"{m.local_path} ({first.name}: {first.state}), {s.to_copy / 1e6:,.1f} MB to copy",
               "copy them: `sparkstack stage` (resumes, copies only what is missing)")
    elif s.extra:
        rr.add("staged", Status.WARN, f"{m.local_path} holds {len(s.extra)} files that {m.path} lacks "
               f"({', '.join(s.extra[:3])}{', ...' if len(s.extra) > 3 else ''})",
               f"remove them on this rank (`rm {m.local_path}/NAME`): the engine reads every *.safetensors there")
    else:
        rr.add("staged", Status.PASS, f"{m.local_path}: {len(s.files)} files, the size and mtime of {m.path}'s")


@row("load", order=230, reads=("checkpoint", "model_mount", "interfaces"))
def _check_load(inp: Case, r: int, f: Facts, rr: RankReport) -> None:
    """Which link carries the rank's checkpoint reads, and the cold load it makes (issue 15)."""
    nfs = inp.loaded.cluster.model.nfs
    p = load_path.for_ranks(inp.facts, nfs.server if nfs else None).get(r)
    if p is None:
        rr.add("load", Status.WARN, "not estimated: the checkpoint or its mount was not read",
               "fix the checkpoint row first")
        return
    shown = p.describe()
    if p.seconds and p.seconds * load_path.MARGIN > DEFAULT_WAIT_S:
        shown += f"; `up` waits {p.seconds * load_path.MARGIN:.0f} s for the API"
    if p.faster:
        name, speed = p.faster
        fast = load_path.LoadPath(r, p.kind, p.bytes, p.source, p.server, name, speed, sharing=p.sharing)
        rr.add("load", Status.WARN, shown,
               f"the checkpoint is read over a {p.speed_mbps / 1000:g} Gb/s port while {name} runs at "
               f"{speed / 1000:g} Gb/s (~{load_path.minutes(fast.seconds)}): mount it from the file "
               f"server's address on that network (model.nfs.server, then `sparkstack prep`), or stage "
               "it on the local disk")
    elif p.seconds is None:
        rr.add("load", Status.WARN, shown, f"the speed of {p.iface or 'the interface'} is not reported "
               "(sysfs): no cold-load estimate; `up` waits its --timeout")
    else:
        rr.add("load", Status.PASS, shown)


def _nfs_fix(loaded: Loaded, f: Facts) -> str:
    """Reading the model dir hung: the server to look at, and the mount that bounds the hang."""
    path, nfs = loaded.cluster.model.path, loaded.cluster.model.nfs
    server = (f"{nfs.server}:{nfs.export}" if nfs else
              f.model_mount.source if f.model_mount else f"the server behind {path}")
    wanted = ", ".join(node_settings.NFS_HANG_OPTIONS.split(","))
    return (f"check the NFS server {server} (is it up, its NFS service running, the export in "
            f"`showmount -e`?); on this rank `findmnt -o OPTIONS {path}` should include {wanted}: a "
            f"hard mount hangs every reader until the server is back (remount: `umount -l {path}`, "
            "then `sparkstack prep`)")
