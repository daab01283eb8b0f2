"""The Facts record: what the probe saw of a rank, assembled from the subject modules' parts.

The probe (`launcher/onrank/probe.py`) runs once per rank and prints raw outputs; each subject
module beside this one (memory, limits, network, rdma, docker, mounts, checkpoint_dir, gpu, disks,
clock, nccl_lib, kernel) holds its facts' types and pure parsers -- raw text or a raw dict in, a
frozen dataclass out -- so each is tested on real-format output without a rank
(tests/facts_cases/*.json, pyinfra-style), and declares a `Part` per field of Facts it fills: the
probe output it reads and its parser. `parse_facts` runs the parts of `PARTS` in order and turns
every missing or broken source into a line of `Facts.problems` rather than an exception: `check`
shows what it can and says what it could not see. Output in a shape the probe never prints (wrong
types, extra structure) is a ShapeError naming the part, checked against the types Facts declares:
that rank fails, never `check` or the plan further on.

The probe's contract (`invocation` builds it): the caller runs exactly ONE command,
`python3 - '<args JSON>'`, with the probe's source on stdin, and reads one JSON object from
stdout. Sizes are bytes, speeds Mb/s (as sysfs reports them), limits -1 when unlimited.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from functools import cache
from ipaddress import IPv4Address, IPv6Address
from pathlib import PurePosixPath

from .. import onrank
from . import checkpoint_dir, clock, disks, docker, gpu, kernel, limits, memory, mounts, nccl_lib, network, rdma
from .checkpoint_dir import Checkpoint
from .clock import Clock
from .disks import Disk
from .docker import Docker, api_problem
from .gpu import CdiSpec, Driver, Gpu, GpuClocks
from .limits import DockerUlimits, Ulimits
from .memory import Memory
from .mounts import Mount
from .nccl_lib import NcclLib
from .network import Interface, Route
from .parts import FactError, Part, ShapeError
from .rdma import RdmaDevice

PROBE_SOURCE = onrank.path("probe")
PROBE_VERSION = 1


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
    sysfs_root: str = "/"  # "/" on a Spark; a sandbox rank's fixture tree
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


# --- the sources the rank could not read -------------------------------------------------------

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
        problems.append(api_problem(api))
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

# Every field of Facts but `problems`, as its subject declares it, in the order they are read:
# the order of `problems`' lines, and the part a rank's error names when several are broken.
PARTS: tuple[Part, ...] = (
    mounts.MODEL_MOUNT, kernel.HOSTNAME, kernel.KERNEL, memory.MEMORY, kernel.SYSCTLS, limits.ULIMITS,
    limits.DOCKER_ULIMITS, network.INTERFACES, rdma.RDMA, docker.DOCKER, mounts.MOUNTS, checkpoint_dir.CHECKPOINT,
    gpu.GPU, disks.DISKS, clock.CLOCK, network.SSH_ADDRESS, network.DEFAULT_ROUTE_IF, network.ROUTES,
    nccl_lib.NCCL_LIB, kernel.PAGE_SIZE, kernel.SYSFS_ROOT, gpu.DRIVER, gpu.GPU_CLOCKS, gpu.CDI_SPECS, gpu.NVIDIA_CTK,
)


def _fill(part: Part, raw: dict, local: dict, problems: list[str]):
    """The value of `part`'s field; a source the rank could not read, where the part allows it,
    is a line of `problems` and the part's default."""
    args = [read(raw, local) for read in part.reads]
    try:
        value = _part(part.what, part.checked_as or part.field, part.parse, *args)
    except ShapeError:
        raise
    except FactError as e:
        if not part.problem:
            raise
        problems.append(str(e))
        value = part.default
    return part.pick(value) if part.pick else value


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
    local = {"sent": sent, "received": received}
    fields = {part.field: _fill(part, raw, local, problems) for part in PARTS}
    return Facts(**fields, problems=tuple(problems))
