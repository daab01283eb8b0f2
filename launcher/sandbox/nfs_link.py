"""The sandbox's "NFS" link: the speed of the path a rank's checkpoint reads take (issue 15).

The checkpoint is a host directory bind-mounted into every rank (cluster.py: this kernel has no
NFS). On a real cluster it is an NFS export, and a cold load takes as long as its bytes take over
the rank's link to the file server. The sandbox says the same through the facts a real rank
gives, so `check`'s estimate reads it as it reads a Spark:

- the mount: a mountinfo fixture in the rank (/sandbox/mountinfo, beside its sysfs fixture; the
  probe's `findmnt -F` reads it for the model dir) names the checkpoint as `nfs4` from the
  sandbox network's gateway, the host that really holds the files (`addr=` as the kernel shows);
- the route: the rank's real /proc/net/route takes that address over its bridge interface, eth0;
- the speed: the rank's sysfs fixture gives eth0 a `speed` (Mb/s, sysfs format): the link's
  line rate, SPARKSTACK_SANDBOX_NFS_MBPS at `sandbox up` (DEFAULT_MBPS), or `set_speed`.

The stand-in engine reads every shard at that line rate shared by its --nnodes ranks (all of
them read the one server port at once), so a sandbox load takes the time its bytes take.
DEFAULT_MBPS is a 25G server port: fast enough that the sandbox's few MB load at once, and above
a Spark's 10G management port, so `check` does not ask for a faster path by default.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

IFACE = "eth0"  # a rank's interface on the sandbox bridge (Docker's name), towards the host
DEFAULT_MBPS = 25_000
STATE_FILE = "nfs-mbps"  # in the sandbox's state dir: the speed every fixture rewrite keeps
MOUNTINFO = "/sandbox/mountinfo"  # in the rank: beside /sandbox/sysfs, where the probe looks
# what prep mounts NFS with (node_settings.NFS_HANG_OPTIONS), so `check` judges it as a good mount
OPTIONS = "ro,vers=4.2,rsize=1048576,wsize=1048576,soft,timeo=600,retrans=2,proto=tcp"


def speed(state_dir: Path) -> int:
    """The link's speed in Mb/s: the state dir's (set_speed), else the environment's, else the default."""
    f = Path(state_dir) / STATE_FILE
    if f.exists():
        return int(f.read_text())
    return int(os.environ.get("SPARKSTACK_SANDBOX_NFS_MBPS", DEFAULT_MBPS))


def sysfs_files(mbps: int) -> dict[str, str]:
    """eth0's files in the rank's sysfs fixture, as /sys/class/net/<if>/ shows them."""
    p = f"class/net/{IFACE}"
    return {f"{p}/speed": f"{mbps}\n", f"{p}/operstate": "up\n", f"{p}/carrier": "1\n",
            f"{p}/mtu": "1500\n", f"{p}/type": "1\n"}


def server(net: ipaddress.IPv4Network) -> str:
    """The "file server": the sandbox network's gateway, the host the checkpoint lives on."""
    return str(net.network_address + 1)


def mountinfo(net: ipaddress.IPv4Network, model_path: str) -> str:
    """The rank's mount table as the probe should see it for the checkpoint (mountinfo format)."""
    addr = server(net)
    return (f"1 0 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
            f"2 1 0:99 / {model_path} ro,relatime - nfs4 {addr}:{model_path} {OPTIONS},addr={addr}\n")


def set_speed(state_dir: Path, ranks_dir: Path, mbps: int | None) -> None:
    """Change the link's speed now (every rank's fixture) and for later `up`s; None: back to
    the environment's or the default."""
    (Path(state_dir) / STATE_FILE).unlink(missing_ok=True)
    if mbps is not None:
        (Path(state_dir) / STATE_FILE).write_text(f"{mbps}\n")
    mbps = speed(state_dir)
    for rdir in sorted(Path(ranks_dir).iterdir()):
        f = rdir / "sysfs" / "class" / "net" / IFACE / "speed"
        if f.exists():
            with open(f, "r+") as out:  # the same inode: the file is bind-mounted into the rank
                out.truncate(0)
                out.write(f"{mbps}\n")
