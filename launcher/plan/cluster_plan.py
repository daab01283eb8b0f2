"""The plan: per rank the environment, the `docker run` argv and the engine argv, and the KV sizing.

Pure data computed from the config, the profile and what the caller read beforehand (`Gathered`:
the checkpoint, the serving image's tag, the API key, the ranks' facts; launcher/gather/
reads them). Nothing here reads a file, asks Docker or touches a rank. Every input that had to be
defaulted is listed in `assumed`, so a plan made without the cluster says what it took on trust.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from . import caches, engine_conf, kv
from .. import engines, redact
from ..errors import ConfigError, PlanRefused, SparkstackError
from ..facts import fabric, load_path
from ..facts.record import Facts
from ..gather.value import Gathered, ModelFacts, parallelism
from ..inputs import apikey, vllm_flags, vllm_guard
from ..inputs.config import Cluster, ContainerSettings, Loaded, cluster_name, master_port, rendezvous

# A GB10's memory, used only for ranks whose /proc/meminfo has not been read: MemTotal
# 127,600,000 kB (≈ 121.7 GiB; docs/architecture.md, "The GB10's memory"), and MemAvailable once
# page caches are dropped and nothing runs: 122,771,456 kB (≈ 117.1 GiB,
# tests/facts_cases/meminfo_gb10_caches_dropped.json).
GB10_MEM_TOTAL = 127_600_000 * 1024
GB10_MEM_AVAILABLE = 122_771_456 * 1024

from ..facts.remote import CONTAINER_NAME  # noqa: E402,F401 -- the plan names its container by it
FABRIC_ENV = ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "UCX_NET_DEVICES", "GLOO_SOCKET_IFNAME")
# Every container's environment travels on stdin (env_file), never as `-e` on a command line,
# where `ps` on the rank would show each value to every local user.
ENV_FROM_STDIN = ["--env-file", "/dev/stdin"]
# The engine is the first to go when memory runs out: the kernel's OOM killer and earlyoom both
# pick the highest oom_score, which this raises for every process of the container, whatever the
# engine calls its processes (earlyoom's --prefer matches names: vLLM's, not `python3 -m
# tensorfold.cli`'s), and on a GB10 the GPU memory it holds need not count in its RSS.
OOM_SCORE_ADJ = 1000
AUTO = -1  # vLLM's --max-model-len auto (also written -1)


@dataclass(frozen=True)
class MemoryNeed:
    """What one rank's MemAvailable must cover for the plan to start (see memory_need)."""

    weights: int
    runtime_overhead: int
    headroom: int
    kv_min: int
    kv_why: str
    assumed: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return self.weights + self.runtime_overhead + self.headroom + self.kv_min

    def explain(self) -> str:
        return (f"weights {kv.gib(self.weights)} + runtime {kv.gib(self.runtime_overhead)} + "
                f"headroom {kv.gib(self.headroom)} + KV {kv.gib(self.kv_min)} ({self.kv_why})")


@dataclass
class RankPlan:
    rank: int
    host: str
    env: dict[str, str]
    docker_run: list[str]
    engine: list[str]


