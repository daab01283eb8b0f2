"""`sparkstack down`: the serving container stopped on every rank."""

from __future__ import annotations

import click

from ..errors import SparkstackError
from .console import err, out
from .shared import lock_option, trust_option, with_cluster


@click.command()
@with_cluster()
@trust_option()
@lock_option
@click.option("--purge-caches", is_flag=True,
              help="also remove every rank's compile caches (container.cache_dir): the next start compiles afresh")
def down(loaded, trust_new_hosts, wait_lock, purge_caches):
    """Stop and remove the serving container on every rank (fine when nothing runs)."""
    from ..apply import cluster_lock, deploy, engine_caches

    say = lambda line: err.print(line, markup=False)  # noqa: E731
    with deploy.group_for(loaded, trust_new_hosts, say) as group, cluster_lock.held(loaded, group, wait_lock, say):
        failed = deploy.down(loaded, group, say)
        if failed:
            raise SparkstackError(f"could not stop the container on {', '.join(failed)}"
                                  + ("; the compile caches were left alone" if purge_caches else ""))
        not_purged = engine_caches.purge(loaded, group, say) if purge_caches else []
    if not_purged:
        raise SparkstackError("stopped on every rank, but:\n" + "\n".join(not_purged))
    out.print("stopped on every rank" + (f"; compile caches under {loaded.cluster.container.cache_dir} removed"
                                         if purge_caches and loaded.cluster.container.cache_dir else ""))
