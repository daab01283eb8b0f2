"""`sparkstack restore`: every rank's fabric put back as it was before `init` first changed it."""

from __future__ import annotations

import json

import click

from ..errors import SparkstackError
from .console import err, out
from .shared import json_option, lock_option, trust_option, with_cluster


@click.command()
@with_cluster()
@trust_option()
@lock_option
@click.option("--dry-run", is_flag=True, help="print what would be put back on each rank; change nothing")
@json_option
def restore(loaded, trust_new_hosts, wait_lock, dry_run, as_json):
    """Undo `init --apply` on every rank, byte for byte, from init's journal.

    Puts back every file init wrote (its bytes, mode and owner; a file it created is removed)
    and each fabric port's MTU, link state and IPv4 addresses, from the journal init kept on each
    rank before changing it (/var/lib/sparkstack/init-journal.json;
    a copy on this host stands in when the rank's is gone). All ranks or none: a rank that cannot
    be read, or whose port is gone, stops it before anything changes. Each rank is read back
    afterwards and shown against its state before init; then `sparkstack check` shows the cluster.

    \b
    See first: sparkstack restore --dry-run
    """
    from ..apply import cluster_lock, deploy, serve
    from ..init import journal

    say = lambda line: err.print(line, markup=False)  # noqa: E731
    with deploy.group_for(loaded, trust_new_hosts, say) as group:
        plans = journal.plan_restore(loaded, group)
        refused = [f"{p.name}: {r}" for p in plans for r in p.refusals]
        if dry_run or refused:
            _show(plans, as_json, done=False)
        if refused:
            raise SparkstackError("restore changed nothing, because:\n" + "\n".join(refused))
        if dry_run:
            return
        if all(p.journal is None for p in plans):
            raise SparkstackError("no rank has an init journal: `sparkstack init --apply` changed none of them "
                                  "(or a restore already put them back), so there is nothing to restore")
        with cluster_lock.held(loaded, group, wait_lock, say):  # no `up` starts meanwhile
            serving = [s for s in serve.states(group) if s.state == "running"]
            if serving:
                raise SparkstackError("restore changed nothing: the engine serves on "
                                      + ", ".join(f"rank {s.rank} ({s.host})" for s in serving)
                                      + ", over the fabric it would put back; `sparkstack down` first, then restore")
            journal.apply_restore(loaded, group, plans)
    _show(plans, as_json, done=True)
    bad = [p for p in plans if p.error or p.differences]
    if bad:
        raise SparkstackError("not every rank is back as it was:\n"
                              + "\n".join(p.error or f"{p.name}: {'; '.join(p.differences)}" for p in bad)
                              + "\nfix what it says there, then `sparkstack restore` again (its journal is kept)")


def _show(plans, as_json: bool, done: bool) -> None:
    from ..plan import init_journal

    if as_json:
        click.echo(json.dumps({"applied": done, "ranks": [p.to_json() for p in plans]}, indent=2))
        return
    for p in plans:
        out.print(_header(p, done), markup=False, highlight=False)
        if not done:
            for a in p.actions:
                out.print("  " + init_journal.describe(a), markup=False, highlight=False)
        for r in p.refusals:
            out.print(f"  refused: {r}", markup=False, highlight=False)


def _header(p, done: bool) -> str:
    if p.journal is None:
        return f"{p.name}: no init journal, left as it is" + (
            f" (restored before: {p.retired[-1]})" if p.retired else "")
    where = "kept on the rank" if p.source == "rank" else "this host's copy: the rank has none"
    head = f"{p.name}: journal of {p.journal.get('created')} ({where})"
    if not done:
        return head + (": already as it was" if not p.actions else f": {len(p.actions)} to put back")
    if p.error:
        return f"{head}: FAILED: {p.error}"
    if p.differences:
        return f"{head}: still differs: " + "; ".join(p.differences)
    return f"{head}: restored ({len(p.actions)} put back), matches its state before init byte for byte"

