"""The deploy history: what each `up`, `upgrade` and `rollback` put on the ranks, kept on the
control host beside the kit's other state ($XDG_STATE_HOME/sparkstack/history/<rank 0>.json, as
the supervisor's log and the checkpoint manifests are).

An entry holds what is needed to know a deploy again and to go back to it: the profile, the
serving image's ref and its image ID on every rank, the checkpoint's fingerprint per rank, each
rank's engine argv (secrets masked), a hash of its environment and of its whole plan (the
container's label), the verification's figures (or that none was available, or was skipped), when, and how
(up, upgrade, rollback). An attempt that did not serve is kept too (`outcome: failed`, its
error), so that history shows both sides of an upgrade that rolled back.

The file is one JSON document rewritten atomically (temp file, fsync, rename) and holds at most
MAX_ENTRIES; the oldest go first. Choosing what to roll back to is pure (`pick`), as is building
an entry (`entry_for`): tests/test_history.py holds them as data.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from .. import redact
from ..errors import SparkstackError
from ..inputs import apikey

MAX_ENTRIES = 100  # a deploy a day for three months; each entry is a few kB
SERVING, FAILED = "serving", "failed"
NOT_AVAILABLE = {"status": "not available"}  # no verification was run: said, never assumed good
SKIPPED = {"status": "skipped"}  # the owner skipped it on purpose (`--no-verify`)


@dataclass
class RankDeploy:
    rank: int
    host: str
    image_id: str | None
    checkpoint: str | None  # the checkpoint's fingerprint as the rank's probe read it
    plan_hash: str  # the serving container's label (serve.plan_hash): env, docker run, engine argv
    env_hash: str
    engine: list[str]


@dataclass
class Entry:
    id: int
    at: str
    how: str  # up | upgrade | rollback
    outcome: str  # serving | failed
    profile: str
    image: str
    ranks: list[RankDeploy]
    verify: dict = field(default_factory=lambda: dict(NOT_AVAILABLE))
    error: str | None = None
    downtime_s: float | None = None
    note: str | None = None  # e.g. "rolled back to entry 3 after ..."
    config: str | None = None  # the cluster.yaml it was planned from: a rollback plans from it again

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Entry":
        ranks = [RankDeploy(**r) for r in d.get("ranks", [])]
        return cls(**{**d, "ranks": ranks})

    @property
    def image_ids(self) -> dict[int, str | None]:
        return {r.rank: r.image_id for r in self.ranks}

    def same_deploy(self, other: "Entry") -> bool:
        """The same plan on every rank, from the same images."""
        return key(self) == key(other)


def key(e: Entry) -> tuple:
    return tuple(sorted((r.rank, r.plan_hash, r.image_id) for r in e.ranks))


def env_hash(env: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()[:16]


def masked_argv(argv: list[str], env: dict[str, str], marked=()) -> list[str]:
    """The engine argv as kept: a secret of the environment (the API key) never written out."""
    secrets = set(redact.secret_values(env, marked))
    out, hide = [], False
    for a in argv:
        out.append(redact.MASK if hide or a in secrets else a)
        hide = bool(re.fullmatch(r"--[a-z-]*(api-key|token|secret)[a-z-]*", a))
    return out


def verdict(result) -> dict:
    """A verification's result as kept: None -> not available; else its status (`.ok`), its
    figures (its `figures` when it has them -- VerifyResult's: perplexities and probe counts, a
    few hundred bytes -- else its `to_json()`) and its `message`."""
    if result is None:
        return dict(NOT_AVAILABLE)
    figures = getattr(result, "figures", None)
    if figures is None:
        figures = result.to_json() if hasattr(result, "to_json") else {}
    return {"status": "passed" if result.ok else "failed", "figures": figures,
            "message": getattr(result, "message", "") or ""}


def entry_for(profile: str, plan, image_ids: dict[int, str | None], checkpoints: dict[int, str | None],
              *, how: str, outcome: str = SERVING, verify: dict | None = None, error: str | None = None,
              at: str | None = None, plan_hash=None, config: str | None = None) -> Entry:
    """An entry (id 0: `add` numbers it) from the plan that was started and what the ranks hold."""
    from .serve import plan_hash as default_hash

    hash_of = plan_hash or default_hash
    ranks = [RankDeploy(r.rank, r.host, image_ids.get(r.rank), checkpoints.get(r.rank), hash_of(r),
                        env_hash(r.env), masked_argv(r.engine, r.env, plan.secret_env)) for r in plan.ranks]
    return Entry(0, at or now(), how, outcome, profile, plan.image, ranks, verify or dict(NOT_AVAILABLE),
                 redact.scrub(error) if error else None, config=config)


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# --- what to roll back to (pure) ----------------------------------------------------------------

class NoTarget(SparkstackError):
    pass


def current(entries: list[Entry], running: dict[int, str | None]) -> Entry | None:
    """The serving entry the ranks run now (their containers' plan hashes), else None."""
    for e in reversed(entries):
        if e.outcome == SERVING and running and all(running.get(r.rank) == r.plan_hash for r in e.ranks):
            return e
    return None


def pick(entries: list[Entry], running: dict[int, str | None], wanted: str | None = None) -> Entry:
    """The entry to roll back to: `wanted` (its id, `3` or `#3`), else the last good deploy before
    the current one (what runs now; nothing running: the newest good entry) that differs from it."""
    if not entries:
        raise NoTarget("the deploy history is empty: nothing to roll back to (a good `up` records one)")
    if wanted is not None:
        try:
            n = int(str(wanted).lstrip("#"))
        except ValueError:
            raise NoTarget(f"{wanted!r} is not a history entry's number: `sparkstack history` lists them") from None
        found = next((e for e in entries if e.id == n), None)
        if found is None:
            raise NoTarget(f"history has no entry {n} (it keeps {entries[0].id}–{entries[-1].id}): "
                           "`sparkstack history` lists them")
        if found.outcome != SERVING:
            raise NoTarget(f"entry {n} never served ({found.error or 'it failed'}): pick a serving one "
                           "from `sparkstack history`")
        return found
    now_serving = current(entries, running)
    good = [e for e in entries if e.outcome == SERVING]
    if now_serving is None and good:
        now_serving = good[-1] if not any(running.values()) else None
    before = [e for e in good if now_serving is None or (e.id < now_serving.id and not e.same_deploy(now_serving))]
    if not before:
        what = f"entry {now_serving.id} ({now_serving.profile})" if now_serving else "what runs now"
        raise NoTarget(f"no good deploy before {what} in the history: nothing to roll back to; "
                       "`sparkstack history` lists what there is")
    return before[-1]


# --- the file ----------------------------------------------------------------------------------

def path_for(loaded) -> Path:
    """One history per cluster (named by rank 0's address, as the API key and the log are)."""
    return apikey.state_dir() / "history" / (re.sub(r"[^A-Za-z0-9._-]", "_", loaded.cluster.ranks[0].address)
                                               + ".json")


def load(path: Path) -> list[Entry]:
    if not path.exists():
        return []
    try:
        doc = json.loads(path.read_text())
        return [Entry.from_json(e) for e in doc["entries"]]
    except (ValueError, KeyError, TypeError) as e:
        raise SparkstackError(f"{path}: not a deploy history the kit wrote ({e}); move it aside and "
                              "the next good `up` starts a new one") from None


def add(path: Path, entry: Entry, limit: int = MAX_ENTRIES) -> Entry:
    """Append `entry` numbered after the last, keep the newest `limit`, write atomically."""
    entries = load(path)
    entry.id = (entries[-1].id + 1) if entries else 1
    entries = (entries + [entry])[-limit:]
    write(path, entries)
    return entry


def write(path: Path, entries: list[Entry]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    with open(tmp, "w") as f:
        json.dump({"entries": [e.to_json() for e in entries]}, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)  # a reader sees the old file or the new one, never half of one


# --- shown -------------------------------------------------------------------------------------

def short(image_id: str | None) -> str:
    return (image_id or "none").removeprefix("sha256:")[:12]


def line(e: Entry) -> str:
    ids = sorted({short(r.image_id) for r in e.ranks})
    checkpoint = sorted({(r.checkpoint or "unknown")[:12] for r in e.ranks})
    v = e.verify.get("status", "?")
    figures = e.verify.get("figures")
    ppl = figures.get("perplexity") if isinstance(figures, dict) else None
    if ppl:  # the perplexities the record keeps, beside the verdict
        v += " (" + ", ".join(f"{name} {value:.3f}" for name, value in ppl.items()) + ")"
    parts = [f"{e.id:>4}  {e.at}  {e.how:<8} {e.outcome:<7} {e.profile}",
             f"image {e.image} ({', '.join(ids)})", f"checkpoint {', '.join(checkpoint)}", f"verify {v}"]
    if e.downtime_s is not None:
        parts.append(f"downtime {e.downtime_s:.1f} s")
    text = "  ".join(parts)
    if e.error:
        text += f"\n       error: {e.error.splitlines()[0]}"
    if e.note:
        text += f"\n       {e.note}"
    return text
