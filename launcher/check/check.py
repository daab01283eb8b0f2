"""`sparkstack check`: one row per rank and check, each pass / warn / fail with the measured
value and, for every non-pass, the fix in one line.

Two halves, like everything here: `evaluate` is pure (the facts of all ranks, the loaded config,
the plan's memory need, the peers' ping answers in; the report out) and is what the tests feed
fixtures to; `run` gathers (the one probe per rank, then right away one command per rank for the
fabric pings and dockerd's capabilities) and calls it.

Rows a healthy sandbox shows as non-pass, honestly (tests/test_check.py documents them):
image (until the profile's chain is built and shipped), ulimits (warn: the host's hard limits
cap the ranks at nofile 20000 / memlock 8 MiB), roce (warn: the sandbox leaves each port's twin
unaddressed, so NCCL_IB_HCA leaves it out), driver, nvidia runtime and gpu clock (warn, "not
measured": a sandbox rank has no NVIDIA driver).

Drift between ranks (driver, kernel, cx7 firmware, image, nccl): `compare` fails the rank whose
value differs from the majority's, naming the others' value; with no majority, every rank.

A ring is judged as a whole: TP across it needs every link, so a link (rank r to rank r+1, in
the config's order, which must be the cable order) that does not answer both ways, at 9000 B
with don't-fragment for `jumbo`, fails on BOTH ends, each naming the other. The ranks beyond the
neighbours are not pinged: nothing talks across a ring (the sockets use the management network).
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from ipaddress import IPv4Address, ip_interface

from .. import onrank
from ..errors import SparkstackError
from ..facts import fabric, load_path
from ..facts.limits import UNLIMITED
from ..facts.record import Facts
from ..inputs import apikey, node_settings, vllm_guard
from ..inputs.config import Loaded, no_swap
from ..onrank.probe import NOT_ANSWERING
from ..plan.kv import GIB, gib
from ..plan import cluster_plan as planning
from ..plan.cluster_plan import MemoryNeed, ModelFacts, Plan, memory_guard, rank_memory
from ..status import Status
from ..transport.gather import RankFacts

ORDER = ("ssh", "docker", "image", "gpu", "driver", "nvidia runtime", "gpu clock", "kernel", "memory", "vllm guard",
         "free while serving", "swap", "sysctls", "ulimits", "link", "roce", "cx7 firmware", "mtu", "peers", "jumbo",
         "nccl", "checkpoint", "load", "disk", "clock", "api key")
OPTIONAL = ("bandwidth", "hashes")  # rows only on request, after ORDER: `check --bandwidth`, `--deep`
STAGED = "staged"  # a row only with model.local_path, right after the checkpoint row
SHOWN = (*ORDER[:ORDER.index("checkpoint") + 1], STAGED, *ORDER[ORDER.index("checkpoint") + 1:], *OPTIONAL)
CLOCK_TOLERANCE_S = 1.0
PAGE_CACHE_WARN = 8 * GIB  # vLLM's startup guard counts page cache as used (DESIGN.md)
SWAP_USED_WARN = 256 << 20
DISK_FLOOR = 20 * GIB  # room for a new chain stage and the logs, beyond any image
SEED_NOFILE = node_settings.NOFILE
CAP_SYS_RESOURCE = 24  # lets dockerd raise a container's limits above its own
PING_WAIT_S = 1
DEFAULT_WAIT_S = 900  # `up --timeout`: a longer cold load is said on the load row
_LINK_FINDINGS = ("fabric ip", "link", "speed", "sockets")
_ROCE_FINDINGS = ("rdma", "roce gid", "twin", "gid index", "ring ports")


@dataclass(frozen=True)
class Row:
    name: str
    status: Status
    value: str
    fix: str = ""


@dataclass
class RankReport:
    rank: int
    host: str
    checks: list[Row] = field(default_factory=list)

    def add(self, name: str, status: Status, value: str, fix: str = "") -> None:
        self.checks.append(Row(name, status, value, fix if status != Status.PASS else ""))


@dataclass
class Report:
    ranks: list[RankReport]
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not any(c.status == Status.FAIL for r in self.ranks for c in r.checks)

    def to_json(self) -> dict:
        return {"ok": self.ok, "ranks": [{"rank": r.rank, "host": r.host,
                                          "checks": [asdict(c) for c in r.checks]} for r in self.ranks]}


# --- the fabric pings --------------------------------------------------------------------------

@dataclass(frozen=True)
class PingTarget:
    peer: int
    ip: str
    kind: str  # "link": the other end of one of this rank's cables; "fabric": a peer's fabric IP
    df_size: int | None = None  # payload of the don't-fragment ping (MTU - 28), None: none


@dataclass(frozen=True)
class PingAnswer:
    ok: bool
    detail: str  # ping's last line, e.g. "1 packets transmitted, 0 received, 100% packet loss"


@dataclass(frozen=True)
class Extras:
    """What the second command per rank measured: ping answers and dockerd's capabilities."""

    pings: dict[tuple[str, bool], PingAnswer]  # (ip, df) -> answer
    ping_missing: bool = False
    dockerd_can_raise: bool | None = None  # CAP_SYS_RESOURCE; None: not known
    error: str | None = None


def rank_ping_targets(loaded: Loaded, r: int, f: Facts) -> list[PingTarget]:
    """Whom rank `r` pings, from its own facts alone (so its pings start as soon as its probe is
    back). The far ends of its cables (kind "link"): every other address of a point-to-point
    link (/30, /31) of its fabric ports, and, in a ring, the other ranks' configured fabric IPs
    on those ports' subnets -- every addressed port, up or not, so a dead cable still names its
    far end. On a switch also every other rank's configured fabric IP (kind "fabric"). The DF
    ping goes at the port's MTU when that is 9000. A far end's rank is -1 until
    `resolve_peers` finds whose address it is."""
    cluster = loaded.cluster
    ring = cluster.topology == "ring"
    rf = fabric.for_rank(f, cluster, r)
    configured = {str(ip): p for p, rank in enumerate(cluster.ranks) if p != r for ip in rank.fabric_ips}
    netdevs = [n for d in f.rdma or () for n in d.netdevs] if ring else [p.netdev for p in rf.ports]
    found: dict[str, PingTarget] = {}
    for netdev in netdevs:
        df = _df_size(f.interface(netdev))
        for mine in _ipv4(f, netdev):
            for host in _far_ends(mine, configured if ring else {}):
                found[host] = PingTarget(configured.get(host, -1), host, "link", df)
    if not ring:
        df = _df_size(f.interface(rf.primary.netdev)) if rf.primary else None
        for ip, p in configured.items():
            found.setdefault(ip, PingTarget(p, ip, "fabric", df))
    return sorted(found.values(), key=lambda t: IPv4Address(t.ip))


