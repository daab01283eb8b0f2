"""Shipping images to the ranks: only what a rank lacks crosses the wire.

Plan: from every rank's image IDs as gathered (launcher/gather/ranks.py: one command each), which
of the images it lacks (`plan_for`, pure).
Apply: spool each image's `docker save` on this host once (launcher/images/spool.py), ask each rank
which layers it has (its images' diff IDs), and stream into its `docker load`, over its SSH
connection, a save-format tar with the manifest, the config and only the layers above the longest
base it has: Docker's loader reads a layer's file only when that layer's chain is missing, and
verifies each file it reads against its diff ID. All ranks at once, each at the speed of its own
connection (no compression: the host's two cores would be the bottleneck, measured 18 MB/s for
gzip). The image is loaded under a temporary tag; a rank gets the final tag only after its image ID
equals this host's, so a failed or interrupted ship never leaves a half-shipped tag behind.
With --relay the ranks pull from a registry cache on rank 0 instead (launcher/images/relay.py),
fed by a registry on this host (launcher/images/registry.py).

Docker's two image stores: a rank on containerd's image store (Docker 29+ installs, some Spark OEM
images) takes no save-format tar that lacks a layer, and names an image by its manifest's digest.
It gets an OCI layout with only the layers it lacks (spool.oci_tar), its image is known by the
config its manifest names (launcher/images/manifests.py), and only then tagged, as on the classic
store. A rank's store is asked with its layers (RANK_LAYERS).

Where a first ship's time goes (measured on the sandbox, scripts/bench_ship.py): the rank's
`docker load` unpacks the whole stream into a temporary directory and only then applies the layers,
so a first ship takes at least the save plus that apply, the naive `docker save | ssh docker load`
too. A tar already in the rank's /tmp loads at 180-260 MB/s, 32-44% of raw `cat` over the same
connection: no path into Docker's store reaches 70% of raw. CPU per 100 MB: this host's dockerd
saving 0.45 s, this process 0.3 s (docker-py's read 0.13, paramiko 0.15 with AES-GCM), the rank's
sshd and load 0.9 s. OpenSSH's `ssh` costs what paramiko does (0.18 s, chacha20-poly1305), and four
paramiko senders in this one process carry 550-580 MB/s of raw `cat`: neither a subprocess per rank
nor another process for the GIL would move a first ship faster.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from ..errors import SparkstackError
from ..status import Status
from ..facts.image_ref import ImageRef
from ..transport.remote import Connection, Group

if TYPE_CHECKING:  # imported where used: docker-py and httpx cost a no-op ship ~0.5 s
    from .local_docker import LocalDocker
    from .registry import LocalRegistry
    from .relay import Route
    from .source import Source

PULL_TIMEOUT_S = 3600
PROGRESS_S = 2.0  # a rank's progress line at most this often
# every image's diff IDs, one image a line; a failed inspect (an image deleted meanwhile) only
# makes the rank look poorer, and it is sent more
# and first its image store (launcher/facts/docker.py parse_store reads it)
STORE_PREFIX = "store "
RANK_LAYERS = ("docker info --format '" + STORE_PREFIX + "{\"Driver\":{{json .Driver}},\"DriverStatus\":{{json .DriverStatus}}}' "
               "|| exit $?; ids=$(docker image ls -aq --no-trunc) || exit $?; echo \"$ids\" | sort -u | "
               "xargs -r docker image inspect --format '{{range .RootFS.Layers}}{{.}} {{end}}' 2>/dev/null; true")
LOAD_COMMAND = "docker load -q"
CONTAINERD = "containerd"


@dataclass
class RankShip:
    """One rank's part: what it lacks (the plan), then what happened (the apply)."""

    rank: int
    host: str
    images: list[str]            # refs this rank lacks
    status: Status = Status.PLANNED  # then SHIPPED, UP_TO_DATE or FAILED
    bytes: int = 0               # what crossed the SSH connection for this rank
    missing: int = 0             # what it lacked, as sent (layers + tar headers); relay: 0
    seconds: float = 0.0
    error: str | None = None
    store: str | None = None     # its Docker's image store, once asked (plan_layers): classic or containerd
    how: str | None = None       # what it will be sent, and why that way (plan_layers)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class ShipPlan:
    local_ids: dict[str, str]    # ref -> image ID on this host
    ranks: list[RankShip] = field(default_factory=list)
    # once the ranks were asked for their layers (plan_layers): rank -> ref -> how many of the
    # image's lowest layers it has; and how this host reads each image (launcher/images/source.py)
    haves: dict[int, dict[str, int]] | None = None
    diff_ids: dict[str, list[str]] = field(default_factory=dict)
    sources: dict[str, "Source"] = field(default_factory=dict)
    stores: dict[int, str] = field(default_factory=dict)  # rank -> "containerd" or "classic" (plan_layers)
    # refs whose layers' tar sizes a containerd rank's manifest needs and this host has not seen:
    # read here by a whole save, once (the rank still gets only what it lacks)
    sizes_wanted: set[str] = field(default_factory=set)

    @property
    def needed(self) -> list[str]:
        return sorted({ref for r in self.ranks for ref in r.images})


