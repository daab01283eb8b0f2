"""The fabric's cabling, found before anything is addressed: which QSFP port of which rank faces
which, ring or switch, and what is missing -- pure functions over every rank's facts and the
neighbour tables `launcher/onrank/neighbours.py` reads on each CX7 netdev.

Every cabled CX7 port has an IPv6 link-local address as soon as it is up, with no configuration:
an all-nodes ping on it (ff02::1%netdev) fills its neighbour table with the MACs on the other end
of the cable. The facts hold every rank's MACs, so each neighbour MAC names a rank and a port.

A QSFP port shows up as two netdevs ("twins", one per PCIe x4 link: enp1s0f0np0 and
enP2p1s0f0np0); both face the same cable, so a port is named by its PCI domain 0 netdev and the
MACs of both twins name it.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from .fabric import pci_key
from .record import Facts

DEFAULT_FABRIC_NET = "192.168.177.0/24"
MTU = 9000  # the fabric's jumbo frames; `check` pings at it with don't-fragment
# A ring's cable subnet. /30 by default: every stack reads it the same way (.1 and .2 the hosts,
# .0 and .3 network and broadcast); /31 (RFC 3021, point-to-point, both addresses hosts) halves
# the addresses a cable takes, which a private /24 for a handful of cables does not need.
PREFIXES = (30, 31)
DEFAULT_PREFIX = 30
TWINS = ("first", "both")
DEFAULT_TWINS = "first"


@dataclass(frozen=True, order=True)
class PortRef:
    rank: int
    netdev: str  # the port's PCI domain 0 netdev


@dataclass(frozen=True)
class Cable:
    a: PortRef  # the lower rank's end
    b: PortRef
    both_ways: bool  # each end saw the other (one-sided: a neighbour table not yet filled)


@dataclass
class Cabling:
    topology: str | None  # "ring", "switch", or None when neither fits
    cables: list[Cable] = field(default_factory=list)  # a ring's (direct rank-to-rank) cables
    switch_ports: dict[int, str] = field(default_factory=dict)  # rank -> its port on the switch
    problems: list[str] = field(default_factory=list)  # one line each: rank, cause, fix
    notes: list[str] = field(default_factory=list)  # worth saying, not wrong

    def to_json(self) -> dict:
        return {"topology": self.topology,
                "cables": [{"a": {"rank": c.a.rank, "netdev": c.a.netdev},
                            "b": {"rank": c.b.rank, "netdev": c.b.netdev}, "both_ways": c.both_ways}
                           for c in self.cables],
                "switch_ports": {str(k): v for k, v in sorted(self.switch_ports.items())},
                "problems": list(self.problems), "notes": list(self.notes)}


def cx7_ports(facts: Facts) -> dict[str, tuple[str, ...]]:
    """{port's domain 0 netdev: (its netdevs, twins included)} from the RDMA devices' netdevs."""
    netdevs = sorted({nd for d in facts.rdma or () for nd in d.netdevs}, key=_domain_order)
    ports: dict[tuple, list[str]] = {}
    for nd in netdevs:
        ports.setdefault(pci_key(nd) or (nd,), []).append(nd)
    return {names[0]: tuple(names) for names in ports.values()}


def _domain_order(netdev: str) -> tuple[int, str]:
    return (1 if "P" in netdev[2:4] else 0, netdev)


def mac_owners(all_facts: dict[int, Facts]) -> dict[str, PortRef]:
    """Every CX7 MAC of every rank -> the rank and port it belongs to."""
    owners = {}
    for r, f in all_facts.items():
        for port, names in cx7_ports(f).items():
            for nd in names:
                iface = f.interface(nd)
                if iface and iface.mac:
                    owners[iface.mac.lower()] = PortRef(r, port)
    return owners


def _label(r: int, labels: dict[int, str]) -> str:
    return f"rank {r} ({labels[r]})" if r in labels else f"rank {r}"


def seen_from(all_facts: dict[int, Facts], neighbours: dict[int, dict[str, list[str] | None]]
              ) -> tuple[dict[PortRef, set[PortRef]], dict[PortRef, set[str]]]:
    """For each port: the ranks' ports its twins' neighbour tables name, and MACs no rank owns."""
    owners = mac_owners(all_facts)
    seen: dict[PortRef, set[PortRef]] = {}
    strangers: dict[PortRef, set[str]] = {}
    for r, f in all_facts.items():
        table = neighbours.get(r, {})
        for port, names in cx7_ports(f).items():
            here = PortRef(r, port)
            seen[here] = set()
            for nd in names:
                for mac in table.get(nd) or ():
                    owner = owners.get(mac.lower())
                    if owner is None:
                        strangers.setdefault(here, set()).add(mac.lower())
                    elif owner.rank != r:
                        seen[here].add(owner)
    return seen, strangers


def discover(all_facts: dict[int, Facts], neighbours: dict[int, dict[str, list[str] | None]],
             labels: dict[int, str] | None = None) -> Cabling:
    """Ring or switch, the cables, and what is missing. `neighbours`: {rank: {netdev: [MAC] or
    None when the netdev could not be read}}. A switch: a port that sees two or more ranks. A
    ring: each rank cabled to the next in the listed order, the last to the first."""
    labels = labels or {}
    seen, strangers = seen_from(all_facts, neighbours)
    n = len(all_facts)
    on_switch = {p: s for p, s in seen.items() if len({q.rank for q in s}) >= 2 or p in strangers}
    if on_switch:
        return _switch(all_facts, seen, on_switch, labels)
    return _ring(n, seen, labels)


def _switch(all_facts, seen, on_switch, labels) -> Cabling:
    out = Cabling("switch")
    for r in sorted(all_facts):
        ports = sorted(p.netdev for p in on_switch if p.rank == r)
        if ports:
            out.switch_ports[r] = ports[0]
        else:
            alone = sorted(p.netdev for p in seen if p.rank == r)
            out.problems.append(f"{_label(r, labels)}: no CX7 port ({', '.join(alone) or 'none found'}) sees the "
                                "other ranks: its cable to the switch is missing or its link is down; "
                                "plug it in (the port's LED lights) and run init again")
    return out


def _ring(n: int, seen: dict[PortRef, set[PortRef]], labels) -> Cabling:
    """Each rank cabled to the next. Two ranks: the ring is one cable between them (its two
    steps, 0->1 and 1->0, may share it), a second cable between their other ports is used too."""
    out = Cabling("ring")
    links: dict[frozenset, Cable] = {}
    for here, there in sorted(seen.items()):
        for peer in there:
            key = frozenset((here, peer))
            a, b = sorted((here, peer))
            links[key] = Cable(a, b, here in seen.get(peer, set()) and peer in seen.get(here, set()))
    pairs: dict[frozenset, list[Cable]] = {}
    for c in sorted(links.values(), key=lambda c: (c.a, c.b)):
        pairs.setdefault(frozenset((c.a.rank, c.b.rank)), []).append(c)
    free = lambda r: [p.netdev for p in seen if p.rank == r and not seen[p]]  # noqa: E731
    for k in range(n if n > 1 else 0):
        nxt = (k + 1) % n
        found = pairs.get(frozenset((k, nxt)))
        if found:
            out.cables.append(found.pop(0))
            if not found:
                del pairs[frozenset((k, nxt))]
        elif n == 2 and out.cables:
            out.notes.append(f"{_label(0, labels)} and {_label(1, labels)} share one cable: enough for two "
                             "ranks; a second one between their other ports doubles the fabric's bandwidth")
        else:
            out.problems.append(
                f"no cable between {_label(k, labels)} and {_label(nxt, labels)}: neither faces the other "
                f"(ports with no neighbour: {_label(k, labels)} {', '.join(free(k)) or 'none'}, "
                f"{_label(nxt, labels)} {', '.join(free(nxt)) or 'none'}); plug that cable in, or list the "
                "ranks in their cabling order")
    for pair, cables in pairs.items():  # a cable between ranks that are not neighbours in the order
        a, b = sorted(pair)
        out.problems.append(f"{_label(a, labels)} is cabled to {_label(b, labels)} "
                            f"({cables[0].a.netdev} to {cables[0].b.netdev}), not to its neighbour in "
                            "the listed order: list the ranks in ring order (each cabled to the next)")
    if not out.cables:
        out.topology = None
    return out


# -- addressing ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Address:
    rank: int
    netdev: str
    cidr: str  # "192.168.177.1/30"
    existing: bool  # already on the port: kept


def existing_ipv4(all_facts: dict[int, Facts], ref: PortRef) -> str | None:
    iface = all_facts[ref.rank].interface(ref.netdev)
    return iface.ipv4[0] if iface and iface.ipv4 else None


def propose(cabling: Cabling, all_facts: dict[int, Facts], net: str = DEFAULT_FABRIC_NET,
            prefix: int = DEFAULT_PREFIX, twins: str = DEFAULT_TWINS) -> list[Address]:
    """Addresses for every cabled port: a ring, a /30 (or /31) per cable (link k from rank k: the
    subnet's first host to the lower end, the wrap link's to the last rank); a switch, one subnet,
    rank r holds host r+1. An address already on a port is kept; its peer gets the other host of
    that subnet. twins="both": each port's second twin gets its first twin's address one `net`
    further on (192.168.177.5 -> 192.168.178.5): a subnet of its own, so the kernel never has
    two interfaces answering for one subnet."""
    base = ipaddress.IPv4Network(net)
    if prefix not in PREFIXES:
        raise ValueError(f"prefix {prefix}: a ring's cable takes a /30 or a /31")
    out: list[Address] = []
    if cabling.topology == "switch":
        for r, nd in sorted(cabling.switch_ports.items()):
            have = existing_ipv4(all_facts, PortRef(r, nd))
            cidr = have or f"{base.network_address + r + 1}/{base.prefixlen}"
            out.append(Address(r, nd, cidr, bool(have)))
    else:
        used: set[int] = set()
        for c in cabling.cables:
            lo, hi = (c.b, c.a) if c.a.rank == 0 and c.b.rank != 1 else (c.a, c.b)  # the wrap link
            k = lo.rank if lo.rank not in used else min(set(range(len(cabling.cables) + len(used) + 1)) - used)
            used.add(k)
            out += _cable_pair(all_facts, lo, hi, base, prefix, k)
    if twins == "both":
        out += [t for a in out for t in _twin_addresses(all_facts, a, base)]
    return sorted(out, key=lambda a: (a.rank, _domain_order(a.netdev)))


def _cable_pair(all_facts, lo: PortRef, hi: PortRef, base, prefix: int, k: int) -> list[Address]:
    have_lo, have_hi = existing_ipv4(all_facts, lo), existing_ipv4(all_facts, hi)
    if have_lo or have_hi:
        subnet = ipaddress.IPv4Interface(have_lo or have_hi).network
        taken = {ipaddress.IPv4Interface(x).ip for x in (have_lo, have_hi) if x}
        free = [h for h in subnet.hosts() if h not in taken]
        cidr_lo = have_lo or f"{free[0]}/{subnet.prefixlen}"
        cidr_hi = have_hi or f"{free[0]}/{subnet.prefixlen}"
    else:
        size = 2 ** (32 - prefix)
        subnet = ipaddress.IPv4Network((int(base.network_address) + size * k, prefix))
        if not subnet.subnet_of(base):
            raise ValueError(f"{base} holds too few /{prefix}s for {k + 1} cables: give a larger --fabric-net")
        first = 0 if prefix == 31 else 1  # a /31 has no network or broadcast address
        cidr_lo = f"{subnet.network_address + first}/{prefix}"
        cidr_hi = f"{subnet.network_address + first + 1}/{prefix}"
    return [Address(lo.rank, lo.netdev, cidr_lo, bool(have_lo)), Address(hi.rank, hi.netdev, cidr_hi, bool(have_hi))]


def _twin_addresses(all_facts, a: Address, base) -> list[Address]:
    """The port's other twins: kept when addressed, else a's address one `base` further on."""
    port = cx7_ports(all_facts[a.rank]).get(a.netdev, (a.netdev,))
    out = []
    for n, nd in enumerate(port[1:], start=1):
        have = existing_ipv4(all_facts, PortRef(a.rank, nd))
        iface = ipaddress.IPv4Interface(a.cidr)
        cidr = have or f"{iface.ip + n * base.num_addresses}/{iface.network.prefixlen}"
        out.append(Address(a.rank, nd, cidr, bool(have)))
    return out


def summary(topology: str, net: str = DEFAULT_FABRIC_NET, prefix: int = DEFAULT_PREFIX,
            twins: str = DEFAULT_TWINS, mtu: int = MTU) -> list[str]:
    """The proposal in words, its trade-offs said: what init prints before it writes anything."""
    lines = []
    if topology == "switch":
        lines.append(f"addressing: one subnet {net} for the switch, rank r holds host r+1")
    else:
        lines.append(f"addressing: a /{prefix} per cable out of {net}"
                     + (" (/31: RFC 3021 point-to-point, both addresses hosts; --prefix 30 if a tool "
                        "on the path wants a network and broadcast address)" if prefix == 31 else
                        " (/30: read the same way by every stack; --prefix 31 uses half the addresses)"))
    lines.append(f"MTU {mtu} on every fabric port" + ("" if mtu == MTU else f" (the fabric's usual is {MTU})"))
    if twins == "both":
        lines.append("twins: both of each port's netdevs addressed (the second in the next subnet): NCCL "
                     "runs RDMA over both PCIe x4 links, the port's full 200G; twice the addresses to keep")
    else:
        lines.append("twins: only each port's first netdev addressed: one address per cable end; NCCL leaves "
                     "the unaddressed twin out (link-local GIDs only), so a port runs on one PCIe x4 link "
                     "(~100G), plenty for decode's small all-reduces; --twins both for the full 200G")
    return lines


def fabric_ips(addresses: list[Address], rank: int) -> list[str]:
    """The rank's fabric IPs for cluster.yaml, in its ports' order."""
    return [a.cidr.split("/")[0] for a in addresses if a.rank == rank]


NETPLAN_FILE = "/etc/netplan/60-sparkstack-fabric.yaml"


def netplan(addresses: list[Address], rank: int, mtu: int = MTU) -> str:
    """The rank's netplan file for its fabric ports (`optional`: boot does not wait for a cable)."""
    mine = [a for a in addresses if a.rank == rank]
    lines = ["# Written by `sparkstack init`: this rank's ConnectX-7 fabric ports.",
             "network:", "  version: 2", "  ethernets:"]
    for a in mine:
        lines += [f"    {a.netdev}:", f"      mtu: {mtu}", f"      addresses: [{a.cidr}]",
                  "      optional: true"]
    return "\n".join(lines) + "\n"
