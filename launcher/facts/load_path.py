"""Which link carries a rank's checkpoint reads, and how long a cold load takes (issue 15).

From the rank's own facts: the mount holding the checkpoint (its fstype; for NFS the server's
address from the mount's `addr=` option, the kernel's own choice), the route the kernel takes
to that server (/proc/net/route) and that interface's speed (sysfs). A local filesystem is read
from the rank's own disk. The bytes a rank reads are the whole checkpoint: vLLM's default
safetensors loader takes every tensor of every shard on every rank and keeps its own slice.
The ranks reading from one file server share its port, taken as no faster than theirs (the
server is not probed): four ranks on one 10G NFS port each get a quarter of it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, replace
from ipaddress import IPv4Address

from .mounts import Mount
from .network import route_to
from .record import Facts

NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "glusterfs", "ceph", "lustre", "fuse.sshfs")
# Assumptions, not measurements (shown with every estimate): NFS over TCP reaches about 80 % of
# a link's line rate; a local NVMe reads at least 3 GB/s sequentially.
LINE_EFFICIENCY = 0.8
LOCAL_DISK_BYTES_S = 3_000_000_000
MARGIN = 2.0  # `up` waits the estimate times this before it gives up on the API
SLOW_PORT_MBPS = 10_000  # a GB10's management port
FAST_PORT_MBPS = 100_000  # a fabric port (a Spark's CX-7 runs 200G)


@dataclass(frozen=True)
class LoadPath:
    rank: int
    kind: str  # "network" (NFS and the like) | "local"
    bytes: int
    source: str  # the mount's source (server:/export) or the local device
    server: str | None = None  # the file server's address the reads come from
    iface: str | None = None  # the rank's interface towards it
    speed_mbps: int | None = None  # that interface's speed (sysfs); None: not known
    faster: tuple[str, int] | None = None  # an up interface at fabric speed the reads skip
    assumed: str = ""
    sharing: int = 1  # ranks reading from the same server at once, sharing its port

    @property
    def bytes_per_s(self) -> float | None:
        if self.kind == "local":
            return LOCAL_DISK_BYTES_S
        return self.speed_mbps * 1e6 / 8 * LINE_EFFICIENCY / self.sharing if self.speed_mbps else None

    @property
    def seconds(self) -> float | None:
        rate = self.bytes_per_s
        return self.bytes / rate if rate else None

    def describe(self) -> str:
        size = f"{self.bytes / 1e9:.1f} GB"
        if self.kind == "local":
            how = f"from the local disk ({self.source})"
        else:
            speed = f"{self.speed_mbps / 1000:g} Gb/s" if self.speed_mbps else "speed unknown"
            shared = f", the server's port shared by {self.sharing} ranks" if self.sharing > 1 else ""
            how = f"from {self.source} over {self.iface or '?'} ({speed}{shared})"
        took = f": ~{minutes(self.seconds)} cold" if self.seconds else ""
        return f"{size} {how}{took}" + (f" ({self.assumed})" if self.assumed and self.seconds else "")

    def to_json(self) -> dict:
        return {**asdict(self), "seconds": round(self.seconds, 1) if self.seconds else None}


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def server_address(mount: Mount, configured: str | None) -> str | None:
    """The file server's IPv4 address: the mount's `addr=` option, its source's host, else the
    config's model.nfs.server; None when only a name is known."""
    options = dict(o.partition("=")[::2] for o in mount.options.split(","))
    for candidate in (options.get("addr"), mount.source.partition(":")[0], configured):
        try:
            return str(IPv4Address(candidate or ""))
        except ValueError:
            continue
    return None


def for_rank(r: int, f: Facts, nfs_server: str | None = None) -> LoadPath | None:
    """The rank's read path, or None when its checkpoint or mount was not read."""
    c, mount = f.checkpoint, f.model_mount
    if not c or not c.shards or not mount:
        return None
    if mount.fstype not in NETWORK_FS:
        return LoadPath(r, "local", c.total_bytes, mount.source,
                        assumed=f"assumed {LOCAL_DISK_BYTES_S / 1e9:g} GB/s of local reads")
    server = server_address(mount, nfs_server)
    route = route_to(f.routes, server) if server else None
    if route is None:
        iface = f.default_route_if
        why = f"no route to {server} read" if server else f"{mount.source}'s server address not known"
        assumed = f"{why}: taken as the default route's"
    else:
        iface, assumed = route.iface, ""
    nic = next((i for i in f.interfaces if i.name == iface), None)
    speed = nic.speed if nic else None
    faster = max(((i.name, i.speed) for i in f.interfaces if i.operstate == "up" and i.speed
                  and i.speed >= FAST_PORT_MBPS and i.name != iface), key=lambda x: x[1], default=None)
    rate = f"at {LINE_EFFICIENCY:.0%} of line rate"
    return LoadPath(r, "network", c.total_bytes, mount.source, server, iface, speed,
                    faster if speed and speed <= SLOW_PORT_MBPS else None,
                    f"{assumed}; {rate}" if assumed else rate)


def for_ranks(facts: dict[int, Facts], nfs_server: str | None = None) -> dict[int, LoadPath]:
    """Every probed rank's read path, the ranks reading from one server sharing its port."""
    paths = {r: p for r, f in facts.items() if (p := for_rank(r, f, nfs_server))}
    servers = Counter(p.server or p.source.partition(":")[0] for p in paths.values() if p.kind == "network")
    return {r: replace(p, sharing=servers[p.server or p.source.partition(":")[0]]) if p.kind == "network" else p
            for r, p in paths.items()}


def wait_timeout(paths: dict[int, LoadPath], configured: float) -> float:
    """How long `up` waits for the API: the configured wait, or longer when the slowest rank's
    cold load times MARGIN needs it."""
    slowest = max((p.seconds for p in paths.values() if p.seconds), default=0.0)
    return max(configured, slowest * MARGIN)
