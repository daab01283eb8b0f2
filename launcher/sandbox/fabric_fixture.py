"""Fabric fixtures for the sandbox ranks, in the real sysfs layout.

A DGX Spark has one ConnectX-7 with two QSFP ports; each port shows up twice ("twins", one per
PCIe x4 link, PCI domains 0000 and 0002):

    rocep1s0f0   port 1 ==> enp1s0f0np0     (QSFP port 0, domain 0000)
    roceP2p1s0f0 port 1 ==> enP2p1s0f0np0   (QSFP port 0, domain 0002)
    rocep1s0f1   port 1 ==> enp1s0f1np1     (QSFP port 1, domain 0000)
    roceP2p1s0f1 port 1 ==> enP2p1s0f1np1   (QSFP port 1, domain 0002)

plus ``enP7s7``, the 10G management port.

The sandbox cables its four ranks as a **ring** (no switch): rank k's QSFP port 1 goes to rank
k-1, its port 0 to rank k+1 (mod 4). Link k (rank k <-> rank k+1) is its own /30 subnet
``192.168.177.(4k)/30``: rank k holds ``.4k+1`` on port 0, rank k+1 holds ``.4k+2`` on port 1.

Each rank has ONE fabric IP in cluster.yaml (``fabric_ips``): the port-0 address for every rank
except rank index 2 (spark3), whose fabric IP is its port-1 address -- the probe must find the
netdev from the IP, not assume port 0.

The RoCE v2 GID index of the fabric IP differs between ranks: ranks 0 and 2 have the plain kernel
table (0/1 = fe80 link-local RoCE v1/v2, 2/3 = IPv4-mapped v1/v2), ranks 1 and 3 also carry a
global IPv6 address on the netdev, which pushes the IPv4-mapped entries to 4/5 (as happens on
real boxes after an address is added). Index 1 is always the ``fe80::`` RoCE v2 entry that fails
with ``ibv_modify_qp: 22`` when used.

Cabled to a **switch** instead (``sandbox up --topology switch``): each rank's fabric port --
the same port as in the ring, so spark3 still uses its second one -- goes to one 9000-MTU
bridge, every fabric IP in one subnet ``192.168.177.0/24`` (rank k holds ``.k+1``); the other
port has no cable and no address.

Everything here is pure: ``sysfs_tree(rank)`` returns ``{relative path: file content}`` rooted at
the sysfs root (paths start with ``class/``), ``fabric_truth(rank)`` the answers the probe must
find. ``write_tree`` puts a tree on disk.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

N_RANKS = 4
FABRIC_NET = "192.168.177.0"
MTU = 9000
SPEED = 200000  # Mb/s, as /sys/class/net/<if>/speed reports a 200G link
MGMT_IF = "enP7s7"

# (hca, netdev, qsfp port, pci domain) -- the twins of each QSFP port
HCAS = [
    ("rocep1s0f0", "enp1s0f0np0", 0, "0000"),
    ("roceP2p1s0f0", "enP2p1s0f0np0", 0, "0002"),
    ("rocep1s0f1", "enp1s0f1np1", 1, "0000"),
    ("roceP2p1s0f1", "enP2p1s0f1np1", 1, "0002"),
]
# which QSFP port carries the rank's fabric IP (rank index -> port; port 0 when not listed)
FABRIC_PORT = {0: 0, 1: 0, 2: 1, 3: 0}
# ranks whose netdevs carry an extra global IPv6 address (shifts the IPv4 GIDs by two)
EXTRA_IPV6 = {1, 3}
FW_VER = "28.45.1020"  # the ConnectX-7's firmware, /sys/class/infiniband/<hca>/fw_ver (check's drift row)
GID_TABLE_LEN = 8  # real tables are longer (e.g. 255); unused entries read all-zero


def _link_subnet(link: int) -> ipaddress.IPv4Network:
    base = int(ipaddress.IPv4Address(FABRIC_NET))
    return ipaddress.IPv4Network((base + 4 * link, 30))


TOPOLOGIES = ("ring", "switch")
SWITCH_PREFIX = 24


def cabled_ports(rank: int, topology: str = "ring") -> tuple[int, ...]:
    """The QSFP ports with a cable: both in a ring, the fabric port on a switch."""
    return (0, 1) if topology == "ring" else (FABRIC_PORT.get(rank, 0),)


def prefix_len(topology: str = "ring") -> int:
    return 30 if topology == "ring" else SWITCH_PREFIX


def port_ip(rank: int, port: int, n: int = N_RANKS, topology: str = "ring") -> str | None:
    """IPv4 address of QSFP ``port`` (0/1) of ``rank``; None for a port without a cable."""
    if topology == "switch":
        if port not in cabled_ports(rank, topology):
            return None
        return str(ipaddress.IPv4Address(FABRIC_NET) + rank + 1)
    if port == 0:  # link `rank` to the next rank, low address
        return str(_link_subnet(rank).network_address + 1)
    prev = (rank - 1) % n  # link `prev` from the previous rank, high address
    return str(_link_subnet(prev).network_address + 2)


def port_peer(rank: int, port: int, n: int = N_RANKS) -> int:
    return (rank + 1) % n if port == 0 else (rank - 1) % n


def mac(rank: int, idx: int) -> str:
    return f"4c:bb:47:{rank + 0x10:02x}:{idx // 256:02x}:{idx % 256:02x}"


def _eui64_fe80(macaddr: str) -> str:
    b = [int(x, 16) for x in macaddr.split(":")]
    b[0] ^= 0x02
    iid = b[:3] + [0xFF, 0xFE] + b[3:]
    return "fe80:0000:0000:0000:" + ":".join(f"{iid[i]:02x}{iid[i + 1]:02x}" for i in range(0, 8, 2))


def _ipv4_mapped(ip: str) -> str:
    a = ipaddress.IPv4Address(ip).packed
    return f"0000:0000:0000:0000:0000:ffff:{a[0]:02x}{a[1]:02x}:{a[2]:02x}{a[3]:02x}"


def _ula(rank: int, port: int) -> str:
    return f"fd00:0000:0177:{port:04x}:0000:0000:0000:{rank + 1:04x}"


ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


def _gid_table(rank: int, netdev: str, macaddr: str, ip: str | None, port: int,
               extra_ipv6: bool | None = None):
    """List of (gid, type, ndev) as the kernel fills a RoCE port's table; `extra_ipv6` (None: as
    EXTRA_IPV6 says) puts a global IPv6 address's entries before the IPv4-mapped ones."""
    ll = _eui64_fe80(macaddr)
    table = [(ll, "IB/RoCE v1", netdev), (ll, "RoCE v2", netdev)]
    if ip is not None:
        if rank in EXTRA_IPV6 if extra_ipv6 is None else extra_ipv6:
            ula = _ula(rank, port)
            table += [(ula, "IB/RoCE v1", netdev), (ula, "RoCE v2", netdev)]
        m = _ipv4_mapped(ip)
        table += [(m, "IB/RoCE v1", netdev), (m, "RoCE v2", netdev)]
    return table


