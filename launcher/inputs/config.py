"""The cluster config (`cluster.yaml`): the ranks, the fabric topology, the model, the profile.

Found at `--config/-c`, else `$SPARKSTACK_CONFIG`, else `./cluster.yaml`. Validated strictly:
every problem is reported with the file and the field path, unknown keys included.
`env/cluster.example.yaml` documents each field.
"""

from __future__ import annotations

import os
import re
import shlex
import unicodedata
from ipaddress import IPv4Address, ip_address
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, PositiveInt, field_validator, model_validator

from . import vllm_flags, vllm_guard
from .. import engines, redact
from ..errors import ConfigError, load_yaml_model
from .profile import PROFILES_DIR, EnvVars, Gib, Profile, Strict, load_profile, one_of

DEFAULT_CONFIG = Path("cluster.yaml")


def _expand_user(path: Path) -> Path:
    try:
        return path.expanduser()
    except RuntimeError:  # ~name of no user here
        raise ValueError(f"{str(path).split('/')[0]}: no such user on this host") from None


def control_chars(text: str) -> list[str]:
    """The line separators (every one str.splitlines() splits on: Ansible's INI parser, among
    others, starts a new line there) and the other control characters in `text`."""
    return sorted({c for c in text if unicodedata.category(c) in ("Cc", "Zl", "Zp")})


def _one_line(value):
    """A config string that reaches a file another program splits into lines (the Ansible
    inventory, fstab, docker's env file, a shell): one line of printable text."""
    bad = control_chars(str(value))
    if bad:
        raise ValueError(f"holds a line break or control character ({', '.join(map(repr, bad))}), "
                         "which would start a new line where it is written (the Ansible inventory, "
                         "fstab): remove it")
    return value


OneLine = Annotated[str, AfterValidator(_one_line)]
UserPath = Annotated[Path, AfterValidator(_one_line), AfterValidator(_expand_user)]


def _mountable(path: str) -> str:
    if not path.startswith("/"):
        raise ValueError("must be an absolute path, the same on every rank")
    if ":" in path or "\0" in path:
        raise ValueError("must not contain ':' or NUL (docker -v PATH:PATH:ro splits on ':'); "
                         "rename the directory or mount it elsewhere")
    return _one_line(path)


MountPath = Annotated[str, AfterValidator(_mountable)]  # bind-mounted at the same path on every rank

# Trees no cache root of the kit's belongs in: the system's, and the world-writable ones.
_SYSTEM_TREES = {"bin", "boot", "dev", "etc", "lib", "lib32", "lib64", "proc", "run", "sbin", "sys", "usr", "tmp"}
# Directories other software shares out (their entries are not the kit's).
_SHARED_DIRS = {"/var/cache", "/var/lib", "/var/tmp", "/var/log", "/var/spool", "/var/opt", "/var/local",
                "/var/backups", "/var/mail", "/var/run", "/var/lock"}


def _own_cache_root(path: str) -> str:
    """container.cache_dir: a directory of the kit's own, two levels deep at least, outside the
    system's trees, not a shared one (/var/cache) nor a home directory. `down --purge-caches`
    removes only what the kit marked there (launcher/plan/caches.py), and this keeps a stray
    value (`/`, `/var`, `/home`) from naming a directory everyone's files live in."""
    parts = path.strip("/").split("/")
    why = None
    if any(p in ("", ".", "..") for p in parts):
        why = "write it without '.', '..' or '//'"
    elif len(parts) < 2:
        why = "a top-level directory is shared by everything on the rank"
    elif parts[0] in _SYSTEM_TREES:
        why = f"/{parts[0]} is the system's (or everyone's) tree"
    elif "/" + "/".join(parts) in _SHARED_DIRS:
        why = "other software keeps its own entries there"
    elif parts[0] in ("home", "root") and len(parts) == 2:
        why = "that is a home directory"
    if why:
        raise ValueError(f"{path} is not a directory of the kit's own ({why}); name one like "
                         "/var/cache/sparkstack, or null for no compile caches")
    return path


