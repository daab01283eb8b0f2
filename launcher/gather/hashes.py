"""The checkpoint's sha256 digests, read: on the ranks (`manifest` shares the files out over the
ranks that see the same checkpoint, each hashing its share at once; `check --deep` has every rank
hash all its files at once, in the directory the engine reads) and on this host (the manifest kept
for a checkpoint's fingerprint, and where its digests come from: `fetch` writes the Hub's).

Judging what was read is launcher/check/hashes.py's.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..facts.checkpoint_dir import parse_checkpoint
from ..facts.checkpoint_hashes import files, hash_command, parse
from ..facts.record import Facts
from ..inputs import apikey
from ..inputs.config import Loaded
from ..transport.remote import Connection, Group

HASH_TIMEOUT_S = 3 * 3600  # 300 GB over a 10G port is ~5 min; a slow disk, much longer


@dataclass
class Read:
    """What `check --deep` read: each rank's digests (or why some are missing), the manifest and
    its source per fingerprint (None: none made), and the directory the ranks hashed."""

    path: str
    local: bool  # the staged copy (model.local_path), not model.path
    ranks: dict[int, tuple[dict[str, str], str]] = field(default_factory=dict)
    manifests: dict[str, dict[str, str] | None] = field(default_factory=dict)
    sources: dict[str, dict | None] = field(default_factory=dict)


def manifest_file(fingerprint: str) -> Path:
    return apikey.state_dir() / "manifests" / f"{fingerprint[:24]}.json"


def load(fingerprint: str) -> dict[str, str] | None:
    path = manifest_file(fingerprint)
    return json.loads(path.read_text())["sha256"] if path.is_file() else None


def _hash(conn: Connection, path: str, names: list[str]) -> tuple[dict[str, str], str]:
    if not names:
        return {}, ""
    r = conn.run(hash_command(path, names), timeout=HASH_TIMEOUT_S)
    return parse(r.stdout), ("" if r.ok else r.why())


def make(loaded: Loaded, group: Group, facts: dict[int, Facts]) -> tuple[Path, dict[str, str]]:
    """Hash every file once, shared out over the ranks that read the most common checkpoint;
    keep the manifest here. Raises ValueError naming the rank that could not hash its share."""
    prints = Counter(f.checkpoint.fingerprint for f in facts.values() if f.checkpoint and f.checkpoint.shards)
    if not prints:
        raise ValueError("no rank has the checkpoint's files: see `sparkstack check`'s checkpoint row")
    fingerprint = prints.most_common(1)[0][0]
    ranks = sorted(r for r, f in facts.items() if f.checkpoint and f.checkpoint.fingerprint == fingerprint)
    names = files(facts[ranks[0]])
    share = {r: names[i::len(ranks)] for i, r in enumerate(ranks)}
    path = loaded.cluster.model.path
    chosen = Group([c for c in group.connections if c.target.rank in share])
    sha: dict[str, str] = {}
    for o in chosen.gather(lambda c: _hash(c, path, share[c.target.rank])):
        got, why = o.value if o.ok else ({}, o.why())
        missing = [n for n in share[o.target.rank] if n not in got]
        if missing:
            raise ValueError(f"{o.target.name}: could not hash {missing[0]} in {path} ({why or 'no hash'}); "
                             "fix the checkpoint row of `sparkstack check`, then run `sparkstack manifest` again")
        sha.update(got)
    return write(fingerprint, path, sha), sha


def write(fingerprint: str, path: str, sha: dict[str, str], source: dict | None = None) -> Path:
    """Keep the manifest for `fingerprint`: `source` says where its digests come from (`fetch`:
    the Hub's repository, revision and commit; none: `manifest` hashed the files on the ranks)."""
    out = manifest_file(fingerprint)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"dir": path, "fingerprint": fingerprint, "sha256": dict(sorted(sha.items()))}
    if source:
        doc["source"] = source
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(out)
    return out


def source(fingerprint: str) -> dict | None:
    """Where the manifest's digests come from, when `fetch` wrote it (the Hub's listing)."""
    path = manifest_file(fingerprint)
    return json.loads(path.read_text()).get("source") if path.is_file() else None


def read(loaded: Loaded, group: Group, facts: dict[int, Facts]) -> Read:
    """`check --deep`'s reads: every rank hashes all its files at once, in the directory the engine
    reads (the staged copy when model.local_path is set); the manifests kept here for the ranks'
    fingerprints."""
    path = loaded.cluster.model.serving_path
    wanted = {r: files(f) for r, f in facts.items() if f.checkpoint and f.checkpoint.shards}
    chosen = Group([c for c in group.connections if c.target.rank in wanted])
    found = Read(path, loaded.cluster.model.local_path is not None)
    found.ranks = {o.target.rank: (o.value if o.ok else ({}, o.why()))
                   for o in chosen.gather(lambda c: _hash(c, path, wanted[c.target.rank]))}
    for r in found.ranks:
        fingerprint = facts[r].checkpoint.fingerprint
        found.manifests[fingerprint] = load(fingerprint)
        found.sources[fingerprint] = source(fingerprint) if found.manifests[fingerprint] else None
    return found


def manifest(listings: dict) -> dict[str, str] | None:
    """The manifest made for the source's fingerprint (`sparkstack manifest`), as the first rank
    that read the source sees it; None when none was made."""
    for _host, listing in listings.values():
        if isinstance(listing, dict) and "checkpoint" in listing.get("src", {}):
            found = parse_checkpoint(listing["src"]["checkpoint"])
            return load(found.fingerprint) if found else None
    return None
