"""Each rank's listing of model.path and model.local_path (launcher/onrank/stage.py `list`): what
`check`'s staged row compares and what `sparkstack stage` plans from (launcher/plan/staging.py)."""

from __future__ import annotations

import json

from .. import onrank
from ..facts.checkpoint_dir import parse_checkpoint
from ..inputs.config import Loaded
from ..transport.remote import Connection
from . import hashes

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


def manifest(listings: dict) -> dict[str, str] | None:
    """The manifest made for the source's fingerprint (`sparkstack manifest`), as the first rank
    that read the source sees it; None when none was made."""
    for _host, listing in listings.values():
        if isinstance(listing, dict) and "checkpoint" in listing.get("src", {}):
            found = parse_checkpoint(listing["src"]["checkpoint"])
            return hashes.load(found.fingerprint) if found else None
    return None
