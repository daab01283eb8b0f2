"""The facts of the last good start, kept on the control host, and what changed on a rank since.

When `up` gets the cluster serving it keeps, per rank, what a later failure is compared with
(facts/start_facts.py) -- from the facts its own gather read before the start, the image it made
sure every rank holds and each rank's MemAvailable as the memory guard last saw it: no extra SSH
round trip. One JSON file per cluster beside the supervisor's log (`<state dir>/last-good/`,
named by rank 0's address as the API key and the log are), replaced atomically: a reader never
sees half a file, a crash mid-write leaves the previous start.

Said by the supervisor after a failure (`explain`: every rank probed once), by `status` (the
same) and by `up` when a start fails (`since_gathered`: the facts its gather already read).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ..check.since_start import Change, block, compare_all
from ..facts import fabric
from ..facts.record import Facts
from ..facts.start_facts import RankStart, snapshot
from ..gather import probe
from ..inputs import apikey
from ..inputs.config import Loaded
from ..transport.remote import Group
from . import serve


@dataclass(frozen=True)
class Kept:
    """The last good start as kept: when, with which profile, each rank's facts."""

    at: str
    profile: str
    ranks: dict[int, RankStart]


@dataclass(frozen=True)
class Since:
    """What changed since the last good start `at` (changes empty: nothing that explains)."""

    at: str
    changes: list[Change]

    def block(self) -> str:
        return block(self.changes, self.at)

    def to_json(self) -> dict:
        return {"at": self.at, "changes": [c.to_json() for c in self.changes]}


def path(loaded: Loaded) -> Path:
    return apikey.state_dir() / "last-good" / (re.sub(r"[^A-Za-z0-9._-]", "_", loaded.cluster.ranks[0].address)
                                               + ".json")


def load(loaded: Loaded) -> Kept | None:
    """The kept start; None when there is none, or the file is not one this kit wrote."""
    try:
        data = json.loads(path(loaded).read_text())
        return Kept(str(data["at"]), str(data["profile"]),
                    {int(x["rank"]): RankStart.from_json(x) for x in data["ranks"]})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def record(loaded: Loaded, gathered, mem_serving: dict[int, int], image_id: str | None = None) -> Path:
    """Keep the start `up` just got serving: per rank from `gathered` (this run's gather, before the
    start), `mem_serving` (MemAvailable while serving, by rank) and `image_id`, the serving image's
    ID every rank now holds (None: as each rank held it when gathered)."""
    ranks = []
    for r, facts in sorted(gathered.facts.items()):
        start = _snapshot(loaded, r, facts, gathered.image, False, image_id=image_id or gathered.local_image_id)
        ranks.append(dataclasses.replace(start, mem_serving=mem_serving.get(r)))
    out = path(loaded)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                               "profile": loaded.profile.name, "ranks": [s.to_json() for s in ranks]},
                              indent=1, sort_keys=True) + "\n")
    tmp.replace(out)
    return out


def since_gathered(loaded: Loaded, gathered, running: set[int]) -> Since | None:
    """What changed, from facts already gathered (`up` before it starts anything): no SSH.
    `running`: the ranks whose engine ran when they were read."""
    kept = load(loaded)
    if kept is None:
        return None
    return _since(loaded, kept, gathered.facts, running, gathered.image, gathered.local_image_id)


def explain(loaded: Loaded, group: Group, states: list[serve.RankState] | None = None) -> Since | None:
    """What changed on the ranks now: each probed once (and its container's state read, unless
    `states` has it: which engines run, on which image). None without a kept start."""
    kept = load(loaded)
    if kept is None:
        return None
    if states is None:
        states = serve.states(group)
    running = {s.rank for s in states if s.state == "running"}
    images = {s.rank: s.image for s in states if s.image}  # the ref the rank's container was made from
    return _since(loaded, kept, probe.facts_of(probe.gather(group, loaded)), running, images)


def _since(loaded: Loaded, kept: Kept, facts: dict[int, Facts], running: set[int],
           image: str | dict[int, str] | None, image_id: str | None = None) -> Since:
    """`image`: the serving image's ref (by rank; a rank without one: the last good start's), and
    `image_id` its ID every rank is about to serve (`up` ships what a rank lacks), else each rank's own."""
    now = {}
    for r, f in facts.items():
        then = kept.ranks.get(r)
        if then is not None:
            ref = (image.get(r) if isinstance(image, dict) else image) or then.image
            now[r] = _snapshot(loaded, r, f, ref, r in running, image_id=image_id,
                               netdevs=tuple(x.netdev for x in then.links), hcas=tuple(then.gid_index or ()))
    return Since(kept.at, compare_all(kept.ranks, now))


def _snapshot(loaded: Loaded, r: int, facts: Facts, image: str | None, running: bool, **kw) -> RankStart:
    rank_fabric = fabric.for_rank(facts, loaded.cluster, r)
    return snapshot(r, loaded.cluster.ranks[r].label, facts, rank_fabric, image=image, engine_running=running, **kw)


def said(text: str, since: Since | None) -> str:
    """`text` with what changed since the last good start closing it (unchanged when nothing did)."""
    extra = since.block() if since else ""
    return f"{text}\n{extra}" if extra else text