class SshSettings(Strict):
    known_hosts: UserPath | None = None  # default: ~/.ssh/known_hosts
    connect_timeout_s: PositiveInt = 10
    # a rank that acknowledges nothing for this long mid-command is declared lost (cut cable,
    # power): the command fails naming it instead of waiting for its own timeout
    dead_after_s: PositiveInt = 30


# Addresses and names reach shell command lines, `docker run`, Ansible inventories and SSH
# options: only what a host name or an address can be is let in, so none of them can carry
# shell syntax, inventory variables or options.
_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")  # RFC 1123
_RANK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def is_host(value: str) -> bool:
    """A host name (RFC 1123) or an IP address (without an IPv6 zone, which may hold anything)."""
    if "%" in value:
        return False
    try:
        ip_address(value)
        return True
    except ValueError:
        return len(value) <= 253 and all(_LABEL.fullmatch(label) for label in value.split("."))


def _host(value: str) -> str:
    if not is_host(value):
        raise ValueError("expected a host name (letters, digits, '-', dot-separated) or an IP address")
    return value


def _rank_name(value: str) -> str:
    if not _RANK_NAME.fullmatch(value):
        raise ValueError("expected a name of letters, digits, '-', '_' and '.' (it becomes the "
                         "rank's Ansible host name)")
    return value


def split_jump(value: str) -> tuple[str | None, str, str | None]:
    """A jump host `[user@]host[:port]` as (user, host, port); a part not given is None. The one
    reading of it, for the validator, the SSH connection and the Ansible inventory."""
    user, at, hostport = value.rpartition("@")
    host, colon, port = hostport.partition(":")
    return (user if at else None), host, (port if colon else None)


def _jump(value: str) -> str:
    user, host, port = split_jump(value)
    if ((user is not None and not _USER.fullmatch(user)) or not is_host(host)
            or (port is not None and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535))):
        raise ValueError("expected host, user@host, host:port or user@host:port, e.g. "
                         "admin@bastion.lan:22 (a host name or an IPv4 address; a port from 1 to 65535)")
    return value


Host = Annotated[str, AfterValidator(_host)]


class Rank(Strict):
    name: Annotated[str, AfterValidator(_rank_name)] | None = None
    address: Host
    port: int = Field(22, ge=1, le=65535)
    user: OneLine = Field(min_length=1)
    key: UserPath | None = None
    jump: Annotated[str, AfterValidator(_jump)] | None = None  # "[user@]host[:port]" of a bastion
    fabric_ips: list[IPv4Address] = []
    sysfs_root: str = "/"  # the sandbox points the probe at fixture sysfs trees

    @property
    def label(self) -> str:
        return self.name or self.address


class NfsExport(Strict):
    server: OneLine
    export: OneLine


class ModelSettings(Strict):
    path: MountPath
    served_name: str | None = None  # default: the profile's
    nfs: NfsExport | None = None
    # a copy on each rank's own disk (`sparkstack stage` makes it): the engine reads it instead
    local_path: MountPath | None = None

    @model_validator(mode="after")
    def _local_not_the_source(self) -> "ModelSettings":
        if self.local_path is not None and self.local_path.rstrip("/") == self.path.rstrip("/"):
            raise ValueError("local_path is model.path: name another directory on each rank's own "
                             "disk for `sparkstack stage` to copy the checkpoint to, or leave local_path out")
        return self

    @property
    def serving_path(self) -> str:
        """The directory the engine reads: the staged copy when there is one, else model.path."""
        return self.local_path or self.path


class ImageSettings(Strict):
    base: str | None = None  # overrides the profile's base image
    patches_dir: UserPath | None = None


def _capability(name: str) -> str:
    """A Linux capability as `docker run --cap-add` takes it: SYS_NICE (CAP_ and any case accepted)."""
    bare = name.upper().removeprefix("CAP_")
    if not re.fullmatch(r"[A-Z][A-Z0-9]*(_[A-Z0-9]+)*", bare) or bare == "ALL":
        raise ValueError(f"{name!r} is not a capability name like SYS_NICE (`man 7 capabilities`); "
                         "`ALL` is what privileged: would be, and is not offered")
    return bare


