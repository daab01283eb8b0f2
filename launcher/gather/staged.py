"""Each rank's listing of model.path and model.local_path (launcher/onrank/stage.py `list`): what
`check`'s staged row compares and what `sparkstack stage` plans from (launcher/plan/staging.py);
the manifest that goes with it is launcher/check/hashes.py's `manifest`."""

from __future__ import annotations

import json

from .. import onrank
from ..inputs.config import Loaded
from ..transport.remote import Connection

LIST_TIMEOUT_S = 60.0  # two directory listings and two small hashes


def list_command(loaded: Loaded) -> tuple[str, bytes]:
    m = loaded.cluster.model
    return onrank.invocation("stage", {"mode": "list", "src": m.path, "dst": m.local_path})


def parse_listing(stdout: str) -> dict | str:
    try:
        found = json.loads(stdout)
    except ValueError:
        found = None
    return found if isinstance(found, dict) else "the staging listing's output is unreadable"


def list_rank(conn: Connection, loaded: Loaded) -> dict | str:
    """The rank's listing, or why there is none."""
    command, stdin = list_command(loaded)
    r = conn.run(command, stdin=stdin, timeout=LIST_TIMEOUT_S)
    return parse_listing(r.stdout) if r.ok else r.why()

