"""`sparkstack wait`: until rank 0's API answers, with each rank's checkpoint reads meanwhile."""

from __future__ import annotations

import click

from .console import err, out
from .shared import trust_option, with_cluster


@click.command()
@with_cluster()
@click.option("--timeout", "wait_timeout", type=click.FloatRange(min=1), default=900, show_default=True)
@click.option("--no-progress", is_flag=True, help="only the API: no probe of the ranks, no read counters")
@trust_option()
def wait(loaded, wait_timeout, no_progress, trust_new_hosts):
    """Wait until rank 0's API answers: /health, then /v1/models, then one short completion.

    
    Meanwhile, every 10 s: the bytes each rank's engine has read of its checkpoint (the engine
    processes' read_bytes in /proc/<pid>/io, the counter vLLM's mmap loads move) against the
    bytes it will read and `check`'s cold-load estimate."""
    from ..apply import deploy, load_progress
    from ..transport import api

    ep = api.endpoint(loaded)
    say = lambda line: err.print(line, markup=False)  # noqa: E731
    if no_progress:
        seconds = api.wait_ready(ep, wait_timeout, say=say)
    else:
        with deploy.group_for(loaded, trust_new_hosts, say) as group:
            progress = load_progress.Progress(group, load_progress.estimates(loaded, group), say)
            seconds = api.wait_ready(ep, wait_timeout, say=say, watch=progress)
    out.print(f"{ep.url} serves {ep.model} ({seconds:.1f} s)")
