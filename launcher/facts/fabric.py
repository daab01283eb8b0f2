"""The fabric of one rank, from its own Facts: which netdev, HCAs and GID its traffic uses, and
the environment that tells NCCL, UCX, Gloo and vLLM so.

    fabric IP --(ip addr)--> netdev --(<hca>/device/net)--> HCA --(name)--> its twin
              --(gids + gid_attrs/types)--> the RoCE v2 GID whose address is ::ffff:<fabric IP>

A Spark's QSFP port shows up as two HCAs, one per PCIe x4 link ("twins": rocep1s0f1 and
roceP2p1s0f1 -- same bus/slot/function, the P2 one in PCI domain 2); NCCL needs both to reach
200G, and each needs an IPv4 address of its own for that (see below). Everything is derived per rank: NICs, GID
indexes and even which port is cabled differ between ranks (docs/architecture.md, "Facts of the hardware").

Every problem is a Finding (pass / warn / fail, the measured value, a one-line fix) for `check`;
`RankFabric.require()` raises FabricError on any failure for the commands that start things.

Which network carries what (docs/architecture.md, "Fabric"): on a switch every fabric IP reaches every
other, so the sockets (NCCL's bootstrap, Gloo, VLLM_HOST_IP) use the fabric netdev too. In a ring
rank 0 and rank 2 share no cable, and the bootstrap (every rank to rank 0) and Gloo (every pair)
would cross it: the sockets go on the management network every rank reaches -- the interface
holding the rank's configured `address`, found in its own facts -- and RDMA stays on the
cable-facing HCAs with NCCL_ALGO=Ring (automatic algorithm choice builds trees that connect
non-neighbours). Both: NCCL_NET=IB, so a failed RDMA set-up fails instead of falling back to
sockets.

RDMA only on HCAs holding an IPv4 RoCE v2 GID: an unaddressed twin has link-local GIDs only and
NCCL would run it on the link-local RoCE v1 entry, so it is left out of NCCL_IB_HCA (a warning
says how to address it). NCCL_IB_GID_INDEX is one number for every HCA and the index drifts
within minutes when addresses change, so it is never set unless the config pins it: NCCL
(>= 2.21) picks the IPv4 RoCE v2 entry per HCA, and `check` shows which one it will pick. Never
the fe80:: link-local entries (index 1 on a fresh table; `ibv_modify_qp: 22`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, ip_address, ip_interface

from ..errors import SparkstackError
from ..status import Finding, Status
from .network import Interface
from .rdma import Gid, RdmaDevice, RdmaPort
from .record import Facts

MIN_SPEED = 200000  # Mb/s, a 200G QSFP link as /sys/class/net/<if>/speed reports it
JUMBO_MTU = 9000
NET_ENV = {"NCCL_NET": "IB"}  # RDMA or nothing: no silent fall back to sockets
# a ring: rings only (no trees across non-neighbours), each HCA to the peer on its subnet, the two
# ports never merged into one NIC (they face different neighbours), no external net plugin
RING_ENV = {"NCCL_ALGO": "Ring", "NCCL_IB_SUBNET_AWARE_ROUTING": "1", "NCCL_IB_MERGE_NICS": "0",
            "NCCL_NET_PLUGIN": "none"}
ROCE_V2 = "RoCE v2"


def topology_env(topology: str) -> dict[str, str]:
    """What every rank of a multi-rank cluster gets whatever its own facts say."""
    return {**NET_ENV, **(RING_ENV if topology == "ring" else {})}

# rocep1s0f1, roceP2p1s0f1, enp1s0f1np1, enP2p1s0f1np1: prefix, PCI domain (absent = 0),
# bus, slot, function, and a netdev's physical port.
_PCI_NAME = re.compile(r"^(?P<kind>[a-z]+?)(?:P(?P<domain>\d+))?p(?P<bus>\d+)s(?P<slot>\d+)"
                       r"(?:f(?P<func>\d+))?(?:np(?P<port>\d+))?$")


class FabricError(SparkstackError):
    def __init__(self, rank: str, failures: Sequence["Finding"]):
        lines = [f"{rank}: {f.name}: {f.value}" + (f" -- fix: {f.fix}" if f.fix else "") for f in failures]
        super().__init__("\n".join(lines))
        self.failures = tuple(failures)


@dataclass(frozen=True)
class FabricPort:
    """One QSFP port this rank's collectives use."""

    netdev: str
    ip: IPv4Address
    hca: str  # the HCA behind `netdev`
    port: int  # the HCA's port number (1 on a Spark)
    twins: tuple[str, ...]  # `hca` and the twin(s) NCCL can use (up, addressed), PCI domain order
    gid_index: int
    gid: str
    configured: bool  # holds a fabric IP of the config (else: a ring's other neighbour link)