@dataclass
class Plan:
    ranks: list[RankPlan]
    kv: kv.KvSizing | None
    image: str
    assumed: list[str] = field(default_factory=list)
    guard: vllm_guard.Guard | None = None  # vLLM's startup memory guard; None: not vLLM
    api: apikey.ApiKey | None = None  # the API's key, where it is kept, or why there is none
    secret_env: tuple[str, ...] = ()  # names masked beyond the secret-looking ones (redact.py)
    notes: list[str] = field(default_factory=list)  # what the user should know before `up`
    memory: dict[int, tuple[int, int]] = field(default_factory=dict)  # rank -> (MemTotal, MemAvailable)
    free_floor: int = 0  # `plan` refuses a rank expected to keep less free while serving
    load: dict[int, load_path.LoadPath] = field(default_factory=dict)  # each probed rank's checkpoint reads

    def wait_timeout(self, configured: float) -> float:
        """`up`'s wait for the API: the configured one, or the slowest cold load × its margin."""
        return load_path.wait_timeout(self.load, configured)

    def serving(self) -> list[dict]:
        """Per rank: the KV pool and the memory expected free while serving (kv.py)."""
        s = self.kv
        if not s:
            return []
        return [{"rank": r, "kv_cache_memory_bytes": s.kv_cache_memory_bytes, "max_tokens": s.max_tokens,
                 "mem_available": avail, "free_while_serving": s.free_while_serving(avail)}
                for r, (_, avail) in sorted(self.memory.items())]

    def to_json(self, reveal_secrets: bool = False) -> dict:
        def env(e: dict[str, str]) -> dict[str, str]:
            return e if reveal_secrets else redact.env(e, self.secret_env)

        sizing = self.kv
        return {
            "ranks": [{"rank": r.rank, "host": r.host, "env": env(r.env),
                       "docker_run": r.docker_run, "engine": r.engine} for r in self.ranks],
            "kv": {"bytes_per_token": sizing.bytes_per_token if sizing else None,
                   "kv_cache_memory_bytes": sizing.kv_cache_memory_bytes if sizing else None,
                   "max_tokens": sizing.max_tokens if sizing else None,
                   "policy": sizing.policy if sizing else None,
                   "target": {"tokens": sizing.target.tokens, "source": sizing.target.source}
                   if sizing and sizing.target else None,
                   "free_floor": self.free_floor, "per_rank": self.serving()},
            "vllm_guard": self.guard.to_json() if self.guard else None,
            "api": self.api.to_json(reveal_secrets) if self.api else None,
            "load": [p.to_json() for _, p in sorted(self.load.items())],
            "assumed": self.assumed,
            "notes": self.notes,
        }


def build(loaded: Loaded, inputs: Gathered) -> Plan:
    """The whole plan from what the caller gathered. Without the ranks' facts the plan falls
    back on documented defaults. Facts supply each rank's memory (KV sizing, vLLM's startup
    guard) and its own fabric environment (launcher.facts.fabric)."""
    cluster, profile, flags = loaded.cluster, loaded.profile, loaded.flags
    assumed: list[str] = []
    key, facts, model = inputs.key, inputs.facts, inputs.model
    if key.source == apikey.NOT_YET:
        assumed.append(f"API key: {key.describe()}; not in this plan")
    memory = rank_memory(loaded, facts, assumed)
    tp, _ = parallelism(loaded)
    assumed += model.assumed
    sizing = _size_kv(loaded, model, memory, assumed)
    guard = memory_guard(loaded, memory) if loaded.engine.startup_guard else None
    if guard and guard.utilization is None:
        raise PlanRefused(f"profile {profile.name} cannot start: {guard.note}. Free memory on that "
                          "rank (sparkstack prep) or lower overrides.runtime_overhead_gib")
    free_floor = int(cluster.overrides.free_floor_gib * kv.GIB)
    _refuse_below_floor(loaded, sizing, memory, free_floor)
    long_env, long_notes = engine_conf.long_context(loaded, model.limits)  # PlanRefused: not wanted
    engine_conf.refuse_missing(loaded, model.limits, inputs.image_caps)
    engine_conf.refuse_heads(loaded, model.limits, tp)
    image = inputs.image
    assumed += inputs.image_assumed
    fabric_env = fabric_envs(loaded, facts, assumed)  # NCCL's pins, whatever the engine
    sized = Sized(tp if vllm_flags.value(flags, "tensor_parallel_size") is None else None,
                  sizing.kv_cache_memory_bytes if sizing and not profile.kv.engine_managed else None,
                  # a profile's or the user's value that stays is as written
                  guard.utilization if guard and guard.source == vllm_flags.PLAN else None)
    master = rendezvous(loaded, fabric_env)
    ranks = [_rank_plan(loaded, r, image, sized, fabric_env.get(r, {}), master,
                        key.value, _prebuilt_id(loaded, image, facts.get(r)), long_env)
             for r in range(len(cluster.ranks))]
    notes = (loaded.engine.notes(master, len(cluster.ranks)) + long_notes
             + engine_conf.quant_notes(model.limits)
             + engine_conf.undeclared_notes(loaded, model.limits, inputs.image_caps)
             + engine_conf.no_effect_notes(loaded, model.limits, ranks[0].env if ranks else {})
             + engine_conf.speculative_notes(loaded))
    nfs = cluster.model.nfs.server if cluster.model.nfs else None
    load = load_path.for_ranks(facts, nfs)
    return Plan(ranks, sizing, image, assumed, guard, key, tuple(cluster.overrides.secret_env), notes,
                memory, free_floor, load)


