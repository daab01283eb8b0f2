"""The sandbox ring's cables: one veth pair per ring link, made by the host between two ranks.

A link k joins rank k's QSFP port 0 to rank k+1's port 1 (see `fabric`). Each end is created
directly in its rank's network namespace, named as the fixtures name that port's netdev
(``enp1s0f0np0`` / ``enp1s0f1np1``), MTU 9000, holding the link's /30 address. So `check`'s peer
pings and its don't-fragment ping at 9000 run over real interfaces with the fabric's addresses,
and a cut cable is one `ip link del` away. The RDMA half (HCAs, GID tables) stays a fixture: no
RoCE exists here.

A pair lives as long as both namespaces: when a rank container is recreated its end vanishes and
the kernel removes the other end with it, so `wire` finds the cable missing and lays it again.
Needs root on the host (it is the host's `ip` and `nsenter`); `up` says so when it cannot.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass

from . import fabric
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
    return end.ip in addrs and "UP" in info.get("flags", []) and info.get("mtu") == fabric.MTU


def _lay(cable: Cable, pids: dict[int, int]) -> None:
    pa, pb = pids[cable.a.rank], pids[cable.b.rank]
    for pid, end in ((pa, cable.a), (pb, cable.b)):
        _ip(pid, "link", "del", end.netdev, check=False)  # a leftover half
    # both ends born in their namespaces: no name ever exists on the host
    subprocess.run(["ip", "link", "add", "name", cable.a.netdev, "netns", str(pa), "mtu", str(fabric.MTU),
                    "type", "veth", "peer", "name", cable.b.netdev, "netns", str(pb), "mtu", str(fabric.MTU)],
                   capture_output=True, text=True, check=True, timeout=10)
    for pid, end in ((pa, cable.a), (pb, cable.b)):
        _ip(pid, "addr", "add", end.ip, "dev", end.netdev)
        _ip(pid, "link", "set", end.netdev, "up")


def fence(pid: int) -> None:
    """The fabric's addresses never leave a rank by its management interface: without this a
    ping to a non-neighbour's fabric IP follows the default route out of this host. A real ring
    has no such route either; here it would reach addresses that are not ours."""
    _ip(pid, "route", "replace", "unreachable", FABRIC_NET)


def wire(pids: dict[int, int], n: int) -> list[int]:
    """Lay every missing cable of the ring between the ranks' namespaces ({rank index: pid of a
    process in it}), fencing the fabric subnet first. Returns the links laid; idempotent."""
    laid = []
    for pid in pids.values():
        try:
            fence(pid)
        except (subprocess.CalledProcessError, FileNotFoundError, subprocess.TimeoutExpired) as e:
            raise SandboxError(f"cannot fence the fabric subnet in a rank: {getattr(e, 'stderr', None) or e}",
                               "run `sparkstack sandbox up` as root") from None
    for cable in cables(n):
        if _has(pids[cable.a.rank], cable.a) and _has(pids[cable.b.rank], cable.b):
            continue
        try:
            _lay(cable, pids)
        except (subprocess.CalledProcessError, FileNotFoundError, subprocess.TimeoutExpired) as e:
            why = (getattr(e, "stderr", None) or str(e)).strip()
            raise SandboxError(f"cannot lay the fabric cable of ring link {cable.link} "
                               f"(rank {cable.a.rank} {cable.a.netdev} <-> rank {cable.b.rank} "
                               f"{cable.b.netdev}): {why}",
                               "run `sparkstack sandbox up` as root (it creates veth pairs with "
                               "`ip` and `nsenter`)") from None
        laid.append(cable.link)
    return laid


def cut(pid: int, netdev: str) -> None:
    """Pull one cable out (a test's fault): deleting one end removes the pair."""
    _ip(pid, "link", "del", netdev)
