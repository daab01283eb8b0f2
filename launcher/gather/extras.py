"""The extra measurements `check` takes right after each rank's probe, by one more command per
rank (launcher/onrank/pinger.py): the fabric pings (whom a rank pings comes from its own facts,
so its pings start as soon as its probe is back) and dockerd's capabilities (CAP_SYS_RESOURCE:
may it raise a container's limits above its own).

A ring's links are pinged from both ends: the far ends of each rank's cables (every other address
of a /30 or /31, the configured fabric IPs on its ports' subnets); on a switch every other rank's
configured fabric IP. The ranks beyond the neighbours of a ring are not pinged.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from ipaddress import IPv4Address, ip_interface

from .. import onrank
from ..facts import fabric
from ..facts.record import Facts
from ..inputs import answers
from ..inputs.config import Loaded

PING_WAIT_S = 1
CAP_SYS_RESOURCE = 24  # lets dockerd raise a container's limits above its own

@dataclass(frozen=True)
class PingTarget:
    peer: int
    ip: str
    kind: str  # "link": the other end of one of this rank's cables; "fabric": a peer's fabric IP
    df_size: int | None = None  # payload of the don't-fragment ping (MTU - 28), None: none


@dataclass(frozen=True)
class PingAnswer:
    ok: bool
    detail: str  # ping's last line, e.g. "1 packets transmitted, 0 received, 100% packet loss"


@dataclass(frozen=True)
class Extras:
    """What the second command per rank measured: ping answers and dockerd's capabilities."""

    pings: dict[tuple[str, bool], PingAnswer]  # (ip, df) -> answer
    ping_missing: bool = False
    dockerd_can_raise: bool | None = None  # CAP_SYS_RESOURCE; None: not known
    error: str | None = None


def rank_ping_targets(loaded: Loaded, r: int, f: Facts) -> list[PingTarget]:
    """Whom rank `r` pings, from its own facts alone (so its pings start as soon as its probe is
    back). The far ends of its cables (kind "link"): every other address of a point-to-point
    link (/30, /31) of its fabric ports, and, in a ring, the other ranks' configured fabric IPs
    on those ports' subnets -- every addressed port, up or not, so a dead cable still names its
    far end. On a switch also every other rank's configured fabric IP (kind "fabric"). The DF
    ping goes at the port's MTU when that is 9000. A far end's rank is -1 until
    `resolve_peers` finds whose address it is."""
    cluster = loaded.cluster
    ring = cluster.topology == "ring"
    rf = fabric.for_rank(f, cluster, r)
    configured = {str(ip): p for p, rank in enumerate(cluster.ranks) if p != r for ip in rank.fabric_ips}
    netdevs = [n for d in f.rdma or () for n in d.netdevs] if ring else [p.netdev for p in rf.ports]
    found: dict[str, PingTarget] = {}
    for netdev in netdevs:
        df = _df_size(f.interface(netdev))
        for mine in _ipv4(f, netdev):
            for host in _far_ends(mine, configured if ring else {}):
                found[host] = PingTarget(configured.get(host, -1), host, "link", df)
    if not ring:
        df = _df_size(f.interface(rf.primary.netdev)) if rf.primary else None
        for ip, p in configured.items():
            found.setdefault(ip, PingTarget(p, ip, "fabric", df))
    return sorted(found.values(), key=lambda t: IPv4Address(t.ip))


def _far_ends(mine, configured: dict[str, int]) -> list[str]:
    """The other addresses of `mine`'s link: all of a /30 or /31, the configured ones on a wider one."""
    net = mine.network
    hosts = net.hosts() if net.prefixlen == 30 else net if net.prefixlen == 31 else ()
    found = [str(h) for h in hosts if h != mine.ip]
    return found + [ip for ip in configured if IPv4Address(ip) in net and ip != str(mine.ip) and ip not in found]


def _df_size(iface) -> int | None:
    return fabric.JUMBO_MTU - 28 if iface and iface.mtu == fabric.JUMBO_MTU else None


def resolve_peers(targets: list[PingTarget], facts: dict[int, Facts]) -> list[PingTarget]:
    """The same targets, in the same order, with each far end's rank filled in from the facts."""
    owner = {str(ip_interface(a).ip): p for p, f in facts.items() for i in f.interfaces for a in i.ipv4}
    return [t if t.peer >= 0 else dataclasses.replace(t, peer=owner.get(t.ip, -1)) for t in targets]


def ping_targets(loaded: Loaded, facts: dict[int, Facts]) -> dict[int, list[PingTarget]]:
    return {r: resolve_peers(rank_ping_targets(loaded, r, f), facts) for r, f in facts.items()}


def _ipv4(f: Facts, netdev: str) -> list:
    iface = f.interface(netdev)
    return [ip_interface(a) for a in iface.ipv4] if iface else []


PINGER_SOURCE = onrank.path("pinger")


# -- whom a rank pinged last time ---------------------------------------------------------------
# A rank's targets come from its own facts, so its pings could start only once its probe was back
# (~0.2 s more of every `check`). The targets it had last time are kept on this host: the pings
# to them start beside the probe, and are kept only when the probe's facts give the very same
# targets (else they are pinged again, as before).

def _targets_key(loaded: Loaded, r: int) -> str:
    rank = loaded.cluster.ranks[r]
    return answers.key("ping-targets", str(loaded.path), r, rank.address, rank.port)


def remembered_targets(loaded: Loaded, r: int) -> list[PingTarget] | None:
    kept = answers.known(_targets_key(loaded, r))
    try:
        return [PingTarget(int(p), str(ip), str(kind), None if df is None else int(df))
                for p, ip, kind, df in kept["targets"]]
    except (KeyError, TypeError, ValueError):
        return None


def remember_targets(loaded: Loaded, r: int, targets: list[PingTarget]) -> None:
    if remembered_targets(loaded, r) != targets:
        answers.keep(_targets_key(loaded, r), {"targets": [dataclasses.astuple(t) for t in targets]})


def extras_invocation(targets: list[PingTarget]) -> tuple[str, bytes]:
    """The second command per rank (launcher/onrank/pinger.py on stdin): every ping in parallel (each at
    most PING_WAIT_S), then dockerd's CapEff. Ping i's plain key is 2i, its DF key 2i + 1."""
    jobs = []
    for i, t in enumerate(targets):
        jobs.append([2 * i, t.ip, None])
        if t.df_size is not None:
            jobs.append([2 * i + 1, t.ip, t.df_size])
    args = {"targets": jobs, "wait_s": PING_WAIT_S}
    return onrank.invocation("pinger", args)


def parse_extras(stdout: str, targets: list[PingTarget]) -> Extras:
    pings: dict[tuple[str, bool], PingAnswer] = {}
    can_raise = None
    missing = False
    for line in stdout.splitlines():
        if line.strip() == "NOPING":
            missing = True
        elif line.startswith("CAPEFF "):
            try:
                can_raise = bool(int(line.split()[1], 16) >> CAP_SYS_RESOURCE & 1)
            except (IndexError, ValueError):
                pass
        elif m := re.match(r"^(\d+) (\d+) ?(.*)$", line):
            key = int(m[1])
            if key // 2 < len(targets):
                pings[(targets[key // 2].ip, bool(key % 2))] = PingAnswer(m[2] == "0", m[3].strip())
    return Extras(pings, missing, can_raise)