def _refuse_below_floor(loaded: Loaded, sizing: kv.KvSizing, memory: dict[int, tuple[int, int]],
                        floor: int) -> None:
    """A GB10 with too little free while serving freezes rather than OOMs (issue 14): refuse it."""
    for r, (_, avail) in sorted(memory.items()):
        free = sizing.free_while_serving(avail)
        if free >= floor:
            continue
        raise PlanRefused(
            f"profile {loaded.profile.name}: rank {r} ({loaded.cluster.ranks[r].label}) would keep "
            f"{kv.gib(free)} free while serving, below overrides.free_floor_gib {kv.gib(floor)}: "
            f"{explain_free(sizing, avail)}. Fix: {free_floor_fix(loaded)}")


def explain_free(sizing: kv.KvSizing, avail: int) -> str:
    """How a rank's memory free while serving is reckoned (shared by `plan` and `check`)."""
    b = sizing.budget
    return (f"MemAvailable {kv.gib(avail)} − weights {kv.gib(b.weights)} − runtime "
            f"{kv.gib(b.runtime_overhead)} − KV {kv.gib(sizing.kv_cache_memory_bytes)} ({sizing.policy})")


def free_floor_fix(loaded: Loaded) -> str:
    return (f"a smaller KV pool (a smaller kv.target in the profile, fewer sequences, a shorter "
            f"--max-model-len), overrides.headroom_gib ({loaded.cluster.overrides.headroom_gib:g}) at "
            "least the floor, or more MemAvailable on that rank (sparkstack prep); kv_policy: max only "
            "makes the pool larger and does not help")


def serving_kv(loaded: Loaded, model: ModelFacts, memory: dict[int, tuple[int, int]]) -> kv.KvSizing:
    """The KV pool the plan would size for ranks with `memory` (PlanRefused when none fits)."""
    return _size_kv(loaded, model, memory, [])


def fabric_envs(loaded: Loaded, facts: dict[int, Facts], assumed: list[str]) -> dict[int, dict[str, str]]:
    """Each probed rank's own NCCL/UCX/Gloo env and VLLM_HOST_IP from its own facts
    (launcher.facts.fabric); what is missing or had to be guessed goes to `assumed`."""
    cluster = loaded.cluster
    what = "fabric environment (" + ", ".join(FABRIC_ENV) + ")"
    if not facts:
        assumed.append(f"{what}: derived from each rank's sysfs once probed; not in this plan")
        if cluster.topology == "ring":
            assumed.append("ring: VLLM_HOST_IP and the master address are each rank's `address`, "
                           "taken as its management IP until probed")
        return {}
    envs: dict[int, dict[str, str]] = {}
    for r, rank in enumerate(cluster.ranks):
        name = f"rank {r} ({rank.label})"
        if r not in facts:
            assumed.append(f"{what} of {name}: not probed; not in this plan")
            continue
        rf = fabric.for_rank(facts[r], cluster, r)
        if rf.failures:
            first = rf.failures[0]
            assumed.append(f"{what} of {name}: not derived ({first.name}: {first.value}; fix: "
                           f"{first.fix}); not in this plan")
            continue
        if rf.management and rf.management.assumed:
            assumed.append(f"management network of {name}: {rf.management.assumed}")
        envs[r] = rf.env
    return envs