def _netdev_files(prefix: str, macaddr: str, mtu: int, speed: int, up: bool, ifindex: int) -> dict:
    return {
        f"{prefix}/mtu": f"{mtu}\n",
        f"{prefix}/speed": f"{speed}\n",
        f"{prefix}/operstate": ("up" if up else "down") + "\n",
        f"{prefix}/carrier": ("1" if up else "0") + "\n",
        f"{prefix}/address": macaddr + "\n",
        f"{prefix}/ifindex": f"{ifindex}\n",
        f"{prefix}/type": "1\n",
    }


def sysfs_tree(rank: int, n: int = N_RANKS, unplugged: frozenset[int] = frozenset(),
               topology: str = "ring", addressed: bool = True, mtu: dict[str, int] | None = None,
               extra_ipv6: bool | None = None) -> dict[str, str]:
    """All fixture files of one rank: relative path under the sysfs root -> content. A QSFP port
    in `unplugged` has lost its cable: both its twins read down (operstate, carrier, RoCE port
    state), as the kernel shows it; addresses and GIDs stay. Not `addressed` (the bare sandbox):
    link-local GIDs only, as on a Spark before its ports get addresses. `mtu`: netdev -> its MTU
    where it is not MTU (a NIC firmware reset puts 1500 back); `extra_ipv6`: a global IPv6
    address on the addressed ports or not (None: EXTRA_IPV6 says), which moves the IPv4 GIDs."""
    if not 0 <= rank < n:
        raise ValueError(f"rank index {rank} out of range 0..{n - 1}")
    files: dict[str, str] = {}
    for idx, (hca, netdev, port, _dom) in enumerate(HCAS):
        macaddr = mac(rank, idx)
        up = port in cabled_ports(rank, topology) and port not in unplugged
        primary_twin = not hca.startswith("roceP2")
        ip = port_ip(rank, port, n, topology) if primary_twin and addressed else None
        ifindex = 3 + idx
        port_mtu = (mtu or {}).get(netdev, MTU)
        files.update(_netdev_files(f"class/net/{netdev}", macaddr, port_mtu, SPEED, up, ifindex))
        files.update(_netdev_files(f"class/infiniband/{hca}/device/net/{netdev}", macaddr, port_mtu,
                                   SPEED, up, ifindex))
        p = f"class/infiniband/{hca}/ports/1"
        files[f"{p}/state"] = ("4: ACTIVE" if up else "1: DOWN") + "\n"
        files[f"{p}/phys_state"] = ("5: LinkUp" if up else "3: Disabled") + "\n"
        files[f"{p}/link_layer"] = "Ethernet\n"
        files[f"{p}/rate"] = "200 Gb/sec (4X HDR)\n"
        table = _gid_table(rank, netdev, macaddr, ip, port, extra_ipv6)
        for i in range(GID_TABLE_LEN):
            if i < len(table):
                gid, typ, ndev = table[i]
                files[f"{p}/gids/{i}"] = gid + "\n"
                files[f"{p}/gid_attrs/types/{i}"] = typ + "\n"
                files[f"{p}/gid_attrs/ndevs/{i}"] = ndev + "\n"
            else:
                # unused entries: the gid reads as zeros; types/ndevs fail with EINVAL on a
                # real box, so they are absent here
                files[f"{p}/gids/{i}"] = ZERO_GID + "\n"
        files[f"class/infiniband/{hca}/node_type"] = "1: CA\n"
        files[f"class/infiniband/{hca}/fw_ver"] = FW_VER + "\n"
        files[f"class/infiniband/{hca}/hca_type"] = "MT4129\n"
    files.update(_netdev_files(f"class/net/{MGMT_IF}", mac(rank, 99), 1500, 10000, True, 2))
    return files


