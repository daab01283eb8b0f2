"""`sparkstack registry-prune`: this host's registry storage and image spool emptied."""

from __future__ import annotations

import click

from .console import friendly_errors, out


@click.command("registry-prune")
@friendly_errors
def registry_prune():
    """Empty this host's registry storage (~/.cache/sparkstack/registry) and the spool of saved
    images (~/.cache/sparkstack/spool).

    \b
    `ship --relay` keeps every image it pushed in the registry storage, so an unchanged layer is
    not pushed twice; `ship` keeps the layers of the last few images it saved in the spool, so a
    re-ship reads nothing again. Pruning frees both; the next ship reads or pushes its images
    again (on this host: the ranks still receive only the layers they lack). Refused while a
    relayed ship runs; a plain ship running meanwhile fails on the ranks still receiving.
    """
    from ..images import registry, spool

    freed = registry.prune()
    out.print(f"registry storage emptied: {freed / 1e9:.2f} GB freed", markup=False)
    freed = spool.prune()
    out.print(f"spool emptied: {freed / 1e9:.2f} GB freed", markup=False)