@dataclass(frozen=True)
class Management:
    """The interface every rank reaches this one on (a ring's sockets use it)."""

    netdev: str
    ip: IPv4Address
    assumed: str = ""  # set when not found from the configured address: what was taken instead


@dataclass(frozen=True)
class RankFabric:
    rank: str
    topology: str
    ports: tuple[FabricPort, ...]
    env: dict[str, str]
    findings: tuple[Finding, ...]
    management: Management | None = None

    @property
    def primary(self) -> FabricPort | None:
        """The port of the first configured fabric IP (its GID index is the one `check` shows)."""
        return next((p for p in self.ports if p.configured), None)

    @property
    def failures(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.status == Status.FAIL)

    def require(self) -> dict[str, str]:
        """The env, or FabricError naming the rank, each failure and its fix."""
        if self.failures:
            raise FabricError(self.rank, self.failures)
        return self.env


def pci_key(name: str) -> tuple[str, int, int, int] | None:
    """(prefix, bus, slot, function) of a PCI-named device, the same for both twins."""
    m = _PCI_NAME.match(name)
    if not m:
        return None
    return m["kind"], int(m["bus"]), int(m["slot"]), int(m["func"] or 0)


def _domain(name: str) -> int:
    m = _PCI_NAME.match(name)
    return int(m["domain"] or 0) if m else 0


def twins_of(device: RdmaDevice, devices: Sequence[RdmaDevice]) -> tuple[str, ...]:
    """The HCA and every other HCA on the same physical port: same prefix, bus, slot and
    function in another PCI domain (by the HCA names, else by their netdevs' names)."""
    def keys(d: RdmaDevice) -> set:
        found = {pci_key(d.name)} | {pci_key(n) for n in d.netdevs}
        return {k for k in found if k}
    mine = keys(device)
    same = [d.name for d in devices if d.name == device.name or (mine & keys(d))]
    return tuple(sorted(same, key=lambda n: (_domain(n), n)))


def ipv4_roce_v2(port: RdmaPort, ip: IPv4Address | None = None, netdev: str | None = None) -> Gid | None:
    """The RoCE v2 GID carrying `ip` (any IPv4 when None); never link-local, never RoCE v1."""
    for gid in port.gids:
        if gid.type != ROCE_V2 or gid.ipv4 is None:
            continue
        if (ip is None or gid.ipv4 == ip) and (netdev is None or gid.ndev in (None, netdev)):
            return gid
    return None


def _gid_table(port: RdmaPort) -> str:
    return "; ".join(f"{g.index} {g.address.compressed} {g.type or '?'}" for g in port.gids) or "empty"


