"""Facts of a rank: what the probe saw, parsed into typed, pure data.

The probe (`launcher/onrank/probe.py`) runs once per rank and prints raw outputs; every function here
is pure -- raw text or a raw dict in, a frozen dataclass out -- so each is tested on real-format
output without a rank (tests/facts_cases/*.json, pyinfra-style). `parse_facts` assembles them
and turns every missing or broken source into a line of `Facts.problems` rather than an
exception: `check` shows what it can and says what it could not see. Output in a shape the probe
never prints (wrong types, extra structure) is a ShapeError naming the part, checked against the
types the dataclasses declare: that rank fails, never `check` or the plan further on.

The probe's contract (`invocation` builds it): the caller runs exactly ONE command,
`python3 - '<args JSON>'`, with the probe's source on stdin, and reads one JSON object from
stdout. Sizes are bytes, speeds Mb/s (as sysfs reports them), limits -1 when unlimited.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import types
import typing
from dataclasses import dataclass
from functools import cache
from ipaddress import IPv4Address, IPv4Network, IPv6Address, ip_interface
from pathlib import PurePosixPath

from .. import onrank
from .image_ref import ImageRef

PROBE_SOURCE = onrank.path("probe")
PROBE_VERSION = 1
UNLIMITED = -1
KIT_LABEL_PREFIX = "org.sparkstack."


class FactError(ValueError):
    """Raw output that does not have the expected shape."""


class ShapeError(FactError):
    """A part of the probe's output in a shape the probe never prints (wrong types, missing or
    extra structure): the rank's facts cannot be trusted, so the rank fails, naming the part."""


# --- the facts ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Memory:
    total: int
    available: int
    free: int
    cached: int
    buffers: int
    swap_total: int
    swap_free: int


@dataclass(frozen=True)
class Limit:
    soft: int  # UNLIMITED (-1) or a number
    hard: int


@dataclass(frozen=True)
class Ulimits:
    nofile: Limit | None
    memlock: Limit | None


@dataclass(frozen=True)
class DockerUlimits:
    """What a container gets: the daemon's `default-ulimits`, else the daemon's own limits
    (which are also the ceiling for `--ulimit` when the daemon cannot raise them)."""

    defaults: dict[str, Limit]
    daemon: Ulimits | None


@dataclass(frozen=True)
class Interface:
    name: str
    operstate: str | None  # sysfs words: up, down, unknown, lowerlayerdown
    speed: int | None  # Mb/s; None when the link is down or reports none
    mtu: int | None
    mac: str | None
    ipv4: tuple[str, ...]  # "192.168.177.1/30"
    ipv6: tuple[str, ...]


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


@dataclass(frozen=True)
class Image:
    id: str
    tags: tuple[str, ...]
    labels: dict[str, str]
    size: int | None

    @property
    def kit(self) -> bool:
        return any(k.startswith(KIT_LABEL_PREFIX) for k in self.labels)


@dataclass(frozen=True)
class Docker:
    client_version: str | None
    server_version: str | None  # None: the daemon did not answer
    root_dir: str
    storage_avail: int | None
    storage_size: int | None
    images: tuple[Image, ...]

    def image(self, ref: str) -> Image | None:
        """The image a tag (`repo:tag`, `:latest` implied) or an ID names."""
        parsed = ImageRef.parse(ref)
        ref_tag = ref if parsed.tag or parsed.digest else ref + ":latest"
        for image in self.images:
            if ref_tag in image.tags or image.id in (ref, "sha256:" + ref):
                return image
        return None


@dataclass(frozen=True)
class Route:
    """One IPv4 route of /proc/net/route that is up."""

    iface: str
    dest: str  # CIDR, e.g. "10.0.0.0/16" (a string: Facts travel as JSON)
    gateway: str | None  # None: on-link
    metric: int


@dataclass(frozen=True)
class Mount:
    target: str
    source: str
    fstype: str
    options: str


@dataclass(frozen=True)
class Checkpoint:
    dir: str
    config_sha256: str | None
    index_sha256: str | None
    shards: tuple[tuple[str, int | None], ...]
    fingerprint: str  # equal on two ranks <=> same config, index and shard names and sizes
    total_bytes: int


@dataclass(frozen=True)
class Gpu:
    name: str
    driver: str
    memory_total: int | None  # None on GB10: unified memory reads "[N/A]"


@dataclass(frozen=True)
class Driver:
    """The NVIDIA driver as the rank runs it: nvidia-smi's (the user-space library's) version and
    the CUDA driver API version it reports, and the loaded kernel module's version."""

    version: str | None  # "580.95.05" (nvidia-smi -q: Driver Version)
    cuda: str | None  # "13.0" (nvidia-smi -q: CUDA Version)
    kernel_module: str | None = None  # /proc/driver/nvidia/version's (NVRM) version


@dataclass(frozen=True)
class GpuClocks:
    """Graphics clocks (MHz) from `nvidia-smi -q -d CLOCK`, and the lock prep or the Ansible unit
    applied since the boot (nvidia-smi has no query for an -lgc lock, so they record it)."""

    graphics_mhz: int | None  # now
    max_graphics_mhz: int | None  # the hardware's top
    locked: tuple[int, int] | None = None  # the -lgc MIN,MAX applied; None: none recorded


