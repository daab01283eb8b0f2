"""The compile caches on the ranks (launcher/plan/caches.py): their sizes for `status`, and
`down --purge-caches`, which removes them so the next start compiles from scratch."""

from __future__ import annotations

from ..inputs.config import Loaded
from ..plan import caches
from ..transport.remote import Group


def sizes(loaded: Loaded, group: Group, ranks: list[int]) -> dict[int, dict[str, int] | str]:
    """Per rank: {image cache directory: bytes} ({}: none yet), or why it could not be read."""
    command = caches.size_command(loaded.cluster)
    if not command or not ranks:
        return {}
    chosen = Group([c for c in group.connections if c.target.rank in ranks])
    found: dict[int, dict[str, int] | str] = {}
    for r in chosen.run(command, timeout=60).results:
        found[r.target.rank] = caches.parse_sizes(r.stdout) if r.ok else r.why()
    return found


def purge(loaded: Loaded, group: Group, say=print) -> list[str]:
    """Remove the compile caches the kit made (caches.MARKER) on every rank, as root (Docker made
    them as root); what else cache_dir holds stays, and is named. Returns one line per rank that
    failed, naming it, the cause and the fix."""
    command = caches.purge_command(loaded.cluster)
    if not command:
        return []
    failed = []
    for r in group.run(command, timeout=300, sudo=True).results:
        left = caches.parse_left(r.stdout)
        if left:
            say(f"{r.target.name}: left under {loaded.cluster.container.cache_dir}: {', '.join(left)} (not "
                f"marked {caches.MARKER} by the kit: made by another program, or by sparkstack before it "
                "marked its caches; remove them by hand if they are its)")
        if not r.ok:
            failed.append(f"{r.target.name}: cannot remove the compile caches under "
                          f"{loaded.cluster.container.cache_dir} ({r.why()}); fix: give {r.target.user} "
                          "passwordless sudo, or remove that directory's contents as root")
    return failed


def total(found: dict[str, int] | str | None) -> int | None:
    return sum(found.values()) if isinstance(found, dict) else None
