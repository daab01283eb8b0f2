"""The facts of a start, per rank: what a later failure is compared with (check/since_start.py).

A NIC firmware reset puts a port's MTU back at 1500 or moves the RoCE v2 GID index NCCL picks,
and NCCL then fails with `IBV_WC_RETRY_EXC_ERR` with nothing naming the box that changed. So
when `up` gets the cluster serving it keeps, per rank, the few facts whose change explains such a
failure (apply/last_good.py writes them on the control host): each fabric netdev's link state and
MTU and its IPv4 addresses, the RoCE v2 GID index NCCL picks on each HCA it uses (as `check`'s gid
index row shows it), the driver and its CUDA version, Docker's version and image store (an upgrade to Docker 29 may
switch to containerd's store, which hides every image loaded before), the image ID behind the
serving image's ref, and MemAvailable before the start (caches dropped, no engine) and with the engine serving.

Derived from the probe's Facts and the rank's fabric (fabric.py), nothing read here: the same
derivation makes the facts of the last good start and the facts now, so the two compare field by
field. The facts now are read on the netdevs and HCAs the last good start used (`netdevs`,
`hcas`): a port whose link is down drops out of the fabric's own ports, not out of the comparison.
"""

from __future__ import annotations

from dataclasses import dataclass

from .fabric import RankFabric, ipv4_roce_v2
from .record import Facts, to_jsonable


@dataclass(frozen=True)
class Link:
    """One fabric netdev as the rank showed it."""

    netdev: str
    state: str | None  # sysfs operstate: up, down, ...; None: the netdev is gone
    mtu: int | None
    ipv4: tuple[str, ...] = ()  # "192.168.177.9/30"


@dataclass(frozen=True)
class RankStart:
    rank: int
    host: str  # the config's label of the rank (its name, else its address)
    links: tuple[Link, ...] = ()
    gid_index: dict[str, int | None] | None = None  # HCA -> the IPv4 RoCE v2 entry NCCL picks; None: none
    driver: str | None = None  # "580.95.05"
    cuda: str | None = None  # "13.0"
    image: str | None = None  # the serving image's ref
    image_id: str | None = None  # its ID on the rank ("sha256:..."); "": the rank lacks it; None: not known
    mem_before: int | None = None  # MemAvailable (bytes) with no engine running (before a start)
    mem_serving: int | None = None  # MemAvailable (bytes) with the engine running
    docker: str | None = None  # the Docker Engine's version ("26.1.5")
    store: str | None = None  # its image store: classic or containerd (facts/docker.py)

    @property
    def label(self) -> str:
        return f"rank {self.rank} ({self.host})"

    def link(self, netdev: str) -> Link | None:
        return next((x for x in self.links if x.netdev == netdev), None)

    def to_json(self) -> dict:
        return to_jsonable(self)

    @classmethod
    def from_json(cls, data: dict) -> RankStart:
        """The kept form back (to_json's); KeyError/TypeError/ValueError on another shape."""
        links = tuple(Link(x["netdev"], x["state"], x["mtu"], tuple(x.get("ipv4", ()))) for x in data["links"])
        gids = data.get("gid_index")
        return cls(int(data["rank"]), str(data["host"]), links,
                   {str(k): v for k, v in gids.items()} if gids is not None else None,
                   **{k: data.get(k) for k in ("driver", "cuda", "image", "image_id", "mem_before", "mem_serving",
                                               "docker", "store")})


def fabric_names(facts: Facts, fabric: RankFabric | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(netdevs, HCAs) the rank's fabric uses: the HCAs NCCL lists (each port's and its twins),
    each port's netdev and its twins' netdevs."""
    ports = fabric.ports if fabric else ()
    hcas = tuple(h for p in ports for h in p.twins)
    twin_netdevs = tuple(n for h in hcas for n in (facts.rdma_device(h).netdevs if facts.rdma_device(h) else ()))
    return tuple(dict.fromkeys(tuple(p.netdev for p in ports) + twin_netdevs)), hcas


def snapshot(rank: int, host: str, facts: Facts, fabric: RankFabric | None, *, image: str | None,
             engine_running: bool, image_id: str | None = None, mem_available: int | None = None,
             netdevs: tuple[str, ...] = (), hcas: tuple[str, ...] = ()) -> RankStart:
    """The rank's facts to compare: on its fabric's netdevs and HCAs plus `netdevs`/`hcas` (those
    of the last good start). MemAvailable (`mem_available`, else the probe's) goes where it
    compares like with like: `mem_serving` while the engine runs, else `mem_before`. `image_id`:
    when known otherwise (shipped after the probe), else the ID the probe saw for `image`."""
    own_netdevs, own_hcas = fabric_names(facts, fabric)
    links = tuple(_link(facts, n) for n in dict.fromkeys(own_netdevs + netdevs))
    gids = {h: _gid_index(facts, h) for h in dict.fromkeys(own_hcas + hcas)} if facts.rdma is not None else None
    if image_id is None and image and facts.docker and facts.docker.server_version:
        found = facts.docker.image(image)
        image_id = found.id if found else ""
    if mem_available is None and facts.memory:
        mem_available = facts.memory.available
    driver, docker = facts.driver, facts.docker
    return RankStart(rank, host, links, gids, driver.version if driver else None, driver.cuda if driver else None,
                     image, image_id, None if engine_running else mem_available,
                     mem_available if engine_running else None,
                     docker.server_version if docker else None, docker.store if docker else None)


def _link(facts: Facts, netdev: str) -> Link:
    iface = facts.interface(netdev)
    if iface is None:
        return Link(netdev, None, None)
    return Link(netdev, iface.operstate, iface.mtu, tuple(iface.ipv4))


def _gid_index(facts: Facts, hca: str) -> int | None:
    """The index NCCL (>= 2.21, NCCL_IB_GID_INDEX unset) picks on `hca`: its IPv4 RoCE v2 entry."""
    device = facts.rdma_device(hca)
    port = device.ports[0] if device and device.ports else None
    gid = ipv4_roce_v2(port) if port else None
    return gid.index if gid else None