@dataclass(frozen=True)
class CdiSpec:
    """An NVIDIA CDI spec the container runtime reads (nvidia-ctk cdi generate)."""

    path: str
    driver: str | None  # the driver version it was generated for; None: none named in it
    problem: str | None = None  # unreadable or not a CDI spec


@dataclass(frozen=True)
class Disk:
    path: str
    avail: int
    size: int


@dataclass(frozen=True)
class Clock:
    """The rank's wall clock against ours: the probe ran between `sent` and `received`."""

    remote_started: float
    remote_finished: float
    sent: float | None = None
    received: float | None = None

    @property
    def offset(self) -> float | None:
        """Rank clock minus local clock, in seconds (None without local timestamps)."""
        if self.sent is None or self.received is None:
            return None
        return (self.remote_started + self.remote_finished) / 2 - (self.sent + self.received) / 2

    @property
    def uncertainty(self) -> float | None:
        if self.sent is None or self.received is None:
            return None
        return max(0.0, (self.received - self.sent) - (self.remote_finished - self.remote_started)) / 2


@dataclass(frozen=True)
class NcclLib:
    """The host NCCL build `nccl.host_lib` names, as found on the rank."""

    path: str
    present: bool
    realpath: str | None = None  # the file the path (usually a soname link) resolves to
    size: int | None = None
    version: str | None = None  # "2.30.7+cuda13.0": the string NCCL prints at init, else the file name's
    problem: str | None = None  # why it could not be read


@dataclass(frozen=True)
class Facts:
    hostname: str
    kernel: str
    memory: Memory | None
    sysctls: dict[str, str | None]
    ulimits: Ulimits
    docker_ulimits: DockerUlimits
    interfaces: tuple[Interface, ...]
    rdma: tuple[RdmaDevice, ...] | None  # None: no /sys/class/infiniband at all
    docker: Docker | None  # None: no docker CLI
    mounts: tuple[Mount, ...]
    model_mount: Mount | None  # the mount holding the checkpoint directory
    checkpoint: Checkpoint | None
    gpu: Gpu | None
    disks: tuple[Disk, ...]
    clock: Clock
    problems: tuple[str, ...] = ()  # sources that were missing or unreadable, one line each
    ssh_address: str | None = None  # the rank's address the kit's SSH connection arrived at
    default_route_if: str | None = None  # the interface of the IPv4 default route
    routes: tuple[Route, ...] = ()  # the IPv4 routes that are up (/proc/net/route)
    nccl_lib: NcclLib | None = None  # only when nccl.host_lib is configured
    page_size: int | None = None  # bytes: 4096, or 65536 on a 64k-page kernel
    driver: Driver | None = None  # None: no NVIDIA driver seen (no nvidia-smi, no module)
    gpu_clocks: GpuClocks | None = None
    cdi_specs: tuple[CdiSpec, ...] = ()  # the NVIDIA CDI specs present
    nvidia_ctk: str | None = None  # the NVIDIA Container Toolkit's version ("1.17.8")

    @property
    def fw_versions(self) -> tuple[str, ...]:
        """The HCAs' firmware versions, each once ((): none read)."""
        return tuple(sorted({d.fw_ver for d in self.rdma or () if d.fw_ver}))

    def interface(self, name: str) -> Interface | None:
        return next((i for i in self.interfaces if i.name == name), None)

    def rdma_device(self, name: str) -> RdmaDevice | None:
        return next((d for d in self.rdma or () if d.name == name), None)

    def disk(self, path: str) -> Disk | None:
        return next((d for d in self.disks if d.path == path), None)

    def to_json(self) -> dict:
        return to_jsonable(self)


def to_jsonable(value):
    """Dataclasses as dicts, tuples as lists: the form the JSON cases and `--json` use."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (IPv4Address, IPv6Address)):
        return str(value)
    return value


# --- invoking the probe ------------------------------------------------------------------------

def probe_args(sysfs_root: str = "/", model_dir: str | None = None, sysctls: tuple[str, ...] = (),
               disk_paths: tuple[str, ...] = (), timeout_s: float = 5.0, nccl_lib: str | None = None) -> dict:
    """The probe's arguments for a rank. A fixture sysfs root (anything but "/" or "/sys") comes
    with an `ip-addr.json` beside it (the sandbox's /sandbox/sysfs and /sandbox/ip-addr.json):
    fixture netdevs have addresses only there; and a `mountinfo` beside it, when there, is the
    mount table the checkpoint's mount is looked up in (the sandbox's "NFS" mount)."""
    args: dict = {"sysfs_root": sysfs_root, "timeout_s": timeout_s}
    if sysfs_root.rstrip("/") not in ("", "/sys"):
        args["ip_addr_file"] = str(PurePosixPath(sysfs_root.rstrip("/")).parent / "ip-addr.json")
        args["mount_table"] = str(PurePosixPath(sysfs_root.rstrip("/")).parent / "mountinfo")
    if model_dir:
        args["model_dir"] = model_dir
    if sysctls:
        args["sysctls"] = list(sysctls)
    if disk_paths:
        args["disk_paths"] = list(disk_paths)
    if nccl_lib:
        args["nccl_lib"] = nccl_lib
    return args


def invocation(args: dict) -> tuple[str, bytes]:
    """The one remote command line and the bytes to send on its stdin."""
    return onrank.invocation("probe", args)


# --- parsers: raw in, fact out -----------------------------------------------------------------

def parse_meminfo(text: str) -> Memory:
    """/proc/meminfo, "Name:   123 kB" lines, into bytes."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[name.strip()] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    missing = [k for k in ("MemTotal", "MemAvailable") if k not in values]
    if missing:
        raise FactError(f"/proc/meminfo: no {', '.join(missing)}")
    if values["MemTotal"] == 0:  # vLLM's guard divides by it
        raise FactError("/proc/meminfo: MemTotal is 0")
    return Memory(values["MemTotal"], values["MemAvailable"], values.get("MemFree", 0),
                  values.get("Cached", 0), values.get("Buffers", 0), values.get("SwapTotal", 0),
                  values.get("SwapFree", 0))


