"""`sparkstack systemd-unit`: a unit that runs `sparkstack up` after every boot."""

from __future__ import annotations

import sys

import click

from .shared import with_cluster


@click.command("systemd-unit")
@with_cluster()
@click.option("--user", default=None, help="who runs it (default: you)")
@click.option("--timeout", type=click.IntRange(min=1), default=1800, show_default=True,
              help="seconds `up` waits for the API")
@click.option("--keep", is_flag=True, help="run `up --keep`: supervise the cluster and re-deploy it after a failure")
def systemd_unit(loaded, user, timeout, keep):
    """Print a systemd unit that runs `sparkstack up` on this control host after every boot
    (with --keep, `up --keep`, so a crash also ends in a serving cluster)."""
    import getpass
    import pathlib

    from ..plan import systemd_unit

    path = loaded.path.resolve()
    click.echo(systemd_unit.render(profile=loaded.profile.name, ranks=len(loaded.cluster.ranks),
                                   user=user or getpass.getuser(), workdir=path.parent, config=path,
                                   sparkstack=pathlib.Path(sys.executable).parent / "sparkstack",  # beside its python
                                   timeout=timeout, keep=keep), nl=False)