class ContainerSettings(Strict):
    """How each rank's serving container is started (docs/architecture.md, "Serving"). The defaults
    are the seeds': NCCL needs nofile 1048576 at 4 ranks, RDMA needs memlock unlimited (-1)."""

    # `--security-opt no-new-privileges`: no process in the engine's container gains privileges
    # (setuid binaries, file capabilities) beyond those it started with
    no_new_privileges: bool = True
    # the capabilities it keeps: `--cap-drop ALL` then `--cap-add` each (vLLM, NCCL over RDMA and
    # CUDA need none: launcher/plan/cluster_plan.py's host_settings says why); null: Docker's defaults
    capabilities: list[Annotated[str, AfterValidator(_capability)]] | None = []

    gpus: str | None = "all"  # `--gpus` value; null leaves it out (no GPU, as in the sandbox)
    devices: list[str] = ["/dev/infiniband"]
    nofile: PositiveInt = 1048576
    memlock: int = Field(-1, ge=-1)  # bytes; -1 = unlimited
    shm_size: str = "16g"
    # the engine's compile caches (vLLM, inductor, Triton, FlashInfer, CUDA's JIT) kept on each
    # rank across boots, one directory per serving image (launcher/plan/caches.py); null: none
    cache_dir: Annotated[MountPath, AfterValidator(_own_cache_root)] | None = "/var/cache/sparkstack"


class ServingGuardSettings(Strict):
    """The memory guard on every rank while the engine serves (launcher/apply/servguard.py:
    detached on the rank, events in a file there): below soft_free_gib of MemFree it drops page
    caches and compacts memory; below hard_available_gib of MemAvailable it stops that rank's
    engine, so the box survives instead of freezing. Defaults: the seeds keep ~9-15 GB (8.4-14
    GiB) free on every Spark while serving (the plan's free_floor_gib, 8 GiB, is that figure's
    floor), so MemFree under 6 GiB means something beyond the plan (page cache, a long prefill)
    eats that margin, worth a drop; under 3 GiB of MemAvailable -- the load-time hard floor --
    the next prefill chunk can no longer be served from unified memory (NV_ERR_NO_MEMORY, then
    a hard reset: vLLM issues 46307/56824, dgx-spark-playbooks #97)."""

    enabled: bool = True
    soft_free_gib: Gib = 6.0
    hard_available_gib: Gib = 3.0
    interval_s: float = Field(1.0, gt=0, le=60)
    cooldown_s: float = Field(30.0, ge=0, le=3600)  # between two reliefs on one rank
    # before `up --keep` re-deploys: how long every rank may take to give its memory back
    memory_back_s: float = Field(120.0, gt=0, le=3600)

    @model_validator(mode="after")
    def _floors_in_order(self):
        if self.hard_available_gib >= self.soft_free_gib:
            raise ValueError(f"hard_available_gib ({self.hard_available_gib:g}) must be below soft_free_gib "
                             f"({self.soft_free_gib:g}): the cache drop comes first, stopping the engine last")
        return self


class MemoryGuardSettings(Strict):
    """The load-time memory guard on every rank (launcher/apply/memguard.py), from the start of
    the engines until the API answers: below soft_free_gib of MemFree it drops page caches and
    compacts memory; below hard_available_gib of MemAvailable it stops the cluster. `serving`:
    the guard that takes over on each rank once the API answers."""

    enabled: bool = True
    soft_free_gib: Gib = 8.0
    hard_available_gib: Gib = 3.0
    interval_s: float = Field(1.0, gt=0, le=60)
    cooldown_s: float = Field(5.0, ge=0, le=600)  # between two reliefs on one rank
    serving: ServingGuardSettings = ServingGuardSettings()


class LivenessSettings(Strict):
    """`up --keep`'s liveness (launcher/apply/liveness.py): every interval_s a one-token
    completion and a read of rank 0's /metrics; after grace_s from the start of serving,
    stalled_checks intervals in a row with requests running or waiting and no token produced
    (nor KV-cache usage moved, nor the probe answered) is a wedge: re-deployed like a crash."""

    enabled: bool = True
    interval_s: float = Field(30.0, gt=0, le=3600)
    grace_s: float = Field(300.0, ge=0)  # the first requests after a start may wait on warm-up
    stalled_checks: int = Field(6, ge=1)  # 6 x 30 s: three minutes without a token while asked