class _Assessment:
    """Collects findings while walking one rank's facts."""

    def __init__(self, facts: Facts, rank: str):
        self.facts, self.rank = facts, rank
        self.findings: list[Finding] = []

    def add(self, name: str, status: Status, value: str, fix: str = "") -> None:
        self.findings.append(Finding(name, status, value, fix))

    def port_for_ip(self, ip: IPv4Address) -> FabricPort | None:
        facts = self.facts
        iface = next((i for i in facts.interfaces
                      if any(ip_interface(a).ip == ip for a in i.ipv4)), None)
        if iface is None:
            self.add("fabric ip", Status.FAIL, f"{ip} is on no interface of {self.rank}",
                     f"assign {ip} to the cabled ConnectX port (netplan), or correct fabric_ips in cluster.yaml")
            return None
        self.add("fabric ip", Status.PASS, f"{ip} on {iface.name}")
        return self.port_for_netdev(iface.name, ip, configured=True)

    def port_for_netdev(self, netdev: str, ip: IPv4Address, configured: bool) -> FabricPort | None:
        iface = self.facts.interface(netdev)
        if iface is None or iface.operstate != "up":
            self.add("link", Status.FAIL, f"{netdev} is {iface.operstate if iface else 'absent'}",
                     f"check the QSFP cable of {netdev}; `sudo ip link set {netdev} up`")
            return None
        self.add("link", Status.PASS, f"{netdev} up")
        self.link_quality(netdev)
        if self.facts.rdma is None:
            self.add("rdma", Status.FAIL, "no /sys/class/infiniband",
                     "load the RDMA drivers (mlx5_ib; rdma-core) -- DGX OS ships them")
            return None
        device = next((d for d in self.facts.rdma if netdev in d.netdevs), None)
        if device is None or not device.ports:
            self.add("rdma", Status.FAIL, f"no RDMA device behind {netdev}",
                     f"use a ConnectX port for the fabric IP; `rdma link` should list {netdev}")
            return None
        port = next((p for p in device.ports if any(g.ndev == netdev for g in p.gids)), device.ports[0])
        if port.link_layer != "Ethernet":
            self.add("rdma", Status.FAIL, f"{device.name} port {port.number} link layer is {port.link_layer}, not Ethernet",
                     "set the ConnectX port to Ethernet (mlxconfig LINK_TYPE_P*=2) for RoCE")
            return None
        if port.state != "ACTIVE":
            self.add("rdma", Status.FAIL, f"{device.name} port {port.number} is {port.state}",
                     f"bring {netdev} up with its cable in; the RDMA port follows the link")
            return None
        gid = ipv4_roce_v2(port, ip, netdev)
        if gid is None:
            self.add("roce gid", Status.FAIL,
                     f"no RoCE v2 GID for {ip} on {device.name} (table: {_gid_table(port)})",
                     f"the kernel adds it with the address: check `ip addr show {netdev}`, then re-run")
            return None
        self.add("roce gid", Status.PASS, f"{device.name} GID {gid.index} = ::ffff:{ip} (RoCE v2)")
        twins = twins_of(device, self.facts.rdma)
        if len(twins) < 2:
            self.add("twin", Status.WARN, f"no twin HCA found for {device.name}: one PCIe x4 link (~100G)",
                     "check that both functions of the QSFP port are up (`rdma link`)")
        else:
            twins = self.active_twins(device.name, twins)
        return FabricPort(netdev, ip, device.name, port.number, twins, gid.index, gid.gid, configured)

    def active_twins(self, hca: str, twins: tuple[str, ...]) -> tuple[str, ...]:
        """The twins NCCL can use: up, and holding an IPv4 RoCE v2 GID (an unaddressed twin has
        only link-local entries, and NCCL would run it on the link-local RoCE v1 one)."""
        keep = []
        for name in twins:
            d = self.facts.rdma_device(name)
            port = d.ports[0] if d and d.ports else None
            if name == hca:
                keep.append(name)
            elif port is None or port.state != "ACTIVE":
                self.add("twin", Status.WARN, f"{name} (twin of {hca}) is {port.state if port else None}: "
                         "left out, ~100G only", f"check the cable and `rdma link show {name}/1`")
            elif ipv4_roce_v2(port) is None:
                netdev = d.netdevs[0] if d.netdevs else name
                self.add("twin", Status.WARN, f"{name} (twin of {hca}) has no IPv4 address, only link-local "
                         "GIDs: left out of NCCL_IB_HCA (NCCL would run it on the link-local RoCE v1 "
                         "entry), ~100G on this port",
                         f"address {netdev} on a subnet of its own, on both ends of the cable (netplan; "
                         "as NVIDIA's playbooks do), then re-run")
            else:
                keep.append(name)
        return tuple(keep)

    def management(self, address: str | None) -> Management | None:
        """The interface holding the rank's configured `address`; failing that (a host name, a
        NAT's address) the one the kit's SSH connection arrived at, then the default route's."""
        found = self._holding(_ipv4_or_none(address))
        if found:
            self.add("sockets", Status.PASS, f"sockets on {found.netdev} ({found.ip}): the management "
                     "network every rank reaches")
            return found
        why = ("no address given" if not address else f"{address} is a host name"
               if _ipv4_or_none(address) is None else f"{address} is on no interface of {self.rank}")
        fallbacks = (("where the kit's SSH connection arrived", self._holding(_ipv4_or_none(self.facts.ssh_address))),
                     ("the default route's interface", self._on_interface(self.facts.default_route_if)))
        for how, hit in fallbacks:
            if hit:
                note = f"{why}: sockets on {hit.netdev} ({hit.ip}), {how}"
                self.add("sockets", Status.WARN, note, "write the rank's management IPv4 as its `address` in "
                         "cluster.yaml (behind a NAT, reach it through `jump`)")
                return Management(hit.netdev, hit.ip, note)
        self.add("sockets", Status.FAIL, f"{why}, and no other address of the management network was found: "
                 "the bootstrap and Gloo need one every rank reaches",
                 "write the rank's management IPv4 (its 10G port's) as its `address` in cluster.yaml")
        return None

    def _holding(self, ip: IPv4Address | None) -> Management | None:
        iface = next((i for i in self.facts.interfaces
                      if ip is not None and any(ip_interface(a).ip == ip for a in i.ipv4)), None)
        return Management(iface.name, ip) if iface else None

    def _on_interface(self, netdev: str | None) -> Management | None:
        iface: Interface | None = self.facts.interface(netdev) if netdev else None
        return Management(iface.name, ip_interface(iface.ipv4[0]).ip) if iface and iface.ipv4 else None

    def link_quality(self, netdev: str) -> None:
        iface = self.facts.interface(netdev)
        if iface.speed is None or iface.speed < MIN_SPEED:
            self.add("speed", Status.WARN, f"{netdev} at {iface.speed or 'unknown'} Mb/s, expected {MIN_SPEED}",
                     "use a 200G QSFP112 cable/port; `ethtool` shows the negotiated speed")
        else:
            self.add("speed", Status.PASS, f"{netdev} at {iface.speed} Mb/s")
        if iface.mtu != JUMBO_MTU:
            self.add("mtu", Status.WARN, f"{netdev} MTU {iface.mtu}, expected {JUMBO_MTU}",
                     f"set mtu: {JUMBO_MTU} for {netdev} in netplan on every rank")
        else:
            self.add("mtu", Status.PASS, f"{netdev} MTU {iface.mtu}")

    def ring_neighbours(self, ports: list[FabricPort]) -> list[FabricPort]:
        """A ring rank talks to two neighbours: every other addressed, up RoCE port joins in."""
        used = {h for p in ports for h in p.twins}
        found = []
        for device in sorted(self.facts.rdma or (), key=lambda d: (_domain(d.name), d.name)):  # twins: domain 0 first
            if device.name in used:
                continue
            for netdev in device.netdevs:
                iface = self.facts.interface(netdev)
                if iface is None or not iface.ipv4 or iface.operstate != "up":
                    continue
                port = self.port_for_netdev(netdev, ip_interface(iface.ipv4[0]).ip, configured=False)
                if port:
                    found.append(port)
                    used.update(port.twins)
                break
        return found


