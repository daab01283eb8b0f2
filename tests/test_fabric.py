"""Fabric derivation on fixture facts: fabric IP -> netdev -> HCA and twin -> RoCE v2 GID -> env."""

from __future__ import annotations

from ipaddress import IPv4Address

import pytest

from local_probe import sandbox_rank_facts
from launcher.facts import fabric
from launcher.facts.fabric import FabricError
from launcher.facts.clock import Clock
from launcher.facts.limits import DockerUlimits, Ulimits
from launcher.facts.network import Interface
from launcher.facts.rdma import Gid, RdmaDevice, RdmaPort
from launcher.facts.record import Facts
from launcher.sandbox import fabric_fixture as sandbox_fabric

HCAS = [("rocep1s0f0", "enp1s0f0np0"), ("roceP2p1s0f0", "enP2p1s0f0np0"),
        ("rocep1s0f1", "enp1s0f1np1"), ("roceP2p1s0f1", "enP2p1s0f1np1")]
V1, V2 = "IB/RoCE v1", "RoCE v2"


def mapped(ip: str) -> str:
    a, b, c, d = (int(x) for x in ip.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"


def gid_table(netdev: str, n: int, ip: str | None, extra_ipv6: bool = False) -> tuple[Gid, ...]:
    """As the kernel fills a RoCE port: fe80 link-local v1/v2 first (so index 1 is the
    link-local RoCE v2 entry), then each address's v1/v2 pair."""
    ll = f"fe80:0000:0000:0000:4ebb:47ff:fe2c:{n:04x}"
    entries = [(ll, V1), (ll, V2)]
    if ip and extra_ipv6:
        entries += [(f"fd00:0000:0177:0000:0000:0000:0000:{n:04x}", V1), (f"fd00:0000:0177:0000:0000:0000:0000:{n:04x}", V2)]
    if ip:
        entries += [(mapped(ip), V1), (mapped(ip), V2)]
    return tuple(Gid(i, g, t, netdev) for i, (g, t) in enumerate(entries))


def spark(ips: dict[str, str], *, extra_ipv6=(), speed=200000, mtu=9000, down=(),
          link_layer="Ethernet", tables: dict[str, tuple[Gid, ...]] | None = None,
          rdma: bool = True, mgmt=("enP7s7", "10.0.0.13/24"), ssh_address=None,
          default_route_if=None) -> Facts:
    """A Spark's facts: the four ConnectX HCAs (twins per QSFP port), addresses on `ips`, the
    management port `mgmt` (name, address)."""
    interfaces = [Interface(mgmt[0], "up", 10000, 1500, "4c:bb:47:2c:01:99", (mgmt[1],), ())]
    devices = []
    for n, (hca, netdev) in enumerate(HCAS):
        ip = ips.get(netdev)
        state = "down" if netdev in down else "up"
        interfaces.append(Interface(netdev, state, speed if state == "up" else None, mtu,
                                    f"4c:bb:47:2c:01:{n:02x}", (f"{ip}/30",) if ip else (), ()))
        gids = (tables or {}).get(hca) or gid_table(netdev, n, ip, netdev in extra_ipv6)
        port = RdmaPort(1, "DOWN" if netdev in down else "ACTIVE", link_layer, gids)
        devices.append(RdmaDevice(hca, (netdev,), (port,)))
    return Facts(hostname="spark", kernel="6.11.0-1016-nvidia", memory=None, sysctls={},
                 ulimits=Ulimits(None, None), docker_ulimits=DockerUlimits({}, None),
                 interfaces=tuple(sorted(interfaces, key=lambda i: i.name)),
                 rdma=tuple(sorted(devices, key=lambda d: d.name)) if rdma else None,
                 docker=None, mounts=(), model_mount=None, checkpoint=None, gpu=None, disks=(),
                 clock=Clock(0.0, 0.0), ssh_address=ssh_address, default_route_if=default_route_if)


def ip(s: str) -> list[IPv4Address]:
    return [IPv4Address(s)]


def status(rf: fabric.RankFabric, name: str) -> list[str]:
    return [f.status for f in rf.findings if f.name == name]


# --- a ring: each rank's own env -----------------------------------------------------------------

RING = {"NCCL_NET": "IB", "NCCL_ALGO": "Ring", "NCCL_IB_SUBNET_AWARE_ROUTING": "1", "NCCL_IB_MERGE_NICS": "0",
        "NCCL_NET_PLUGIN": "none"}


def test_ring_ranks_get_their_own_env():
    # spark1: fabric IP on port 0, plain table (IPv4 RoCE v2 at 3), management on enP7s7
    r0 = fabric.assess(spark({"enp1s0f0np0": "192.168.177.1", "enp1s0f1np1": "192.168.177.14"},
                             mgmt=("enP7s7", "10.0.0.11/24")),
                       ip("192.168.177.1"), "ring", "spark1", address="10.0.0.11")
    # spark3: fabric IP on the SECOND port; a global IPv6 moves its IPv4 GIDs to 4/5; its
    # management port has another name: found from its facts, not assumed
    r2 = fabric.assess(spark({"enp1s0f1np1": "192.168.177.6", "enp1s0f0np0": "192.168.177.9"},
                             extra_ipv6=("enp1s0f1np1", "enp1s0f0np0"), mgmt=("eno1", "10.0.0.13/24")),
                       ip("192.168.177.6"), "ring", "spark3", address="10.0.0.13")
    assert not r0.failures and not r2.failures
    assert (r0.primary.netdev, r0.primary.hca, r0.primary.gid_index) == ("enp1s0f0np0", "rocep1s0f0", 3)
    assert (r2.primary.netdev, r2.primary.hca, r2.primary.gid_index) == ("enp1s0f1np1", "rocep1s0f1", 5)
    # the twins carry no address: RDMA only on the addressed HCA of each port
    assert r2.primary.twins == ("rocep1s0f1",)
    assert r0.env == {
        # bootstrap, Gloo and VLLM_HOST_IP on the management network every rank reaches
        "NCCL_SOCKET_IFNAME": "=enP7s7", "GLOO_SOCKET_IFNAME": "enP7s7", "VLLM_HOST_IP": "10.0.0.11",
        # RDMA on both cable-facing ports (a ring rank has two neighbours), port order
        "NCCL_IB_HCA": "=rocep1s0f0,rocep1s0f1",
        "UCX_NET_DEVICES": "rocep1s0f0:1,rocep1s0f1:1",
        **RING,
    }
    assert (r2.env["NCCL_SOCKET_IFNAME"], r2.env["GLOO_SOCKET_IFNAME"], r2.env["VLLM_HOST_IP"]) == \
        ("=eno1", "eno1", "10.0.0.13")
    assert r2.env["NCCL_IB_HCA"] == r0.env["NCCL_IB_HCA"]
    assert "NCCL_IB_GID_INDEX" not in r0.env and "NCCL_IB_GID_INDEX" not in r2.env
    assert [p.gid_index for p in r2.ports] == [5, 5]
    [sockets] = [f for f in r2.findings if f.name == "sockets"]
    assert sockets == fabric.Finding("sockets", "pass", "sockets on eno1 (10.0.0.13): the management network "
                                     "every rank reaches")


def test_ring_with_one_addressed_port_warns():
    rf = fabric.assess(spark({"enp1s0f1np1": "192.168.177.6"}), ip("192.168.177.6"), "ring", "spark3",
                       address="10.0.0.13")
    assert status(rf, "ring ports") == ["warn"] and not rf.failures
    assert rf.env["NCCL_IB_HCA"] == "=rocep1s0f1"


def test_switch_keeps_the_fabric_for_sockets_and_no_ring_settings():
    rf = fabric.assess(spark({"enp1s0f1np1": "10.10.0.3", "enP2p1s0f1np1": "10.11.0.3"}), ip("10.10.0.3"),
                       "switch", "spark1", address="10.0.0.13")
    assert rf.env == {"NCCL_SOCKET_IFNAME": "=enp1s0f1np1", "GLOO_SOCKET_IFNAME": "enp1s0f1np1",
                      "VLLM_HOST_IP": "10.10.0.3", "NCCL_IB_HCA": "=rocep1s0f1,roceP2p1s0f1",
                      "UCX_NET_DEVICES": "rocep1s0f1:1", "NCCL_NET": "IB"}
    assert rf.management is None and status(rf, "sockets") == []


# --- the management network of a ring rank ---------------------------------------------------------

def test_ring_host_name_falls_back_to_where_ssh_arrived_with_a_warning():
    facts_ = spark({"enp1s0f1np1": "192.168.177.6"}, mgmt=("enP7s7", "10.0.0.13/24"), ssh_address="10.0.0.13")
    rf = fabric.assess(facts_, ip("192.168.177.6"), "ring", "spark3", address="spark3.lan")
    assert (rf.env["NCCL_SOCKET_IFNAME"], rf.env["VLLM_HOST_IP"]) == ("=enP7s7", "10.0.0.13")
    [warn] = [f for f in rf.findings if f.name == "sockets"]
    assert warn.status == "warn" and warn.value == ("spark3.lan is a host name: sockets on enP7s7 (10.0.0.13), "
                                                    "where the kit's SSH connection arrived")
    assert "`address`" in warn.fix and rf.management.assumed == warn.value


def test_ring_address_behind_a_nat_falls_back_to_the_default_route():
    facts_ = spark({"enp1s0f1np1": "192.168.177.6"}, mgmt=("enP7s7", "10.0.0.13/24"), default_route_if="enP7s7")
    rf = fabric.assess(facts_, ip("192.168.177.6"), "ring", "spark3", address="203.0.113.7")
    [warn] = [f for f in rf.findings if f.name == "sockets"]
    assert warn.value == ("203.0.113.7 is on no interface of spark3: sockets on enP7s7 (10.0.0.13), "
                          "the default route's interface")
    assert rf.env["GLOO_SOCKET_IFNAME"] == "enP7s7" and not rf.failures


def test_ring_without_any_management_address_fails():
    rf = fabric.assess(spark({"enp1s0f1np1": "192.168.177.6"}), ip("192.168.177.6"), "ring", "spark3",
                       address="203.0.113.7")
    [fail] = rf.failures
    assert fail.name == "sockets" and fail.value.startswith("203.0.113.7 is on no interface of spark3, and no other")
    assert "NCCL_SOCKET_IFNAME" not in rf.env
    with pytest.raises(FabricError, match="write the rank's management IPv4"):
        rf.require()


# --- twins ----------------------------------------------------------------------------------------

def test_unaddressed_twin_is_dropped_with_a_warning_that_says_how_to_address_it():
    rf = fabric.assess(spark({"enp1s0f1np1": "10.10.0.3"}), ip("10.10.0.3"), "switch", "spark1")
    assert rf.env["NCCL_IB_HCA"] == "=rocep1s0f1"
    [twin] = [f for f in rf.findings if f.name == "twin"]
    assert twin.status == "warn" and twin.value.startswith("roceP2p1s0f1 (twin of rocep1s0f1) has no IPv4 "
                                                           "address, only link-local GIDs: left out of NCCL_IB_HCA")
    assert twin.fix.startswith("address enP2p1s0f1np1 on a subnet of its own, on both ends of the cable")


def test_addressed_twins_are_both_used():
    rf = fabric.assess(spark({"enp1s0f1np1": "10.10.0.3", "enP2p1s0f1np1": "10.11.0.3"}), ip("10.10.0.3"),
                       "switch", "spark1")
    assert rf.env["NCCL_IB_HCA"] == "=rocep1s0f1,roceP2p1s0f1" and status(rf, "twin") == []


# --- GID index ----------------------------------------------------------------------------------

def test_gid_index_is_never_pinned_by_default_and_check_shows_nccls_pick():
    # both twins addressed, one of them behind an extra IPv6: NCCL picks 3 and 5
    facts_ = spark({"enp1s0f1np1": "10.10.0.3", "enP2p1s0f1np1": "10.11.0.3"}, extra_ipv6=("enP2p1s0f1np1",))
    rf = fabric.assess(facts_, ip("10.10.0.3"), "switch", "spark1")
    assert "NCCL_IB_GID_INDEX" not in rf.env
    [note] = [f for f in rf.findings if f.name == "gid index"]
    assert note == fabric.Finding("gid index", "pass", "NCCL_IB_GID_INDEX unset: NCCL picks the IPv4 RoCE v2 "
                                  "entry per HCA: rocep1s0f1 3, roceP2p1s0f1 5")


def test_pinned_gid_index_is_set_and_checked_on_every_hca():
    facts_ = spark({"enp1s0f1np1": "10.10.0.3", "enP2p1s0f1np1": "10.11.0.3"})
    rf = fabric.assess(facts_, ip("10.10.0.3"), "switch", "spark1", gid_index=3)
    assert rf.env["NCCL_IB_GID_INDEX"] == "3" and not rf.failures
    wrong = fabric.assess(facts_, ip("10.10.0.3"), "switch", "spark1", gid_index=1)
    [fail] = wrong.failures
    assert fail.name == "gid index" and fail.value == (
        "NCCL_IB_GID_INDEX=1 (pinned) is not the IPv4 RoCE v2 entry: rocep1s0f1 index 1 is "
        "fe80::4ebb:47ff:fe2c:2 RoCE v2 (link-local) (NCCL's own pick: 3); roceP2p1s0f1 index 1 is "
        "fe80::4ebb:47ff:fe2c:3 RoCE v2 (link-local) (NCCL's own pick: 3)")
    assert fail.fix.startswith("remove fabric.gid_index")


def test_link_local_roce_v2_at_index_1_is_never_chosen():
    table = gid_table("enp1s0f1np1", 2, "10.10.0.3")
    assert table[1].type == V2 and table[1].link_local
    rf = fabric.assess(spark({"enp1s0f1np1": "10.10.0.3"}), ip("10.10.0.3"), "switch", "spark1")
    assert rf.primary.gid_index == 3 and rf.primary.gid == mapped("10.10.0.3")


def test_no_roce_v2_gid_for_the_ip_fails():
    # only link-local entries and the RoCE v1 one for the address (e.g. right after re-addressing)
    ll = "fe80:0000:0000:0000:4ebb:47ff:fe2c:0002"
    table = (Gid(0, ll, V1, "enp1s0f1np1"), Gid(1, ll, V2, "enp1s0f1np1"),
             Gid(2, mapped("10.10.0.3"), V1, "enp1s0f1np1"))
    facts_ = spark({"enp1s0f1np1": "10.10.0.3"}, tables={"rocep1s0f1": table})
    rf = fabric.assess(facts_, ip("10.10.0.3"), "switch", "spark2")
    [fail] = rf.failures
    assert fail.name == "roce gid" and "no RoCE v2 GID for 10.10.0.3 on rocep1s0f1" in fail.value
    assert "1 fe80::4ebb:47ff:fe2c:2 RoCE v2" in fail.value  # shows the table it looked at
    with pytest.raises(FabricError, match=r"^spark2: roce gid: no RoCE v2 GID .* fix: .*ip addr show enp1s0f1np1"):
        rf.require()


def test_gid_of_another_address_does_not_count():
    facts_ = spark({"enp1s0f1np1": "10.10.0.3"}, tables={"rocep1s0f1": gid_table("enp1s0f1np1", 2, "10.10.0.99")})
    rf = fabric.assess(facts_, ip("10.10.0.3"), "switch", "spark1")
    assert [f.name for f in rf.failures] == ["roce gid"]


# --- failures and warnings -----------------------------------------------------------------------

@pytest.mark.parametrize("case, facts_, name, text", [
    ("ip on no interface", spark({"enp1s0f1np1": "10.10.0.3"}), "fabric ip", "10.10.0.7 is on no interface of spark1"),
    ("interface down", spark({"enp1s0f1np1": "10.10.0.7"}, down=("enp1s0f1np1",)), "link", "enp1s0f1np1 is down"),
    ("infiniband link layer", spark({"enp1s0f1np1": "10.10.0.7"}, link_layer="InfiniBand"), "rdma",
     "rocep1s0f1 port 1 link layer is InfiniBand, not Ethernet"),
    ("no /sys/class/infiniband", spark({"enp1s0f1np1": "10.10.0.7"}, rdma=False), "rdma", "no /sys/class/infiniband"),
])
def test_failures_name_the_problem_and_a_fix(case, facts_, name, text):
    rf = fabric.assess(facts_, ip("10.10.0.7"), "switch", "spark1")
    [fail] = rf.failures
    assert (fail.name, fail.value) == (name, text) and fail.fix
    assert rf.env == {}
    with pytest.raises(FabricError) as e:
        rf.require()
    assert e.value.message.startswith(f"spark1: {name}: {text} -- fix: ")


def test_slow_link_and_small_mtu_warn_but_serve():
    rf = fabric.assess(spark({"enp1s0f1np1": "10.10.0.3"}, speed=100000, mtu=1500), ip("10.10.0.3"), "switch", "s")
    assert status(rf, "speed") == ["warn"] and status(rf, "mtu") == ["warn"]
    assert "100000 Mb/s, expected 200000" in next(f.value for f in rf.findings if f.name == "speed")
    assert rf.require()["NCCL_IB_HCA"] == "=rocep1s0f1"


def test_down_twin_is_left_out_with_a_warning():
    rf = fabric.assess(spark({"enp1s0f1np1": "10.10.0.3", "enP2p1s0f1np1": "10.11.0.3"}, down=("enP2p1s0f1np1",)),
                       ip("10.10.0.3"), "switch", "s")
    assert rf.env["NCCL_IB_HCA"] == "=rocep1s0f1" and status(rf, "twin") == ["warn"]
    assert "roceP2p1s0f1 (twin of rocep1s0f1) is DOWN" in next(f.value for f in rf.findings if f.name == "twin")


def test_no_fabric_ips_is_a_warning_and_no_env():
    rf = fabric.assess(spark({}), [], "switch", "solo")
    assert rf.env == {} and status(rf, "fabric ip") == ["warn"] and rf.require() == {}


@pytest.mark.parametrize("topology, names", [
    ("switch", ["fabric ip", "link", "speed", "mtu", "roce gid", "gid index"]),
    ("ring", ["fabric ip", "link", "speed", "mtu", "roce gid", "link", "speed", "mtu", "roce gid", "sockets",
              "gid index"]),
])
def test_all_findings_pass_on_a_healthy_rank(topology, names):
    ips = {"enp1s0f1np1": "10.10.0.3", "enP2p1s0f1np1": "10.11.0.3", "enp1s0f0np0": "10.12.0.3",
           "enP2p1s0f0np0": "10.13.0.3"}
    rf = fabric.assess(spark(ips), ip("10.10.0.3"), topology, "s", address="10.0.0.13")
    assert {f.status for f in rf.findings} == {"pass"}
    assert [f.name for f in rf.findings] == names
    assert ("NCCL_ALGO" in rf.env) == (topology == "ring") and rf.env["NCCL_NET"] == "IB"
    if topology == "ring":  # both ports, both (addressed) twins of each; UCX on each port's first twin
        assert rf.env["NCCL_IB_HCA"] == "=rocep1s0f0,roceP2p1s0f0,rocep1s0f1,roceP2p1s0f1"
        assert rf.env["UCX_NET_DEVICES"] == "rocep1s0f0:1,rocep1s0f1:1"


# --- twins by name --------------------------------------------------------------------------------

def test_twins_are_the_same_function_in_the_other_pci_domain():
    devices = spark({}).rdma
    by_name = {d.name: d for d in devices}
    assert fabric.twins_of(by_name["roceP2p1s0f1"], devices) == ("rocep1s0f1", "roceP2p1s0f1")
    assert fabric.twins_of(by_name["rocep1s0f0"], devices) == ("rocep1s0f0", "roceP2p1s0f0")
    # mlx5_N-named HCAs: matched through their netdevs' PCI names instead
    renamed = tuple(RdmaDevice(f"mlx5_{i}", d.netdevs, d.ports) for i, d in enumerate(devices))
    netdev_of = {d.name: d.netdevs[0] for d in renamed}
    twins = fabric.twins_of(next(d for d in renamed if d.netdevs == ("enp1s0f1np1",)), renamed)
    assert sorted(netdev_of[t] for t in twins) == ["enP2p1s0f1np1", "enp1s0f1np1"]


# --- the sandbox's fixtures, through the real probe ------------------------------------------------

def test_sandbox_ranks_match_their_truth(tmp_path):
    """The sandbox writes each rank's sysfs and states what a correct probe must find."""
    for r in range(sandbox_fabric.N_RANKS):
        truth = sandbox_fabric.fabric_truth(r)
        address = f"172.31.240.{11 + r}"  # on eth0, as local_probe lays it out
        rf = fabric.assess(sandbox_rank_facts(tmp_path / f"spark{r + 1}", r), ip(truth["fabric_ip"]), "ring",
                           truth["name"], address=address)
        assert not rf.failures, rf.failures
        p = rf.primary
        assert (p.netdev, p.hca, p.gid_index, p.gid) == (truth["netdev"], truth["hca"], truth["gid_index"], truth["gid"])
        # RDMA on the HCAs holding an IPv4 address: the sandbox leaves each port's twin unaddressed
        addressed = [port["hcas"][0] for port in truth["ports"]]
        assert p.twins == (truth["hca"],) and status(rf, "twin") == ["warn", "warn"]
        assert rf.env["NCCL_IB_HCA"] == "=" + ",".join(h for h in truth["hcas_in_use"] if h in addressed)
        assert (rf.env["NCCL_SOCKET_IFNAME"], rf.env["VLLM_HOST_IP"]) == ("=eth0", address)
