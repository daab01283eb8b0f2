"""`sparkstack manifest`: every checkpoint file hashed once, the manifest kept on this host."""

from __future__ import annotations

import click

from ..errors import SparkstackError
from .console import err, out
from .shared import trust_option, with_cluster


@click.command()
@with_cluster()
@trust_option()
def manifest(loaded, trust_new_hosts):
    """Hash every checkpoint file once (sha256), shared out over the ranks at once, and keep the
    manifest on this host ($XDG_STATE_HOME/sparkstack/manifests/, named after the checkpoint's
    fingerprint): `check --deep` then names any rank whose shard differs from it."""
    from ..gather import hashes
    from ..gather import probe

    with probe.open_group(loaded, trust_new=trust_new_hosts,
                           say=lambda line: err.print(line, markup=False, highlight=False)) as group:
        facts = probe.facts_of(probe.gather(group, loaded, model_dir=loaded.cluster.model.path))
        try:
            path, sha = hashes.make(loaded, group, facts)
        except ValueError as e:
            raise SparkstackError(str(e)) from None
    out.print(f"{len(sha)} files hashed; manifest {path}", markup=False)
