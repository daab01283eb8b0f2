"""`sparkstack ship`: every rank gets the images it lacks, and only those."""

from __future__ import annotations

import json

import click

from ..errors import SparkstackError
from ..status import Status
from .console import err
from .shared import json_option, lock_option, print_ranks, trust_option, with_cluster


@click.command()
@with_cluster(profile=True)
@json_option
@click.option("--image", "refs", multiple=True, metavar="REF",
              help="ship this image (repeatable; default: the profile's serving image)")
@click.option("--dry-run", is_flag=True, help="say which rank lacks what, move nothing")
@trust_option()
@click.option("--relay", is_flag=True,
              help="ranks pull from a cache on rank 0: the uplink carries each blob twice, not once per rank")
@lock_option
def ship(loaded, as_json, refs, dry_run, trust_new_hosts, relay, wait_lock):
    """Send every rank the images it lacks, and only those.

    \b
    Each rank is asked (by image ID) what it already has, and which layers. This host reads each
    image by the cheapest way (shown by --dry-run): `save` (the whole image, for ranks that lack
    all of it), `push` (into a registry on this host, which takes only the layers it lacks; then
    the change is read back: a base is pushed once, later changes read only themselves) or
    `spooled` (kept in ~/.cache/sparkstack/spool from an earlier ship), and streams into every
    rank's `docker load`, over its SSH connection, only the layers it lacks (uncompressed), each
    rank at once, with progress (moved of missing, rate, ETA). A rank gets the image's tag only once its
    image ID equals this host's. --relay: every rank pulls from a registry cache on rank 0
    instead, fed by a registry on this host (both Debian's docker-registry), so this host's
    uplink carries each missing blob twice in all (the cache's fetch and store), not once per
    rank; `bytes` then shows the uplink's bytes on rank 0. A layer that came by a plain ship has
    no registry digest on the rank: the first relayed pull over it moves it once more.
    A rank on containerd's image store (Docker 29+ installs) gets the layers it lacks as an OCI
    layout, and its image is known by the config its manifest names.
    --json prints {"ranks": [{"rank", "host", "images", "bytes", "missing", "seconds", "status",
    "error", "store", "how"}], "sources": [{"ref", "how", "read_bytes", "seconds", "why"}]}.
    """
    from ..images import build as build_mod
    from ..images import relay as relay_mod
    from ..transport import remote
    from ..gather import ranks
    from ..images import ship as ship_mod
    from ..apply import cluster_lock

    refs = refs or [build_mod.local_chain(loaded).top]
    ids = ship_mod.local_image_ids(list(refs))  # Docker's socket, without docker-py
    with remote.Group.for_cluster(loaded.cluster, trust_new=trust_new_hosts, say=err.print) as group:
        shipment = ranks.ship_plan(group, ids)
        if not dry_run:
            say = lambda line: err.print(line, markup=False)  # noqa: E731
            with cluster_lock.held(loaded, group, wait_lock, say):
                ship_mod.apply(shipment, group, say=say, relay=relay_mod.route(loaded) if relay else None)
    rows = [r.to_json() for r in shipment.ranks]
    sources = [src.to_json() for src in shipment.sources.values()] if not relay else []
    if as_json:
        click.echo(json.dumps({"ranks": rows, "sources": sources}, indent=2))
    else:
        print_ranks([(r["rank"], r["host"], r["status"], _what_shipped(r)) for r in rows],
                     [r["error"] for r in rows])
        for r in rows:
            if r["how"] and r["status"] in (Status.PLANNED, Status.SHIPPED):
                click.echo(f"rank {r['rank']} ({r['store']} image store) gets {r['how']}")
        for src in sources:
            click.echo(f"this host reads {src['ref']} by {src['how']} (~{src['seconds']:.1f} s): {src['why']}")
    failed = [r for r in shipment.ranks if r.status == Status.FAILED]
    if failed:
        raise SparkstackError(f"ship failed on {len(failed)} of {len(rows)} ranks "
                              f"({', '.join(f'rank {r.rank}' for r in failed)}); fix the cause above "
                              "and re-run `sparkstack ship`: only what is missing moves")


def _what_shipped(rank: dict) -> str:
    from ..images.ship import RankShip, moved

    what = ", ".join(rank["images"]) or "nothing"
    if rank["status"] == Status.SHIPPED or rank["missing"]:
        what += f" ({moved(RankShip(**rank))})"
    return what