def _ipv4_or_none(text: str | None) -> IPv4Address | None:
    try:
        found = ip_address(text) if text else None
    except ValueError:
        return None
    return found if isinstance(found, IPv4Address) else None


def assess(facts: Facts, fabric_ips: Sequence[IPv4Address], topology: str, rank: str = "rank", *,
           address: str | None = None, gid_index: int | None = None) -> RankFabric:
    """The rank's fabric and env from its own facts; never raises (see RankFabric.require).
    `address` is the rank's configured (management) address, `gid_index` the config's pin."""
    a = _Assessment(facts, rank)
    if not fabric_ips:
        a.add("fabric ip", Status.WARN, "no fabric_ips configured: collectives fall back to sockets",
              "list the rank's 200G address under fabric_ips in cluster.yaml")
        return RankFabric(rank, topology, (), {}, tuple(a.findings))
    ports: list[FabricPort] = []
    for ip in fabric_ips:
        port = a.port_for_ip(IPv4Address(ip))
        if port and not any(port.hca in p.twins for p in ports):  # two IPs on one port: once
            ports.append(port)
    management = None
    if topology == "ring" and ports:
        ports += a.ring_neighbours(ports)
        if len({p.hca for p in ports}) < 2:
            a.add("ring ports", Status.WARN, f"only {ports[0].netdev} is up with an address: one neighbour reachable",
                  "cable and address both QSFP ports (each link its own subnet)")
    if topology == "ring":
        management = a.management(address)
    ports.sort(key=lambda p: (pci_key(p.hca) or (p.hca,), p.hca))
    env = _env(a, ports, topology, management, gid_index)
    return RankFabric(rank, topology, tuple(ports), env, tuple(a.findings), management)


