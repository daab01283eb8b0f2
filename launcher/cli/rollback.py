"""`sparkstack rollback [ENTRY]`: a deploy of the history serves again."""

from __future__ import annotations

import json

import click

from .console import err, out
from .shared import json_option, lock_option, trust_option, with_cluster


@click.command()
@with_cluster()
@click.argument("entry", required=False, metavar="[ENTRY]")
@json_option
@click.option("--dry-run", is_flag=True, help="print what would be rolled back to, change nothing")
@trust_option()
@lock_option
@click.option("--timeout", "wait_timeout", type=click.FloatRange(min=1), default=900, show_default=True,
              help="seconds to wait for the API once started")
@click.option("--no-verify", is_flag=True,
              help="skip the quick verification of the deploy it starts (`sparkstack verify`'s quick form): on purpose only")
def rollback(loaded, entry, as_json, dry_run, trust_new_hosts, wait_lock, wait_timeout, no_verify):
    """Serve a deploy of the history again: ENTRY (its number in `sparkstack history`), by
    default the last good deploy before the one running now.

    \b
    The entry's profile is planned again from the cluster.yaml it was planned from (this one if
    that file is gone; a plan that differs from the entry's is said) and started from the image
    ID each rank still holds: nothing is built or shipped. A rank that no longer has that image
    is named, with the fix, and nothing is changed. Then: every rank's engine stopped, the
    entry's deploy started, the API waited for, verified by the quick form of `sparkstack verify`
    (--no-verify skips it; one that fails leaves nothing serving), the deploy recorded as a new
    entry (how: rollback).
    --dry-run prints the plan; --json prints {"plan": {"target", "current", "problems"}} and,
    after a rollback, "report".
    """
    from ..apply import cluster_lock, deploy, upgrade, verify as verifying

    say = lambda line: err.print(line, markup=False)  # noqa: E731
    with deploy.group_for(loaded, trust_new_hosts, say) as group:
        plan = upgrade.plan_rollback(loaded, group, entry)
        if dry_run:
            if as_json:
                click.echo(json.dumps({"plan": plan.to_json()}, indent=2))
            else:
                for line in plan.lines():
                    out.print(line, markup=False, highlight=False)
            upgrade.refuse(plan)  # a plan that cannot be carried out exits non-zero, --dry-run or not
            return
        upgrade.refuse(plan)
        with cluster_lock.held(loaded, group, wait_lock, say):
            report = upgrade.rollback(loaded, group, plan, wait_timeout=wait_timeout, say=say,
                                      verify=verifying.chosen(no_verify))
    if as_json:
        click.echo(json.dumps({"plan": plan.to_json(), "report": report.to_json()}, indent=2))
        return
    out.print(f"rolled back to entry {plan.target.id}: serving {plan.target.profile} "
              f"(recorded as entry {report.entry.id if report.entry else '?'}, {report.seconds:.1f} s)",
              markup=False)
