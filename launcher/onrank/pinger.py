"""check's second command per rank: ping the peers' fabric IPs, read dockerd's capabilities.

Sent on stdin like the probe and run on the rank as

    python3 - '{"targets": [[key, ip, df_payload or null], ...], "wait_s": 1}'

so it is a self-contained stdlib script. Why not a shell one-liner: a shell pipeline per ping
(subshell, ping, grep, tail) is ~4 processes, and with every rank pinging every other rank's
fabric IPs that is O(ranks^2) forks -- on a 16-rank sandbox sharing 2 CPUs it was most of
`check`'s time. Here a target with no route (a non-neighbour in a plain ring) is answered by a
UDP connect() (no packet leaves, no process starts), and the routable ones get one `ping` each,
all in parallel.

Output, one line each: `<key> <rc> <why>` per ping (rc 0 = answered; `why` is ping's telling
line: "local error: message too long, mtu=1400", "Destination Host Unreachable", else its
summary), `NOPING` when there is no ping on the rank, `CAPEFF <hex>` for dockerd.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys

WHY = re.compile(r"error|too long|unreachable|not permitted|unknown|invalid", re.I)


def route_error(ip):
    """ping's own words for an address this rank has no route to; None when it has one."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect((ip, 9))  # UDP: only a route lookup, nothing is sent
        return None
    except OSError as e:
        return "ping: connect: %s" % (e.strerror or e)
    finally:
        s.close()


def telling_line(output):
    lines = [x for x in output.splitlines() if x.strip()]
    for line in lines:
        if WHY.search(line):
            return line.strip()
    return lines[-1].strip() if lines else ""


def pings(targets, wait_s):
    if not targets:
        return []
    if shutil.which("ping") is None:
        return ["NOPING"]
    out, running = [], []
    for key, ip, df_payload in targets:
        why = route_error(ip)
        if why:
            out.append("%d 2 %s" % (key, why))
            continue
        argv = ["ping", "-n", "-c1", "-W%d" % wait_s]
        if df_payload:
            argv += ["-M", "do", "-s", str(df_payload)]
        running.append((key, subprocess.Popen(argv + [ip], stdin=subprocess.DEVNULL,
                                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)))
    for key, p in running:
        try:
            text = p.communicate(timeout=wait_s + 5)[0].decode(errors="replace")
        except subprocess.TimeoutExpired:
            p.kill()
            text = "ping did not finish in %ss" % (wait_s + 5)
        out.append("%d %d %s" % (key, p.returncode if p.returncode is not None else 1, telling_line(text)))
    return out


def dockerd_capeff():
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/comm" % pid) as f:
                if f.read() != "dockerd\n":
                    continue
            with open("/proc/%s/status" % pid) as f:
                for line in f:
                    if line.startswith("CapEff:"):
                        return "CAPEFF " + line.split()[1]
        except OSError:
            continue
    return None


def main(argv):
    args = json.loads(argv[1]) if len(argv) > 1 else {}
    lines = pings(args.get("targets", []), int(args.get("wait_s", 1)))
    caps = dockerd_capeff()
    sys.stdout.write("\n".join(lines + ([caps] if caps else [])) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