def _far_ends(mine, configured: dict[str, int]) -> list[str]:
    """The other addresses of `mine`'s link: all of a /30 or /31, the configured ones on a wider one."""
    net = mine.network
    hosts = net.hosts() if net.prefixlen == 30 else net if net.prefixlen == 31 else ()
    found = [str(h) for h in hosts if h != mine.ip]
    return found + [ip for ip in configured if IPv4Address(ip) in net and ip != str(mine.ip) and ip not in found]


def _df_size(iface) -> int | None:
    return fabric.JUMBO_MTU - 28 if iface and iface.mtu == fabric.JUMBO_MTU else None


def resolve_peers(targets: list[PingTarget], facts: dict[int, Facts]) -> list[PingTarget]:
    """The same targets, in the same order, with each far end's rank filled in from the facts."""
    owner = {str(ip_interface(a).ip): p for p, f in facts.items() for i in f.interfaces for a in i.ipv4}
    return [t if t.peer >= 0 else dataclasses.replace(t, peer=owner.get(t.ip, -1)) for t in targets]


def ping_targets(loaded: Loaded, facts: dict[int, Facts]) -> dict[int, list[PingTarget]]:
    return {r: resolve_peers(rank_ping_targets(loaded, r, f), facts) for r, f in facts.items()}


def _ipv4(f: Facts, netdev: str) -> list:
    iface = f.interface(netdev)
    return [ip_interface(a) for a in iface.ipv4] if iface else []


def _fabric_mtu(f: Facts, rf: fabric.RankFabric) -> int | None:
    port = rf.primary
    iface = f.interface(port.netdev) if port else None
    return iface.mtu if iface else None


PINGER_SOURCE = onrank.path("pinger")


def extras_invocation(targets: list[PingTarget]) -> tuple[str, bytes]:
    """The second command per rank (launcher/onrank/pinger.py on stdin): every ping in parallel (each at
    most PING_WAIT_S), then dockerd's CapEff. Ping i's plain key is 2i, its DF key 2i + 1."""
    jobs = []
    for i, t in enumerate(targets):
        jobs.append([2 * i, t.ip, None])
        if t.df_size is not None:
            jobs.append([2 * i + 1, t.ip, t.df_size])
    args = {"targets": jobs, "wait_s": PING_WAIT_S}
    return onrank.invocation("pinger", args)


