"""The network as the rank sees it: its interfaces (`ip -j addr` joined with /sys/class/net), its
IPv4 routes and default route (/proc/net/route), and the address the kit's SSH connection arrived
at ($SSH_CONNECTION)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, ip_interface

from .parts import FactError, Part, ShapeError, command, int_or_none, key, stripped


@dataclass(frozen=True)
class Interface:
    name: str
    operstate: str | None  # sysfs words: up, down, unknown, lowerlayerdown
    speed: int | None  # Mb/s; None when the link is down or reports none
    mtu: int | None
    mac: str | None
    ipv4: tuple[str, ...]  # "192.168.177.1/30"
    ipv6: tuple[str, ...]


@dataclass(frozen=True)
class Route:
    """One IPv4 route of /proc/net/route that is up."""

    iface: str
    dest: str  # CIDR, e.g. "10.0.0.0/16" (a string: Facts travel as JSON)
    gateway: str | None  # None: on-link
    metric: int


def _ip_json(text: str, source: str) -> list[dict]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise FactError(f"{source}: not JSON ({e})") from None
    if not isinstance(data, list):
        raise FactError(f"{source}: expected a list of interfaces")
    return data


def parse_interfaces(ip_addr: dict | None, sysfs_net: dict, ip_addr_file: str | None = None) -> tuple[Interface, ...]:
    """`ip -j addr` (its addresses) joined with /sys/class/net/<if> (state, speed, MTU, MAC).
    A fixture `ip_addr_file` replaces the command's entries of the same name."""
    links: dict[str, dict] = {}
    if ip_addr and ip_addr.get("rc") == 0:
        for entry in _ip_json(ip_addr["stdout"], "ip -j addr"):
            links[entry["ifname"]] = entry
    if isinstance(ip_addr_file, str):
        for entry in _ip_json(ip_addr_file, "ip-addr fixture"):
            links[entry["ifname"]] = entry
    out = []
    for name in sorted(set(links) | set(sysfs_net)):
        link, sys_ = links.get(name, {}), sysfs_net.get(name, {})
        addrs = link.get("addr_info", [])
        speed = int_or_none(sys_.get("speed"))
        state = stripped(sys_.get("operstate")) or (link.get("operstate") or "").lower() or None
        out.append(Interface(
            name=name, operstate=state,
            speed=speed if speed is not None and speed > 0 else None,
            mtu=int_or_none(sys_.get("mtu")) or link.get("mtu"),
            mac=stripped(sys_.get("address")) or link.get("address"),
            ipv4=_addresses(name, addrs, "inet", 4), ipv6=_addresses(name, addrs, "inet6", 6)))
    return tuple(out)


def _addresses(name: str, addrs: list[dict], family: str, version: int) -> tuple[str, ...]:
    """`ip -j addr`'s addresses of one family as "address/prefix"."""
    out = []
    for a in addrs:
        if a.get("family") != family:
            continue
        text = f"{a['local']}/{a['prefixlen']}"
        try:
            valid = ip_interface(text).version == version
        except ValueError:
            valid = False
        if not valid:
            raise ShapeError(f"{name}: {text!r:.60} is not an IPv{version} address with its prefix length")
        out.append(text)
    return tuple(out)


def parse_ssh_connection(text: str | None) -> str | None:
    """$SSH_CONNECTION ("client port server port"): the server address, i.e. the rank's own."""
    parts = text.split() if isinstance(text, str) else []
    return parts[2] if len(parts) == 4 else None


def parse_default_route(text: str | None) -> str | None:
    """/proc/net/route: the interface of the IPv4 default route (lowest metric), else None."""
    best = None
    for line in text.splitlines()[1:] if isinstance(text, str) else ():
        cols = line.split()
        if len(cols) < 8 or cols[1] != "00000000" or cols[7] != "00000000":
            continue
        try:
            up, metric = int(cols[3], 16) & 1, int(cols[6])
        except ValueError:
            continue
        if up and (best is None or metric < best[0]):
            best = (metric, cols[0])
    return best[1] if best else None


def _le_ipv4(hexa: str) -> str:
    """/proc/net/route's addresses: 8 hex digits, the bytes in the host's (little-endian) order."""
    return str(IPv4Address(int.from_bytes(bytes.fromhex(hexa), "little")))


def parse_routes(text: str | None) -> tuple[Route, ...]:
    """/proc/net/route: every IPv4 route that is up (flag RTF_UP); unreadable lines are skipped."""
    routes = []
    for line in text.splitlines()[1:] if isinstance(text, str) else ():
        cols = line.split()
        try:
            if len(cols) < 8 or not int(cols[3], 16) & 1:
                continue
            dest = str(IPv4Network(f"{_le_ipv4(cols[1])}/{_le_ipv4(cols[7])}", strict=False))
            gateway = _le_ipv4(cols[2]) if int(cols[2], 16) else None
            routes.append(Route(cols[0], dest, gateway, int(cols[6])))
        except ValueError:
            continue
    return tuple(routes)


def route_to(routes: tuple[Route, ...], address: str) -> Route | None:
    """The route the kernel takes to `address`: the longest prefix, then the lowest metric."""
    try:
        ip = IPv4Address(address)
    except ValueError:
        return None
    nets = [(IPv4Network(r.dest), r) for r in routes]
    matching = [(net, r) for net, r in nets if ip in net]
    return min(matching, key=lambda m: (-m[0].prefixlen, m[1].metric))[1] if matching else None


INTERFACES = Part("interfaces", "interfaces", parse_interfaces,
                  (command("ip_addr"), key("sysfs_net", {}), key("ip_addr_file")), problem=True, default=())
SSH_ADDRESS = Part("ssh_address", "ssh_connection", parse_ssh_connection, (key("ssh_connection"),))
DEFAULT_ROUTE_IF = Part("default_route_if", "route", parse_default_route, (key("route"),))
ROUTES = Part("routes", "route", parse_routes, (key("route"),))