def local_image_ids(refs: list[str], engine: "LocalDocker | None" = None) -> dict[str, str]:
    """ref -> image ID on this host, asked of Docker's socket without importing docker-py."""
    if engine is None:
        from .local_docker import connect

        engine = connect()
    ids = {}
    for ref in refs:
        ids[ref] = engine.image_id(ref)
        if not ids[ref]:
            raise SparkstackError(f"image {ref} is not on this host: run `sparkstack build` "
                                  "first (or `docker pull`/`docker load` it here)")
    return ids


def plan_for(local_ids: dict[str, str], found: list[tuple[object, dict[str, str] | None, str | None]]) -> ShipPlan:
    """Which rank lacks which image, from the ranks' image IDs as gathered (launcher/gather/
    ranks.py `image_ids`: per rank its target, {ref: image ID} or None, and why not). Pure."""
    plan = ShipPlan(local_ids)
    for target, have, why in found:
        rank = RankShip(target.rank, target.address, [])
        if have is None:
            rank.status, rank.error = Status.FAILED, why
        else:
            rank.images = [ref for ref, image_id in local_ids.items() if have.get(ref) != image_id]
            rank.status = Status.PLANNED if rank.images else Status.UP_TO_DATE
        plan.ranks.append(rank)
    return plan


def docker_hint(why: str, name: str) -> str:
    if "Cannot connect to the Docker daemon" in why:
        return f"{name}: Docker daemon not running ({why}); start it: sudo systemctl start docker"
    if "no space left" in why.lower():
        return f"{name}: disk full ({why}); free space on the rank: docker image prune, or grow the disk"
    return why if why.startswith(name) else f"{name}: {why}"


def apply(plan: ShipPlan, group: Group, say=print, relay: "Route | None" = None, bwlimit: int = 0) -> ShipPlan:
    """Move what the plan says; every rank independently, results kept per rank. With `relay`
    (rank 0's address the other ranks reach, and theirs), every rank pulls from a cache on rank 0
    and this host's uplink carries each blob once (launcher/images/relay.py). `bwlimit` (bytes/s
    per rank, 0: none) caps each rank's `docker load` stream (an upgrade's, next to a serving
    engine); the relay's pulls are not capped."""
    if not plan.needed:
        return plan
    todo = [r for r in plan.ranks if r.status == Status.PLANNED]
    # containerd's image store pulls from the relay's loopback registry over TLS, which it does not
    # speak (measured on Docker 26.1: "tls: first record does not look like a TLS handshake"): such
    # a rank gets the layers it lacks from this host instead
    loads = [r for r in todo if relay is None or plan.stores.get(r.rank) == CONTAINERD]
    pulls = [r for r in todo if r not in loads]
    if relay is not None and loads:
        say(f"relay: {', '.join(f'rank {r.rank}' for r in loads)} on containerd's image store, which pulls "
            "from no plain-HTTP loopback registry: sent the layers it lacks from this host instead")
    if loads:
        _apply_loads(plan, group, loads, say, bwlimit)
    if pulls:
        _apply_registry(plan, group, pulls, say, relay)
    return plan


