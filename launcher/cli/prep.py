"""`sparkstack prep`: every rank prepared for serving after a boot."""

from __future__ import annotations

import json

import click

from ..errors import SparkstackError
from .console import err, make_table, plain, print_table
from .shared import json_option, lock_option, print_errors, trust_option, with_cluster


@click.command()
@with_cluster()
@json_option
@click.option("--no-drop", is_flag=True, help="set sysctls and mounts only; keep the page cache")
@click.option("--wait-timeout", type=click.FloatRange(min=1), default=120, show_default=True,
              help="seconds to wait for MemAvailable to come back after dropping caches")
@trust_option()
@lock_option
def prep(loaded, as_json, no_drop, wait_timeout, trust_new_hosts, wait_lock):
    """Prepare every rank for serving after a boot (idempotent, all ranks in parallel).

    \b
    Sets the sysctls of launcher/inputs/node_settings.py (vm.swappiness=1,
    vm.compaction_proactiveness=0, plus overrides), turns swap off when the profile or
    overrides.no_swap says no swap (swapoff -a; swap lines of /etc/fstab commented out, so it
    stays off after a reboot), mounts the checkpoint's NFS export at
    model.path when the config names one and it is not mounted (the NFS server's own node
    bind-mounts its export there), drops page caches and waits until every rank's MemAvailable
    covers what the plan needs. Reports per rank what changed and what was already set.
    Needs root or sudo on the ranks (the cache drop alone works through the narrow sudoers
    rule). --json prints {"ok", "mem_needed", "seconds", "ranks": [{"rank", "host",
    "changed", "already", "failed", "mem_available", "error"}]}.
    """
    from ..apply import cluster_lock
    from ..apply import prep as prep_mod

    from ..gather import probe

    say = lambda line: err.print(line, markup=False, highlight=False)  # noqa: E731
    with probe.open_group(loaded, trust_new=trust_new_hosts, say=say) as group, \
            cluster_lock.held(loaded, group, wait_lock, say):
        report = prep_mod.prepare(loaded, group, drop=not no_drop, wait_timeout=wait_timeout, say=say)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        _print_prep(report)
    if not report.ok:
        bad = [f"rank {r.rank}" for r in report.ranks if r.error or r.failed]
        raise SparkstackError(f"prep failed on {', '.join(bad)}: see the lines above; fix and re-run "
                              "`sparkstack prep` (what is already set is left alone)")


def _print_prep(report) -> None:
    rows = make_table("rank", "changed", "already set", "FAILED", "MemAvailable")
    for r in report.ranks:
        mem = "" if r.mem_available is None else f"{r.mem_available / 2**30:.1f} GiB"
        rows.add_row(*map(plain, (f"{r.rank} {r.host}", ", ".join(r.changed), ", ".join(r.already),
                                  ", ".join(r.failed), mem)))
    print_table(rows)
    print_errors([r.error for r in report.ranks])
