"""The kernel's part the bare sandbox's fixtures cannot play by themselves: when a port gets an
IPv4 address, its RDMA device's GID table gains the IPv4-mapped RoCE v1/v2 entries (and loses
them with the address), and /sys/class/net/<port>/mtu shows the port's MTU as `ip link` sets it. Runs in each bare rank (python3 -c SOURCE), over the rank's own
`ip -j addr`, rewriting the GID files of its sysfs fixture; the normal sandbox's fixtures are
written with their addresses' GIDs from the start and need none.
"""

SOURCE = r'''
import ipaddress, json, os, subprocess, sys, time

ROOT = os.path.join(sys.argv[2], "class", "infiniband")
ZERO = ":".join(["0000"] * 8)


def mapped(ip):
    a = ipaddress.IPv4Address(ip).packed
    return "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x" % tuple(a)


def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def write(path, text):
    if text is None:
        if os.path.exists(path):
            os.unlink(path)
    elif read(path) != text:
        with open(path, "w") as f:
            f.write(text + "\n")


def one_port(pdir, addrs):
    n = len(os.listdir(os.path.join(pdir, "gids")))
    rows = []
    ndev = None
    for i in range(n):
        gid = read(os.path.join(pdir, "gids", str(i)))
        if gid and gid != ZERO and not gid.startswith("0000:0000:0000:0000:0000:ffff:"):
            ndev = read(os.path.join(pdir, "gid_attrs", "ndevs", str(i)))
            rows.append((gid, read(os.path.join(pdir, "gid_attrs", "types", str(i))), ndev))
    for ip in addrs.get(ndev, []):
        rows += [(mapped(ip), "IB/RoCE v1", ndev), (mapped(ip), "RoCE v2", ndev)]
    for i in range(n):
        gid, typ, nd = rows[i] if i < len(rows) else (ZERO, None, None)
        write(os.path.join(pdir, "gids", str(i)), gid)
        write(os.path.join(pdir, "gid_attrs", "types", str(i)), typ)
        write(os.path.join(pdir, "gid_attrs", "ndevs", str(i)), nd)


while True:
    try:
        out = subprocess.run(["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True).stdout
        addrs = {e["ifname"]: [a["local"] for a in e.get("addr_info", [])] for e in json.loads(out)}
        for hca in os.listdir(ROOT):
            one_port(os.path.join(ROOT, hca, "ports", "1"), addrs)
        out = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True).stdout
        for e in json.loads(out):
            mtu = os.path.join(sys.argv[2], "class", "net", e["ifname"], "mtu")
            if os.path.exists(mtu):
                write(mtu, str(e["mtu"]))
    except (OSError, ValueError, KeyError):
        pass
    time.sleep(0.1)
'''