def parse_sysctls(raw: dict) -> dict[str, str | None]:
    """Values as `sysctl -n` prints them (tabs of multi-value entries become single spaces);
    None for a sysctl this kernel does not have or would not let us read."""
    return {name: " ".join(v.split()) if isinstance(v, str) else None for name, v in sorted(raw.items())}


def parse_rlimits(raw: dict) -> Ulimits:
    def limit(name: str) -> Limit | None:
        pair = raw.get(name)
        return Limit(int(pair[0]), int(pair[1])) if pair else None
    return Ulimits(limit("nofile"), limit("memlock"))


_LIMITS_ROWS = {"Max open files": "nofile", "Max locked memory": "memlock"}


def parse_docker_ulimits(daemon_json: str | dict | None, dockerd_limits: str | dict | None) -> DockerUlimits:
    """`default-ulimits` from /etc/docker/daemon.json and dockerd's /proc/<pid>/limits."""
    defaults: dict[str, Limit] = {}
    if isinstance(daemon_json, str) and daemon_json.strip():
        try:
            conf = json.loads(daemon_json)
        except json.JSONDecodeError as e:
            raise FactError(f"/etc/docker/daemon.json: not JSON ({e})") from None
        try:  # a file people write by hand: a wrong shape is a finding, not the rank's failure
            for name, v in sorted((conf.get("default-ulimits") or {}).items()):
                defaults[name] = Limit(int(v.get("Soft", UNLIMITED)), int(v.get("Hard", UNLIMITED)))
        except (AttributeError, TypeError, ValueError, OverflowError) as e:
            raise FactError(f"/etc/docker/daemon.json: default-ulimits is not "
                            f'{{"name": {{"Soft": n, "Hard": n}}}} ({e})') from None
    daemon = None
    if isinstance(dockerd_limits, str):
        found: dict[str, Limit] = {}
        for line in dockerd_limits.splitlines():
            cols = re.split(r"\s{2,}", line.strip())
            if cols[0] in _LIMITS_ROWS and len(cols) >= 3:
                found[_LIMITS_ROWS[cols[0]]] = Limit(*(UNLIMITED if c == "unlimited" else int(c) for c in cols[1:3]))
        daemon = Ulimits(found.get("nofile"), found.get("memlock"))
    return DockerUlimits(defaults, daemon)


def _int(raw) -> int | None:
    if not isinstance(raw, str):
        return None
    try:
        return int(raw.strip())
    except ValueError:
        return None


def _text(raw) -> str | None:
    return raw.strip() if isinstance(raw, str) else None


def _ip_json(text: str, source: str) -> list[dict]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise FactError(f"{source}: not JSON ({e})") from None
    if not isinstance(data, list):
        raise FactError(f"{source}: expected a list of interfaces")
    return data


def parse_interfaces(ip_addr: dict | None, sysfs_net: dict, ip_addr_file: str | None = None) -> tuple[Interface, ...]:
    """`ip -j addr` (its addresses) joined with /sys/class/net/<if> (state, speed, MTU, MAC).
    A fixture `ip_addr_file` replaces the command's entries of the same name."""
    links: dict[str, dict] = {}
    if ip_addr and ip_addr.get("rc") == 0:
        for entry in _ip_json(ip_addr["stdout"], "ip -j addr"):
            links[entry["ifname"]] = entry
    if isinstance(ip_addr_file, str):
        for entry in _ip_json(ip_addr_file, "ip-addr fixture"):
            links[entry["ifname"]] = entry
    out = []
    for name in sorted(set(links) | set(sysfs_net)):
        link, sys_ = links.get(name, {}), sysfs_net.get(name, {})
        addrs = link.get("addr_info", [])
        speed = _int(sys_.get("speed"))
        state = _text(sys_.get("operstate")) or (link.get("operstate") or "").lower() or None
        out.append(Interface(
            name=name, operstate=state,
            speed=speed if speed is not None and speed > 0 else None,
            mtu=_int(sys_.get("mtu")) or link.get("mtu"),
            mac=_text(sys_.get("address")) or link.get("address"),
            ipv4=_addresses(name, addrs, "inet", 4), ipv6=_addresses(name, addrs, "inet6", 6)))
    return tuple(out)