def for_rank(facts: Facts, cluster, r: int) -> RankFabric:
    """`assess` with what the config says of rank r (cluster: a config.Cluster)."""
    rank = cluster.ranks[r]
    return assess(facts, rank.fabric_ips, cluster.topology, f"rank {r} ({rank.label})",
                  address=rank.address, gid_index=cluster.gid_index)


def _env(a: _Assessment, ports: list[FabricPort], topology: str, management: Management | None,
         pin: int | None) -> dict[str, str]:
    if not ports:
        return {}
    env = {
        "NCCL_IB_HCA": "=" + ",".join(h for p in ports for h in p.twins),
        "UCX_NET_DEVICES": ",".join(f"{p.hca}:{p.port}" for p in ports),
        **topology_env(topology),
    }
    if topology == "switch":  # every fabric IP reaches every other: the sockets go there too
        configured = [p for p in ports if p.configured]
        env.update({"NCCL_SOCKET_IFNAME": "=" + ",".join(p.netdev for p in configured),
                    "GLOO_SOCKET_IFNAME": configured[0].netdev, "VLLM_HOST_IP": str(configured[0].ip)})
    elif management:  # a ring: where every rank reaches every other
        env.update({"NCCL_SOCKET_IFNAME": "=" + management.netdev, "GLOO_SOCKET_IFNAME": management.netdev,
                    "VLLM_HOST_IP": str(management.ip)})
    if _gid_index(a, ports, pin) is not None:
        env["NCCL_IB_GID_INDEX"] = str(pin)
    return env


def _gid_index(a: _Assessment, ports: list[FabricPort], pin: int | None) -> int | None:
    """The pin when the config gives one, checked on every listed HCA; else None (NCCL picks the
    IPv4 RoCE v2 entry per HCA). Either way the finding shows the index each HCA gets."""
    tables = {}
    for p in ports:
        for name in p.twins:
            d = a.facts.rdma_device(name)
            tables[name] = d.ports[0] if d and d.ports else None
    picks = {h: ipv4_roce_v2(port) if port else None for h, port in tables.items()}
    shown = ", ".join(f"{h} {g.index if g else '-'}" for h, g in picks.items())
    if pin is None:
        a.add("gid index", Status.PASS, f"NCCL_IB_GID_INDEX unset: NCCL picks the IPv4 RoCE v2 entry per HCA: {shown}")
        return None
    wrong = [f"{h} index {pin} is {_entry(tables[h], pin)} (NCCL's own pick: {g.index if g else '-'})"
             for h, g in picks.items() if g is None or g.index != pin]
    if wrong:
        a.add("gid index", Status.FAIL, f"NCCL_IB_GID_INDEX={pin} (pinned) is not the IPv4 RoCE v2 entry: "
              + "; ".join(wrong), "remove fabric.gid_index (and NCCL_IB_GID_INDEX from overrides.env): NCCL "
              "then picks the entry per HCA, following it when addresses change")
    else:
        a.add("gid index", Status.PASS, f"NCCL_IB_GID_INDEX={pin} (pinned), the IPv4 RoCE v2 entry on every HCA: {shown}")
    return pin


def _entry(port: RdmaPort | None, index: int) -> str:
    gid = next((g for g in port.gids if g.index == index), None) if port else None
    if gid is None:
        return "empty"
    return f"{gid.address.compressed} {gid.type or '?'}" + (" (link-local)" if gid.link_local else "")
