"""`sparkstack upgrade`: prepare the new deploy while the old one serves, then swap."""

from __future__ import annotations

import json

import click

from .console import err, out
from .shared import json_option, lock_option, trust_option, with_cluster


@click.command()
@with_cluster(profile=True)
@json_option
@trust_option()
@lock_option
@click.option("--bwlimit", type=click.FloatRange(min=0, min_open=True), default=None, metavar="MB/S",
              help="cap each rank's image load and checkpoint copy at this many MB/s while the old deploy serves")
@click.option("--timeout", "wait_timeout", type=click.FloatRange(min=1), default=900, show_default=True,
              help="seconds to wait for the new API once started")
@click.option("--no-verify", is_flag=True,
              help="skip the quick verification of the deploy it starts (`sparkstack verify`'s quick form): on purpose only")
def upgrade(loaded, as_json, trust_new_hosts, wait_lock, bwlimit, wait_timeout, no_verify):
    """Change what serves (a new image chain, profile or config) with the least downtime, and
    go back by itself when the new one does not serve.

    \b
    While the old deploy serves: the new image is built here and shipped to the ranks that
    lack it, and the checkpoint staged where model.local_path is set (both capped at --bwlimit;
    the staged copy keeps out of the page cache, which on a GB10 is the GPU's memory). Then the
    swap: old down, new up (the same checks as `up`), verified by the quick form of `sparkstack
    verify` (--no-verify skips it; the history records the figures, or that it was skipped),
    recorded in the history. When the new start fails, trips a guard or fails verification, it
    is recorded as failed and the last good deploy (its image still on every rank) is started
    again by itself, and verified; both are reported and the command exits 1. The downtime
    (old API stopped -> new API verified) is printed.
    --json prints {"upgrade": {"old", "new", "downtime_s", "prepared_s", "steps"}}.
    """
    from ..apply import cluster_lock, deploy, upgrade as upgrade_mod, verify as verifying

    say = lambda line: err.print(line, markup=False)  # noqa: E731
    with deploy.group_for(loaded, trust_new_hosts, say) as group, cluster_lock.held(loaded, group, wait_lock, say):
        report = upgrade_mod.upgrade(loaded, group, bwlimit=int(bwlimit * 1e6) if bwlimit else 0,
                                     wait_timeout=wait_timeout, say=say, verify=verifying.chosen(no_verify))
    if as_json:
        click.echo(json.dumps({"upgrade": report.to_json()}, indent=2))
        return
    out.print(f"upgraded to {loaded.profile.name}: serving (history entry "
              f"{report.new.id if report.new else '?'}); downtime {report.downtime_s:.1f} s", markup=False)