def _addresses(name: str, addrs: list[dict], family: str, version: int) -> tuple[str, ...]:
    """`ip -j addr`'s addresses of one family as "address/prefix"."""
    out = []
    for a in addrs:
        if a.get("family") != family:
            continue
        text = f"{a['local']}/{a['prefixlen']}"
        try:
            valid = ip_interface(text).version == version
        except ValueError:
            valid = False
        if not valid:
            raise ShapeError(f"{name}: {text!r:.60} is not an IPv{version} address with its prefix length")
        out.append(text)
    return tuple(out)


_ZERO_GID = IPv6Address(0)


def _state_word(raw) -> str | None:
    text = _text(raw)
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
                text = _text(raw)
                try:
                    if text is None or IPv6Address(text) == _ZERO_GID:
                        continue
                except ValueError:
                    raise FactError(f"{hca} port {number} GID {index}: not a GID: {text!r}") from None
                gids.append(Gid(int(index), text, _text(p.get("gid_types", {}).get(index)),
                                _text(p.get("gid_ndevs", {}).get(index))))
            ports.append(RdmaPort(int(number), _state_word(p.get("state")),
                                  _text(p.get("link_layer")), tuple(gids)))
        devices.append(RdmaDevice(hca, tuple(d.get("netdevs", [])), tuple(ports), _text(d.get("fw_ver")) or None))
    return tuple(devices)


def _json_lines(text: str, source: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise FactError(f"{source}: not JSON lines ({e})") from None
    return out


def parse_docker(version: dict, images: dict | None, inspect: dict | None,
                 root_dir: str = "/var/lib/docker", disk: dict | None = None) -> Docker | None:
    """`docker version`, `docker images` and `docker image inspect` (for labels) into one fact;
    None when there is no docker CLI at all."""
    if version.get("missing"):
        return None
    client_version = server_version = None
    if version.get("stdout", "").strip():
        try:
            doc = json.loads(version["stdout"].splitlines()[0])
        except json.JSONDecodeError as e:
            raise FactError(f"docker version: not JSON ({e})") from None
        client_version = (doc.get("Client") or {}).get("Version")
        server_version = (doc.get("Server") or {}).get("Version")
    found: dict[str, Image] = {}
    if inspect and inspect.get("rc") == 0:
        for e in _json_lines(inspect["stdout"], "docker image inspect"):
            found[e["Id"]] = Image(e["Id"], tuple(sorted(e.get("RepoTags") or ())),
                                   dict(sorted((e.get("Labels") or {}).items())), e.get("Size"))
    elif images and images.get("rc") == 0:  # no labels without inspect, but IDs and tags
        for e in _json_lines(images["stdout"], "docker images"):
            tag = f"{e['Repository']}:{e['Tag']}" if "<none>" not in (e["Repository"], e["Tag"]) else None
            old = found.get(e["ID"])
            tags = (old.tags if old else ()) + ((tag,) if tag else ())
            found[e["ID"]] = Image(e["ID"], tuple(sorted(tags)), {}, None)
    space = (disk or {}).get(root_dir) or {}
    return Docker(client_version, server_version, root_dir, space.get("avail"), space.get("size"),
                  tuple(found[k] for k in sorted(found)))


def parse_docker_api(api: dict, root_dir: str = "/var/lib/docker", disk: dict | None = None) -> Docker:
    """The Engine API's GET /version and /images/json (labels included: no inspect needed), as
    the probe read them from the daemon's socket. There is no client here: client_version None."""
    version = api.get("version") or {}
    server_version = None
    if version.get("status") == 200:
        try:
            server_version = json.loads(version["body"]).get("Version")
        except json.JSONDecodeError as e:
            raise FactError(f"GET /version: not JSON ({e})") from None
    found: dict[str, Image] = {}
    images = api.get("images") or {}
    if images.get("status") == 200:
        try:
            listed = json.loads(images["body"])
        except json.JSONDecodeError as e:
            raise FactError(f"GET /images/json: not JSON ({e})") from None
        for e in listed:
            tags = tuple(sorted(t for t in e.get("RepoTags") or () if t != "<none>:<none>"))
            found[e["Id"]] = Image(e["Id"], tags, dict(sorted((e.get("Labels") or {}).items())), e.get("Size"))
    space = (disk or {}).get(root_dir) or {}
    return Docker(None, server_version, root_dir, space.get("avail"), space.get("size"),
                  tuple(found[k] for k in sorted(found)))


def _api_problem(api: dict) -> str | None:
    """One line when the daemon did not answer its socket (or answered an error)."""
    for key in ("version", "images"):
        got = api.get(key) or {}
        where = f"{got.get('endpoint', key)} on {api.get('socket')}"
        if "error" in got:
            return f"docker: the daemon does not answer ({where}: {got['error']})"
        if got.get("status") != 200:
            return f"docker: GET {where}: HTTP {got.get('status')}: {(got.get('body') or '').strip()[:200]}"
    return None


def parse_mounts(findmnt: dict | None) -> tuple[Mount, ...]:
    """`findmnt -J` (list or tree form) into a flat list, in the order findmnt gives."""
    if not findmnt or findmnt.get("rc") != 0:
        return ()
    try:
        data = json.loads(findmnt["stdout"])
    except json.JSONDecodeError as e:
        raise FactError(f"findmnt: not JSON ({e})") from None
    out: list[Mount] = []

    def walk(entries):
        for e in entries:
            out.append(Mount(e.get("target", ""), e.get("source", ""), e.get("fstype", ""), e.get("options", "")))
            walk(e.get("children", []))
    walk(data.get("filesystems", []))
    return tuple(out)


def parse_checkpoint(raw: dict | None) -> Checkpoint | None:
    """The probe's hashes and shard list, folded into one fingerprint to compare across ranks."""
    if not raw or "error" in raw:
        return None
    def digest(v):
        return v if isinstance(v, str) else None
    shards = tuple((name, size) for name, size in raw.get("shards", []))
    cfg, idx = digest(raw.get("config_sha256")), digest(raw.get("index_sha256"))
    doc = json.dumps({"config": cfg, "index": idx, "shards": shards}, sort_keys=True)
    return Checkpoint(raw["dir"], cfg, idx, shards, hashlib.sha256(doc.encode()).hexdigest(),
                      sum(s or 0 for _, s in shards))


_MEMORY = re.compile(r"^(\d+)\s*MiB$")


def parse_gpu(nvidia_smi: dict | None) -> Gpu | None:
    """`nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader`, first
    GPU. Memory "[N/A]" (GB10's unified memory) or "Not Supported" reads as None."""
    if not nvidia_smi or nvidia_smi.get("rc") != 0:
        return None
    for line in nvidia_smi["stdout"].splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) >= 3 and cols[0]:
            memory = _MEMORY.match(cols[2])
            return Gpu(cols[0], cols[1], int(memory.group(1)) << 20 if memory else None)
    return None