class KeepSettings(Strict):
    """`up --keep` (launcher/apply/supervisor.py): how often it looks, how it backs off, when it
    gives up, and how it judges liveness."""

    check_interval_s: float = Field(10.0, gt=0, le=3600)
    api_failures: int = Field(3, ge=1)  # /health checks missed in a row that count as a failure
    backoff_s: float = Field(30.0, ge=0)  # before the first re-deploy; doubled after each
    backoff_max_s: float = Field(600.0, ge=0)
    max_restarts_per_hour: int = Field(6, ge=0)
    liveness: LivenessSettings = LivenessSettings()

    def describe(self) -> str:
        """One line for `plan` and `status`."""
        live = self.liveness
        judged = (f"liveness every {live.interval_s:g} s after {live.grace_s:g} s: {live.stalled_checks} "
                  "checks in a row with requests and no token are a wedge" if live.enabled else
                  "liveness from token progress off")
        return (f"every {self.check_interval_s:g} s each rank's container and /health "
                f"({self.api_failures} misses fail); {judged}; re-deploy after {self.backoff_s:g} s "
                f"(doubling to {self.backoff_max_s:g} s), at most {self.max_restarts_per_hour} an hour")


class Overrides(Strict):
    engine_args: list[str] = []
    env: EnvVars = {}
    headroom_gib: Gib = 8.0
    runtime_overhead_gib: Gib = 14.0
    # the KV pool: the profile's target capped by what fits ("target"), or all that fits ("max")
    kv_policy: Literal["target", "max"] = "target"
    # `plan` refuses a rank expected to keep less than this free while serving (launcher/plan/kv.py)
    free_floor_gib: Gib = 8.0
    # how far below vLLM's startup guard the planned --gpu-memory-utilization stays (vllm_guard.py)
    utilization_margin: float = Field(vllm_guard.MARGIN, ge=0, lt=1)
    api_port: int | None = Field(None, ge=1, le=65535)
    # passed as VLLM_API_KEY in the container env, masked in output; unset: a key generated once
    # and kept on this host (launcher/inputs/apikey.py), unless open_api says to serve without one
    api_key: str | None = None
    open_api: bool = False
    secret_env: list[str] = []  # env names masked in output beyond *TOKEN*, *KEY*, ... (redact.py)
    sysctls: dict[str, Annotated[int | str, AfterValidator(_one_line)]] = {}  # beyond vm.swappiness=1, vm.compaction_proactiveness=0
    no_swap: bool | None = None  # swap off on every rank (`prep`, `check`); unset: the profile's

    @field_validator("api_key")
    @classmethod
    def _bearer(cls, v: str | None) -> str | None:
        if v is not None and (not v or any(c.isspace() for c in v)):
            raise ValueError("must be one word, no spaces or line breaks (clients send it as "
                             "`Authorization: Bearer KEY`)")
        return v

    @model_validator(mode="after")
    def _one_way_to_the_key(self):
        if self.api_key and self.open_api:
            raise ValueError("api_key and open_api: true disagree: give one (open_api serves the API "
                             "with no key at all)")
        if "VLLM_API_KEY" in self.env:
            raise ValueError("env.VLLM_API_KEY: put the key in overrides.api_key (passed the same way; "
                             "sparkstack's own clients read it there)")
        return self


class FabricSettings(Strict):
    """Pins on the derived fabric env (launcher/facts/fabric.py); leave unset unless something forces it."""

    # NCCL_IB_GID_INDEX for every HCA. Unset: NCCL (>= 2.21) picks the IPv4 RoCE v2 entry per HCA,
    # which follows the index when it drifts (it does, within minutes, when addresses change).
    gid_index: int | None = Field(None, ge=0)