def parse_extras(stdout: str, targets: list[PingTarget]) -> Extras:
    pings: dict[tuple[str, bool], PingAnswer] = {}
    can_raise = None
    missing = False
    for line in stdout.splitlines():
        if line.strip() == "NOPING":
            missing = True
        elif line.startswith("CAPEFF "):
            try:
                can_raise = bool(int(line.split()[1], 16) >> CAP_SYS_RESOURCE & 1)
            except (IndexError, ValueError):
                pass
        elif m := re.match(r"^(\d+) (\d+) ?(.*)$", line):
            key = int(m[1])
            if key // 2 < len(targets):
                pings[(targets[key // 2].ip, bool(key % 2))] = PingAnswer(m[2] == "0", m[3].strip())
    return Extras(pings, missing, can_raise)


# --- the pure judgement ------------------------------------------------------------------------

@dataclass
class Inputs:
    """Everything `evaluate` judges, gathered beforehand."""

    loaded: Loaded
    gathered: dict[int, RankFacts]
    need: MemoryNeed | None
    need_error: str | None = None  # why the memory need could not be computed
    image: str | None = None  # the profile's serving image ref
    image_error: str | None = None  # why its tag is not known (chain not buildable here)
    local_image_id: str | None = None  # its ID on the build host, when Docker there has it
    targets: dict[int, list[PingTarget]] = field(default_factory=dict)
    extras: dict[int, Extras] = field(default_factory=dict)
    api_key: apikey.ApiKey | None = None  # None: read from this host (apikey.resolve)
    staged: dict[int, dict | str] = field(default_factory=dict)  # model.local_path vs model.path listings
    model: ModelFacts | None = None  # the checkpoint as read here (None: as need_error says)

    _fabrics: dict = field(default_factory=dict, repr=False)
    _guard: vllm_guard.Guard | None = field(default=None, repr=False)
    _kv: object = field(default=None, repr=False)  # the plan's KV sizing, or why there is none

    def __post_init__(self):
        if self.api_key is None:
            self.api_key = apikey.resolve(self.loaded)

    @property
    def facts(self) -> dict[int, Facts]:
        return {r: g.facts for r, g in self.gathered.items() if g.facts is not None}

    def fabric(self, r: int) -> fabric.RankFabric:
        """The rank's fabric assessment, once (several rows and the MTU comparison use it)."""
        if r not in self._fabrics:
            self._fabrics[r] = fabric.for_rank(self.facts[r], self.loaded.cluster, r)
        return self._fabrics[r]

    def guard(self) -> vllm_guard.Guard:
        """vLLM's startup guard at the utilisation the plan would pass on these facts, once;
        raises ConfigError for a utilisation that is not a number."""
        if self._guard is None:
            self._guard = memory_guard(self.loaded, rank_memory(self.loaded, self.facts, []))
        return self._guard

    def kv(self):
        """The KV pool the plan would size on these facts (plan.serving_kv), once; the error's
        text when it cannot be sized."""
        from . import plan_inputs

        if self._kv is None:
            try:
                self.model = self.model or plan_inputs.read_model(self.loaded)
                self._kv = planning.serving_kv(self.loaded, self.model, rank_memory(self.loaded, self.facts, []))
            except SparkstackError as e:
                self._kv = e.message
        return self._kv


def evaluate(inp: Inputs) -> Report:
    """The whole table. An unreachable rank gets one failed `ssh` row; the cross-rank checks
    (image IDs, MTU, checkpoint fingerprint, clocks) compare the ranks that answered."""
    cluster = inp.loaded.cluster
    report = Report([])
    for r, rank in enumerate(cluster.ranks):
        g = inp.gathered.get(r)
        rr = RankReport(r, rank.label)
        report.ranks.append(rr)
        if g is None or g.facts is None:
            rr.add("ssh", Status.FAIL, (g.error if g else "not probed") or "no answer",
                   f"check the rank is up and `ssh -p {rank.port} {rank.user}@{rank.address}` works")
            continue
        f = g.facts
        rr.add("ssh", Status.PASS, f"{rank.user}@{rank.address}:{rank.port}, probe {g.seconds:.2f} s")
        for name in ORDER[1:]:
            CHECKS[name](inp, r, f, rr)
    return report


def _check_docker(inp: Inputs, r: int, f: Facts, rr: RankReport) -> None:
    d = f.docker
    if d is None:
        rr.add("docker", Status.FAIL, "docker CLI not installed", "install Docker (DGX OS ships it): apt install docker.io")
    elif d.server_version is None:
        why = next((p for p in f.problems if p.startswith("docker")), "the daemon does not answer")
        rr.add("docker", Status.FAIL, why, "sudo systemctl start docker; and the SSH user must be in the docker group")
    else:
        rr.add("docker", Status.PASS, f"server {d.server_version}, {len(d.images)} images")


def _check_image(inp: Inputs, r: int, f: Facts, rr: RankReport) -> None:
    if inp.image is None:
        rr.add("image", Status.FAIL, f"the profile's image is not known: {inp.image_error}", "sparkstack build")
        return
    if f.docker is None or f.docker.server_version is None:
        rr.add("image", Status.FAIL, f"{inp.image}: cannot ask (no Docker)", "fix the docker row first")
        return
    found = f.docker.image(inp.image)
    if found is None:
        rr.add("image", Status.FAIL, f"{inp.image} missing on rank {r} ({rr.host})", "sparkstack ship")
        return
    fix = "sparkstack ship (a rank is re-tagged only once its image ID matches)"
    if inp.local_image_id:  # the build host's is THE image: each rank against it
        if found.id != inp.local_image_id:
            rr.add("image", Status.FAIL, f"{inp.image} is {_short(found.id)} on rank {r}, "
                   f"{_short(inp.local_image_id)} on the build host", fix)
        else:
            rr.add("image", Status.PASS, f"{inp.image} {_short(found.id)}, as on the build host")
        return
    ids = {p: _short(img.id) for p, x in inp.facts.items() if x.docker
           for img in [x.docker.image(inp.image)] if img}
    _drift_row(rr, "image", ids, r, f"{inp.image} {_short(found.id)}", fix)


# --- drift between ranks: a value every rank must share ----------------------------------------

def compare(values: dict[int, str], r: int) -> tuple[bool, str]:
    """Rank r's value among the measured ranks': (whether rank r is odd, what to say). With a
    majority (the most common value ahead of the next), the ranks that differ from it are odd,
    each named with the value the others have; with no majority (2 ranks, a tie) every rank is
    odd and each rank's value is listed: nothing says which side is right."""
    counts = Counter(values.values()).most_common()
    if len(counts) == 1:
        return False, "same on all ranks" if len(values) > 1 else ""
    if counts[0][1] > counts[1][1]:
        top = counts[0][0]
        same = [p for p, v in values.items() if v == top]
        if values[r] == top:
            odd = ", ".join(f"rank {p}" for p, v in sorted(values.items()) if v != top)
            return False, f"same on ranks {_ranks(same)} ({odd} differ)"
        return True, f"rank {r} has {values[r]}; ranks {_ranks(same)} have {top}"
    return True, "ranks differ: " + ", ".join(f"rank {p} {v}" for p, v in sorted(values.items()))


def _ranks(ranks) -> str:
    return ", ".join(str(p) for p in sorted(ranks))


def _drift_row(rr: RankReport, name: str, values: dict[int, str], r: int, shown: str, fix: str) -> None:
    """A row that fails rank r when its value drifts from the others' (`compare`)."""
    odd, said = compare(values, r)
    if odd:
        rr.add(name, Status.FAIL, f"{shown}: {said}", fix)
    else:
        rr.add(name, Status.PASS, f"{shown}, {said}" if said else shown)


def _not_measured(f: Facts, what: str) -> str:
    why = next((p for p in f.problems if p.startswith("nvidia-smi")), "nvidia-smi lists no GPU")
    return f"not measured: {why} (no {what} to compare)"


def _check_driver(inp: Inputs, r: int, f: Facts, rr: RankReport) -> None:
    """The NVIDIA driver and the CUDA driver API version it gives: the same on every rank (NCCL
    and the engine's kernels across ranks), and the loaded module the same as the library."""
    d = f.driver
    if d is None:
        rr.add("driver", Status.WARN, _not_measured(f, "driver"),
               "install the NVIDIA driver (DGX OS ships it); `nvidia-smi` must answer on every rank")
        return
    if d.version and d.kernel_module and d.version != d.kernel_module:
        rr.add("driver", Status.FAIL, f"the loaded kernel module is {d.kernel_module}, its library "
               f"{d.version} (Driver/library version mismatch)",
               "reboot this rank: the driver was upgraded and the old module is still loaded")
        return
    fix = ("install the same NVIDIA driver on every rank (DGX OS: `sudo apt update && sudo apt "
           "full-upgrade` on each, then reboot): ranks on different drivers do not form one TP group")
    values = {p: _driver_text(x.driver) for p, x in inp.facts.items() if x.driver}
    _drift_row(rr, "driver", values, r, _driver_text(d), fix)


def _driver_text(d) -> str:
    return f"{d.version or d.kernel_module} (CUDA {d.cuda or '?'})"


def _check_nvidia_runtime(inp: Inputs, r: int, f: Facts, rr: RankReport) -> None:
    """The container runtime's NVIDIA configuration on this rank: a CDI spec generated for
    another driver than the one running (the trap after a driver upgrade) hands the container
    libraries that are not there; nvidia-ctk's version is compared across ranks."""
    name, d = "nvidia runtime", f.driver
    running = (d.version or d.kernel_module) if d else None
    bad = [s.problem for s in f.cdi_specs if s.problem]
    stale = [s for s in f.cdi_specs if not s.problem and running and s.driver and s.driver != running]
    if bad or stale:
        why = bad + [f"stale CDI spec: {s.path} names driver {s.driver}, the rank runs {running}" for s in stale]
        path = (stale or f.cdi_specs)[0].path
        rr.add(name, Status.FAIL, "; ".join(why), f"sudo nvidia-ctk cdi generate --output={path}")
        return
    specs = ", ".join(f"{s.path} (driver {s.driver or '?'})" for s in f.cdi_specs) or "no CDI spec"
    shown = f"{specs}; nvidia-ctk {f.nvidia_ctk or 'not installed'}"
    if running is None:
        rr.add(name, Status.WARN, f"{shown}; {_not_measured(f, 'driver')}",
               "install the NVIDIA driver and container toolkit (DGX OS ships them)")
        return
    versions = {p: x.nvidia_ctk or "no nvidia-ctk" for p, x in inp.facts.items() if x.driver}
    odd, said = compare(versions, r)
    if odd:
        rr.add(name, Status.WARN, f"{shown}: NVIDIA Container Toolkit {said}",
               "install the same nvidia-container-toolkit on every rank (`sudo apt install nvidia-container-toolkit`)")
    else:
        rr.add(name, Status.PASS, shown + (f", {said}" if said else ""))


def _check_gpu_clock(inp: Inputs, r: int, f: Facts, rr: RankReport) -> None:
    """The GPU clock: the lock cluster.yaml's gpu_clock asks for, as prep or the Ansible unit
    recorded it, and the clocks nvidia-smi reads now."""
    name, want = "gpu clock", node_settings.gpu_clock_range(inp.loaded.cluster)
    c = f.gpu_clocks
    locked = c.locked if c else None
    now = (f"now {c.graphics_mhz or '?'} of max {c.max_graphics_mhz or '?'} MHz"
           if c and (c.graphics_mhz or c.max_graphics_mhz) else None)
    if want is not None and locked != want:
        found = f"locked {locked[0]},{locked[1]} MHz" if locked else "no lock recorded"
        rr.add(name, Status.FAIL, f"gpu_clock asks {want[0]},{want[1]} MHz, the rank has {found}"
               + (f" ({now})" if now else ""),
               "sparkstack prep (nvidia-smi -lgc; the Ansible role's unit sets it at every boot)")
    elif locked is not None and want is None:
        rr.add(name, Status.WARN, f"locked {locked[0]},{locked[1]} MHz by an earlier prep, but gpu_clock is unset",
               "sparkstack prep resets it (nvidia-smi -rgc)")
    elif now is None and f.driver is None:
        rr.add(name, Status.WARN, _not_measured(f, "clock"),
               "install the NVIDIA driver (DGX OS ships it); `nvidia-smi -q -d CLOCK` must answer")
    else:
        lock = f"locked {want[0]},{want[1]} MHz (gpu_clock)" if want else "the driver's (no lock)"
        rr.add(name, Status.PASS, lock + (f"; {now}" if now else ""))


def _check_kernel(inp: Inputs, r: int, f: Facts, rr: RankReport) -> None:
    """The kernel and its page size: the same everywhere (a 64k-page kernel beside 4k ones, or
    another kernel's RDMA and NVIDIA modules, are what an update on one box brings)."""
    values = {p: _kernel_text(x) for p, x in inp.facts.items()}
    _drift_row(rr, "kernel", values, r, _kernel_text(f),
               "boot every rank into the same kernel (`uname -r`; DGX OS: `sudo apt full-upgrade`, "
               "then reboot each): a 64k-page kernel does not mix with 4k ones")


def _kernel_text(f: Facts) -> str:
    page = f"{f.page_size // 1024} KiB pages" if f.page_size else "page size unknown"
    return f"{f.kernel or '?'}, {page}"


def _check_cx7_firmware(inp: Inputs, r: int, f: Facts, rr: RankReport) -> None:
    """The ConnectX-7 firmware (/sys/class/infiniband/<hca>/fw_ver): the same on every rank."""
    name = "cx7 firmware"
    if not f.fw_versions:
        why = "no RDMA devices" if not f.rdma else "no fw_ver under /sys/class/infiniband"
        rr.add(name, Status.WARN, f"not measured: {why}", "see the roce row")
        return
    values = {p: " / ".join(x.fw_versions) for p, x in inp.facts.items() if x.fw_versions}
    _drift_row(rr, name, values, r, f"fw {values[r]}",
               "flash the same ConnectX-7 firmware on every rank (`sudo mlxfwmanager --online -u`, or "
               "the DGX OS update that carries it), then reboot it")


def _short(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:12]


def _check_gpu(inp: Inputs, r: int, f: Facts, rr: RankReport) -> None:
    if not inp.loaded.cluster.container.gpus:
        shown = f"; nvidia-smi shows {f.gpu.name}" if f.gpu else ""
        rr.add("gpu", Status.PASS, f"not required by config (container.gpus: null){shown}")
    elif f.gpu is None:
        why = next((p for p in f.problems if p.startswith("nvidia-smi")), "nvidia-smi lists no GPU")
        rr.add("gpu", Status.FAIL, why, "install the NVIDIA driver and container toolkit (DGX OS ships "
               "them); `nvidia-smi` must list the GB10")
    else:
        rr.add("gpu", Status.PASS, f"{f.gpu.name}, driver {f.gpu.driver}")


def _check_memory(inp: Inputs, r: int, f: Facts, rr: RankReport) -> None:
    if f.memory is None:
        rr.add("memory", Status.FAIL, "/proc/meminfo unreadable", "check the rank's /proc")
        return
    if inp.need is None:
        rr.add("memory", Status.FAIL, f"MemAvailable {gib(f.memory.available)}; the plan's need is "
               f"unknown: {inp.need_error}", "fix the config or profile (see `sparkstack plan`)")
        return
    avail, need = f.memory.available, inp.need
    shown = f"MemAvailable {gib(avail)}, needs {gib(need.total)} = {need.explain()}"
    largest = max(x.memory.available for x in inp.facts.values() if x.memory)
    if avail < need.total:
        rr.add("memory", Status.FAIL, shown.replace(", needs", " < needs"),
               "sparkstack prep (drops page caches); stop what else holds memory "
               "(`docker ps`, `ps aux --sort=-rss | head`); or lower --max-model-len / headroom_gib")
    elif f.memory.cached > PAGE_CACHE_WARN:
        rr.add("memory", Status.WARN, f"{shown}; {gib(f.memory.cached)} is page cache, which vLLM "
               "counts as used", "sparkstack prep (drops page caches)")
    elif largest - avail > need.headroom:
        rr.add("memory", Status.WARN, f"{shown}; {gib(largest - avail)} less than the fullest rank: "
               "every rank's KV cache is sized to this one", "free memory on this rank "
               "(`ps aux --sort=-rss | head`), then sparkstack prep")
    else:
        rr.add("memory", Status.PASS, f"{shown}; margin {gib(avail - need.total)}")


def _check_vllm_guard(inp: Inputs, r: int, f: Facts, rr: RankReport) -> None:
    """vLLM refuses to start when free memory < MemTotal × --gpu-memory-utilization
    (launcher/inputs/vllm_guard.py); the fix names the utilisation every rank clears with the margin."""
    name, engine = "vllm guard", inp.loaded.profile.engine
    if engine != "vllm":
        rr.add(name, Status.PASS, f"not vLLM ({engine}): no startup memory guard")
        return
    if f.memory is None:
        rr.add(name, Status.FAIL, "/proc/meminfo unreadable", "check the rank's /proc")
        return
    try:
        guard = inp.guard()
    except SparkstackError as e:
        rr.add(name, Status.FAIL, e.message, "fix the config or profile (see `sparkstack plan`)")
        return
    g = next(x for x in guard.ranks if x.rank == r)
    free_more = ("free memory on this rank: sparkstack prep (drops page caches), stop what else "
                 "holds memory (`ps aux --sort=-rss | head`)")
    if g.highest <= 0:
        rr.add(name, Status.FAIL, f"no --gpu-memory-utilization clears vLLM's guard: free {gib(g.free)} "
               f"(MemAvailable {gib(g.mem_available)} − runtime {gib(g.runtime_overhead)}) of "
               f"MemTotal {gib(g.mem_total)}", free_more)
        return
    util, whose = guard.utilization, {"plan": "planned", "profile": "the profile's",
                                      "config": "cluster.yaml's"}[guard.source]
    if util is None:  # another rank clears nothing: its row fails
        rr.add(name, Status.PASS, f"clears up to {g.highest} with margin {g.margin}")
        return
    shown = f"--gpu-memory-utilization {util} ({whose}): {g.explain()}"
    use = (f"set --gpu-memory-utilization {guard.highest} or less in cluster.yaml "
           "overrides.engine_args (or drop it: the plan picks one)")
    if g.refusal:
        rr.add(name, Status.FAIL, f"{shown}; vLLM refuses: ValueError: {g.refusal}",
               use if guard.highest > 0 else free_more)
    elif util > g.highest:
        rr.add(name, Status.WARN, f"{shown}; less than the margin {g.margin} to spare: MemAvailable "
               "moves before the worker measures", use)
    else:
        rr.add(name, Status.PASS, f"{shown}; clears up to {g.highest} with margin {g.margin}")


def _check_free_while_serving(inp: Inputs, r: int, f: Facts, rr: RankReport) -> None:
    """The memory this rank keeps free once the engine holds its weights, runtime and KV pool,
    from its measured MemAvailable (plan shows the same from the config's figures): the seeds
    keep ~9-15 GB free on every Spark; below overrides.free_floor_gib a GB10 freezes, not OOMs."""
    name, floor = "free while serving", int(inp.loaded.cluster.overrides.free_floor_gib * GIB)
    if f.memory is None or inp.need is None:
        why = "/proc/meminfo unreadable" if f.memory is None else f"the plan's need is unknown: {inp.need_error}"
        rr.add(name, Status.FAIL, why, "fix the memory row first")
        return
    sizing = inp.kv()
    if isinstance(sizing, str):
        rr.add(name, Status.FAIL, f"no KV pool fits: {sizing}", "see `sparkstack plan`")
        return
    free = sizing.free_while_serving(f.memory.available)
    shown = f"{gib(free)} = {planning.explain_free(sizing, f.memory.available)}"
    if free < floor:
        rr.add(name, Status.FAIL, f"{shown} < overrides.free_floor_gib {gib(floor)}",
               planning.free_floor_fix(inp.loaded))
    else:
        rr.add(name, Status.PASS, f"{shown}; floor {gib(floor)} (the seeds keep ~9-15 GB)")


def _check_swap(inp: Inputs, r: int, f: Facts, rr: RankReport) -> None:
    m = f.memory
    if m is None or m.swap_total == 0:
        rr.add("swap", Status.PASS, "none")
        return
    used = m.swap_total - m.swap_free
    if no_swap(inp.loaded):
        where = ("overrides.no_swap" if inp.loaded.cluster.overrides.no_swap is not None
                 else f"profile {inp.loaded.profile.name}")
        rr.add("swap", Status.FAIL, f"{gib(m.swap_total)} on ({gib(used)} used); {where} says no swap",
               "`sparkstack prep` turns it off (swapoff -a, swap lines of /etc/fstab commented out), "
               "or the Ansible role spark_node")
        return
    if used > SWAP_USED_WARN:
        rr.add("swap", Status.WARN, f"{gib(used)} of {gib(m.swap_total)} swapped out: memory was squeezed",
               "find what pushed it out (`ps aux --sort=-rss`); `sudo swapoff -a && sudo swapon -a` empties it")
    else:
        rr.add("swap", Status.PASS, f"{gib(m.swap_total)}, {gib(used)} used")


def _check_sysctls(inp: Inputs, r: int, f: Facts, rr: RankReport) -> None:
    want = node_settings.sysctls(inp.loaded.cluster)
    wrong = [f"{k}={f.sysctls.get(k) or 'absent'} (want {v})" for k, v in want.items()
             if f.sysctls.get(k) != str(v)]
    if wrong:
        rr.add("sysctls", Status.WARN, ", ".join(wrong), "sparkstack prep (and the Ansible role for after reboots)")
    else:
        rr.add("sysctls", Status.PASS, ", ".join(f"{k}={v}" for k, v in want.items()))


def _limit(n: int, item: str) -> str:
    if n == UNLIMITED:
        return "unlimited"
    if item == "memlock" and n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20} MiB"
    return str(n)


def _above(a: int, b: int) -> bool:
    """a > b, -1 being unlimited."""
    return a != b and (a == UNLIMITED or (b != UNLIMITED and a > b))


def _check_ulimits(inp: Inputs, r: int, f: Facts, rr: RankReport) -> None:
    """What a container can get is what the config asks of `docker run --ulimit`, capped by
    dockerd: with CAP_SYS_RESOURCE (a root dockerd on a real Spark) up to the kernel's ceilings,
    without it (the sandbox) its own hard limits."""
    c = inp.loaded.cluster.container
    extra = inp.extras.get(r)
    can_raise = extra.dockerd_can_raise if extra else None
    daemon = f.docker_ulimits.daemon
    if can_raise is None and daemon is None:
        rr.add("ulimits", Status.WARN, "dockerd's limits not readable", "is dockerd running? (`pgrep -a dockerd`)")
        return
    parts, status, fix = [], Status.PASS, ""
    for item, asked, seed in (("nofile", c.nofile, SEED_NOFILE), ("memlock", c.memlock, UNLIMITED)):
        ceiling, how = _grantable(item, f, daemon, can_raise)
        parts.append(f"{item} asks {_limit(asked, item)}, grantable {_limit(ceiling, item)} ({how})")
        if _above(asked, ceiling):
            status, fix = Status.FAIL, (f"raise dockerd's {item} limit (LimitNOFILE=/LimitMEMLOCK=infinity in "
                                        f"docker.service) or lower container.{item} in cluster.yaml")
        elif status == Status.PASS and (_above(seed, ceiling) or _above(seed, asked)):
            status, fix = Status.WARN, (f"the seeds use nofile {SEED_NOFILE} / memlock unlimited (NCCL at 4 "
                                        "ranks, RDMA): set container.nofile/memlock to those and raise dockerd's limits (LimitNOFILE=/LimitMEMLOCK=infinity) to allow them")
    rr.add("ulimits", status, "; ".join(parts), fix)


def _grantable(item: str, f: Facts, daemon, can_raise: bool | None) -> tuple[int, str]:
    """The most `docker run --ulimit <item>=` can get on this rank, and why."""
    own = getattr(daemon, item, None) if daemon else None
    if can_raise or own is None:
        if item == "nofile":
            return _int(f.sysctls.get("fs.nr_open")) or SEED_NOFILE, "kernel fs.nr_open"
        return UNLIMITED, "kernel"
    return own.hard, "dockerd hard limit"


def _int(text) -> int | None:
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def _from_findings(rr: RankReport, name: str, findings, names: tuple[str, ...]) -> None:
    mine = [x for x in findings if x.name in names]
    if not mine:
        rr.add(name, Status.FAIL, "not assessed (no fabric port found)", "see the link row")
        return
    worst = next((x for s in (Status.FAIL, Status.WARN) for x in mine if x.status == s), None)
    shown = "; ".join(x.value for x in mine if x.status != Status.PASS) if worst else \
        "; ".join(x.value for x in mine)
    rr.add(name, worst.status if worst else Status.PASS, shown, worst.fix if worst else "")


def _check_link(inp: Inputs, r: int, f: Facts, rr: RankReport) -> None:
    _from_findings(rr, "link", inp.fabric(r).findings, _LINK_FINDINGS)


def _check_roce(inp: Inputs, r: int, f: Facts, rr: RankReport) -> None:
    _from_findings(rr, "roce", inp.fabric(r).findings, _ROCE_FINDINGS)


def _check_mtu(inp: Inputs, r: int, f: Facts, rr: RankReport) -> None:
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


def _check_peers(inp: Inputs, r: int, f: Facts, rr: RankReport) -> None:
    _pings(inp, r, rr, df=False)


def _check_jumbo(inp: Inputs, r: int, f: Facts, rr: RankReport) -> None:
    _pings(inp, r, rr, df=True)


def _pings(inp: Inputs, r: int, rr: RankReport, df: bool) -> None:
    name = "jumbo" if df else "peers"
    targets = [t for t in inp.targets.get(r, []) if not df or t.df_size]
    extra = inp.extras.get(r)
    ring = inp.loaded.cluster.topology == "ring"
    if df and inp.targets.get(r) and not targets:
        rr.add(name, Status.PASS, f"not measured: the fabric MTU is not {fabric.JUMBO_MTU}")
        return
    if not targets and not ring:  # a ring's links are judged from both ends: its neighbours' pings
        rr.add(name, Status.WARN if not df else Status.PASS, "not measured: no peer fabric IPs",
               "list every rank's fabric_ips in cluster.yaml")
        return
    if extra is None or extra.error:
        rr.add(name, Status.FAIL, f"not measured: {extra.error if extra else 'no answer'}", "re-run check")
        return
    if extra.ping_missing:
        rr.add(name, Status.WARN, "not measured: no `ping` on the rank", "apt install iputils-ping")
        return
    if ring:
        _ring_links(inp, r, rr, df)
        return
    bad, good = [], []
    for t in targets:
        answer = _answer(inp, r, t, df)
        (good if answer.ok else bad).append(_label(t, df) + ("" if answer.ok else f": {answer.detail or 'no reply'}"))
    ok = f"{len(good)}/{len(targets)} answer"
    if bad:
        fix = ("a path in between fragments or drops jumbo frames: same MTU on both ends and the "
               "switch" if df else "check the cable/switch port and the peer's address (`ip addr`)")
        rr.add(name, Status.FAIL, f"{ok}; unreachable: " + "; ".join(bad), fix)
    else:
        rr.add(name, Status.PASS, f"{ok}: " + ", ".join(good))


def _answer(inp: Inputs, r: int, t: PingTarget, df: bool) -> PingAnswer:
    return inp.extras[r].pings.get((t.ip, df), PingAnswer(False, "no result"))


def _label(t: PingTarget, df: bool) -> str:
    return f"rank {t.peer if t.peer >= 0 else '?'} {t.ip}" + (f" ({t.df_size + 28} B DF)" if df else "")


def _ring_links(inp: Inputs, r: int, rr: RankReport, df: bool) -> None:
    """Rank r's two ring links (to r-1 and r+1), each judged from both ends' pings: a link that
    does not answer both ways fails here and, by the same rule, on the other end too."""
    name = "jumbo" if df else "peers"
    n = len(inp.loaded.cluster.ranks)
    neighbours = sorted({(r - 1) % n, (r + 1) % n} - {r})
    good, bad, unjudged = [], [], []
    for p in neighbours:
        if p not in inp.facts:
            unjudged.append(f"rank {p} did not answer")
            continue
        answers = _link_answers(inp, r, p, df) + _link_answers(inp, p, r, df)
        failed = [f"rank {a} → {_label(t, df)}: {got.detail or 'no reply'}" for a, t, got in answers if not got.ok]
        if not answers:
            elsewhere = [_label(t, df) for t in inp.targets.get(r, []) if t.peer not in neighbours]
            failed = [f"no addressed cable between rank {r} and rank {p} found"
                      + (f" (this rank's cables end at {', '.join(elsewhere)})" if elsewhere else "")]
        if failed:
            bad.append(f"ring link to rank {p} unreachable: " + "; ".join(failed))
        else:
            good += [_label(t, df) for _, t, _ in _link_answers(inp, r, p, df)]
    if bad:
        fix = ("a link drops 9000 B frames: mtu 9000 on both ends of its cable (netplan)" if df else
               "check the cable between the two ranks and both ends' addresses (`ip addr`); list the "
               "ranks in cable order (each rank cabled to the next, the last to the first)")
        rr.add(name, Status.FAIL, "TP needs every link of the ring: " + " | ".join(bad + unjudged), fix)
    elif unjudged:
        rr.add(name, Status.WARN, f"links up: {', '.join(good) or 'none'}; not judged: " + ", ".join(unjudged),
               "see that rank's ssh row")
    else:
        rr.add(name, Status.PASS, "ring links answer both ways: " + ", ".join(good))


def _link_answers(inp: Inputs, a: int, b: int, df: bool) -> list[tuple[int, PingTarget, PingAnswer]]:
    """What rank a's pings to rank b's end of their cables got (none when a's were not measured)."""
    extra = inp.extras.get(a)
    if extra is None or extra.error or extra.ping_missing:
        return []
    return [(a, t, _answer(inp, a, t, df)) for t in inp.targets.get(a, []) if t.peer == b and (not df or t.df_size)]


def _check_nccl(inp: Inputs, r: int, f: Facts, rr: RankReport) -> None:
    """The host NCCL build (nccl.host_lib): on every rank, and the same build everywhere."""
    lib = inp.loaded.cluster.nccl.host_lib
    if not lib:
        rr.add("nccl", Status.PASS, "the image's own (nccl.host_lib not set)")
        return
    mine = f.nccl_lib
    if mine is None or not mine.present:
        rr.add("nccl", Status.FAIL, (mine.problem if mine else None) or f"{lib}: not looked for",
               f"install the same NCCL build at {lib} on every rank, or remove nccl.host_lib from cluster.yaml")
        return
    builds = {p: _build_text(_build(x.nccl_lib)) for p, x in inp.facts.items() if x.nccl_lib and x.nccl_lib.present}
    shown = f"{lib} ({mine.realpath}): {builds[r]}"
    odd, said = compare(builds, r)
    if odd:
        rr.add("nccl", Status.FAIL, f"{shown}: {said}",
               f"install the same NCCL build at {lib} on every rank (ranks with different builds "
               "cannot form one communicator)")
    elif mine.problem or mine.version is None:
        rr.add("nccl", Status.WARN, f"{shown}; {mine.problem or 'no NCCL version string in the file'}",
               f"is it an NCCL library? `strings {lib} | grep 'NCCL version'`")
    else:
        rr.add("nccl", Status.PASS, shown + (f", {said}" if said else ""))


def _build(lib) -> tuple[str | None, int | None]:
    return lib.version, lib.size


def _build_text(build: tuple[str | None, int | None]) -> str:
    version, size = build
    return f"NCCL {version or '(version unknown)'}, {size:,} B" if size is not None else f"NCCL {version}"


def _check_checkpoint(inp: Inputs, r: int, f: Facts, rr: RankReport) -> None:
    _checkpoint_row(inp, r, f, rr)
    _check_staged(inp, r, f, rr)


def _checkpoint_row(inp: Inputs, r: int, f: Facts, rr: RankReport) -> None:
    path = inp.loaded.cluster.model.serving_path  # the staged copy when model.local_path is set
    c = f.checkpoint
    if c is None or not c.shards:
        why = next((p for p in f.problems if p.startswith("checkpoint")), f"no *.safetensors in {path}")
        if NOT_ANSWERING in why:
            rr.add("checkpoint", Status.FAIL, f"NFS server not answering: {why}", _nfs_fix(inp.loaded, f))
            return
        staged = inp.loaded.cluster.model.local_path is not None
        rr.add("checkpoint", Status.FAIL, why, f"copy the checkpoint to {path} on every rank: `sparkstack stage`"
               if staged else f"mount the checkpoint at {path} on every rank (sparkstack prep)")
        return
    prints = Counter(x.checkpoint.fingerprint for x in inp.facts.values() if x.checkpoint and x.checkpoint.shards)
    common = prints.most_common(1)[0][0]
    mount = f" on {f.model_mount.source} ({f.model_mount.fstype})" if f.model_mount else ""
    shown = f"{path}{mount}: {len(c.shards)} shards, {gib(c.total_bytes)}, fingerprint {c.fingerprint[:12]}"
    if len(prints) > 1 and c.fingerprint != common:
        rr.add("checkpoint", Status.FAIL, f"{shown}, other ranks {common[:12]}",
               "every rank must see the same files: mount the one NFS export (a partial copy differs)")
    else:
        rr.add("checkpoint", Status.PASS, shown + (", same on all ranks" if len(prints) == 1 else ""))


def _check_staged(inp: Inputs, r: int, f: Facts, rr: RankReport) -> None:
    """With model.local_path: every file of model.path in the rank's copy, same size and mtime."""
    from ..plan import staging

    m = inp.loaded.cluster.model
    if m.local_path is None:
        return
    listing = inp.staged.get(r, "not listed")
    if isinstance(listing, str):
        rr.add(STAGED, Status.WARN, f"{m.local_path} not compared with {m.path}: {listing}", "re-run check")
        return
    s = staging.rank_stage(r, "", listing, m.path, m.local_path)
    if s.error:
        rr.add(STAGED, Status.WARN, f"{m.local_path} not compared: {s.error}",
               "the engine reads the local copy; mount model.path to have it compared (`sparkstack prep`)")
    elif s.todo:
        first = s.todo[0]
        rr.add(STAGED, Status.FAIL, f"{len(s.todo)} of {len(s.files)} files of {m.path} not in place in "
               f"{m.local_path} ({first.name}: {first.state}), {s.to_copy / 1e6:,.1f} MB to copy",
               "copy them: `sparkstack stage` (resumes, copies only what is missing)")
    elif s.extra:
        rr.add(STAGED, Status.WARN, f"{m.local_path} holds {len(s.extra)} files that {m.path} lacks "
               f"({', '.join(s.extra[:3])}{', ...' if len(s.extra) > 3 else ''})",
               f"remove them on this rank (`rm {m.local_path}/NAME`): the engine reads every *.safetensors there")
    else:
        rr.add(STAGED, Status.PASS, f"{m.local_path}: {len(s.files)} files, the size and mtime of {m.path}'s")


def _check_load(inp: Inputs, r: int, f: Facts, rr: RankReport) -> None:
    """Which link carries the rank's checkpoint reads, and the cold load it makes (issue 15)."""
    nfs = inp.loaded.cluster.model.nfs
    p = load_path.for_ranks(inp.facts, nfs.server if nfs else None).get(r)
    if p is None:
        rr.add("load", Status.WARN, "not estimated: the checkpoint or its mount was not read",
               "fix the checkpoint row first")
        return
    shown = p.describe()
    if p.seconds and p.seconds * load_path.MARGIN > DEFAULT_WAIT_S:
        shown += f"; `up` waits {p.seconds * load_path.MARGIN:.0f} s for the API"
    if p.faster:
        name, speed = p.faster
        fast = load_path.LoadPath(r, p.kind, p.bytes, p.source, p.server, name, speed, sharing=p.sharing)
        rr.add("load", Status.WARN, shown,
               f"the checkpoint is read over a {p.speed_mbps / 1000:g} Gb/s port while {name} runs at "
               f"{speed / 1000:g} Gb/s (~{load_path.minutes(fast.seconds)}): mount it from the file "
               f"server's address on that network (model.nfs.server, then `sparkstack prep`), or stage "
               "it on the local disk")
    elif p.seconds is None:
        rr.add("load", Status.WARN, shown, f"the speed of {p.iface or 'the interface'} is not reported "
               "(sysfs): no cold-load estimate; `up` waits its --timeout")
    else:
        rr.add("load", Status.PASS, shown)


def _nfs_fix(loaded: Loaded, f: Facts) -> str:
    """Reading the model dir hung: the server to look at, and the mount that bounds the hang."""
    path, nfs = loaded.cluster.model.path, loaded.cluster.model.nfs
    server = (f"{nfs.server}:{nfs.export}" if nfs else
              f.model_mount.source if f.model_mount else f"the server behind {path}")
    wanted = ", ".join(node_settings.NFS_HANG_OPTIONS.split(","))
    return (f"check the NFS server {server} (is it up, its NFS service running, the export in "
            f"`showmount -e`?); on this rank `findmnt -o OPTIONS {path}` should include {wanted}: a "
            f"hard mount hangs every reader until the server is back (remount: `umount -l {path}`, "
            "then `sparkstack prep`)")


def _check_disk(inp: Inputs, r: int, f: Facts, rr: RankReport) -> None:
    d = f.docker
    if d is None or d.storage_avail is None:
        rr.add("disk", Status.WARN, "Docker's storage not readable", "fix the docker row first")
        return
    sizes = [img.size for x in inp.facts.values() if x.docker and inp.image
             for img in [x.docker.image(inp.image)] if img and img.size]
    missing = inp.image and d.image(inp.image) is None
    need = (max(sizes) if sizes and missing else 0)
    shown = f"{d.root_dir}: {gib(d.storage_avail)} free" + (f", image needs up to {gib(need)}" if need else "")
    if d.storage_avail < need:
        rr.add("disk", Status.FAIL, shown, f"free space under {d.root_dir} (`docker image prune`)")
    elif d.storage_avail < need + DISK_FLOOR:
        rr.add("disk", Status.WARN, shown, f"keep {gib(DISK_FLOOR)} free beyond the images (`docker image prune`)")
    else:
        rr.add("disk", Status.PASS, shown)


def _check_clock(inp: Inputs, r: int, f: Facts, rr: RankReport) -> None:
    offsets = {p: x.clock.offset for p, x in inp.facts.items() if x.clock.offset is not None}
    if r not in offsets:
        rr.add("clock", Status.WARN, "not measured", "re-run check")
        return
    median = statistics.median(offsets.values())
    delta, unc = offsets[r] - median, f.clock.uncertainty or 0.0
    shown = f"{delta:+.2f} s from the ranks' median (±{unc:.2f}; {offsets[r]:+.2f} s from this host)"
    if abs(delta) - unc > CLOCK_TOLERANCE_S:
        rr.add("clock", Status.FAIL, shown, "enable NTP on every rank: sudo timedatectl set-ntp true")
    else:
        rr.add("clock", Status.PASS, shown)


def _check_api_key(inp: Inputs, r: int, f: Facts, rr: RankReport) -> None:
    """Rank 0 serves the API on the host network: does it ask for a key (launcher/inputs/apikey.py)?"""
    if r != 0:
        return
    key = inp.api_key
    if key.warning:
        fix = ("remove overrides.open_api to serve with a generated key" if key.source == apikey.OPEN
               else "keep rank 0's API port on a private network, or put an authenticating proxy before it")
        rr.add("api key", Status.WARN, key.warning, fix)
    else:
        rr.add("api key", Status.PASS, "required: " + key.describe())


CHECKS = {name: globals()[f"_check_{name.replace(' ', '_')}"] for name in ORDER[1:]}


# --- gathering and running ---------------------------------------------------------------------

def collect(loaded: Loaded, group, image: str | None = None) -> Inputs:
    """Per rank, in parallel: the probe, then at once one more command that pings the peers'
    fabric IPs and reads dockerd's capabilities. The local part (the plan's memory need, the
    image's tag and local ID) runs meanwhile. Never raises for a rank's failure: a rank whose
    part raised is reported like one that did not answer, the others as they answered."""
    from concurrent.futures import ThreadPoolExecutor

    from ..transport import gather
    from . import staged as staged_mod

    staged: dict[int, dict | str] = {}

    def rank(conn) -> tuple[gather.RankFacts, list[PingTarget], Extras | None]:
        """Probe, then at once this rank's pings: no waiting for the slowest rank's probe."""
        found = gather.probe_rank(conn, loaded)
        if found.facts is None:
            return found, [], None
        targets = rank_ping_targets(loaded, conn.target.rank, found.facts)
        command, stdin = extras_invocation(targets)
        result = conn.run(command, stdin=stdin, timeout=PING_WAIT_S + 10)
        extra = parse_extras(result.stdout, targets) if result.ok else Extras({}, error=result.why())
        if loaded.cluster.model.local_path:  # the staged copy against its source, by size and mtime
            staged[conn.target.rank] = staged_mod.list_rank(conn, loaded)
        return found, targets, extra

    with ThreadPoolExecutor(max_workers=1) as local:
        here = local.submit(_local_inputs, loaded, image)
        answers = [o.value if o.ok else (gather.failed(o), [], None) for o in group.gather(rank)]
        inp = here.result()
    inp.gathered = {g.rank: g for g, _, _ in answers}
    facts = inp.facts
    inp.targets = {g.rank: resolve_peers(t, facts) for g, t, _ in answers if g.facts is not None}
    inp.extras = {g.rank: e for g, _, e in answers if e is not None}
    inp.staged = staged
    return inp


def _local_inputs(loaded: Loaded, image: str | None) -> Inputs:
    """What this host knows: the memory the plan needs and the serving image's tag and ID."""
    from ..images import build as image_build
    from . import plan_inputs

    inp = Inputs(loaded, {}, None)
    try:
        inp.model = plan_inputs.read_model(loaded)
        inp.need = planning.memory_need(loaded, inp.model)
    except SparkstackError as e:
        inp.need_error = e.message
    if image is None:
        image, notes = image_build.serving_image(loaded)
        if image.endswith(":unbuilt"):
            image, inp.image_error = None, "; ".join(notes)
    inp.image = image
    inp.local_image_id = image_build.local_base_id(image) if image else None
    return inp


def add_bandwidth(report: Report, inp: Inputs, group) -> None:
    """`check --bandwidth`: one more row per rank that answered, an NCCL all-reduce across all
    ranks in the serving image (launcher/check/bandwidth.py), over the same open Group."""
    from . import bandwidth

    found = bandwidth.check(inp.loaded, group, image=inp.image, facts=inp.facts,
                            image_error=inp.image_error).findings
    for rr in report.ranks:
        if rr.rank in found:
            f = found[rr.rank]
            rr.add("bandwidth", f.status, f.value, f.fix)


def add_hashes(report: Report, inp: Inputs, group) -> None:
    """`check --deep`: every rank hashes its checkpoint files (launcher/check/hashes.py)."""
    from . import hashes

    found = hashes.verify(inp.loaded, group, inp.facts)
    for rr in report.ranks:
        if rr.rank in found:
            f = found[rr.rank]
            rr.add("hashes", f.status, f.value, f.fix)


def run(loaded: Loaded, *, trust_new: bool = False, image: str | None = None, say=None,
        bandwidth: bool = False, deep: bool = False) -> Report:
    """The whole `check`: connect (one attempt each, the config's connect timeout), collect,
    evaluate; with `bandwidth`, the all-reduce row too; with `deep`, the checkpoint's hashes."""
    import time

    from ..transport import gather

    started = time.monotonic()
    with gather.open_group(loaded, trust_new=trust_new, say=say) as group:
        inp = collect(loaded, group, image)
        report = evaluate(inp)
        if bandwidth:
            add_bandwidth(report, inp, group)
        if deep:
            add_hashes(report, inp, group)
    report.seconds = time.monotonic() - started
    return report


class CheckFailed(SparkstackError):
    """The preflight found failures; the message lists each with its rank and fix."""


def plan_or_refuse(loaded: Loaded, group, image: str | None = None,
                   tolerate: tuple[str, ...] = ("image",)) -> Plan:
    """What `up` calls before starting anything: check every rank over the open Group; a failed
    row raises CheckFailed (nothing is started); else the plan made from these facts. Rows in
    `tolerate` do not stop it: by default the image, which `up` builds and ships after this."""
    from . import plan_inputs

    inp = collect(loaded, group, image)
    report = evaluate(inp)
    failed = [(r, c) for r in report.ranks for c in r.checks if c.status == Status.FAIL and c.name not in tolerate]
    if failed:
        raise CheckFailed("check failed; nothing was started:\n" + "\n".join(
            f"rank {r.rank} ({r.host}) {c.name}: {c.value} -- fix: {c.fix}" for r, c in failed))
    return plan_inputs.build_plan(loaded, inp.facts)