def parse_disks(raw: dict) -> tuple[Disk, ...]:
    return tuple(Disk(p, v["avail"], v["size"]) for p, v in sorted(raw.items()) if "avail" in v)


def parse_clock(raw: dict, sent: float | None = None, received: float | None = None) -> Clock:
    return Clock(raw["started"], raw.get("finished", raw["started"]), sent, received)


def parse_ssh_connection(text: str | None) -> str | None:
    """$SSH_CONNECTION ("client port server port"): the server address, i.e. the rank's own."""
    parts = text.split() if isinstance(text, str) else []
    return parts[2] if len(parts) == 4 else None


def parse_default_route(text: str | None) -> str | None:
    """/proc/net/route: the interface of the IPv4 default route (lowest metric), else None."""
    best = None
    for line in text.splitlines()[1:] if isinstance(text, str) else ():
        cols = line.split()
        if len(cols) < 8 or cols[1] != "00000000" or cols[7] != "00000000":
            continue
        try:
            up, metric = int(cols[3], 16) & 1, int(cols[6])
        except ValueError:
            continue
        if up and (best is None or metric < best[0]):
            best = (metric, cols[0])
    return best[1] if best else None


def _le_ipv4(hexa: str) -> str:
    """/proc/net/route's addresses: 8 hex digits, the bytes in the host's (little-endian) order."""
    return str(IPv4Address(int.from_bytes(bytes.fromhex(hexa), "little")))


def parse_routes(text: str | None) -> tuple[Route, ...]:
    """/proc/net/route: every IPv4 route that is up (flag RTF_UP); unreadable lines are skipped."""
    routes = []
    for line in text.splitlines()[1:] if isinstance(text, str) else ():
        cols = line.split()
        try:
            if len(cols) < 8 or not int(cols[3], 16) & 1:
                continue
            dest = str(IPv4Network(f"{_le_ipv4(cols[1])}/{_le_ipv4(cols[7])}", strict=False))
            gateway = _le_ipv4(cols[2]) if int(cols[2], 16) else None
            routes.append(Route(cols[0], dest, gateway, int(cols[6])))
        except ValueError:
            continue
    return tuple(routes)


def route_to(routes: tuple[Route, ...], address: str) -> Route | None:
    """The route the kernel takes to `address`: the longest prefix, then the lowest metric."""
    try:
        ip = IPv4Address(address)
    except ValueError:
        return None
    nets = [(IPv4Network(r.dest), r) for r in routes]
    matching = [(net, r) for net, r in nets if ip in net]
    return min(matching, key=lambda m: (-m[0].prefixlen, m[1].metric))[1] if matching else None


_NCCL_VERSION = re.compile(r"^NCCL version (\d+\.\d+\.\d+\S*)")
_SONAME_VERSION = re.compile(r"libnccl\.so\.(\d+\.\d+\.\d+)$")


