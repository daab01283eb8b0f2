"""Neighbour discovery on a rank's CX7 netdevs, before any of them has an address.

Sent as it is on stdin and run as `python3 - '<{"netdevs": [...]}>'` (standard library only, like
probe.py). For each netdev: an all-nodes ping on its IPv6 link-local scope (ff02::1%netdev) makes
every host on the other end of the cable answer, and the kernel's neighbour table then holds
their MACs. Prints ONE JSON object {netdev: {"state", "macs", "error"}}; the interpretation is
launcher/facts/cabling.py's. Changes nothing on the rank.
"""

import json
import os
import subprocess
import sys
import threading

PING = ["ping", "-6", "-n", "-c", "2", "-W", "1"]  # multicast: no interval below 1 s


def state(netdev):
    try:
        with open("/sys/class/net/%s/operstate" % netdev) as f:
            return f.read().strip()
    except OSError:
        return None


def neighbours(netdev, out):
    if state(netdev) is None:
        out[netdev] = {"state": None, "macs": [], "error": "no such netdev"}
        return
    ping = subprocess.run(PING + ["ff02::1%" + netdev], capture_output=True, text=True, timeout=10)
    neigh = subprocess.run(["ip", "-j", "-6", "neigh", "show", "dev", netdev], capture_output=True,
                           text=True, timeout=10)
    macs, error = [], None
    if neigh.returncode == 0:
        macs = sorted({e["lladdr"] for e in json.loads(neigh.stdout or "[]")
                       if e.get("lladdr") and e.get("state") != ["FAILED"]})
    else:
        error = neigh.stderr.strip()
    if not macs and ping.returncode not in (0, 1):  # 1: no answer; else ping itself failed
        error = (ping.stderr or ping.stdout).strip()
    out[netdev] = {"state": state(netdev), "macs": macs, "error": error}


def main(argv):
    args = json.loads(argv[1]) if len(argv) > 1 else {}
    out = {}
    threads = [threading.Thread(target=neighbours, args=(nd, out)) for nd in args.get("netdevs", [])
               if "/" not in nd and nd not in (".", "..") and os.path.basename(nd) == nd]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
