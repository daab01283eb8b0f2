"""init's journal on the ranks and here, and `sparkstack restore`'s remote part. The format and
every decision are launcher/plan/init_journal.py's; the rank's side is onrank/init_journal.py,
run as root through the kit's remote layer (`sudo -n`, as `prep` runs its root steps)."""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .. import onrank
from ..facts import cabling
from ..inputs import apikey
from ..plan import init_journal as jr
from .hosts import InitError

TIMEOUT_S = 60
FIX_SUDO = ("init's journal and restore need root on the rank through `sudo -n` (as ansible/fabric.yml "
            "does): give the user passwordless sudo there, then run it again")


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


def _run(conn, args: dict, payload=None) -> dict:
    command, script = onrank.invocation_keeping_stdin("init_journal", {**args, "journal": jr.RANK_PATH})
    stdin = script + (json.dumps(payload).encode() if payload is not None else b"")
    res = conn.run(command, stdin=stdin, timeout=TIMEOUT_S, sudo=True)
    if not res.ok:
        fix = FIX_SUDO if "sudo" in res.stderr else "see the message above"
        raise InitError(f"{conn.target.name}: init's journal ({jr.RANK_PATH}): {res.why()}; {fix}")
    return json.loads(res.stdout)


def touched(addresses: list) -> dict[int, dict]:
    """What ansible/fabric.yml changes per rank (bringup.fabric_vars): the netplan file, the ports."""
    return {r: {"files": [cabling.NETPLAN_FILE], "netdevs": sorted({a.netdev for a in addresses if a.rank == r})}
            for r in sorted({a.rank for a in addresses})}


# -- this host's copy -------------------------------------------------------------------------------
def host_dir() -> Path:
    return apikey.state_dir() / "init-journals"


def host_copy(rank) -> Path:
    return host_dir() / jr.host_copy_name(rank.address, rank.port)


def _save_host_copy(rank, doc: dict) -> Path:
    path = host_copy(rank)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(temp, path)
    return path


def _load_host_copy(rank) -> dict | None:
    try:
        return json.loads(host_copy(rank).read_text())
    except (OSError, ValueError):
        return None


# -- init: record before changing ---------------------------------------------------------------------
def record(loaded, group, changes: dict[int, dict]) -> dict[int, Path]:
    """Each rank's journal, written on the rank and then copied here, BEFORE init changes it: what
    `changes` names, as it is now, added to the journal a former init left (whose entries stay).
    Any rank failing raises, and init changes no rank."""
    at = now_iso()

    def one(conn):
        r = conn.target.rank
        if r not in changes:
            return None
        c, rank = changes[r], loaded.cluster.ranks[r]
        got = _run(conn, {"op": "read", **c})
        bad = [got["journal_error"]] if got["journal_error"] else []
        if got["journal"] is not None:
            bad += jr.problems(got["journal"], jr.RANK_PATH)
        bad += jr.unreadable(got["state"], c["files"])
        if bad:
            raise InitError(f"{conn.target.name}: " + "; ".join(bad)
                            + f"; move it aside (it is the state before the kit first changed the rank), then init again")
        doc = jr.merged(got["journal"], got["state"], {"name": rank.label, "address": rank.address,
                                                       "port": rank.port}, c["files"], c["netdevs"], at)
        _run(conn, {"op": "write"}, doc)
        return doc

    outcomes = group.gather(one)
    failed = [o.why() for o in outcomes if not o.ok]
    if failed:
        raise InitError("init's journal could not be written, so no rank was changed:\n" + "\n".join(failed))
    return {o.rank: _save_host_copy(loaded.cluster.ranks[o.rank], o.value) for o in outcomes if o.value}


# -- restore ------------------------------------------------------------------------------------------------
@dataclass
class RankRestore:
    rank: int
    name: str
    source: str | None  # where the journal came from: "rank", "this host's copy", None (no journal)
    journal: dict | None = None
    actions: list = field(default_factory=list)
    refusals: list = field(default_factory=list)
    retired: list = field(default_factory=list)  # journals a former restore set aside
    differences: list | None = None  # after applying: how the rank differs from its before
    error: str | None = None

    def to_json(self) -> dict:
        return {"rank": self.rank, "name": self.name, "journal": self.source,
                "created": (self.journal or {}).get("created"),
                "actions": [jr.public(a) for a in self.actions], "refusals": self.refusals,
                "retired": self.retired, "differences": self.differences, "error": self.error}


def plan_restore(loaded, group) -> list[RankRestore]:
    """Every rank's journal (the rank's own, else this host's copy) and the actions that put the
    rank back, from what it has now. A rank that cannot be read raises: nothing is changed."""
    copies = {r: _load_host_copy(rank) for r, rank in enumerate(loaded.cluster.ranks)}

    def one(conn):
        c = copies[conn.target.rank] or {}
        return _run(conn, {"op": "read", "files": list(c.get("files", {})), "netdevs": list(c.get("ports", {}))})

    outcomes = group.gather(one)
    failed = [o.why() for o in outcomes if not o.ok]
    if failed:
        raise InitError("restore read no rank's journal, so nothing was changed:\n" + "\n".join(failed))
    return [_rank_plan(o.rank, o.target.name, o.value, copies[o.rank]) for o in outcomes]


def _rank_plan(r: int, name: str, got: dict, copy: dict | None) -> RankRestore:
    journal, source = (got["journal"], "rank") if got["journal"] is not None else (copy, "this host's copy")
    rr = RankRestore(r, name, source if journal is not None else None, journal, retired=got["retired"])
    if got["journal_error"]:
        rr.refusals.append(f"{got['journal_error']}: not a journal this sparkstack can read; move it aside "
                           "(this host's copy then stands in), then restore again")
    if journal is None:
        return rr
    rr.refusals += jr.problems(journal, jr.RANK_PATH if source == "rank" else "this host's copy")
    if not rr.refusals:
        rr.actions, refusals = jr.restore_plan(journal, got["state"])
        rr.refusals += refusals
    return rr


def apply_restore(loaded, group, plans: list[RankRestore]) -> None:
    """The actions on every journaled rank at once; each then reads itself back (`differences`),
    and a rank that matches its before sets its journal aside, here too."""
    by_rank = {p.rank: p for p in plans if p.journal is not None}

    def one(conn):
        p = by_rank.get(conn.target.rank)
        if p is None:
            return None
        before = jr.before_state(p.journal)
        return _run(conn, {"op": "restore"}, {"actions": p.actions, "before": before})

    for o in group.gather(one):
        p = by_rank.get(o.rank)
        if p is None:
            continue
        if not o.ok:
            p.error = o.why()
            continue
        p.error = o.value["error"] and f"{p.name}: {o.value['error']}"
        p.differences = jr.differences(jr.before_state(p.journal), o.value["state"])
        if not (p.error or p.differences):  # back as it was: the next init journals afresh
            _retire_host_copy(loaded.cluster.ranks[o.rank])


def _retire_host_copy(rank) -> None:
    path = host_copy(rank)
    if path.exists():
        path.rename(path.with_name(path.name + ".restored-" + now_iso().replace(":", "")))