class NcclSettings(Strict):
    """A host NCCL build used instead of the image's own (rings in the field run a newer or
    patched one): bind-mounted read-only at the same path and preloaded in the serving container."""

    host_lib: MountPath | None = None  # e.g. /opt/nccl-2.30.7/lib/libnccl.so.2, the same on every rank
    env: EnvVars = {}  # that build's own switches, e.g. NCCL_SWITCHLESS_RING_ONLY: "1"

    @model_validator(mode="after")
    def _env_needs_lib(self):
        if self.env and not self.host_lib:
            raise ValueError("`env` is for the host NCCL build's own switches: give `host_lib` too "
                             "(other variables go under overrides.env)")
        return self


class GpuClockSettings(Strict):
    """Lock (`lock_mhz`) or cap (`max_mhz`, from `min_mhz`) the GPU clock on every rank with
    `nvidia-smi -lgc MIN,MAX`, applied by `prep` and the Ansible role: a TP step waits for the
    slowest rank, so one rank boosting less than the others costs every rank."""

    lock_mhz: PositiveInt | None = None
    max_mhz: PositiveInt | None = None
    min_mhz: int = Field(0, ge=0)  # with max_mhz: the floor of the range

    @model_validator(mode="after")
    def _one_way(self):
        if (self.lock_mhz is None) == (self.max_mhz is None):
            raise ValueError("give lock_mhz (one clock) or max_mhz (a cap), not both or neither")
        if self.max_mhz is not None and self.min_mhz > self.max_mhz:
            raise ValueError(f"min_mhz {self.min_mhz} is above max_mhz {self.max_mhz}")
        if self.lock_mhz is not None and "min_mhz" in self.model_fields_set:
            raise ValueError("min_mhz goes with max_mhz; lock_mhz is both ends")
        return self

    @property
    def range(self) -> tuple[int, int]:
        """The -lgc MIN,MAX pair."""
        if self.lock_mhz is not None:
            return self.lock_mhz, self.lock_mhz
        return self.min_mhz, self.max_mhz


GID_INDEX_ENV = "NCCL_IB_GID_INDEX"


class Cluster(Strict):
    # names this cluster on its containers and its lock (default: the config file's name), so a
    # second cluster on the same ranks is named, not silently replaced
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    profile: str
    topology: Literal["switch", "ring"]
    rendezvous: Host | None = None  # address of rank 0 every rank reaches; see rendezvous()
    # the port rank 0's rendezvous listens on (--master-port); see master_port()
    master_port: int | None = Field(None, ge=1, le=65535)
    # how the ranks form one vLLM: its native multi-node (--nnodes ...) or a Ray cluster (head on
    # rank 0, workers join; the image must have `ray`)
    multinode: Annotated[str, one_of(engines.multinode_modes)] = "native"  # launcher/engines/ serve each
    ssh: SshSettings = SshSettings()
    ranks: list[Rank] = Field(min_length=1)
    model: ModelSettings
    images: ImageSettings = ImageSettings()
    overrides: Overrides = Overrides()
    container: ContainerSettings = ContainerSettings()
    memory_guard: MemoryGuardSettings = MemoryGuardSettings()
    keep: KeepSettings = KeepSettings()
    fabric: FabricSettings = FabricSettings()
    nccl: NcclSettings = NcclSettings()
    gpu_clock: GpuClockSettings | None = None  # unset: clocks left to the driver (a lock prep set is reset)
    profiles_dir: UserPath | None = None

    @property
    def gid_index(self) -> int | None:
        """The pinned NCCL_IB_GID_INDEX (fabric.gid_index, or the same in overrides.env), else None."""
        if self.fabric.gid_index is not None:
            return self.fabric.gid_index
        given = self.overrides.env.get(GID_INDEX_ENV)
        return int(given) if given is not None else None

    @model_validator(mode="after")
    def _one_gid_index(self):
        given = self.overrides.env.get(GID_INDEX_ENV)
        if given is None:
            return self
        if not given.isdigit():
            raise ValueError(f"overrides.env.{GID_INDEX_ENV}: {given!r} is not a GID index (0, 1, 2, ...)")
        if self.fabric.gid_index is not None and int(given) != self.fabric.gid_index:
            raise ValueError(f"fabric.gid_index {self.fabric.gid_index} and overrides.env.{GID_INDEX_ENV} "
                             f"{given} disagree: give one")
        return self

    @model_validator(mode="after")
    def _unique_addresses(self):
        seen: dict[tuple[str, int], int] = {}
        for i, rank in enumerate(self.ranks):
            where = (rank.address, rank.port)
            if where in seen:
                raise ValueError(f"ranks[{i}] has the same address {rank.address}:{rank.port} "
                                 f"as ranks[{seen[where]}]")
            seen[where] = i
        return self