def plan_layers(plan: ShipPlan, group: Group, engine: "LocalDocker | None" = None) -> ShipPlan:
    """Ask the ranks that lack something which layers they have (one command each), then choose
    how this host reads each image (launcher/images/source.py): what `ship --dry-run` shows."""
    from . import source, spool
    from .local_docker import connect
    from .pushed import registered
    from .registry import REGISTRY_BINARY, STORAGE

    plan.haves = {}
    todo = [r for r in plan.ranks if r.status == Status.PLANNED]
    if not todo:
        return plan
    engine = engine or connect()
    by_rank = {c.target.rank: c for c in group.connections}
    plan.diff_ids = {ref: engine.diff_ids(plan.local_ids[ref]) for ref in plan.needed}
    outcome = {r.rank: r for r in todo}
    for result in Group([by_rank[r.rank] for r in todo]).run(RANK_LAYERS, timeout=120).results:
        rank = outcome[result.target.rank]
        if not result.ok:
            rank.status, rank.error = Status.FAILED, docker_hint(result.why(), result.target.name)
            continue
        store, chains = rank_layers(result.stdout)
        plan.stores[rank.rank] = rank.store = store
        plan.haves[rank.rank], hows = {}, []
        for ref in rank.images:
            have, how = _sendable(plan, rank.rank, ref, have_layers(plan.diff_ids[ref], chains))
            plan.haves[rank.rank][ref] = have
            hows.append(how)
            chains.append(plan.diff_ids[ref])  # the next image may stand on this one
        rank.how = "; ".join(hows)
    registry = shutil.which(REGISTRY_BINARY) is not None
    for ref in plan.needed:
        haves = [h[ref] for h in plan.haves.values() if ref in h]
        if not haves:
            continue
        image_id, ids = plan.local_ids[ref], plan.diff_ids[ref]
        total, sizes = engine.layer_sizes(image_id)
        in_spool, config = spool.spooled(image_id, ids)
        layers = source.Layers(ids, sizes or source.even_sizes(total, len(ids)), in_spool,
                               registered(ids, STORAGE) if registry else frozenset(), config, registry)
        plan.sources[ref] = source.choose(ref, layers, min(haves), learn_sizes=ref in plan.sizes_wanted)
    return plan


def rank_layers(stdout: str) -> tuple[str, list[list[str]]]:
    """RANK_LAYERS' answer: the rank's image store and its images' diff ID chains."""
    from ..facts.docker import parse_store

    store, chains = "classic", []
    for line in stdout.splitlines():
        if line.startswith(STORE_PREFIX):
            try:
                _, containerd = parse_store(json.loads(line[len(STORE_PREFIX):]))
            except ValueError:
                containerd = None
            store = CONTAINERD if containerd else "classic"
        elif line.strip():
            chains.append(line.split())
    return store, chains


def _sendable(plan: ShipPlan, rank: int, ref: str, have: int) -> tuple[int, str]:
    """How many of the image's lowest layers need not be sent to this rank, and what it is sent.
    A rank on containerd's store gets a manifest naming every layer, so the tar sizes of the
    layers it has must be known here: an earlier save passed them, or this ship reads the whole
    image here (`sizes_wanted`: a local read, not the network's bytes)."""
    from . import spool

    n = len(plan.diff_ids[ref])
    containerd = plan.stores.get(rank) == CONTAINERD
    if have == 0:
        return 0, f"{ref}: the whole image (it has none of its {n} layers)"
    if not containerd:
        return have, f"{ref}: the {n - have} of {n} layers it lacks, config and manifest (a save-format tar)"
    lower = plan.diff_ids[ref][:have]
    learn = ""
    if not set(lower) <= set(spool.known_sizes(spool.SPOOL, lower)):
        plan.sizes_wanted.add(ref)
        learn = (f"; its manifest names the tar size of the {have} layers it has, which this host has not "
                 "seen pass: `docker save` reads them here first")
    return have, (f"{ref}: the {n - have} of {n} layers it lacks, config and manifest (an OCI layout: "
                  f"containerd's image store takes no save-format tar that lacks a layer){learn}")


