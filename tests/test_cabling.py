"""Cabling discovery from facts + neighbour tables (launcher/facts/cabling.py), pure: the
sandbox fixtures' facts, and the neighbour tables a cabled ring or switch would fill."""

from __future__ import annotations

import dataclasses

import pytest

from launcher.facts import cabling
from launcher.sandbox import fabric_fixture as fx
from local_probe import sandbox_rank_facts

PORT_NETDEVS = {0: ("enp1s0f0np0", "enP2p1s0f0np0"), 1: ("enp1s0f1np1", "enP2p1s0f1np1")}


def _macs(rank: int, port: int) -> list[str]:
    return [fx.mac(rank, i) for i, (_h, _nd, p, _d) in enumerate(fx.HCAS) if p == port]


@pytest.fixture(scope="module")
def facts(tmp_path_factory):
    root = tmp_path_factory.mktemp("facts")
    return {r: sandbox_rank_facts(root, r) for r in range(4)}


def _bare(f):
    """The facts of a rank whose fabric ports hold no address yet."""
    return dataclasses.replace(f, interfaces=tuple(dataclasses.replace(i, ipv4=()) for i in f.interfaces))


def ring_tables(n=4, cut: set[int] = frozenset()) -> dict:
    """Rank k's port 0 faces rank k+1's port 1 (link k); both twins of a port see both of the peer's."""
    t = {r: {nd: [] for p in (0, 1) for nd in PORT_NETDEVS[p]} for r in range(n)}
    for k in range(n):
        if k in cut:
            continue
        nxt = (k + 1) % n
        for nd in PORT_NETDEVS[0]:
            t[k][nd] = _macs(nxt, 1)
        for nd in PORT_NETDEVS[1]:
            t[nxt][nd] = _macs(k, 0)
    return t


def test_a_ring_is_found_with_each_cable_and_its_ports(facts):
    found = cabling.discover(facts, ring_tables())
    assert found.topology == "ring" and found.problems == []
    assert [(c.a, c.b, c.both_ways) for c in found.cables] == [
        (cabling.PortRef(0, "enp1s0f0np0"), cabling.PortRef(1, "enp1s0f1np1"), True),
        (cabling.PortRef(1, "enp1s0f0np0"), cabling.PortRef(2, "enp1s0f1np1"), True),
        (cabling.PortRef(2, "enp1s0f0np0"), cabling.PortRef(3, "enp1s0f1np1"), True),
        (cabling.PortRef(0, "enp1s0f1np1"), cabling.PortRef(3, "enp1s0f0np0"), True)]


def test_a_bare_ring_gets_a_30_per_cable_as_the_sandbox_lays_them(facts):
    bare = {r: _bare(f) for r, f in facts.items()}
    addrs = cabling.propose(cabling.discover(bare, ring_tables()), bare)
    got = {(a.rank, a.netdev): a.cidr for a in addrs}
    want = {(r, fx.HCAS[2 * p][1]): f"{fx.port_ip(r, p)}/30" for r in range(4) for p in (0, 1)}
    assert got == want and not any(a.existing for a in addrs)
    assert cabling.fabric_ips(addrs, 2) == ["192.168.177.9", "192.168.177.6"]
    assert cabling.netplan(addrs, 0) == (
        "# Written by `sparkstack init`: this rank's ConnectX-7 fabric ports.\n"
        "network:\n  version: 2\n  ethernets:\n"
        "    enp1s0f0np0:\n      mtu: 9000\n      addresses: [192.168.177.1/30]\n      optional: true\n"
        "    enp1s0f1np1:\n      mtu: 9000\n      addresses: [192.168.177.14/30]\n      optional: true\n")


def test_addresses_already_on_the_ports_are_kept(facts):
    one = dict(facts)
    one[1] = _bare(facts[1])  # rank 1 unaddressed, its neighbours addressed
    addrs = cabling.propose(cabling.discover(one, ring_tables()), one)
    got = {(a.rank, a.netdev): (a.cidr, a.existing) for a in addrs}
    assert got[(0, "enp1s0f0np0")] == ("192.168.177.1/30", True)
    assert got[(1, "enp1s0f1np1")] == ("192.168.177.2/30", False)  # the other host of rank 0's /30
    assert got[(1, "enp1s0f0np0")] == ("192.168.177.5/30", False)  # rank 2 holds .6


def test_a_missing_cable_is_named_with_both_ranks_and_their_free_ports(facts):
    found = cabling.discover(facts, ring_tables(cut={3}), {0: "spark1", 3: "spark4"})
    assert found.topology == "ring" and len(found.cables) == 3
    assert found.problems == [
        "no cable between rank 3 (spark4) and rank 0 (spark1): neither faces the other (ports with no "
        "neighbour: rank 3 (spark4) enp1s0f0np0, rank 0 (spark1) enp1s0f1np1); plug that cable in, "
        "or list the ranks in their cabling order"]


