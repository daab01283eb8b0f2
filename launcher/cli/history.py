"""`sparkstack history`: the deploys this host recorded, newest last."""

from __future__ import annotations

import json

import click

from .console import out
from .shared import json_option, with_cluster


@click.command()
@with_cluster()
@json_option
def history(loaded, as_json):
    """The deploy history kept on this host: each good `up`, `upgrade` and `rollback` (and each
    attempt that failed), newest last, with its profile, the image ID per rank, the checkpoint's
    fingerprint, the verification's status and, for a swap, the downtime. Reads no rank.

    \b
    `sparkstack rollback N` goes back to entry N. --json prints {"path", "entries": [{"id", "at",
    "how", "outcome", "profile", "image", "ranks": [{"rank", "host", "image_id", "checkpoint",
    "plan_hash", "env_hash", "engine"}], "verify", "error", "downtime_s", "note"}]}.
    """
    from ..apply import history as history_mod

    path = history_mod.path_for(loaded)
    entries = history_mod.load(path)
    if as_json:
        click.echo(json.dumps({"path": str(path), "entries": [e.to_json() for e in entries]}, indent=2))
        return
    if not entries:
        out.print(f"no deploy recorded yet ({path}): a good `sparkstack up` records one", markup=False)
        return
    for e in entries:
        out.print(history_mod.line(e), markup=False, highlight=False)