def _apply_loads(plan: ShipPlan, group: Group, todo: list[RankShip], say, bwlimit: int = 0) -> None:
    """Each rank's `docker load` gets only the layers it lacks, every rank at once: from this
    host's spool, a layer as soon as this host's save has passed it (or once the registry gave
    it back: source `push`); a rank that lacks every layer of an image gets the save stream
    itself, as it comes."""
    from . import pushed, spool
    from .local_docker import connect
    from .registry import LocalRegistry

    by_rank = {c.target.rank: c for c in group.connections}
    if plan.haves is None:
        plan_layers(plan, group)
    engine = connect()
    for r in todo:
        if r.status == Status.FAILED:
            say(_progress_line(by_rank[r.rank].target.name, r))
    todo = [r for r in todo if r.status == Status.PLANNED]
    saves = {}
    for ref in plan.needed:
        lacking = [plan.haves[r.rank][ref] == 0 for r in todo if ref in r.images]
        if not lacking:
            continue  # the ranks that lacked it could not say which layers they have
        src = plan.sources[ref]
        say(f"{ref}: this host reads it by {src.how}: {src.why}")
        if src.how == "push":
            try:
                low = min(plan.haves[r.rank][ref] for r in todo if ref in r.images)
                saves[ref] = pushed.fill(LocalRegistry(), plan.local_ids[ref], plan.diff_ids[ref], low, say=say)
            except SparkstackError as e:
                for r in todo:
                    if ref in r.images:
                        r.status, r.error = Status.FAILED, f"{by_rank[r.rank].target.name}: {e.message}"
            continue
        # every rank lacks all of it: the save goes to them as it comes, and is not kept here
        saves[ref] = spool.start(engine, plan.local_ids[ref], plan.diff_ids[ref], say=say,
                                 feeds=sum(lacking), keep=not all(lacking))
    todo = [r for r in todo if r.status == Status.PLANNED]

    def ship_one(conn: Connection, rank: RankShip) -> None:
        _load_rank(conn, rank, plan.local_ids, [(ref, saves[ref], plan.haves[rank.rank][ref]) for ref in rank.images], say,
                   bwlimit, containerd=plan.stores.get(rank.rank) == CONTAINERD)

    _each_rank(todo, by_rank, ship_one, say)
    for ref, spooling in saves.items():
        try:
            spooling.finished()  # a save that failed after every rank had what it needed
        except spool.SpoolError as e:
            say(f"{ref}: {e.message}")


def _load_rank(conn: Connection, rank: RankShip, local_ids: dict[str, str], loads: list[tuple], say,
               bwlimit: int = 0, containerd: bool = False) -> None:
    """`loads`: per image (ref, its spool, how many of its lowest layers the rank has). The image
    loads untagged; it gets its tag once its ID is the build host's image (`_tag_verified`)."""
    from . import spool

    started = time.monotonic()
    streams = [(ref, spooling, have, spooling.take_feed() if have == 0 else None) for ref, spooling, have in loads]

    def missing() -> int | None:
        sizes = [(spooling.save_bytes if spooling.done else None) if feed else spooling.tar_size(have)
                 for _, spooling, have, feed in streams]
        return None if None in sizes else sum(sizes)

    progress = Progress(conn.target.name, missing, say, bwlimit)
    try:
        for ref, spooling, have, feed in streams:
            failed: list[Exception] = []
            if feed is not None:
                chunks = feed
            else:
                chunks = spool.oci_tar(spooling, have) if containerd else spool.load_tar(spooling, have)
            result = conn.run(LOAD_COMMAND, timeout=PULL_TIMEOUT_S, stdin=progress.count(_noting(chunks, failed)))
            rank.bytes = progress.moved
            rank.missing = max(missing() or 0, rank.bytes)
            if failed:
                rank.status, rank.error = Status.FAILED, f"{conn.target.name}: sending {ref} failed: {failed[0]}"
                return
            if not result.ok:
                rank.status, rank.error = Status.FAILED, docker_hint(result.why(), conn.target.name)
                return
            why = _tag_verified(conn, ref, local_ids[ref], _loaded_id(result.stdout), spooling.manifest())
            if why:
                rank.status, rank.error = Status.FAILED, f"{conn.target.name}: {why}"
                return
        rank.status = Status.SHIPPED
    finally:
        for _, _, _, feed in streams:
            if feed is not None:
                feed.drop()  # a load that never started or stopped early holds up no one
        rank.seconds = round(time.monotonic() - started, 3)


def have_layers(diff_ids: list[str], chains: list[list[str]]) -> int:
    """How many of the image's lowest layers the rank has: the longest prefix of `diff_ids` that
    one of its images (each a chain of diff IDs, bottom first) starts with."""
    best = 0
    for chain in chains:
        n = 0
        while n < min(len(chain), len(diff_ids)) and chain[n] == diff_ids[n]:
            n += 1
        best = max(best, n)
    return best


def _noting(chunks, failed: list):
    """`chunks`, keeping why they stopped (the spool's file gone, a disk error) for the message."""
    try:
        yield from chunks
    except Exception as e:
        failed.append(e)
        raise


