"""Rank state: the named facts of launcher/facts/remote.py asked of every rank (each a command,
run here over the open Group, and its parser, pure, there): which images each rank holds, by
image ID, which `ship` plans from (images/ship.py takes them as a value) and `up` reads. By content: a
containerd store's manifest digest is read as the config digest it names (images/manifests.py).
"""

from __future__ import annotations

from ..facts import remote as rank_facts
from ..images import ship
from ..transport.remote import Group


def image_ids(group: Group, refs: list[str]) -> list[tuple[object, dict[str, str] | None, str | None]]:
    """Per rank: (target, {ref: image ID it has}, None) or (target, None, why it could not say)."""
    from ..images import manifests, spool

    answers = group.run(rank_facts.image_ids_command(refs), timeout=30)
    known = manifests.known(spool.SPOOL)  # a containerd store's manifest digest -> the config it names
    out = []
    for result in answers.results:
        if not result.ok:
            out.append((result.target, None, ship.docker_hint(result.why(), result.target.name)))
        else:
            have = rank_facts.parse_image_ids(result.stdout)
            out.append((result.target, {ref: manifests.content_id(image.id, known) for ref, image in have.items()}, None))
    return out


def ship_plan(group: Group, local_ids: dict[str, str]) -> ship.ShipPlan:
    """Which rank lacks which of the images (`local_ids`: ref -> this host's image ID): the
    ranks' image IDs, asked at once, then ship.plan_for; where a rank lacks one, which layers it
    has and how this host will read each image (ship.plan_layers)."""
    plan = ship.plan_for(local_ids, image_ids(group, list(local_ids)))
    return ship.plan_layers(plan, group) if plan.needed else plan
