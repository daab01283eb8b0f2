"""`up` on a cluster that already serves as planned: seen from ONE probe per rank.

The probe (launcher/onrank/probe.py) also reads the serving container's inspect JSON and the
memory guard's pid, so in one round trip per rank `up` knows whether anything would change:
- every rank answered, and every node setting prep applies (sysctls, swap, the checkpoint
  mount, the GPU clock) reads as prep would set it: prep would run nothing but the cache drop;
- the plan built from these very facts (the checkpoint, the image's content tag, the key as kept
  here) gives each rank the hash its running container carries (serve.is_current: the same
  image, env, `docker run` and engine argv).
Then the cache drop and the memory wait are pointless (the engine holds that memory by design)
and the pings are not needed (the API answering through every rank says more); the caller
asks the API once more. Anything else takes the full path, which reuses this probe for prep
and the preflight, and skips the drop when the containers already run as planned. Either way `up` verifies what
the API serves (its `verify` seam: an HTTP matter) and keeps the serving guard, the last good
start and the history entry from this same probe: the guard is
started only where the probe did not see it watching the running container, and the image IDs
the history records are the probe's listing (nothing was shipped).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import prep, serve
from ..errors import SparkstackError
from ..facts import remote as rank_facts
from ..facts.parts import FactError
from ..gather import cluster, probe
from ..gather.ahead import SERVING, Ahead
from ..gather.probe import RankFacts
from ..gather.value import Gathered
from ..inputs.config import Loaded
from ..plan import cluster_plan as planning
from ..transport import api
from ..transport.remote import Group

API_TIMEOUT_S = 10.0  # a serving cluster answers at once; one that does not takes the full path


@dataclass
class Look:
    probed: dict[int, RankFacts]
    current: bool  # every rank's container runs as this probe's plan says
    why_not: str | None  # None: serving as planned, nothing to change (the API aside)
    watched: bool  # every rank's memory guard watches its running container
    states: list[serve.RankState] | None = None  # each rank's container, as read (None: a rank unread)
    gathered: Gathered | None = None  # the plan's part of the value, from this probe (cluster.from_probe)
    plan: planning.Plan | None = None  # the plan from it, when the containers run at all

    @property
    def as_planned(self) -> bool:
        return self.why_not is None


def look(loaded: Loaded, group: Group, image: str | None = None,
         probed: dict[int, RankFacts] | None = None) -> Look:
    """One probe per rank, the serving container read with it; what it says of the cluster.
    `image`: the serving image's ref instead of the profile's (rollback). `probed`: that probe
    already taken (gather/ahead.py)."""
    probed = probed if probed is not None else probe.gather(group, loaded, container=SERVING)
    unread = [g.error for g in probed.values() if g.facts is None]
    if unread:
        return Look(probed, False, "; ".join(unread), False)
    states = [serve.probed_state(r, g.host, g.container) for r, g in probed.items()]
    seen = Look(probed, False, None, False, None if any(s.state == "unknown" for s in states) else states)
    why = _current(loaded, seen, states, image)
    seen.current = why is None
    seen.why_not = why or _unsettled(loaded, probed)
    seen.watched = seen.current and _watched(probed)
    return seen


def _current(loaded: Loaded, seen: Look, states: list[serve.RankState], image: str | None = None) -> str | None:
    """Why a rank's container does not run as this probe's plan says (None: every one does);
    the plan and its value kept in `seen`."""
    not_running = [f"rank {s.rank} ({s.host}): {serve.CONTAINER_NAME} {s.describe()}"
                   for s in states if s.state != "running"]
    if not_running:
        return "; ".join(not_running)
    seen.gathered = cluster.from_probe(loaded, seen.probed, image)
    try:
        seen.plan = planning.build(loaded, seen.gathered)
    except SparkstackError as e:
        return f"no plan from this probe ({e.message.splitlines()[0]})"
    if not serve.is_current(states, seen.plan):
        return "a rank's container runs another plan than this one"
    return None


def _unsettled(loaded: Loaded, probed: dict[int, RankFacts]) -> str | None:
    """A node setting prep would change, said as `rank r (host): name (was …)`."""
    due = [f"rank {r} ({g.host}): {s.name} ({s.detail})" for r, g in probed.items()
           for s in prep.plan_rank(loaded, r, g.facts, drop=False) if s.needed]
    return "; ".join(due) or None


def _watched(probed: dict[int, RankFacts]) -> bool:
    """The guard's process names the running container's ID on every rank (servguard.start_script)."""
    for g in probed.values():
        found = g.container or {}
        cid = _container_id(found)
        if not cid or cid not in (found.get("watcher") or ""):
            return False
    return True


def _container_id(raw: dict) -> str | None:
    try:
        found = rank_facts.parse_probed_container(raw, serve.PLAN_LABEL)
    except FactError:
        return None
    return found.id if found else None


def answers(loaded: Loaded, say, ahead: Ahead | None = None) -> bool:
    """The API answers as `up`'s wait asks it (health, the model listed, a completion).
    `ahead`: its pass taken beside the look, kept when every step answered."""
    said = ahead.answered() if ahead is not None else None
    if said is not None:
        for line in said:
            say(line)
        return True
    try:
        api.wait_ready(api.endpoint(loaded), API_TIMEOUT_S, say=say)
    except api.NotServing as e:
        say(f"{e.message}: the full path")
        return False
    return True