def parse_nccl_lib(raw: dict | None) -> NcclLib | None:
    """The probe's look at the host NCCL library: present or not, and its version, read from
    the "NCCL version X.Y.Z..." string in the file, else from its real name (libnccl.so.X.Y.Z)."""
    if not raw:
        return None
    if raw.get("missing"):
        return NcclLib(raw["path"], False, problem=f"{raw['path']}: no such file")
    if "error" in raw and "size" not in raw:
        return NcclLib(raw["path"], False, problem=f"{raw['path']}: {raw['error']}")
    real = raw.get("realpath")
    m = _NCCL_VERSION.match(raw.get("version_text") or "")
    name = _SONAME_VERSION.search(PurePosixPath(real).name) if real else None
    version = m[1] if m else name[1] if name else None
    problem = f"{raw['path']}: {raw['error']}" if "error" in raw else None
    return NcclLib(raw["path"], True, real, raw.get("size"), version, problem)


_HEADER_LINE = re.compile(r"^(Driver Version|CUDA Version)\s*:\s*(\S+)\s*$")
_NVRM = re.compile(r"^NVRM version:.*?Kernel Module\S*(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)*)")


def parse_driver(nvidia_smi_clocks: dict | None, proc_version: str | dict | None) -> Driver | None:
    """`nvidia-smi -q`'s header ("Driver Version : 580.95.05", "CUDA Version : 13.0") and
    /proc/driver/nvidia/version's first line ("NVRM version: NVIDIA UNIX Open Kernel Module for
    aarch64  580.95.05  Release Build ..."); None when neither names a version."""
    found: dict[str, str] = {}
    if nvidia_smi_clocks and nvidia_smi_clocks.get("rc") == 0:
        for line in nvidia_smi_clocks["stdout"].splitlines():
            m = _HEADER_LINE.match(line.strip())
            if m and m[2] != "N/A":
                found.setdefault(m[1], m[2])
    module = None
    if isinstance(proc_version, str):
        m = _NVRM.match(proc_version.strip())
        module = m[1] if m else None
    if not found and module is None:
        return None
    return Driver(found.get("Driver Version"), found.get("CUDA Version"), module)


_CLOCK_LINE = re.compile(r"^(\w[\w ]*?)\s*:\s*(\d+) MHz$")
_LOCK = re.compile(r"^(\d+),(\d+)$")


def parse_gpu_clocks(nvidia_smi_clocks: dict | None, lock_file: str | dict | None) -> GpuClocks | None:
    """The first GPU's "Clocks" and "Max Clocks" Graphics lines of `nvidia-smi -q -d CLOCK`
    ("N/A" reads None), and the lock recorded in /run/sparkstack/gpu-clock ("MIN,MAX")."""
    m = _LOCK.match(lock_file.strip()) if isinstance(lock_file, str) else None
    locked = (int(m[1]), int(m[2])) if m else None
    if not nvidia_smi_clocks or nvidia_smi_clocks.get("rc") != 0:
        return GpuClocks(None, None, locked) if locked else None
    section, values = None, {}
    for line in nvidia_smi_clocks["stdout"].splitlines():
        if line.startswith("GPU ") and values:
            break  # the first GPU only
        text = line.strip()
        if text and ":" not in text:
            section = text
            continue
        c = _CLOCK_LINE.match(text)
        if c and c[1] == "Graphics":
            values.setdefault(section, int(c[2]))
    return GpuClocks(values.get("Clocks"), values.get("Max Clocks"), locked)


_CDI_DRIVER = (re.compile(r"--host-driver-version=(\d+\.\d+(?:\.\d+)*)"),
               re.compile(r"/libcuda\.so\.(\d+\.\d+(?:\.\d+)*)\b"),
               re.compile(r"/libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)*)\b"))


def parse_cdi_specs(raw: dict | None) -> tuple[CdiSpec, ...]:
    """NVIDIA CDI specs (YAML from `nvidia-ctk cdi generate`, read as text: no YAML parser on
    the probe's side, nor needed here): the driver version they were generated for, from the
    enable-cuda-compat hook's --host-driver-version= or the versioned libcuda / libnvidia-ml
    they mount. Absent files are left out."""
    out = []
    for path, text in sorted((raw or {}).items()):
        if text is None:
            continue
        if not isinstance(text, str):
            why = text.get("error") if isinstance(text, dict) else None
            out.append(CdiSpec(path, None, f"{path}: unreadable ({why if isinstance(why, str) else repr(text)[:60]})"))
            continue
        if "nvidia.com/" not in text or "cdiVersion" not in text:
            out.append(CdiSpec(path, None, f"{path}: not an NVIDIA CDI spec (no cdiVersion / kind nvidia.com/...)"))
            continue
        version = next((m[1] for pattern in _CDI_DRIVER for m in [pattern.search(text)] if m), None)
        out.append(CdiSpec(path, version))
    return tuple(out)


_CTK_VERSION = re.compile(r"version\s+v?(\d+\.\d+\.\d+\S*)", re.I)


def parse_nvidia_ctk(result: dict | None) -> str | None:
    """`nvidia-ctk --version`: "NVIDIA Container Toolkit CLI version 1.17.8" -> "1.17.8"."""
    if not result or result.get("rc") != 0:
        return None
    m = _CTK_VERSION.search(result.get("stdout") or "")
    return m[1] if m else None


