"""`check --deep`'s verdict (issue 15): a corrupt or partial shard on a rank is named with its
rank. Pure judging of what launcher/gather/hashes.py read: each rank's digests against the manifest
made for its fingerprint (`sparkstack manifest`, or the Hub's digests `fetch` kept), else (none
made yet) against what most ranks read.
"""

from __future__ import annotations

from collections import Counter

from ..facts.checkpoint_hashes import files
from ..facts.record import Facts
from ..gather.hashes import Read
from ..status import Finding, Status

NAME = "hashes"  # the row's name (`check --deep`)


def judge(read: Read, facts: dict[int, Facts]) -> dict[int, Finding]:
    """Each rank's finding: against the manifest made for its fingerprint, else against the hash
    most ranks read."""
    majority: dict[str, str] = {}
    for name in {n for r in read.ranks for n in files(facts[r])}:
        votes = Counter(got.get(name) for got, _ in read.ranks.values() if got.get(name))
        if votes:
            majority[name] = votes.most_common(1)[0][0]
    findings = {}
    for r, (got, why) in read.ranks.items():
        fingerprint = facts[r].checkpoint.fingerprint
        findings[r] = _judge(r, facts[r], got, why, read.path, majority, read.local,
                             read.manifests.get(fingerprint), read.sources.get(fingerprint))
    return findings


def _judge(r: int, f: Facts, got: dict[str, str], why: str, path: str, majority: dict[str, str],
           local: bool, manifest: dict[str, str] | None, hub: dict | None) -> Finding:
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
        if hub:
            what = f"the Hub's digest ({hub.get('repo')} at {str(hub.get('commit'))[:12]})"
        return Finding(NAME, Status.FAIL, f"rank {r}: {bad[0]} differs from {what} (sha256 {got[bad[0]][:12]}, "
                       f"expected {against[bad[0]][:12]})" + (f", {len(bad) - 1} more" if len(bad) > 1 else ""),
                       f"on this rank `rm {path}/{bad[0]}`, then `sparkstack stage` copies it again" if local
                       else f"`sparkstack fetch {hub.get('repo')} --revision {hub.get('commit')} --verify-all` on the "
                       f"checkpoint's host re-fetches {bad[0]}" if hub
                       else f"copy {bad[0]} to this rank's {path} again from a good copy")
    note = (f" (the Hub's digests: {hub.get('repo')} at {str(hub.get('commit'))[:12]})" if hub
            else "" if manifest else " (no manifest: `sparkstack manifest` makes one)")
    return Finding(NAME, Status.PASS if manifest else Status.WARN,
                   f"{len(names)} files match {what}{note}",
                   "" if manifest else "run `sparkstack manifest` once to have a reference")
