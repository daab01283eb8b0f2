"""The sandbox ring's cables: one veth pair per ring link, made by the host between two ranks.

A link k joins rank k's QSFP port 0 to rank k+1's port 1 (see `fabric`). Each end is created
directly in its rank's network namespace, named as the fixtures name that port's netdev
(``enp1s0f0np0`` / ``enp1s0f1np1``), MTU 9000, holding the link's /30 address. So `check`'s peer
pings and its don't-fragment ping at 9000 run over real interfaces with the fabric's addresses,
and a cut cable is one `ip link del` away. The RDMA half (HCAs, GID tables) stays a fixture: no
RoCE exists here.

Cabled as a switch (`sandbox up --topology switch`), each rank's fabric port gets a veth pair
to a bridge (MTU 9000) in a network namespace of its own, ``sparkstack-switch``: the switch is
its own box, so the host's firewall and bridge-netfilter settings never see the fabric's frames,
and the host holds no fabric address.

Each end carries the MAC its rank's sysfs fixture names, and IPv6 on (link-local addresses, as
a Spark's ports have): `sparkstack init` finds the cabling from the neighbours those addresses
answer. In the bare sandbox (`bare()`) the ends get no IPv4 address and the MTU a fresh port has
(1500): `init` gives them theirs (its netplan file, MTU 9000 by default).

A pair lives as long as both namespaces: when a rank container is recreated its end vanishes and
the kernel removes the other end with it, so `wire` finds the cable missing and lays it again.
Needs root on the host (it is the host's `ip` and `nsenter`); `up` says so when it cannot.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass

from . import fabric_fixture as fabric
from .errors import SandboxError

FABRIC_NET = f"{fabric.FABRIC_NET}/24"  # every link's /30 lies in it


@dataclass(frozen=True)
class End:
    rank: int
    netdev: str
    ip: str  # with the /30


@dataclass(frozen=True)
class Cable:
    link: int
    a: End  # rank `link`, port 0
    b: End  # rank `link + 1`, port 1


def _netdev(port: int) -> str:
    return next(nd for _h, nd, p, dom in fabric.HCAS if p == port and dom == "0000")


SWITCH_BRIDGE = "fabric0"


def bare() -> bool:
    """The bare sandbox (`sandbox up --bare`, $SPARKSTACK_SANDBOX_BARE=1): its own containers,
    network, state dir and switch; cables without IPv4 addresses, for `sparkstack init`."""
    import os

    return os.environ.get("SPARKSTACK_SANDBOX_BARE") == "1"


def switch_ns() -> str:
    return "sparkstack-switch-bare" if bare() else "sparkstack-switch"


def cables(n: int) -> list[Cable]:
    """The ring's links, pure: every rank's port 0 to the next rank's port 1."""
    out = []
    for k in range(n):
        nxt = (k + 1) % n
        out.append(Cable(k, End(k, _netdev(0), fabric.port_ip(k, 0, n) + "/30"),
                         End(nxt, _netdev(1), fabric.port_ip(nxt, 1, n) + "/30")))
    return out


def _ip(pid: int, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["nsenter", "-t", str(pid), "-n", "ip", *args], capture_output=True,
                          text=True, check=check, timeout=10)


def switch_ends(n: int) -> list[End]:
    """Each rank's switch-facing port, with its /24 address, pure."""
    out = []
    for k in range(n):
        port = fabric.cabled_ports(k, "switch")[0]
        ip = fabric.port_ip(k, port, n, "switch")
        out.append(End(k, _netdev(port), f"{ip}/{fabric.SWITCH_PREFIX}"))
    return out


BARE_MTU = 1500  # a port nobody has configured yet


def _end_mtu() -> int:
    return BARE_MTU if bare() else fabric.MTU


def _has(pid: int, end: End) -> bool:
    """The end exists, is up, and holds its address."""
    done = _ip(pid, "-j", "addr", "show", "dev", end.netdev, check=False)
    if done.returncode != 0:
        return False
    try:
        info = json.loads(done.stdout)[0]
    except (ValueError, IndexError):
        return False
    addrs = {f"{a['local']}/{a['prefixlen']}" for a in info.get("addr_info", []) if a.get("family") == "inet"}
    addressed = bare() or end.ip in addrs  # the bare sandbox's ends start without one
    return addressed and "UP" in info.get("flags", []) and (bare() or info.get("mtu") == fabric.MTU)


def _lay(cable: Cable, pids: dict[int, int]) -> None:
    pa, pb = pids[cable.a.rank], pids[cable.b.rank]
    for pid, end in ((pa, cable.a), (pb, cable.b)):
        _ip(pid, "link", "del", end.netdev, check=False)  # a leftover half
    # both ends born in their namespaces: no name ever exists on the host
    subprocess.run(["ip", "link", "add", "name", cable.a.netdev, "netns", str(pa), "mtu", str(_end_mtu()),
                    "address", _mac(cable.a), "type", "veth", "peer", "name", cable.b.netdev,
                    "netns", str(pb), "mtu", str(_end_mtu()), "address", _mac(cable.b)],
                   capture_output=True, text=True, check=True, timeout=10)
    for pid, end in ((pa, cable.a), (pb, cable.b)):
        _bring_up(pid, end)


