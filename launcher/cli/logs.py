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
@click.option("--guard", is_flag=True,
              help="the rank's memory guard events while serving instead (JSON lines, with MemAvailable and MemFree)")
def logs(loaded, trust_new_hosts, rank, follow, tail, guard):
    """Show a rank's serving container log, or its memory guard's record.

    --guard: what the rank's memory guard did while serving (each cache drop and engine stop,
    with MemAvailable and MemFree), as it recorded them on the rank, in JSON lines
    (~/.cache/sparkstack/memguard/events.jsonl)."""
    from ..apply import deploy, servguard
    from ..plan.cluster_plan import CONTAINER_NAME

    if not 0 <= rank < len(loaded.cluster.ranks):  # bad input: exit 2, as click's own checks
        raise click.BadParameter(f"{rank}: the config has ranks 0..{len(loaded.cluster.ranks) - 1}",
                                 param_hint="'--rank'")
    with deploy.group_for(loaded, trust_new_hosts, lambda line: err.print(line)) as group:
        conn = group.connections[rank]
        command = f"docker logs --tail {tail} {'-f ' if follow else ''}{CONTAINER_NAME} 2>&1"
        if guard:
            where = f'"{servguard.GUARD_DIR}/{servguard.EVENTS}"'
            command = (f"[ -f {where} ] || {{ echo 'no memory guard event recorded on this rank yet'; exit 0; }}; "
                       f"tail -n {tail} {'-f ' if follow else ''}{where}")
        status = conn.stream(command, lambda data: (sys.stdout.buffer.write(data), sys.stdout.flush()))
    if status not in (0, None):
        raise SparkstackError(f"{conn.target.name}: no serving container to show (docker logs exited {status})")