def test_ranks_listed_out_of_ring_order_are_told_to_reorder(facts):
    order = [0, 2, 1, 3]  # listed: spark1, spark3, spark2, spark4
    listed = {i: facts[r] for i, r in enumerate(order)}
    t = ring_tables()
    found = cabling.discover(listed, {i: t[r] for i, r in enumerate(order)})
    assert any("not to its neighbour in the listed order" in p for p in found.problems)


def test_a_switch_is_found_from_ports_that_see_every_rank(facts):
    fabric_port = {r: fx.FABRIC_PORT.get(r, 0) for r in range(4)}
    t = {r: {nd: [] for p in (0, 1) for nd in PORT_NETDEVS[p]} for r in range(4)}
    for r in range(4):
        for nd in PORT_NETDEVS[fabric_port[r]]:
            t[r][nd] = [m for o in range(4) if o != r for m in _macs(o, fabric_port[o])]
    t[2][PORT_NETDEVS[1][0]] = None  # a netdev that could not be read is no neighbour
    found = cabling.discover(facts, t)
    assert found.topology == "switch" and found.problems == []
    assert found.switch_ports == {0: "enp1s0f0np0", 1: "enp1s0f0np0", 2: "enp1s0f1np1", 3: "enp1s0f0np0"}


def test_a_31_per_cable_uses_both_addresses_of_each_subnet(facts):
    bare = {r: _bare(f) for r, f in facts.items()}
    addrs = cabling.propose(cabling.discover(bare, ring_tables()), bare, prefix=31)
    got = {(a.rank, a.netdev): a.cidr for a in addrs}
    assert got[(0, "enp1s0f0np0")] == "192.168.177.0/31" and got[(1, "enp1s0f1np1")] == "192.168.177.1/31"
    assert got[(3, "enp1s0f0np0")] == "192.168.177.6/31" and got[(0, "enp1s0f1np1")] == "192.168.177.7/31"
    with pytest.raises(ValueError):
        cabling.propose(cabling.discover(bare, ring_tables()), bare, prefix=29)


def test_both_twins_get_a_subnet_of_their_own_and_the_proposal_says_the_trade_off(facts):
    bare = {r: _bare(f) for r, f in facts.items()}
    addrs = cabling.propose(cabling.discover(bare, ring_tables()), bare, twins="both")
    mine = [(a.netdev, a.cidr) for a in addrs if a.rank == 0]
    assert mine == [("enp1s0f0np0", "192.168.177.1/30"), ("enp1s0f1np1", "192.168.177.14/30"),
                    ("enP2p1s0f0np0", "192.168.178.1/30"), ("enP2p1s0f1np1", "192.168.178.14/30")]
    assert cabling.fabric_ips(addrs, 0)[:2] == ["192.168.177.1", "192.168.177.14"]
    assert "    enP2p1s0f0np0:\n      mtu: 9000\n      addresses: [192.168.178.1/30]\n" in cabling.netplan(addrs, 0)
    both = " ".join(cabling.summary("ring", twins="both"))
    first = " ".join(cabling.summary("ring"))
    assert "full 200G" in both and "one PCIe x4 link (~100G)" in first and "--twins both" in first
    assert "/30" in first and "--prefix 31" in first


def test_a_two_rank_ring_with_two_cables_uses_both(facts):
    two = {r: _bare(facts[r]) for r in (0, 1)}
    found = cabling.discover(two, ring_tables(n=2))
    assert found.topology == "ring" and found.problems == [] and found.notes == []
    assert [(c.a, c.b) for c in found.cables] == [
        (cabling.PortRef(0, "enp1s0f0np0"), cabling.PortRef(1, "enp1s0f1np1")),
        (cabling.PortRef(0, "enp1s0f1np1"), cabling.PortRef(1, "enp1s0f0np0"))]
    got = {(a.rank, a.netdev): a.cidr for a in cabling.propose(found, two)}
    assert got == {(0, "enp1s0f0np0"): "192.168.177.1/30", (1, "enp1s0f1np1"): "192.168.177.2/30",
                   (0, "enp1s0f1np1"): "192.168.177.5/30", (1, "enp1s0f0np0"): "192.168.177.6/30"}


def test_a_two_rank_ring_with_one_cable_seen_by_both_twins_is_enough(facts):
    two = {r: _bare(facts[r]) for r in (0, 1)}
    found = cabling.discover(two, ring_tables(n=2, cut={1}))
    assert found.topology == "ring" and found.problems == []
    assert [(c.a, c.b, c.both_ways) for c in found.cables] == [
        (cabling.PortRef(0, "enp1s0f0np0"), cabling.PortRef(1, "enp1s0f1np1"), True)]
    assert found.notes == ["rank 0 and rank 1 share one cable: enough for two ranks; a second one between "
                           "their other ports doubles the fabric's bandwidth"]
    addrs = cabling.propose(found, two, twins="both")
    assert [(a.rank, a.netdev, a.cidr) for a in addrs] == [
        (0, "enp1s0f0np0", "192.168.177.1/30"), (0, "enP2p1s0f0np0", "192.168.178.1/30"),
        (1, "enp1s0f1np1", "192.168.177.2/30"), (1, "enP2p1s0f1np1", "192.168.178.2/30")]