class Loaded(Strict):
    """A validated config with its profile and the merged engine flags."""

    path: Path
    cluster: Cluster
    profile: Profile
    flags: list[vllm_flags.Flag]  # each with its source: the profile, overrides.engine_args

    @property
    def engine(self) -> engines.Engine:
        """The engine that serves it (launcher/engines/): the profile's, under `multinode:`."""
        return engines.pick(self.profile.engine, self.cluster.multinode)


def rendezvous(loaded: Loaded, fabric_env: dict[int, dict[str, str]] | None = None) -> str:
    """An address of rank 0 every rank reaches: the config's choice; on a switch, rank 0's fabric
    IP; in a ring (rank 0 is not every rank's neighbour) its management IP, found from its facts
    (its VLLM_HOST_IP in `fabric_env`), else its configured `address`."""
    cluster = loaded.cluster
    if cluster.rendezvous:
        return cluster.rendezvous
    first = cluster.ranks[0]
    if cluster.topology == "switch" and first.fabric_ips:
        return str(first.fabric_ips[0])
    return (fabric_env or {}).get(0, {}).get("VLLM_HOST_IP") or first.address


def cluster_name(loaded: Loaded) -> str:
    """The config's `name`, else its file's name without .yaml (made label-safe)."""
    if loaded.cluster.name:
        return loaded.cluster.name
    stem = re.sub(r"[^A-Za-z0-9._-]", "-", Path(loaded.path).stem).strip("-._") if loaded.path else ""
    return stem[:63] or "cluster"


def master_port(loaded: Loaded) -> int:
    """The port of rank 0's rendezvous: cluster.yaml's master_port, else a --master-port in the
    profile's or the config's vLLM flags, else the engine's own (launcher/engines/)."""
    if loaded.cluster.master_port is not None:
        return loaded.cluster.master_port
    given = vllm_flags.value(loaded.flags, "master_port")
    return int(given) if given else loaded.engine.master_port


def no_swap(loaded: Loaded) -> bool:
    """Whether the ranks must run without swap: overrides.no_swap, else the profile's no_swap."""
    given = loaded.cluster.overrides.no_swap
    return loaded.profile.no_swap if given is None else given


def config_path(given: str | None) -> Path:
    return Path(given or os.environ.get("SPARKSTACK_CONFIG") or DEFAULT_CONFIG)


def load(path: Path, profile_name: str | None = None) -> Loaded:
    """Read and cross-check the config and its profile; raises ConfigError listing every problem.
    `profile_name` (`--profile`) replaces the config's `profile:`, and is checked as that is."""
    cluster: Cluster = load_yaml_model(path, Cluster, "cluster config")
    if profile_name is not None:
        cluster = cluster.model_copy(update={"profile": profile_name})
    named_in = "--profile" if profile_name is not None else f"{path}: profile"
    profile = load_profile(cluster.profile, _profiles_dir(cluster, path), named_in)
    flags = _engine_flags(path, cluster, profile, engines.pick(profile.engine, cluster.multinode))
    _check_sizes(path, profile, flags)
    _check_parallelism(path, cluster, flags)
    o = cluster.overrides
    redact.remember(o.api_key, *redact.secret_values(o.env, o.secret_env))
    return Loaded(path=path, cluster=cluster, profile=profile, flags=flags)


def _profiles_dir(cluster: Cluster, path: Path) -> Path:
    if cluster.profiles_dir is None:
        return PROFILES_DIR
    return cluster.profiles_dir if cluster.profiles_dir.is_absolute() else path.parent / cluster.profiles_dir


