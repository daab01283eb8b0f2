"""`sparkstack logs`: a rank's serving container log."""

from __future__ import annotations

import sys

import click

from ..errors import SparkstackError
from .console import err
from .shared import trust_option, with_cluster


@click.command()
@with_cluster()
@trust_option()
@click.option("--rank", "rank", type=int, default=0, show_default=True, help="whose logs")
@click.option("-f", "--follow", is_flag=True, help="keep printing; Ctrl+C detaches, the model keeps running")
@click.option("--tail", type=click.IntRange(min=0), default=100, show_default=True, help="lines of history")
def logs(loaded, trust_new_hosts, rank, follow, tail):
    """Show a rank's serving container log."""
    from ..apply import deploy
    from ..plan.cluster_plan import CONTAINER_NAME

    if not 0 <= rank < len(loaded.cluster.ranks):  # bad input: exit 2, as click's own checks
        raise click.BadParameter(f"{rank}: the config has ranks 0..{len(loaded.cluster.ranks) - 1}",
                                 param_hint="'--rank'")
    with deploy.group_for(loaded, trust_new_hosts, lambda line: err.print(line)) as group:
        conn = group.connections[rank]
        command = f"docker logs --tail {tail} {'-f ' if follow else ''}{CONTAINER_NAME} 2>&1"
        status = conn.stream(command, lambda data: (sys.stdout.buffer.write(data), sys.stdout.flush()))
    if status not in (0, None):
        raise SparkstackError(f"{conn.target.name}: no serving container to show (docker logs exited {status})")