def memory_need(loaded: Loaded, model: ModelFacts) -> MemoryNeed:
    """The least MemAvailable a rank must have for this profile to start: its weights, the
    runtime overhead, the headroom and the smallest KV cache the plan accepts (the profile's
    fixed --kv-cache-memory-bytes, else one --max-model-len sequence, else one token).
    Never refuses: `check` and `prep` compare each rank's memory against it."""
    cluster, profile, flags = loaded.cluster, loaded.profile, loaded.flags
    assumed: list[str] = list(model.assumed)
    mtp = _mtp_enabled(flags)
    dcp = int(vllm_flags.value(flags, "decode_context_parallel_size") or 1)
    weights = _weights(loaded, model, mtp, assumed)
    bpt = kv.bytes_per_token(model.shape, profile.kv.layout, mtp=mtp, dcp=dcp)
    fixed = vllm_flags.converted(flags, "kv_cache_memory_bytes")
    max_len = vllm_flags.converted(flags, "max_model_len")
    if fixed:
        kv_min, kv_why = fixed, "the profile's --kv-cache-memory-bytes"
    else:
        tokens = max_len if max_len and max_len > 0 else 1  # -1: auto, whatever fits
        kv_min, kv_why = tokens * bpt, f"{tokens:,} tokens at {bpt:,} B/token"
    o = cluster.overrides
    return MemoryNeed(weights, int(o.runtime_overhead_gib * kv.GIB), int(o.headroom_gib * kv.GIB),
                      kv_min, kv_why, tuple(assumed))


def rank_memory(loaded: Loaded, facts: dict[int, Facts], assumed: list[str]) -> dict[int, tuple[int, int]]:
    """Each rank's (MemTotal, MemAvailable) from its /proc/meminfo, else a GB10's with page
    caches dropped (listed in `assumed`)."""
    read = {r: (f.memory.total, f.memory.available) for r, f in facts.items() if f.memory}
    n = len(loaded.cluster.ranks)
    if len(read) < n:
        assumed.append(f"MemAvailable: {kv.gib(GB10_MEM_AVAILABLE)} of MemTotal "
                       f"{kv.gib(GB10_MEM_TOTAL)} per rank (a GB10 with page caches dropped) "
                       "for ranks whose /proc/meminfo was not read")
    return {r: read.get(r, (GB10_MEM_TOTAL, GB10_MEM_AVAILABLE)) for r in range(n)}


def memory_guard(loaded: Loaded, memory: dict[int, tuple[int, int]]) -> vllm_guard.Guard:
    """The --gpu-memory-utilization that clears vLLM's startup guard on every rank with the
    config's margin (launcher/inputs/vllm_guard.py), or the value the config or profile gives."""
    o = loaded.cluster.overrides
    given, given_by = _given_utilization(loaded)
    return vllm_guard.choose(memory, int(o.runtime_overhead_gib * kv.GIB), o.utilization_margin,
                             given, given_by, loaded.profile.name)


def _given_utilization(loaded: Loaded) -> tuple[float | None, str]:
    """The --gpu-memory-utilization written in cluster.yaml's overrides.engine_args ("config")
    or else in the profile ("profile"); (None, "plan") when neither sets one."""
    written = vllm_flags.value(loaded.flags, "gpu_memory_utilization")
    if written is None:
        return None, vllm_flags.PLAN
    by_user = vllm_flags.find(loaded.flags, "gpu_memory_utilization").source == vllm_flags.CONFIG
    where = f"{loaded.path}: overrides.engine_args" if by_user else f"profile {loaded.profile.name}"
    try:
        utilization = float(written)
    except ValueError:
        utilization = float("nan")
    if not 0 < utilization <= 1:
        raise ConfigError([f"{where}: --gpu-memory-utilization {written!r}: expected a fraction "
                           "of memory above 0 and at most 1, e.g. 0.8"])
    return utilization, vllm_flags.CONFIG if by_user else vllm_flags.PROFILE


