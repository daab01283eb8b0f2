"""The checkpoint's sha256 manifest and `check --deep` (issue 15): a corrupt or partial shard on
a rank is named with its rank.

`sparkstack manifest` hashes every file of the checkpoint once, the files shared out over the
ranks that see the same checkpoint (each hashes its share at once), and keeps the result on this
host, named after the checkpoint's fingerprint (config, index, shard names and sizes): a changed
checkpoint gets a new manifest. `check --deep` has every rank hash all its files at once and
compares them with that manifest, else (none made yet) with what the other ranks read.
"""

from __future__ import annotations

import json
import shlex
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..facts.checkpoint_dir import parse_checkpoint
from ..facts.record import Facts
from ..inputs import apikey
from ..inputs.config import Loaded
from ..status import Finding, Status
from ..transport.remote import Connection, Group

HASH_TIMEOUT_S = 3 * 3600  # 300 GB over a 10G port is ~5 min; a slow disk, much longer
EXTRA_FILES = ("config.json", "model.safetensors.index.json")
NAME = "hashes"  # the row's name (`check --deep`)


def files(f: Facts) -> list[str]:
    """The files hashed: every shard and the config and index the rank has."""
    c = f.checkpoint
    names = [n for n, _ in c.shards] if c else []
    extra = [n for n, sha in zip(EXTRA_FILES, (c.config_sha256, c.index_sha256)) if sha] if c else []
    return extra + names


def hash_command(path: str, names: list[str]) -> str:
    """sha256sum over `names` in `path`; a missing or unreadable file is said on stderr and the
    others are still hashed."""
    return f"cd -- {shlex.quote(path)} && sha256sum -- {' '.join(shlex.quote(n) for n in names)}"


def parse(stdout: str) -> dict[str, str]:
    """sha256sum's `HASH  NAME` lines into {name: hash}."""
    found = {}
    for line in stdout.splitlines():
        digest, _, name = line.partition("  ")
        if len(digest) == 64 and name:
            found[name.lstrip("*")] = digest
    return found


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


def verify(loaded: Loaded, group: Group, facts: dict[int, Facts]) -> dict[int, Finding]:
    """Every rank hashes all its files at once, in the directory the engine reads (the staged
    copy when model.local_path is set); each rank's finding against the manifest made for its
    fingerprint, else against the hash most ranks read."""
    path = loaded.cluster.model.serving_path
    wanted = {r: files(f) for r, f in facts.items() if f.checkpoint and f.checkpoint.shards}
    chosen = Group([c for c in group.connections if c.target.rank in wanted])
    read = {o.target.rank: (o.value if o.ok else ({}, o.why()))
            for o in chosen.gather(lambda c: _hash(c, path, wanted[c.target.rank]))}
    majority: dict[str, str] = {}
    for name in {n for names in wanted.values() for n in names}:
        votes = Counter(got.get(name) for got, _ in read.values() if got.get(name))
        if votes:
            majority[name] = votes.most_common(1)[0][0]
    local = loaded.cluster.model.local_path is not None
    return {r: _judge(r, facts[r], got, why, path, majority, local) for r, (got, why) in read.items()}


def _judge(r: int, f: Facts, got: dict[str, str], why: str, path: str, majority: dict[str, str],
           local: bool = False) -> Finding:
    manifest = load(f.checkpoint.fingerprint)
    against, what = (manifest, "the manifest") if manifest else (majority, "the other ranks")
    names = files(f)
    unread = [n for n in names if n not in got]
    if unread:
        return Finding(NAME, Status.FAIL, f"rank {r}: {unread[0]} in {path} could not be read ({why or 'no hash'})"
                       + (f", {len(unread) - 1} more" if len(unread) > 1 else ""),
                       "copy the file again: `sparkstack stage`" if local else
                       "copy the file again (or remount the checkpoint: `sparkstack prep`)")
    bad = [n for n in names if against.get(n) and got[n] != against[n]]
    if bad:
        hub = source(f.checkpoint.fingerprint) if manifest else None
        if hub:
            what = f"the Hub's digest ({hub.get('repo')} at {str(hub.get('commit'))[:12]})"
        return Finding(NAME, Status.FAIL, f"rank {r}: {bad[0]} differs from {what} (sha256 {got[bad[0]][:12]}, "
                       f"expected {against[bad[0]][:12]})" + (f", {len(bad) - 1} more" if len(bad) > 1 else ""),
                       f"on this rank `rm {path}/{bad[0]}`, then `sparkstack stage` copies it again" if local
                       else f"`sparkstack fetch {hub.get('repo')} --revision {hub.get('commit')} --verify-all` on the "
                       f"checkpoint's host re-fetches {bad[0]}" if hub
                       else f"copy {bad[0]} to this rank's {path} again from a good copy")
    hub = source(f.checkpoint.fingerprint) if manifest else None
    note = (f" (the Hub's digests: {hub.get('repo')} at {str(hub.get('commit'))[:12]})" if hub
            else "" if manifest else " (no manifest: `sparkstack manifest` makes one)")
    return Finding(NAME, Status.PASS if manifest else Status.WARN,
                   f"{len(names)} files match {what}{note}",
                   "" if manifest else "run `sparkstack manifest` once to have a reference")


def manifest(listings: dict) -> dict[str, str] | None:
    """The manifest made for the source's fingerprint (`sparkstack manifest`), as the first rank
    that read the source sees it; None when none was made."""
    for _host, listing in listings.values():
        if isinstance(listing, dict) and "checkpoint" in listing.get("src", {}):
            found = parse_checkpoint(listing["src"]["checkpoint"])
            return load(found.fingerprint) if found else None
    return None