def _engine_flags(path: Path, cluster: Cluster, profile: Profile,
                 engine: engines.Engine) -> list[vllm_flags.Flag]:
    """The profile's flags merged with overrides.engine_args (parsed here, once), each knowing
    its source; an engine that takes its flags as written has none (its own parser checks them)."""
    problems = engine.config_problems(path, cluster, profile)
    if problems:
        raise ConfigError(problems)
    if engine.flags != engines.VLLM_FLAGS:
        return []
    plugin = frozenset(profile.plugin_flags)
    try:
        overrides = vllm_flags.parse(vllm_flags.split_lines(cluster.overrides.engine_args), plugin,
                                     vllm_flags.CONFIG)
    except (vllm_flags.FlagError, ValueError) as e:
        raise ConfigError([f"{path}: overrides.engine_args: {e}"]) from None
    written = profile.flags()
    problems = [f"{where}: {problem}" for where, flags in ((f"{path}: overrides.engine_args", overrides),
                                                           (f"profile {profile.name}", written))
                for problem in _secret_flags(flags)]
    if problems:
        raise ConfigError(problems)
    return vllm_flags.merge(written, overrides)


# Engine flags that would put a secret on the `docker run` command line, where `ps` on the rank
# shows it to every local user; the environment (sent on stdin) carries it instead.
SECRET_FLAGS = {"api_key": "put the key in overrides.api_key",
                "hf_token": "put the token in overrides.env as HF_TOKEN"}


def _secret_flags(flags: list[vllm_flags.Flag]) -> list[str]:
    return [f"{f.name} with a value would show it on the rank's command line (`ps`): {SECRET_FLAGS[f.key]}"
            for f in flags if f.key in SECRET_FLAGS and f.values]


# Sizes vLLM's parser takes (any int) but its engine refuses: key -> (accepted?, what is expected).
SIZE_FLAGS = {
    "tensor_parallel_size": (lambda n: n >= 1, "1 or more (one GPU per rank)"),
    "pipeline_parallel_size": (lambda n: n >= 1, "1 or more"),
    "decode_context_parallel_size": (lambda n: n >= 1, "1 or more, dividing tensor parallel"),
    "max_model_len": (lambda n: n >= 1 or n == -1, "a number of tokens (1 or more), or auto"),
    "kv_cache_memory_bytes": (lambda n: n is None or n >= 1, "a number of bytes (1 or more), e.g. 14g"),
}


def _check_sizes(path: Path, profile: Profile, flags: list[vllm_flags.Flag]) -> None:
    """Refuse the sizes SIZE_FLAGS refuses, naming where each was set, before the plan divides by them."""
    problems = []
    for key, (accepted, expected) in SIZE_FLAGS.items():
        flag = vllm_flags.find(flags, key)
        if flag is None:
            continue
        where = (f"{path}: overrides.engine_args" if flag.source == vllm_flags.CONFIG
                 else f"{path}: profile {profile.name}")
        try:
            if not accepted(vllm_flags.converted(flags, key)):
                problems.append(f"{where}: {shlex.join(flag.argv())}: expected {expected}")
        except vllm_flags.FlagError as e:
            problems.append(f"{where}: {e}")
    if problems:
        raise ConfigError(problems)


def _check_parallelism(path: Path, cluster: Cluster, flags: list[vllm_flags.Flag]) -> None:
    """One GPU per Spark: TP × PP must equal the number of ranks; DCP must divide TP."""
    tp = int(vllm_flags.value(flags, "tensor_parallel_size") or len(cluster.ranks))
    pp = int(vllm_flags.value(flags, "pipeline_parallel_size") or 1)
    dcp = int(vllm_flags.value(flags, "decode_context_parallel_size") or 1)
    problems = []
    if tp * pp != len(cluster.ranks):
        problems.append(f"{path}: ranks: {len(cluster.ranks)} ranks listed, but tensor parallel "
                        f"{tp} × pipeline parallel {pp} = {tp * pp} (one GPU per rank)")
    if tp % dcp:
        problems.append(f"{path}: profile {cluster.profile}: decode-context-parallel {dcp} "
                        f"does not divide tensor parallel {tp}")
    if problems:
        raise ConfigError(problems)
