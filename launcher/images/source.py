"""How this host reads an image's layers for a ship, chosen by what each way costs. Pure.

Docker 20.10 (the control host's) has one way to hand out an image's layer tars by themselves:
`docker push`. `docker save` writes the WHOLE image into a temporary directory before its first
byte comes out, so a save of a 1 MiB change over a 20 GB base reads 20 GB. The ways:

- `spooled`: every layer and the config are in this host's spool already: nothing is read.
- `save`: `docker save` of the whole image (launcher/images/spool.py); the only way when some
  rank lacks every layer (the save then streams to it as it comes: the first ship of a stack).
- `push`: `docker push` into this host's registry (launcher/images/pushed.py), which compresses
  and sends only the layers the registry lacks (Docker skips a layer it pushed there before),
  then the layers the ranks lack are read back from the registry, uncompressed and checked
  against their diff IDs. A base goes into the registry once; later changes over it read only
  themselves.

The choice weighs this ship and the HORIZON_SHIPS after it (the everyday "edit a patch, build,
ship" loop, ../shared/DESIGN.md): `save` pays the whole image on every change, `push` pays a base
it has not pushed once (gzip is ~5× slower per byte than a save) and then only the change.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# Measured on the sandbox's host (2 cores, Docker 20.10, random bytes; scripts/bench_ship.py):
SAVE_BPS = 150e6    # `docker save` of a 300 MB image: 2.1 s
PUSH_BPS = 32e6     # `docker push` of the same into the local registry (gzip): 9.5 s
FETCH_BPS = 200e6   # a layer read back from the registry and gunzipped, hashed, written
PUSH_FIXED_S = 0.6  # the registry's start, the push's per-layer checks, the manifest
HORIZON_SHIPS = 10  # this ship and the changes after it that the choice weighs


@dataclass(frozen=True)
class Source:
    """How this host reads one image for this ship, and what it will cost."""

    ref: str
    how: str               # "spooled", "save" or "push"
    read_bytes: int        # what this host's Docker reads now
    seconds: float         # the estimate for this ship
    why: str               # one line: the numbers the choice was made on

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Layers:
    """What is known of one image's layers here, bottom first."""

    diff_ids: list[str]
    sizes: list[int]       # bytes per layer (the image's size shared evenly when Docker's history did not say)
    spooled: frozenset     # diff IDs in this host's spool
    registered: frozenset  # diff IDs this host's registry holds
    config_spooled: bool   # the spool has the config too (an earlier save of this very image)
    registry: bool         # `docker-registry` is installed here


def choose(ref: str, layers: Layers, min_have: int, learn_sizes: bool = False) -> Source:
    """The cheapest way to read `ref` for ranks that hold at least its `min_have` lowest layers.
    `learn_sizes`: a rank on containerd's image store needs the tar size of every layer (its
    manifest names them) and this host knows not all: only a save passes them all."""
    ids, sizes = layers.diff_ids, layers.sizes
    image = sum(sizes)
    needed = [i for i in range(min_have, len(ids))]
    save_s = image / SAVE_BPS
    if learn_sizes:
        return Source(ref, "save", image, save_s, f"`docker save` of the whole image ({_mb(image)}) here: a rank "
                      "on containerd's image store needs every layer's tar size, which this host has not seen "
                      "(the ranks still get only what they lack)")
    if layers.config_spooled and all(ids[i] in layers.spooled for i in needed):
        return Source(ref, "spooled", 0, 0.0, "its layers are in this host's spool from an earlier ship")
    if min_have == 0:
        return Source(ref, "save", image, save_s,
                      f"a rank lacks every layer: `docker save` streams the whole image ({_mb(image)})")
    if not layers.registry:
        return Source(ref, "save", image, save_s, f"`docker save` of the whole image ({_mb(image)}); "
                      "no docker-registry here for reading only the change (apt-get install docker-registry)")
    change = sum(sizes[i] for i in needed)
    unpushed = sum(s for d, s in zip(ids, sizes) if d not in layers.registered)
    fetch = sum(sizes[i] for i in needed if ids[i] not in layers.spooled)
    push_s = PUSH_FIXED_S + unpushed / PUSH_BPS + fetch / FETCH_BPS
    later_s = PUSH_FIXED_S + change / PUSH_BPS + change / FETCH_BPS  # a change of the same size
    numbers = (f"the ranks lack {_mb(change)} of {_mb(image)}; push ~{push_s:.1f} s now "
               f"({_mb(unpushed)} not yet in this host's registry), ~{later_s:.1f} s per later change; "
               f"save ~{save_s:.1f} s now and on every change")
    if push_s + (HORIZON_SHIPS - 1) * later_s <= HORIZON_SHIPS * save_s:
        return Source(ref, "push", unpushed + fetch, push_s, numbers)
    return Source(ref, "save", image, save_s, numbers)


def even_sizes(total: int, n: int) -> list[int]:
    """The image's size shared over its layers: when Docker's history cannot be matched to them."""
    return [total // n + (1 if i < total % n else 0) for i in range(n)] if n else []


def _mb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"