class Progress:
    """One rank's bytes moved of its bytes missing (`total()`: None while this host's save has not
    yet passed every layer the rank lacks); a line through `say` at most every PROGRESS_S."""

    def __init__(self, name: str, total, say, bwlimit: int = 0):
        self.name, self.total, self.say, self.bwlimit = name, total, say, bwlimit
        self.moved = 0
        self.started = self.last = time.monotonic()

    def count(self, chunks):
        for chunk in chunks:
            yield chunk
            self.moved += len(chunk)
            now = time.monotonic()
            ahead = self.moved / self.bwlimit - (now - self.started) if self.bwlimit else 0
            if ahead > 0:  # over the cap: wait until this rank's average is back under it
                time.sleep(ahead)
                now = time.monotonic()
            if now - self.last >= PROGRESS_S:
                self.last = now
                self.say(self.line(now))

    def line(self, now: float) -> str:
        rate = self.moved / max(now - self.started, 1e-9)
        total = self.total()
        if total is None:
            return (f"{self.name}: {self.moved / 1e6:.1f} MB, {rate / 1e6:.1f} MB/s "
                    "(this host is still reading the image)")
        eta = max(total - self.moved, 0) / rate if rate else float("inf")
        return (f"{self.name}: {self.moved / 1e6:.1f} of {total / 1e6:.1f} MB, "
                f"{rate / 1e6:.1f} MB/s, ETA {eta:.0f} s")


def _loaded_id(stdout: str) -> str | None:
    """The image ID `docker load -q` printed for a tar that names no tag."""
    ids = [line[len("Loaded image ID: "):].strip() for line in stdout.splitlines()
           if line.startswith("Loaded image ID: ")]
    return ids[-1] if ids else None


def _tag_verified(conn: Connection, ref: str, image_id: str, loaded: str | None, manifest: bytes | None) -> str | None:
    """Give the loaded image its tag when it is the build host's: its ID is the config's digest
    (the classic store) or that of the manifest naming that config (containerd's store; the
    manifest is then kept here, launcher/images/manifests.py). Else why not."""
    from . import manifests

    accepted = {image_id}
    if manifest is not None:
        accepted.add(manifests.digest_of(manifest))
    if loaded not in accepted:
        also = f" nor its manifest {manifests.digest_of(manifest)}" if manifest is not None else ""
        return (f"docker load gave image {loaded or '(no ID)'}, not the build host's {image_id}{also}; "
                "re-run `sparkstack ship`")
    if loaded != image_id:
        from .spool import SPOOL

        manifests.remember(manifest, SPOOL)
    result = conn.run(f"docker tag {shlex.quote(loaded)} {shlex.quote(ref)}", timeout=60)
    return None if result.ok else docker_hint(result.why(), conn.target.name)


def _apply_registry(plan: ShipPlan, group: Group, todo: list[RankShip], say, relay: "Route") -> None:
    """The relay's way: this host's registry, rank 0's cache in front of it."""
    from .registry import LocalRegistry

    by_rank = {c.target.rank: c for c in group.connections}
    with LocalRegistry() as registry:
        for ref in plan.needed:
            registry.push(ref)

        def ship_many(ranks: list[RankShip], cache) -> None:
            _each_rank(ranks, by_rank, lambda conn, rank: _relay_rank(conn, rank, plan.local_ids, registry, cache), say)

        _apply_relayed(plan, by_rank, registry, relay, todo, ship_many, say)


def _each_rank(ranks: list[RankShip], by_rank: dict, ship_one, say) -> None:
    """`ship_one(conn, rank)` on these ranks at once, each said when done; one whose ship raised
    is FAILED with why, the others as they went."""
    def one(conn: Connection) -> None:
        rank = next(r for r in ranks if r.rank == conn.target.rank)
        ship_one(conn, rank)
        say(_progress_line(conn.target.name, rank))

    for o in Group([by_rank[r.rank] for r in ranks]).gather(one):
        if not o.ok:
            rank = next(r for r in ranks if r.rank == o.rank)
            rank.status, rank.error = Status.FAILED, o.why()
            say(_progress_line(o.target.name, rank))