def parse_page_size(raw) -> int | None:
    return raw if type(raw) is int and raw > 0 else None


# --- the whole probe output --------------------------------------------------------------------

def _command_problem(name: str, result: dict | None) -> str | None:
    if result is None:
        return None
    if result.get("missing"):
        return f"{name}: not installed"
    if "error" in result:
        return f"{name}: {result['error']}"
    if result.get("rc") != 0:
        # its last words: on stderr, else on stdout (nvidia-smi prints "couldn't communicate with
        # the NVIDIA driver" there)
        said = (result.get("stderr") or "").strip() or (result.get("stdout") or "").strip()
        last = said.splitlines()[-1:] or [""]
        return f"{name}: exit {result.get('rc')}: {last[0][:300]}".rstrip(": ")
    return None


def _source_problems(raw: dict) -> tuple[str, ...]:
    """One line per source the rank could not read: a command missing or failing, the daemon
    not answering, no RDMA class, the checkpoint or /proc/meminfo unreadable."""
    cmds, api = raw.get("commands", {}), raw.get("docker_api")
    named = (("ip", "ip_addr"), ("findmnt", "findmnt"), ("nvidia-smi", "nvidia_smi"))
    problems = [_command_problem(name, cmds.get(key))
                for name, key in named + (() if api else (("docker", "docker_version"),))]
    if api:
        problems.append(_api_problem(api))
    elif _command_problem("docker", cmds.get("docker_version")) is None:  # else said once above
        problems += [_command_problem(name, cmds.get(key)) for name, key in
                     (("docker images", "docker_images"), ("docker image inspect", "docker_inspect"))]
    if raw.get("sysfs_infiniband") is None:
        problems.append("/sys/class/infiniband: absent (no RDMA devices, or the RDMA modules are not loaded)")
    ckpt = raw.get("checkpoint")
    if ckpt and "error" in ckpt:
        problems.append(f"checkpoint {ckpt['dir']}: {ckpt['error']}")
    if not isinstance(raw.get("meminfo"), str):
        problems.append("/proc/meminfo: unreadable")
    return tuple(p for p in problems if p)


# --- every part checked against the types Facts declares ---------------------------------------

# what a parser may raise on output of an unexpected shape
_SHAPE_ERRORS = (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError, RecursionError)


@cache
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