def fabric_truth(rank: int, n: int = N_RANKS, topology: str = "ring") -> dict:
    """What a correct probe must conclude for this rank."""
    port = FABRIC_PORT.get(rank, 0)
    twins = [h for h, _nd, p, _d in HCAS if p == port]
    netdev = next(nd for h, nd, p, d in HCAS if p == port and d == "0000")
    hca = twins[0]
    ip = port_ip(rank, port, n, topology)
    table = _gid_table(rank, netdev, mac(rank, [h for h, *_ in HCAS].index(hca)), ip, port)
    gid_index = next(i for i, (g, t, _nd) in enumerate(table)
                     if t == "RoCE v2" and g == _ipv4_mapped(ip))
    ports = []
    for pp in cabled_ports(rank, topology):
        ports.append({
            "port": pp,
            "ip": port_ip(rank, pp, n, topology),
            "netdev": next(nd for h, nd, p, d in HCAS if p == pp and d == "0000"),
            "hcas": [h for h, _nd, p, _d in HCAS if p == pp],
            "peer_rank": port_peer(rank, pp, n) if topology == "ring" else None,
            "subnet": str(_link_subnet(rank if pp == 0 else (rank - 1) % n)) if topology == "ring"
            else f"{FABRIC_NET}/{SWITCH_PREFIX}",
        })
    return {
        "topology": topology,
        "rank": rank,
        "name": f"spark{rank + 1}",
        "fabric_ip": ip,
        "fabric_port": port,
        "netdev": netdev,
        "hca": hca,
        "hca_twins": twins,
        # what NCCL_IB_HCA lists: the addressed HCA of each cabled port (the twins hold no
        # address, so NCCL would run them on a link-local RoCE v1 entry)
        "hcas_in_use": [h for h, _nd, p, d in HCAS if p in cabled_ports(rank, topology) and d == "0000"],
        "gid_index": gid_index,
        "gid": _ipv4_mapped(ip),
        "link_local_gid_index": 1,
        "mtu": MTU,
        "speed": SPEED,
        "mgmt_if": MGMT_IF,
        "ports": ports,
    }


def ip_addr_json(rank: int, n: int = N_RANKS, topology: str = "ring") -> list[dict]:
    """What ``ip -j -4 addr show`` would print for the fabric netdevs (sysfs holds no IPs)."""
    out = []
    for idx, (hca, netdev, port, dom) in enumerate(HCAS):
        cabled = port in cabled_ports(rank, topology)
        entry = {"ifindex": 3 + idx, "ifname": netdev, "mtu": MTU,
                 "operstate": "UP" if cabled else "DOWN", "address": mac(rank, idx), "addr_info": []}
        ip = port_ip(rank, port, n, topology)
        if dom == "0000" and ip:
            entry["addr_info"].append({"family": "inet", "local": ip,
                                       "prefixlen": prefix_len(topology), "scope": "global"})
        out.append(entry)
    return out


def counter_links(state_dir: str, n_hcas: int = len(HCAS)) -> dict[str, str]:
    """Each HCA's port counters as links into the rank's RoCE counter stand-in
    (roce_standin.py), which keeps them moving with the veth's traffic: relative path -> target."""
    return {f"class/infiniband/{hca}/ports/1/{folder}": f"{state_dir}/{hca}/{folder}"
            for hca, *_ in HCAS[:n_hcas] for folder in ("counters", "hw_counters")}


def write_tree(root: str | os.PathLike, files: dict[str, str], links: dict[str, str] | None = None) -> None:
    """Write a fixture tree (and `links`: relative path -> symlink target, which may exist only
    inside the rank); removes files under ``root`` that the tree does not name."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    wanted = {root / rel for rel in files}
    for path in sorted(root.rglob("*"), reverse=True):
        if path.is_file() and not path.is_symlink() and path not in wanted:
            path.unlink()
    for rel, target in (links or {}).items():
        path = root / rel
        if path.is_symlink() and os.readlink(path) == target:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            path.unlink()
        path.symlink_to(target)
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != content:
            path.write_text(content)