def _mac(end: End) -> str:
    """The MAC the rank's sysfs fixture gives this netdev: neighbour tables name what facts name."""
    return fabric.mac(end.rank, [nd for _h, nd, _p, _d in fabric.HCAS].index(end.netdev))


def _bring_up(pid: int, end: End) -> None:
    """Link-local IPv6 on (a container starts with it off; a Spark's ports have it), the
    address unless bare, up."""
    subprocess.run(["nsenter", "-t", str(pid), "-n", "sysctl", "-qw",
                    f"net.ipv6.conf.{end.netdev}.disable_ipv6=0"], capture_output=True, timeout=10)
    if not bare():
        _ip(pid, "addr", "add", end.ip, "dev", end.netdev)
    _ip(pid, "link", "set", end.netdev, "up")


def _sw(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "-n", switch_ns(), *args], capture_output=True, text=True,
                          check=check, timeout=10)


def _ensure_switch() -> None:
    if subprocess.run(["ip", "netns", "exec", switch_ns(), "true"], capture_output=True,
                      timeout=10).returncode != 0:
        subprocess.run(["ip", "netns", "add", switch_ns()], capture_output=True, text=True,
                       check=True, timeout=10)
    if _sw("link", "show", SWITCH_BRIDGE, check=False).returncode != 0:
        _sw("link", "add", SWITCH_BRIDGE, "mtu", str(fabric.MTU), "type", "bridge")
    _sw("link", "set", SWITCH_BRIDGE, "up")


def remove_switch() -> None:
    """The switch namespace goes, and with it every rank's switch cable."""
    subprocess.run(["ip", "netns", "del", switch_ns()], capture_output=True, timeout=10)


def _lay_switch_port(end: End, pid: int) -> None:
    port_name = f"sw{end.rank}"
    _ip(pid, "link", "del", end.netdev, check=False)
    _sw("link", "del", port_name, check=False)
    subprocess.run(["ip", "link", "add", "name", end.netdev, "netns", str(pid), "mtu", str(_end_mtu()),
                    "address", _mac(end), "type", "veth", "peer", "name", port_name, "netns", switch_ns(),
                    "mtu", str(fabric.MTU)],  # the switch takes jumbo frames; the rank's port decides
                   capture_output=True, text=True, check=True, timeout=10)
    _sw("link", "set", port_name, "master", SWITCH_BRIDGE, "up")
    _bring_up(pid, end)


def fence(pid: int) -> None:
    """The fabric's addresses never leave a rank by its management interface: without this a
    ping to a non-neighbour's fabric IP follows the default route out of this host. A real ring
    has no such route either; here it would reach addresses that are not ours."""
    _ip(pid, "route", "del", "unreachable", FABRIC_NET, check=False)  # one without a metric
    # a high metric: a switch's connected /24 (metric 0) wins over it, a ring's /30s are narrower
    _ip(pid, "route", "replace", "unreachable", FABRIC_NET, "metric", "4096")


def wire(pids: dict[int, int], n: int, topology: str = "ring") -> list[int]:
    """Lay every missing cable between the ranks' namespaces ({rank index: pid of a process in
    it}), fencing the fabric subnet first, and remove the other topology's cables. Returns the
    links (ring) or ranks (switch) laid; idempotent."""
    try:
        for pid in pids.values():
            fence(pid)
        if topology == "switch":
            return _wire_switch(pids, n)
        remove_switch()
        return _wire_ring(pids, n)
    except (subprocess.CalledProcessError, FileNotFoundError, subprocess.TimeoutExpired) as e:
        why = (getattr(e, "stderr", None) or str(e)).strip()
        raise SandboxError(f"cannot lay the sandbox's fabric cables ({topology}): {why}",
                           "run `sparkstack sandbox up` as root (it creates veth pairs with "
                           "`ip` and `nsenter`)") from None


def _wire_ring(pids: dict[int, int], n: int) -> list[int]:
    laid = []
    for cable in cables(n):
        if _has(pids[cable.a.rank], cable.a) and _has(pids[cable.b.rank], cable.b):
            continue
        _lay(cable, pids)
        laid.append(cable.link)
    return laid


def _wire_switch(pids: dict[int, int], n: int) -> list[int]:
    _ensure_switch()
    laid = []
    for end in switch_ends(n):
        pid = pids[end.rank]
        for _h, netdev, _p, dom in fabric.HCAS:  # a ring's cables on the other port go
            if dom == "0000" and netdev != end.netdev:
                _ip(pid, "link", "del", netdev, check=False)
        if _has(pid, end) and _sw("link", "show", f"sw{end.rank}", check=False).returncode == 0:
            continue
        _lay_switch_port(end, pid)
        laid.append(end.rank)
    return laid


def set_mtu(pid: int, netdev: str, mtu: int) -> None:
    """One end's MTU (a test's fault: a NIC reset puts 1500 back); `wire` re-lays a fabric end
    whose MTU is not the fabric's."""
    _ip(pid, "link", "set", "dev", netdev, "mtu", str(mtu))


def cut(pid: int, netdev: str) -> None:
    """Pull one cable out (a test's fault): deleting one end removes the pair."""
    _ip(pid, "link", "del", netdev)
