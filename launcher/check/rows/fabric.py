"""The fabric rows: the ports and links (link), RDMA and RoCE v2 (roce) from the fabric
assessment (launcher/facts/fabric.py), the ConnectX-7 firmware and the MTU, the same on every rank.
"""

from __future__ import annotations

from collections import Counter

from ...facts import fabric
from ...facts.record import Facts
from ...status import Status
from . import row
from .case import Case, RankReport
from .drift import drift_row


_LINK_FINDINGS = ("fabric ip", "link", "speed", "sockets")
_ROCE_FINDINGS = ("rdma", "roce gid", "twin", "gid index", "ring ports")


def _from_findings(rr: RankReport, name: str, findings, names: tuple[str, ...]) -> None:
    mine = [x for x in findings if x.name in names]
    if not mine:
        rr.add(name, Status.FAIL, "not assessed (no fabric port found)", "see the link row")
        return
    worst = next((x for s in (Status.FAIL, Status.WARN) for x in mine if x.status == s), None)
    shown = "; ".join(x.value for x in mine if x.status != Status.PASS) if worst else \
        "; ".join(x.value for x in mine)
    rr.add(name, worst.status if worst else Status.PASS, shown, worst.fix if worst else "")


@row("link", order=150, reads=("interfaces", "rdma"))
def _check_link(inp: Case, r: int, f: Facts, rr: RankReport) -> None:
    _from_findings(rr, "link", inp.fabric(r).findings, _LINK_FINDINGS)


@row("roce", order=160, reads=("interfaces", "rdma"))
def _check_roce(inp: Case, r: int, f: Facts, rr: RankReport) -> None:
    _from_findings(rr, "roce", inp.fabric(r).findings, _ROCE_FINDINGS)


@row("cx7 firmware", order=170, reads=("fw_versions", "rdma"))
def _check_cx7_firmware(inp: Case, r: int, f: Facts, rr: RankReport) -> None:
    """The ConnectX-7 firmware (/sys/class/infiniband/<hca>/fw_ver): the same on every rank."""
    name = "cx7 firmware"
    if not f.fw_versions:
        why = "no RDMA devices" if not f.rdma else "no fw_ver under /sys/class/infiniband"
        rr.add(name, Status.WARN, f"not measured: {why}", "see the roce row")
        return
    values = {p: " / ".join(x.fw_versions) for p, x in inp.facts.items() if x.fw_versions}
    drift_row(rr, name, values, r, f"fw {values[r]}",
               "flash the same ConnectX-7 firmware on every rank (`sudo mlxfwmanager --online -u`, or "
               "the DGX OS update that carries it), then reboot it")


@row("mtu", order=180, reads=("interfaces", "rdma"))
def _check_mtu(inp: Case, r: int, f: Facts, rr: RankReport) -> None:
    mtus = {p: _fabric_mtu(x, inp.fabric(p)) for p, x in inp.facts.items()}
    mine = mtus[r]
    if mine is None:
        rr.add("mtu", Status.FAIL, "no fabric port to read", "see the link row")
        return
    common = Counter(m for m in mtus.values() if m is not None).most_common(1)[0][0]
    if len({m for m in mtus.values() if m is not None}) > 1 and mine != common:
        rr.add("mtu", Status.FAIL, f"MTU {mine}, other ranks {common}",
               f"set the same mtu ({fabric.JUMBO_MTU}) on every rank's fabric ports (netplan)")
    elif mine != fabric.JUMBO_MTU:
        rr.add("mtu", Status.WARN, f"MTU {mine} (same on all), expected {fabric.JUMBO_MTU}",
               f"set mtu: {fabric.JUMBO_MTU} on every rank's fabric ports (netplan)")
    else:
        rr.add("mtu", Status.PASS, f"MTU {mine}, same on all ranks")


def _fabric_mtu(f: Facts, rf: fabric.RankFabric) -> int | None:
    port = rf.primary
    iface = f.interface(port.netdev) if port else None
    return iface.mtu if iface else None
