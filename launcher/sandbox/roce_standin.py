"""The kernel's RoCE port counters for the sandbox's fixture HCAs, moving with the traffic on the
cable each stands for: a SANDBOX STAND-IN run in every rank (python3 -c SOURCE), like
gid_standin.py.

A ConnectX-7 counts a port's traffic in /sys/class/infiniband/<hca>/ports/1/counters (the IBA
PortCounters: port_xmit_data and port_rcv_data in 4-byte words, packets, link_downed, symbol and
receive errors, ...) and, on mlx5, ports/1/hw_counters (out_of_sequence, local_ack_timeout_err,
retries). Here each HCA's netdev is a veth of the sandbox's fabric (or nothing, for the twins), so
twice a second the stand-in reads that veth's own statistics (/sys/class/net/<if>/statistics:
tx_bytes, rx_bytes, packets, rx_errors; carrier_down_count for link_downed) and writes them in
the real units. The fixture tree is read-only in the rank, so its `counters` and `hw_counters`
are links (fabric_fixture.counter_links) into this stand-in's own directory on the rank's /run;
until it has written them they dangle, as a missing directory would read.
"""

STATE_DIR = "/run/sandbox-roce"

SOURCE = r'''
import os, sys, time

ROOT = os.path.join(sys.argv[2], "class", "infiniband")
STATE = sys.argv[3]
HW = ("out_of_sequence", "local_ack_timeout_err", "packet_seq_err", "rnr_nak_retry_err",
      "implied_nak_seq_err", "roce_adp_retrans")


def stat(netdev, name):
    try:
        with open("/sys/class/net/%s/%s" % (netdev, name)) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0  # a twin: no netdev behind it in the sandbox, no traffic


def write(path, value):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % value)
    os.replace(tmp, path)  # a reader never sees half a number


def one(hca):
    nets = os.listdir(os.path.join(ROOT, hca, "device", "net"))
    netdev = nets[0] if nets else ""
    s = lambda name: stat(netdev, "statistics/" + name)
    counters = {"port_xmit_data": s("tx_bytes") // 4, "port_rcv_data": s("rx_bytes") // 4,
                "port_xmit_packets": s("tx_packets"), "port_rcv_packets": s("rx_packets"),
                "link_downed": stat(netdev, "carrier_down_count"), "symbol_error": 0,
                "port_rcv_errors": s("rx_errors"), "link_error_recovery": 0,
                "port_xmit_discards": s("tx_dropped")}
    for folder, values in (("counters", counters), ("hw_counters", dict.fromkeys(HW, 0))):
        d = os.path.join(STATE, hca, folder)
        os.makedirs(d, exist_ok=True)
        for name, value in values.items():
            write(os.path.join(d, name), value)


while True:
    try:
        for hca in os.listdir(ROOT):
            one(hca)
    except OSError:
        pass
    time.sleep(0.5)
'''


def command(sysfs_root: str) -> list[str]:
    """The rank's process: its name in argv[1] finds it (pgrep -f sandbox-roce-standin)."""
    return ["python3", "-c", SOURCE, "sandbox-roce-standin", sysfs_root, STATE_DIR]