def _size_kv(loaded: Loaded, model: ModelFacts, memory: dict[int, tuple[int, int]],
             assumed: list[str]) -> kv.KvSizing:
    cluster, profile, flags = loaded.cluster, loaded.profile, loaded.flags
    mtp = _mtp_enabled(flags)
    dcp = int(vllm_flags.value(flags, "decode_context_parallel_size") or 1)
    weights = _weights(loaded, model, mtp, assumed)
    smallest = min(available for _, available in memory.values())
    o = cluster.overrides
    budget = kv.KvBudget(smallest, weights, int(o.runtime_overhead_gib * kv.GIB), int(o.headroom_gib * kv.GIB))
    bpt = kv.bytes_per_token(model.shape, profile.kv.layout, mtp=mtp, dcp=dcp)
    max_len = vllm_flags.converted(flags, "max_model_len")
    try:
        sizing = kv.size_kv(bpt, budget, None if max_len == AUTO else max_len,
                            vllm_flags.converted(flags, "kv_cache_memory_bytes"),
                            kv_target(loaded, max_len), o.kv_policy)
    except kv.KvDoesNotFit as e:
        raise PlanRefused(f"profile {profile.name} does not fit: {e}") from None
    if max_len == AUTO:
        assumed.append(f"--max-model-len auto: vLLM picks the longest context that fits the KV "
                       f"cache (and the model's own limit): {sizing.max_tokens:,} tokens by this plan")
    return sizing


def kv_target(loaded: Loaded, max_len: int | None) -> kv.KvTarget | None:
    """The profile's KV target in tokens, with its source; never below one --max-model-len
    sequence (a larger --max-model-len from the config raises it)."""
    spec, name = loaded.profile.kv.target, loaded.profile.name
    if spec is None:
        return None
    source = (f"profile {name}: {spec.context:,} context × {spec.sequences} sequence"
              f"{'s' if spec.sequences > 1 else ''} × margin "
              f"{spec.margin:g} ({spec.source})")
    if max_len and max_len > spec.tokens:
        return kv.KvTarget(max_len, f"{source}, raised to --max-model-len {max_len:,}")
    return kv.KvTarget(spec.tokens, source)


def _weights(loaded: Loaded, model: ModelFacts, mtp: bool, assumed: list[str]) -> int:
    """Weight bytes on the fullest rank: from the checkpoint's headers, else the profile."""
    profile = loaded.profile
    if model.weights is not None:
        return model.weights.per_rank_bytes + (model.weights.mtp_per_rank_bytes if mtp else 0)
    d = profile.defaults
    mtp_part = f" + {d.mtp_weights_per_rank_gib} GiB MTP" if mtp and d.mtp_weights_per_rank_gib else ""
    assumed.append(f"weights per rank: {d.weights_per_rank_gib} GiB{mtp_part}"
                   + f" from profile {profile.name} (seeds {', '.join(profile.seeds)})")
    return int((d.weights_per_rank_gib + (d.mtp_weights_per_rank_gib if mtp else 0)) * kv.GIB)


def _mtp_enabled(flags: list[vllm_flags.Flag]) -> bool:
    spec = vllm_flags.value(flags, "speculative_config")
    if not spec:
        return False
    try:
        method = json.loads(spec).get("method", "")
    except (json.JSONDecodeError, AttributeError):
        return False
    return "mtp" in str(method)


def _host_ip(loaded: Loaded, r: int, fabric_env: dict[str, str]) -> str:
    """The rank's own address on the network the rendezvous uses: on a switch its fabric IP
    (unless `rendezvous` picks another network), in a ring its management IP from its facts."""
    cluster = loaded.cluster
    rank = cluster.ranks[r]
    if cluster.topology == "switch":
        return str(rank.fabric_ips[0]) if rank.fabric_ips and not cluster.rendezvous else rank.address
    return fabric_env.get("VLLM_HOST_IP") or rank.address


def _prebuilt_id(loaded: Loaded, image: str, f: Facts | None) -> str | None:
    """A prebuilt ref's image ID on the rank, which keys its compile cache (caches.py): the tag
    can move to another image. A built image's content tag already changes with its content."""
    if not loaded.profile.image.prebuilt or not f or not f.docker:
        return None
    found = f.docker.image(image)
    return found.id if found else None