def _apply_relayed(plan: ShipPlan, by_rank: dict, registry: "LocalRegistry", route: "Route",
                   todo: list[RankShip], ship_many, say) -> None:
    """Rank 0's cache up (its upstream: this host's registry through rank 0's forward, its gate
    open to the ranks for this ship's images only), every rank that lacks something pulls from
    it, the cache down. The uplink's bytes are rank 0's."""
    from . import relay

    head, head_ship = by_rank.get(0), next((r for r in plan.ranks if r.rank == 0), None)
    if head is None or head_ship is None or head_ship.status == Status.FAILED:
        why = head_ship.error if head_ship and head_ship.error else "rank 0 is not in this ship"
        for r in todo:
            r.status, r.error = Status.FAILED, f"rank {r.rank}: the relay needs rank 0 ({why}); ship without --relay"
        return
    spec = relay.gate_spec(route, [registry.contents(ref) for ref in plan.needed])
    front = relay.UpstreamFront(registry.port)  # the forward's end here: reads, with this ship's secret
    try:
        upstream, counter = head.reverse_forward(front.port)
    except Exception as e:  # rank 0 went away between plan and apply
        front.close()
        for r in todo:
            r.status, r.error = Status.FAILED, f"{head.target.name}: cannot open the registry forward for the relay ({e})"
        return
    try:
        cache = relay.start(head, spec, upstream, front.password)
        say(f"relay: rank 0's cache at {route.address}:{cache.port} pulls each blob from here once; "
            "only the ranks may read it, and only this ship's images")
        try:
            # One rank first (rank 0 when it lacks the image): the cache fetches a blob once per
            # request in flight, so concurrent first pulls would each cross the uplink
            # (measured: 15 MB for a 3 MB layer to four ranks); after it, the rest in parallel.
            first, rest = todo[0], todo[1:]
            ship_many([first], cache)
            if rest:
                ship_many(rest, cache)
        finally:
            relay.stop(head, cache)
    except relay.RelayError as e:
        for r in todo:
            r.status, r.error = Status.FAILED, e.message
    finally:
        head.cancel_forward(upstream)
        front.close()
        head_ship.bytes = counter.total  # every relayed blob crossed rank 0's SSH connection


def _relay_rank(conn: Connection, rank: RankShip, local_ids: dict[str, str], registry: "LocalRegistry",
                cache) -> None:
    from . import relay

    started = time.monotonic()
    try:
        for ref in rank.images:
            command, script = relay.pull_invocation(
                cache, _pull_command(registry.name(ref, "{port}"), ref, local_ids[ref]))
            result = conn.run(command, stdin=script, timeout=PULL_TIMEOUT_S)
            if not result.ok:
                rank.status, rank.error = Status.FAILED, docker_hint(result.why(), conn.target.name)
                return
        rank.status = Status.SHIPPED
    finally:
        rank.seconds = round(time.monotonic() - started, 3)


def _pull_command(source: str, ref: str, image_id: str) -> str:
    """Pull through the forward, check the image ID, and only then give it its real tag.

    First, stop pulls of the same image left behind by an earlier ship whose connection died
    (sshd killed, cable cut): their forward is gone, but dockerd keeps retrying their download
    for over a minute, and a new pull of the same layer joins that download instead of starting
    afresh (measured: 75 s lost in the sshd-killed fault test). Stopping the old CLI cancels it."""
    s, r = shlex.quote(source), shlex.quote(ref)
    path = ImageRef.parse(source).tagged  # "127.0.0.1:<port>/<path>": any port, this image
    stale = shlex.quote("[d]ocker pull -q 127[.]0[.]0[.]1:[0-9]+/" + re.escape(path) + "$")
    return (f"pkill -f -- {stale} && sleep 0.5; "
            f"docker pull -q {s} >/dev/null && "
            f"id=$(docker image inspect --format '{{{{.Id}}}}' {s}) && "
            f"if [ \"$id\" != {shlex.quote(image_id)} ]; then docker rmi {s} >/dev/null; "
            f"echo \"image ID $id differs from the build host's {image_id}\" >&2; exit 3; fi && "
            f"docker tag {s} {r} && docker rmi {s} >/dev/null; "
            f"rc=$?; [ $rc -eq 0 ] || docker rmi {s} >/dev/null 2>&1; exit $rc")


def _progress_line(name: str, rank: RankShip) -> str:
    if rank.status == Status.SHIPPED:
        return f"{name}: shipped {', '.join(rank.images)} ({moved(rank)})"
    return f"{name}: FAILED: {rank.error}" + (f" ({moved(rank)})" if rank.missing else "")


def moved(rank: RankShip) -> str:
    """`12.0 of 24.0 MB in 3.1 s, 3.9 MB/s`: for the progress lines and the final table."""
    of = f" of {rank.missing / 1e6:.1f}" if rank.missing else ""
    rate = f", {rank.bytes / 1e6 / rank.seconds:.1f} MB/s" if rank.seconds and rank.bytes else ""
    return f"{rank.bytes / 1e6:.1f}{of} MB in {rank.seconds:.1f} s{rate}"