@cache
def _shape(hint) -> tuple[str, object]:
    """How a value is checked against the annotation `hint`, worked out once per annotation."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return "union", args
    if dataclasses.is_dataclass(hint):
        return "dataclass", tuple((f.name, _hints(hint)[f.name]) for f in dataclasses.fields(hint))
    if origin is tuple:
        return ("items", args[0]) if args[-1:] == (Ellipsis,) else ("fixed", args)
    return ("dict", args) if origin is dict else ("scalar", hint)


def _mismatch(value, hint, where: str) -> str | None:
    """How `value` is not of the annotated type `hint`, or None when it is. `check` and the plan
    trust these types, so a wrong one must stop here."""
    kind, parts = _shape(hint)
    if kind == "union":
        rest = [arg for arg in parts if arg is not type(None)]
        if value is None and len(rest) < len(parts):
            return None
        if len(rest) == 1:  # X | None: say what is wrong inside X
            return _mismatch(value, rest[0], where)
        ok = any(_mismatch(value, arg, where) is None for arg in rest)
        return None if ok else f"{where} is {value!r:.80}, expected {hint}"
    if kind == "dataclass":
        if not isinstance(value, hint):
            return f"{where} is {value!r:.80}, expected {hint.__name__}"
        children = ((getattr(value, name), h, f"{where}.{name}") for name, h in parts)
    elif kind in ("items", "fixed"):
        items = (parts,) * len(value) if kind == "items" and isinstance(value, tuple) else parts
        if not isinstance(value, tuple) or len(items) != len(value):
            return f"{where} is {value!r:.80}, expected a list" + (f" of {len(items)}" if kind == "fixed" else "")
        children = ((v, h, f"{where}[{i}]") for i, (v, h) in enumerate(zip(value, items)))
    elif kind == "dict":
        if not isinstance(value, dict):
            return f"{where} is {value!r:.80}, expected an object"
        children = ((x, h, f"{where}[{k!r:.40}]") for k, v in value.items()
                    for x, h in ((k, parts[0]), (v, parts[1])))
    else:
        return None if _scalar_ok(value, hint) else f"{where} is {value!r:.80}, expected {hint.__name__}"
    return next((m for child in children if (m := _mismatch(*child))), None)


def _scalar_ok(value, hint) -> bool:
    if hint is float:  # JSON gives ints for whole seconds; NaN and infinities are no time
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if hint is int:
        return type(value) is int
    return value is None if hint is type(None) else isinstance(value, hint)


def _part(what: str, field: str, fn, *args):
    """Facts.<field> from its part of the output. A FactError the parser raises (the rank could not
    read a source) passes on as `what: ...`; anything else is a ShapeError naming the part."""
    try:
        value = fn(*args)
    except FactError as e:
        raise type(e)(str(e) if str(e).startswith(what) else f"{what}: {e}") from None
    except _SHAPE_ERRORS as e:
        raise ShapeError(f"{what}: output of an unexpected shape ({type(e).__name__}: {e})") from None
    wrong = _mismatch(value, _hints(Facts)[field], field)
    if wrong:
        raise ShapeError(f"{what}: {wrong}")
    return value


# --- the whole probe output --------------------------------------------------------------------

def parse_facts(raw: dict, sent: float | None = None, received: float | None = None) -> Facts:
    """The probe's whole output into Facts. `sent`/`received` are the caller's time.time()
    around the command, for the clock offset. A source the rank could not read becomes a line
    of `problems`; output that is not the probe's, or a part of it in a shape the probe never
    prints, raises FactError (ShapeError) naming the part: that rank fails, the others stay."""
    if not isinstance(raw, dict) or "fatal" in raw:
        raise FactError(f"probe failed: {raw.get('fatal') if isinstance(raw, dict) else raw!r:.200}")
    if raw.get("probe_version") != PROBE_VERSION:
        raise FactError(f"probe version {raw.get('probe_version')!r:.40}, expected {PROBE_VERSION}")
    if not isinstance(raw.get("commands", {}), dict):
        raise ShapeError("commands: expected an object of command results")
    problems = list(_part("probe output", "problems", _source_problems, raw))
    cmds, api = raw.get("commands", {}), raw.get("docker_api")

    def attempt(what: str, field: str, fn, *args, default=None):
        try:
            return _part(what, field, fn, *args)
        except ShapeError:
            raise
        except FactError as e:
            problems.append(str(e))
            return default

    meminfo = raw.get("meminfo")
    docker_root = raw.get("disk_docker_root", "/var/lib/docker")
    fixture = cmds.get("findmnt_model_fixture")
    model_mounts = attempt("findmnt (model dir)", "mounts", parse_mounts,
                           fixture if fixture and fixture.get("rc") == 0 else cmds.get("findmnt_model"), default=())
    return Facts(
        hostname=_part("hostname", "hostname", raw.get, "hostname", ""),
        kernel=_part("kernel", "kernel", raw.get, "kernel", ""),
        memory=attempt("/proc/meminfo", "memory", parse_meminfo, meminfo) if isinstance(meminfo, str) else None,
        sysctls=_part("sysctls", "sysctls", parse_sysctls, raw.get("sysctls", {})),
        ulimits=_part("rlimits", "ulimits", parse_rlimits, raw.get("rlimits", {})),
        docker_ulimits=attempt("docker ulimits", "docker_ulimits", parse_docker_ulimits,
                               raw.get("docker_daemon_json"), raw.get("dockerd_limits"),
                               default=DockerUlimits({}, None)),
        interfaces=attempt("interfaces", "interfaces", parse_interfaces, cmds.get("ip_addr"),
                           raw.get("sysfs_net", {}), raw.get("ip_addr_file"), default=()),
        rdma=attempt("rdma", "rdma", parse_rdma, raw.get("sysfs_infiniband")),
        docker=(attempt("docker", "docker", parse_docker_api, api, docker_root, raw.get("disk", {})) if api else
                attempt("docker", "docker", parse_docker, cmds.get("docker_version", {"missing": True}),
                        cmds.get("docker_images"), cmds.get("docker_inspect"), docker_root, raw.get("disk", {}))),
        mounts=attempt("findmnt", "mounts", parse_mounts, cmds.get("findmnt"), default=()),
        model_mount=model_mounts[0] if model_mounts else None,
        checkpoint=_part("checkpoint", "checkpoint", parse_checkpoint, raw.get("checkpoint")),
        gpu=attempt("nvidia-smi", "gpu", parse_gpu, cmds.get("nvidia_smi")),
        disks=_part("disk", "disks", parse_disks, raw.get("disk", {})),
        clock=_part("clock", "clock", parse_clock, raw.get("clock", {"started": 0.0}), sent, received),
        problems=tuple(problems),
        ssh_address=_part("ssh_connection", "ssh_address", parse_ssh_connection, raw.get("ssh_connection")),
        default_route_if=_part("route", "default_route_if", parse_default_route, raw.get("route")),
        routes=_part("route", "routes", parse_routes, raw.get("route")),
        nccl_lib=_part("nccl_lib", "nccl_lib", parse_nccl_lib, raw.get("nccl_lib")),
        page_size=_part("page_size", "page_size", parse_page_size, raw.get("page_size")),
        driver=_part("nvidia driver", "driver", parse_driver, cmds.get("nvidia_smi_clocks"),
                     raw.get("nvidia_driver_proc")),
        gpu_clocks=_part("gpu clocks", "gpu_clocks", parse_gpu_clocks, cmds.get("nvidia_smi_clocks"),
                         raw.get("gpu_clock_file")),
        cdi_specs=_part("cdi specs", "cdi_specs", parse_cdi_specs, raw.get("cdi_specs")),
        nvidia_ctk=_part("nvidia-ctk", "nvidia_ctk", parse_nvidia_ctk, cmds.get("nvidia_ctk")),
    )
