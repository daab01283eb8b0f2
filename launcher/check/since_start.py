"""What changed on a rank since the last good start: the facts then (kept on the control host when
`up` got the cluster serving) against the facts now, both facts/start_facts.RankStart.

Pure: one line per change, naming the rank, the thing, the value now and the value then, e.g.
"rank 2 (spark3): enp1s0f1np1 MTU 1500, was 9000 at the last good start". The supervisor's cause
line, `status` and `up`'s failure report say them (apply/last_good.py reads both sides).
A fact not known on either side (no driver on the rank, a rank that did not answer) is no change.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..facts.start_facts import Link, RankStart
from ..plan.kv import gib

WELL_BELOW = 4 << 30  # MemAvailable this much lower than then: a squeeze or a leak, not noise
AT = "at the last good start"
HEADER = "since the last good start"


@dataclass(frozen=True)
class Change:
    rank: int
    host: str
    fact: str  # link | mtu | address | gid index | rdma | driver | docker | image | memory
    subject: str | None  # the netdev or HCA; None for the rank as a whole
    now: object
    then: object
    line: str

    def to_json(self) -> dict:
        return asdict(self)


def compare(then: RankStart, now: RankStart) -> list[Change]:
    """Every difference that can explain a failure, in the order a reader checks them: links,
    RDMA, driver, image, memory."""
    said: list[Change] = []

    def add(fact: str, subject: str | None, now_v, then_v, what: str) -> None:
        said.append(Change(now.rank, now.host, fact, subject, now_v, then_v, f"{now.label}: {what} {AT}"))

    for old in then.links:
        _link(add, old, now.link(old.netdev) or Link(old.netdev, None, None))
    _rdma(add, then, now)
    if then.driver and (now.driver, now.cuda) != (then.driver, then.cuda):
        add("driver", None, now.driver, then.driver,
            f"NVIDIA driver {_driver(now)}, was {_driver(then)}" if now.driver
            else f"no NVIDIA driver seen, was {_driver(then)}")
    _docker(add, then, now)
    _image(add, then, now)
    for slot, how in (("mem_serving", "with the engine serving"), ("mem_before", "with no engine running")):
        old, new = getattr(then, slot), getattr(now, slot)
        if old is not None and new is not None and new < old - WELL_BELOW:
            add("memory", slot, new, old, f"MemAvailable {gib(new)} {how}, was {gib(old)}")
    return said


def _docker(add, then: RankStart, now: RankStart) -> None:
    """Docker upgraded, or its image store switched: a daemon that moves to containerd's image
    store (Docker 29's default for a fresh install; `features.containerd-snapshotter` in
    /etc/docker/daemon.json) no longer shows any image loaded before, and back again."""
    if then.store and now.store and now.store != then.store:
        add("docker", now.store, now.store, then.store,
            f"Docker {now.docker or '?'} with the {now.store} image store (which hides the images loaded "
            f"before: `sparkstack ship` sends them again), was Docker {then.docker or '?'} with the "
            f"{then.store} store")
    elif then.docker and now.docker and now.docker != then.docker:
        add("docker", None, now.docker, then.docker, f"Docker {now.docker}, was {then.docker}")


def _image(add, then: RankStart, now: RankStart) -> None:
    """Another image served (a new build, another profile), or the same ref now naming another
    image on the rank, or missing there."""
    if now.image and then.image and now.image != then.image:
        add("image", now.image, now.image, then.image, f"serves {now.image}{_id(now.image_id)}, "
            f"was {then.image}{_id(then.image_id)}")
    elif then.image_id and now.image_id is not None and now.image_id != then.image_id:
        add("image", then.image, now.image_id, then.image_id,
            f"image {then.image} is {_short(now.image_id)}, was {_short(then.image_id)}" if now.image_id
            else f"image {then.image} is not on the rank, was {_short(then.image_id)}")


def _id(image_id: str | None) -> str:
    return f" ({_short(image_id)})" if image_id else ""


def _link(add, old: Link, new: Link) -> None:
    n = old.netdev
    if new.state != old.state:
        add("link", n, new.state, old.state, f"{n} is {new.state or 'gone'}, was {old.state}")
    if new.state is not None and new.mtu != old.mtu:
        add("mtu", n, new.mtu, old.mtu, f"{n} MTU {new.mtu}, was {old.mtu}")
    if new.state is not None and set(new.ipv4) != set(old.ipv4):
        add("address", n, list(new.ipv4), list(old.ipv4),
            f"{n} has {_addresses(new.ipv4)}, was {_addresses(old.ipv4)}")


def _rdma(add, then: RankStart, now: RankStart) -> None:
    if then.gid_index is None:
        return
    if now.gid_index is None:
        add("rdma", None, None, then.gid_index,
            "no /sys/class/infiniband (the RDMA modules are not loaded), had "
            + ", ".join(f"{h} GID index {i}" for h, i in then.gid_index.items()))
        return
    for hca, old in then.gid_index.items():
        new = now.gid_index.get(hca)
        if new != old:
            add("gid index", hca, new, old,
                f"{hca} has no IPv4 RoCE v2 GID, was index {old}" if new is None
                else f"{hca} RoCE v2 GID index {new} (NCCL's pick), was {'none' if old is None else old}")


def _addresses(ips: tuple[str, ...]) -> str:
    return ", ".join(ips) if ips else "no IPv4 address"


def _driver(s: RankStart) -> str:
    return s.driver + (f" (CUDA {s.cuda})" if s.cuda else "")


def _short(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:12]


def compare_all(then: dict[int, RankStart], now: dict[int, RankStart]) -> list[Change]:
    """Over the ranks both sides know as the same host (a rank whose box was replaced in the
    config is not compared with its predecessor)."""
    return [c for r in sorted(set(then) & set(now)) if then[r].host == now[r].host
            for c in compare(then[r], now[r])]


def block(changes: list[Change], at: str | None = None) -> str:
    """The changes as a message's closing lines ("" when none)."""
    if not changes:
        return ""
    return f"{HEADER}" + (f" ({at})" if at else "") + ":\n" + "\n".join(f"  {c.line}" for c in changes)
