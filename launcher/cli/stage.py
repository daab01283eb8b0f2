"""`sparkstack stage`: the checkpoint copied to every rank's own disk."""

from __future__ import annotations

import json

import click

from ..errors import SparkstackError
from .console import err
from .shared import json_option, lock_option, print_ranks, show_or_refuse, trust_option, with_cluster


@click.command()
@with_cluster(interrupted="interrupted: the files copied so far are in place and the one in flight is kept "
                          "as .NAME.partial; re-run `sparkstack stage` to resume")
@json_option
@click.option("--dry-run", is_flag=True, help="show per rank what is missing and the disk space, copy nothing")
@click.option("--from", "via", type=click.Choice(["auto", "nfs", "peer"]), default="auto", show_default=True,
              help="nfs: every rank reads model.path; peer: one rank does, the others copy from a rank "
                   "that has it over the fabric; auto: the faster by the estimate")
@click.option("--bwlimit", type=click.FloatRange(min=0, min_open=True), default=None, metavar="MB/S",
              help="cap each rank's copy at this many MB/s (keep the file server usable meanwhile)")
@trust_option()
@lock_option
def stage(loaded, as_json, dry_run, via, bwlimit, trust_new_hosts, wait_lock):
    """Copy the checkpoint from model.path to model.local_path on every rank's own disk, all
    ranks at once; `up` then serves from the local copy.

    \b
    Plan first: each rank lists both directories; a top-level file of model.path whose local
    copy has another size or mtime, or none, is copied. Nothing is copied when a rank's free
    space at model.local_path is less than what it lacks, or a rank cannot read model.path: the
    message names the rank. --from nfs: each rank reads its own model.path (the NFS mount) at
    once. --from peer: one rank reads it (a rank with a complete copy: none), the others copy
    from a rank that has the copy, over the fabric (a cable's far end in a ring), phase by phase:
    the file server's port carries the checkpoint once, not once per rank. While a phase runs,
    each source rank serves the files its readers need, unauthenticated, on its fabric address.
    --from auto (the default) takes the one with the shorter estimate (model.path's read path as
    `check`'s load row finds it, the links' speeds), nfs when either is not known. Each file goes
    to `.NAME.partial` first, is checked against `sparkstack manifest`'s sha256 when there is a
    manifest (a mismatch names the file and the rank), given the source's mtime and renamed.
    Interrupted (Ctrl+C, a lost connection), a re-run resumes each partial file from where it
    stopped: only what is missing moves. Progress per rank: copied of missing, rate, ETA.
    `check` compares every rank's copy with model.path by size and mtime; `check --deep` hashes it.
    --json prints {"plan": {"source", "dest", "manifest", "via", "estimates", "to_copy", "ranks":
    [{"rank", "host", "files": [{"name", "size", "state", "have", "mtime"}], "free", "free_at",
    "error", "extra", "peer", "peer_address", "phase", "to_copy"}]}, "ranks":
    [{"rank", "host", "copied", "missing", "seconds", "files", "error"}]} (no "ranks" with --dry-run).
    """
    from ..apply import cluster_lock
    from ..apply import stage as stage_mod
    from ..plan import staging
    from ..gather import probe

    if not loaded.cluster.model.local_path:
        raise SparkstackError("model.local_path is not set in cluster.yaml: nothing to stage to; add it "
                              "(an absolute path on each rank's own disk, the same on every rank)")
    say = lambda line: err.print(line, markup=False, highlight=False)  # noqa: E731
    with probe.open_group(loaded, trust_new=trust_new_hosts, say=say) as group:
        plan = stage_mod.make_plan(loaded, group, via)
        if show_or_refuse(plan, staging.lines, as_json, dry_run, refused="nothing was copied:\n"):
            return
        with cluster_lock.held(loaded, group, wait_lock, say):
            results = stage_mod.apply(plan, group, say, int(bwlimit * 1e6) if bwlimit else 0)
    if as_json:
        click.echo(json.dumps({"plan": plan.to_json(), "ranks": [r.to_json() for r in results]}, indent=2))
    else:
        print_ranks([(r.rank, r.host, _staged_text(r)) for r in results], [r.error for r in results])
    failed = [r for r in results if r.error]
    if failed:
        raise SparkstackError(f"stage failed on {', '.join(f'rank {r.rank}' for r in failed)}: see above; "
                              "fix the cause and re-run `sparkstack stage`: what is in place is kept")


def _staged_text(r) -> str:
    if not r.missing:
        return "complete, nothing to copy"
    rate = f", {r.copied / 1e6 / r.seconds:.1f} MB/s" if r.seconds and r.copied else ""
    state = "FAILED" if r.error else "staged"
    return f"{state}: {r.files} files, {r.copied / 1e6:,.1f} of {r.missing / 1e6:,.1f} MB in {r.seconds:.1f} s{rate}"