def _rank_plan(loaded: Loaded, r: int, image: str, sized: Sized,
               fabric_env: dict[str, str], master: str, api_key: str | None,
               image_id: str | None = None, engine_env: dict[str, str] | None = None) -> RankPlan:
    # the engine configuration's override (engine_conf.long_context) first: the config's env wins
    env = {**(engine_env or {}), **caches.env(loaded.cluster), **rank_env(loaded, r, fabric_env, api_key)}
    return RankPlan(r, loaded.cluster.ranks[r].address, env, _docker_run(loaded, r, image, image_id),
                    _engine_argv(loaded, r, sized, _host_ip(loaded, r, fabric_env), master))


def rank_env(loaded: Loaded, r: int, fabric_env: dict[str, str], api_key: str | None = None) -> dict[str, str]:
    """The rank's container environment; VLLM_API_KEY only when `api_key` is given."""
    cluster, profile = loaded.cluster, loaded.profile
    env = dict(profile.env)
    if len(cluster.ranks) > 1 and cluster.ranks[r].fabric_ips:
        env.update(fabric.topology_env(cluster.topology))  # also before the rank is probed
        if cluster.fabric.gid_index is not None:  # pinned on request only (launcher/facts/fabric.py)
            env["NCCL_IB_GID_INDEX"] = str(cluster.fabric.gid_index)
    if loaded.engine.host_ip_env:  # TensorFold takes its rank, master and model as flags, not env
        env[loaded.engine.host_ip_env] = _host_ip(loaded, r, fabric_env)
    # the rank's own NICs, HCAs and sockets (_host_ip chose VLLM_HOST_IP); the config's env still wins
    env.update({k: v for k, v in fabric_env.items() if k != "VLLM_HOST_IP"})
    env.update(nccl_env(cluster))
    env.update(cluster.overrides.env)
    if api_key:  # apikey.resolve gives none for an engine that reads no key (TensorFold)
        env["VLLM_API_KEY"] = api_key
    return env


def env_file(env: dict[str, str], who: str) -> bytes:
    """The environment as `docker run --env-file /dev/stdin` reads it (ENV_FROM_STDIN)."""
    for key, value in env.items():
        if "\n" in value:
            raise SparkstackError(f"{who}: environment value of {key} has a newline")
    return "".join(f"{k}={env[k]}\n" for k in sorted(env)).encode()


def nccl_env(cluster: Cluster) -> dict[str, str]:
    """A host NCCL build (nccl.host_lib) preloaded over the image's own, for torch and for vLLM's
    own NCCL wrapper alike, with that build's switches."""
    lib = cluster.nccl.host_lib
    return {"LD_PRELOAD": lib, "VLLM_NCCL_SO_PATH": lib, **cluster.nccl.env} if lib else {}


def nccl_mounts(cluster: Cluster) -> list[str]:
    """`docker run` options that bring the host NCCL build in, read-only at the same path."""
    lib = cluster.nccl.host_lib
    return ["-v", f"{lib}:{lib}:ro"] if lib else []


