"""RDMA: /sys/class/infiniband, per HCA its netdevs, firmware and, per port, state, link layer
and GID table (fabric.py derives each rank's RoCE v2 GID from it)."""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address

from .parts import FactError, Part, key, stripped


@dataclass(frozen=True)
class Gid:
    index: int
    gid: str  # as sysfs prints it: eight groups of four hex digits
    type: str | None  # "IB/RoCE v1" or "RoCE v2"
    ndev: str | None

    @property
    def address(self) -> IPv6Address:
        return IPv6Address(self.gid)

    @property
    def ipv4(self) -> IPv4Address | None:
        """The IPv4 address of an IPv4-mapped GID (::ffff:a.b.c.d), else None."""
        return self.address.ipv4_mapped

    @property
    def link_local(self) -> bool:
        return self.address.is_link_local


@dataclass(frozen=True)
class RdmaPort:
    number: int
    state: str | None  # "ACTIVE", "DOWN", ... (the word after "4: ")
    link_layer: str | None  # "Ethernet" for RoCE, "InfiniBand"
    gids: tuple[Gid, ...]  # used entries only; an all-zero GID is an unused slot


@dataclass(frozen=True)
class RdmaDevice:
    name: str
    netdevs: tuple[str, ...]
    ports: tuple[RdmaPort, ...]
    fw_ver: str | None = None  # /sys/class/infiniband/<hca>/fw_ver, e.g. "28.45.1020" (CX7)


_ZERO_GID = IPv6Address(0)


def _state_word(raw) -> str | None:
    text = stripped(raw)
    return text.partition(":")[2].strip() if text and ":" in text else text


def parse_rdma(sysfs_infiniband: dict | None) -> tuple[RdmaDevice, ...] | None:
    """/sys/class/infiniband: per HCA its netdevs and, per port, state, link layer and the used
    GID entries (unused slots read as all zeros and are dropped)."""
    if sysfs_infiniband is None:
        return None
    devices = []
    for hca, d in sorted(sysfs_infiniband.items()):
        ports = []
        for number, p in sorted(d.get("ports", {}).items(), key=lambda kv: int(kv[0])):
            gids = []
            for index, raw in sorted(p.get("gids", {}).items(), key=lambda kv: int(kv[0])):
                text = stripped(raw)
                try:
                    if text is None or IPv6Address(text) == _ZERO_GID:
                        continue
                except ValueError:
                    raise FactError(f"{hca} port {number} GID {index}: not a GID: {text!r}") from None
                gids.append(Gid(int(index), text, stripped(p.get("gid_types", {}).get(index)),
                                stripped(p.get("gid_ndevs", {}).get(index))))
            ports.append(RdmaPort(int(number), _state_word(p.get("state")),
                                  stripped(p.get("link_layer")), tuple(gids)))
        devices.append(RdmaDevice(hca, tuple(d.get("netdevs", [])), tuple(ports), stripped(d.get("fw_ver")) or None))
    return tuple(devices)


RDMA = Part("rdma", "rdma", parse_rdma, (key("sysfs_infiniband"),), problem=True)