def host_settings(c: ContainerSettings) -> list[str]:
    """`docker run` options every engine-side container on a rank shares (the serving one, the
    bandwidth probe's): host network and IPC, the GPU, shm, NCCL-sized ulimits, the RDMA devices,
    and no more privilege than that takes.

    What each is for:
    - `--network host`: NCCL's and Gloo's sockets and vLLM's rendezvous on the rank's own
      interfaces (the fabric netdevs the env pins by name), and the API on rank 0.
    - `--ipc host`: the seeds' setting, kept: vLLM's processes (API server, engine core, workers)
      hand requests and tensors to each other through shared memory (/dev/shm,
      torch.multiprocessing) and CUDA IPC handles, which work only inside one IPC namespace; the
      host's makes /dev/shm as large as the rank's memory (`--shm-size` sizes it only where the
      namespace is private). Its cost: the container shares the rank's SysV IPC and /dev/shm,
      each segment guarded by its owner's file mode.
    - `--device /dev/infiniband` and `--ulimit memlock=-1`: RDMA (NCCL_NET=IB): the verbs device
      files, and pinned memory for every registered buffer (ibv_reg_mr counts against memlock;
      raising the limit here is what CAP_IPC_LOCK would otherwise be needed for).
    - `--security-opt no-new-privileges` and `--cap-drop ALL` (container.no_new_privileges,
      container.capabilities): none of the above needs a capability. The GPU comes in through
      the NVIDIA runtime's device rules, the RDMA devices through --device, the memlock limit is
      set by Docker before the engine starts, and the API port is above 1024; so the engine runs
      with none (a port below 1024 needs NET_BIND_SERVICE, a checkpoint only root's override could
      read DAC_READ_SEARCH: add them under container.capabilities).
    """
    argv = ["--network", "host", "--ipc", "host"]
    if c.gpus:
        argv += ["--gpus", c.gpus]
    argv += ["--shm-size", c.shm_size,
             "--ulimit", f"nofile={c.nofile}:{c.nofile}", "--ulimit", f"memlock={c.memlock}:{c.memlock}"]
    for device in c.devices:
        argv += ["--device", device]
    if c.no_new_privileges:
        argv += ["--security-opt", "no-new-privileges"]
    if c.capabilities is not None:
        argv += ["--cap-drop", "ALL"]
        for capability in dict.fromkeys(c.capabilities):
            argv += ["--cap-add", capability]
    return argv


def _docker_run(loaded: Loaded, r: int, image: str, image_id: str | None = None) -> list[str]:
    """The container every rank runs (docs/architecture.md, "Serving"): host network and IPC, the
    GPU, the RDMA devices, NCCL-sized ulimits, first in line for the OOM killers (OOM_SCORE_ADJ), the
    checkpoint read-only at the same path, the image's compile caches (caches.py); its
    environment on stdin (env_file)."""
    model = loaded.cluster.model.serving_path  # the staged copy when model.local_path is set
    argv = ["docker", "run", "-d", "--name", CONTAINER_NAME, *host_settings(loaded.cluster.container),
            "--oom-score-adj", str(OOM_SCORE_ADJ)]
    argv += ["-v", f"{model}:{model}:ro", *nccl_mounts(loaded.cluster),
             *caches.mounts(loaded.cluster, image, image_id),
             "--label", f"org.sparkstack.profile={loaded.profile.name}",
             "--label", f"org.sparkstack.cluster={cluster_name(loaded)}",
             "--label", f"org.sparkstack.rank={r}", *ENV_FROM_STDIN]
    return argv + [image]


@dataclass(frozen=True)
class Sized:
    """What the plan sized that the engine is told (engines.RankStart); None: not the plan's."""

    tp: int | None
    kv_cache_bytes: int | None
    utilization: float | None


def _engine_argv(loaded: Loaded, r: int, sized: Sized, host_ip: str, master: str) -> list[str]:
    """The container's command after the image, from the engine's template (launcher/engines/):
    the flags it manages merged over the profile's and the config's (vLLM), or before them as
    written (TensorFold: its argparse takes the last of a repeated flag, so the config's win)."""
    cluster, profile, engine = loaded.cluster, loaded.profile, loaded.engine
    start = engines.RankStart(r, len(cluster.ranks), cluster.model.serving_path,
                              cluster.model.served_name or profile.served_name,
                              cluster.overrides.api_port or profile.api_port, host_ip, master,
                              master_port(loaded), tp=sized.tp, kv_cache_bytes=sized.kv_cache_bytes,
                              utilization=sized.utilization)
    managed = engine.managed(start)
    if engine.flags == engines.VLLM_FLAGS:
        ours = [vllm_flags.Flag(name, values, source=vllm_flags.PLAN) for name, values in managed]
        args = vllm_flags.render(vllm_flags.merge(loaded.flags, ours))
    else:
        args = [token for name, values in managed for token in (name, *values)]
        args += vllm_flags.split_lines(profile.args) + vllm_flags.split_lines(cluster.overrides.engine_args)
    return engine.command(start, args)
