"""`check --bandwidth`: the fabric measured, not only inspected -- one NCCL all-reduce across every
rank through torch.distributed, in the serving image, with each rank's own NCCL environment.

Per rank one `docker run --rm` of the serving image (host network and IPC, the GPU, the RDMA
devices, the serving container's ulimits, as launcher/plan/cluster_plan.py's `_docker_run`) runs
launcher/onrank/nccl_allreduce.py (`python3 -c SCRIPT`). Its environment is the rank's serving
environment from the plan (the profile's env, the ring variables, the rank's own
NCCL_SOCKET_IFNAME / NCCL_IB_HCA / NCCL_IB_GID_INDEX / UCX / Gloo pins from its sysfs, the
config's overrides.env; never the API key) plus RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
MASTER_ADDR is the address vLLM's own rendezvous uses (plan.rendezvous: the config's choice, else
rank 0's fabric IP on a switch, its management address in a ring). The environment travels on
stdin as the serving container's does (plan.env_file): overrides.env may hold a token, and a
command line is visible to every user of the rank (`ps`).

Pure, all of it: the command lines (`commands`), reading the script's output (`outcome`) and the
judgement (`judge`); launcher/apply/bandwidth.py runs them on an open remote.Group (`measure`) and
its `check` is what `sparkstack check --bandwidth` calls. A rank that cannot take part (no torch in the image -- the sandbox's
stand-in --, no python3, the image missing, a rank unreachable) makes the row a WARN "not
measured: <why>" with the fix; a failure of the measurement itself (no CUDA, NCCL init,
rendezvous, a wrong sum, a timeout) is a FAIL.

While it runs (about 20-40 s, most of it starting the image and importing torch) the GPU and the
fabric are busy: numbers taken next to a serving engine are low, and a running engine's memory
leaves the probe little room (it allocates about 3 x the buffer).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from .. import onrank
from ..facts.record import Facts
from ..inputs.config import Loaded
from ..plan import cluster_plan as plan_mod
from ..status import Finding, Status

# The bus bandwidth (nccl-tests' busbw, GB/s = 1e9 B/s) a healthy 4-Spark fabric should show for
# a 256 MiB all-reduce. AN ESTIMATE, NOT A MEASUREMENT: the seeds (/work/shared/seeds/*.txt)
# give no NCCL figure. A DGX Spark's ConnectX-7 port is 200 Gb/s = 25 GB/s line rate (each QSFP
# port is two PCIe Gen5 x4 "twins", hence NCCL_IB_HCA naming both); NCCL over RoCE reaches about
# 80% of line rate at large messages, so ~20 GB/s on one port per rank (switch); a ring that
# drives both ports may show more, which passes. Replace it with a measured figure once one exists.
NAME = "bandwidth"  # the row's name (`check --bandwidth`)
EXPECTED_BUSBW_GBPS = 20.0
TOLERANCE = 0.75  # pass at >= 15 GB/s; below that something is wrong (sockets not RDMA, 100G, ...)

CONTAINER = "sparkstack-bandwidth"
PORT = 29517  # rank 0's TCP store; not vLLM's (its own master port) nor Ray's
DEVICE = "cuda:0"  # one GPU per Spark
SCRIPT = onrank.path("nccl_allreduce")
SCRIPT_ARGS = {"device": DEVICE, "bytes": 256 << 20, "dtype": "bfloat16", "warmup": 5, "iters": 20,
               "timeout_s": 60, "deadline_s": 180}
START_MARGIN_S = 120  # beyond the script's deadline: the image starting (a cold 20 GB image)
JOB_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")

NO_TORCH_FIX = ("measure in the serving image with vLLM (it ships torch and NCCL): sparkstack build && "
                "sparkstack ship; the sandbox's stand-in image has no torch")
NCCL_FIX = ("check each rank's NCCL_SOCKET_IFNAME / NCCL_IB_HCA / NCCL_IB_GID_INDEX (sparkstack plan) and "
            "the link/roce/peers rows; NCCL_DEBUG=INFO in overrides.env shows NCCL's own reason")
SLOW_FIX = ("see the link (200G) and mtu rows; NCCL_DEBUG=INFO in overrides.env must show NET/IB "
            "(RDMA), not NET/Socket; nothing else (the engine) may load the GPU or fabric meanwhile")


# --- the command lines (pure) ------------------------------------------------------------------

@dataclass(frozen=True)
class Job:
    """One rank's part: the shell command, its stdin (the container env) and that env."""

    rank: int
    command: str
    stdin: bytes
    env: dict[str, str]
    timeout: float


def rank_envs(loaded: Loaded, facts: dict[int, Facts]) -> tuple[dict[int, dict[str, str]], list[str]]:
    """Each rank's serving environment as the plan builds it (plan.fabric_envs, plan.rank_env),
    without the API key; the fabric pins are derived whatever the engine, since NCCL needs them.
    Also the plan's notes on ranks whose fabric env could not be derived."""
    notes: list[str] = []
    fabric_env = plan_mod.fabric_envs(loaded, facts, notes)
    envs = {r: plan_mod.rank_env(loaded, r, fabric_env.get(r, {})) for r in range(len(loaded.cluster.ranks))}
    return envs, notes


def job_env(env: dict[str, str], rank: int, world: int, master: str, port: int) -> dict[str, str]:
    out = {k: v for k, v in env.items() if k not in JOB_ENV}
    out.update({"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": master,
                "MASTER_PORT": str(port), "LOCAL_RANK": "0"})
    return out


def docker_argv(loaded: Loaded, image: str, args: dict) -> list[str]:
    """`docker run --rm` of the image with the serving container's host settings, the env on
    stdin, the script as `python3 -c`. `--pull never`: a rank without the image says so, it pulls
    nothing."""
    argv = ["docker", "run", "--rm", "--pull", "never", "--name", CONTAINER,
            *plan_mod.host_settings(loaded.cluster.container), *plan_mod.nccl_mounts(loaded.cluster),
            *plan_mod.ENV_FROM_STDIN]
    return argv + ["--entrypoint", "python3", image, "-c", SCRIPT.read_text(), json.dumps(args, sort_keys=True)]


def commands(loaded: Loaded, image: str, envs: dict[int, dict[str, str]], *, master: str | None = None,
             port: int = PORT, args: dict | None = None) -> dict[int, Job]:
    """Every rank's job. A leftover probe container (a run cut off) is removed first."""
    world = len(loaded.cluster.ranks)
    master = master or plan_mod.rendezvous(loaded)
    args = dict(SCRIPT_ARGS, **(args or {}))
    command = f"docker rm -f {CONTAINER} >/dev/null 2>&1; " + shlex.join(docker_argv(loaded, image, args))
    jobs = {}
    for r in range(world):
        env = job_env(envs.get(r, {}), r, world, master, port)
        jobs[r] = Job(r, command, plan_mod.env_file(env, f"check --bandwidth: rank {r}"), env,
                      float(args["deadline_s"]) + START_MARGIN_S)
    return jobs


# --- what came back (pure) ---------------------------------------------------------------------

@dataclass(frozen=True)
class Outcome:
    """One rank's answer: the script's JSON (a measurement or its error), else why there is none."""

    rank: int
    result: dict | None = None
    exit_status: int | None = None
    problem: str | None = None  # no JSON: the connection, docker or the container said this
    kind: str = "measured"  # measured | error | no_torch | no_python | no_image | waiting | broken

    @property
    def causes_others(self) -> bool:
        """A rank that cannot take part: the others wait for it in vain."""
        return self.kind in ("error", "no_torch", "no_python", "no_image", "broken")


WAITING_STAGES = ("rendezvous",)  # failing there is usually another rank's doing


def last_json(stdout: str) -> dict | None:
    """The script's one JSON line; NCCL_DEBUG output may share stdout, so the last that parses."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                found = json.loads(line)
            except ValueError:
                continue
            if isinstance(found, dict):
                return found
    return None


def outcome(rank: int, exit_status: int | None, stdout: str, stderr: str = "",
            error: str | None = None) -> Outcome:
    """Classify one rank's run (exit status and output of the `docker run`, or the connection's
    error)."""
    if error:
        return Outcome(rank, None, exit_status, error, "broken")
    found = last_json(stdout)
    if found is not None:
        if not found.get("error"):
            return Outcome(rank, found, exit_status)
        if found.get("stage") == "import":
            return Outcome(rank, found, exit_status, None, "no_torch")
        waiting = found.get("stage") in WAITING_STAGES or found.get("timeout")
        return Outcome(rank, found, exit_status, None, "waiting" if waiting else "error")
    text = " | ".join((stderr.strip() or stdout.strip()).splitlines()[-3:])
    if exit_status in (126, 127) or "executable file not found" in text:
        return Outcome(rank, None, exit_status, text or "python3 not found in the image", "no_python")
    if "No such image" in text or "Unable to find image" in text:
        return Outcome(rank, None, exit_status, text, "no_image")
    if exit_status == 137:  # stopped (by us, once another rank failed) or killed
        return Outcome(rank, None, exit_status, text or "stopped (exit 137)", "waiting")
    return Outcome(rank, None, exit_status, text or f"exited {exit_status} without a result", "broken")


# --- the judgement (pure) ----------------------------------------------------------------------

def _size(n: int) -> str:
    return f"{n >> 30} GiB" if n >= 1 << 30 and n % (1 << 30) == 0 else \
        f"{n >> 20} MiB" if n % (1 << 20) == 0 else f"{n} B"


def _own(o: Outcome, image: str, master: str, port: int) -> tuple[Status, str, str]:
    """(status, value, fix) for a rank that did not measure, in its own words."""
    r = o.result or {}
    why = r.get("error") or o.problem or "no result"
    if o.kind == "no_torch":
        return Status.WARN, f"not measured: {image} has no torch ({why})", NO_TORCH_FIX
    if o.kind == "no_python":
        return Status.WARN, f"not measured: no python3 in {image} ({why})", NO_TORCH_FIX
    if o.kind == "no_image":
        return Status.WARN, f"not measured: {image} missing ({why})", "sparkstack ship"
    stage = r.get("stage")
    if stage == "rendezvous":
        return Status.FAIL, f"rendezvous failed: {why}", (f"every rank must reach tcp://{master}:{port} (rank 0's "
                                                          "rendezvous address; cluster.yaml `rendezvous` picks "
                                                          "another) and the port must be free on rank 0")
    if stage == "cuda":
        return Status.FAIL, f"no GPU for the probe: {why}", ("the container needs the GPU: container.gpus in "
                                                             "cluster.yaml and the NVIDIA container toolkit")
    if stage == "verify":
        return Status.FAIL, f"wrong result: {why}", ("data arrived corrupted: check the link/roce rows and the "
                                                     "NICs' firmware; " + NCCL_FIX)
    if stage in ("nccl_init", "allreduce"):
        return Status.FAIL, f"NCCL failed in {stage}: {why}", NCCL_FIX
    return Status.FAIL, f"failed: {why}", "re-run check --bandwidth; " + NCCL_FIX


def judge(outcomes: dict[int, Outcome], *, image: str, master: str, port: int = PORT,
          expected: float = EXPECTED_BUSBW_GBPS, tolerance: float = TOLERANCE,
          notes: list[str] | None = None) -> dict[int, Finding]:
    """Per rank: pass at busbw >= expected x tolerance, warn below; a rank that waited in vain
    for another is reported with that other rank's cause; `notes` (ranks measured without their
    fabric env) are appended to every measured value."""
    floor = expected * tolerance
    causes = [o for r, o in sorted(outcomes.items()) if o.causes_others]
    extra = ("; " + "; ".join(notes)) if notes else ""
    found: dict[int, Finding] = {}
    for r, o in sorted(outcomes.items()):
        if o.kind == "measured":
            m = o.result
            busbw, algbw = float(m.get("busbw_gbps") or 0), float(m.get("algbw_gbps") or 0)
            shown = (f"busbw {busbw:.1f} GB/s (algbw {algbw:.1f}), {_size(int(m.get('bytes') or 0))} "
                     f"{m.get('dtype', '')} all-reduce x{m.get('iters')} over {m.get('world')} ranks, "
                     f"NCCL {m.get('nccl_version')}; expected >= {floor:.1f} GB/s "
                     f"({expected:g} x {tolerance:g}){extra}")
            if m.get("correct") is not True:  # the script reports a wrong sum as an error
                found[r] = Finding(NAME, Status.FAIL, "sum not verified: " + shown, NCCL_FIX)
            elif busbw >= floor:
                found[r] = Finding(NAME, Status.PASS, shown)
            else:
                found[r] = Finding(NAME, Status.WARN, shown.replace("; expected >=", "; below the expected"), SLOW_FIX)
            continue
        if o.kind == "waiting" and any(c.rank != r for c in causes):
            cause = next(c for c in causes if c.rank != r)
            status, value, fix = _own(cause, image, master, port)
            value = value.removeprefix("not measured: ")
            found[r] = Finding(NAME, status, f"not measured: rank {cause.rank} could not take part: {value}", fix)
            continue
        status, value, fix = _own(o, image, master, port)
        found[r] = Finding(NAME, status, value, fix)
    return found


def not_measured(ranks, why: str, fix: str) -> dict[int, Finding]:
    return {r: Finding(NAME, Status.WARN, f"not measured: {why}", fix) for r in ranks}


def preconditions(loaded: Loaded, image: str | None, facts: dict[int, Facts],
                  image_error: str | None = None) -> dict[int, Finding] | None:
    """Findings for every answering rank when the measurement cannot start at all; else None.
    An all-reduce needs every rank, each with Docker and the image."""
    ranks = sorted(facts)
    n = len(loaded.cluster.ranks)
    if n < 2:
        return not_measured(ranks, "one rank: nothing crosses the fabric", "")
    if image is None:
        return not_measured(ranks, f"the serving image is not known: {image_error}", "sparkstack build")
    absent = [r for r in range(n) if r not in facts]
    if absent:
        return not_measured(ranks, "the all-reduce needs every rank; " + ", ".join(
            f"rank {r} did not answer" for r in absent), "see the ssh row")
    no_docker = [r for r, f in facts.items() if f.docker is None or f.docker.server_version is None]
    if no_docker:
        return not_measured(ranks, "no Docker on " + ", ".join(f"rank {r}" for r in no_docker),
                            "see the docker row")
    lacking = [r for r, f in facts.items() if f.docker.image(image) is None]
    if lacking:
        return not_measured(ranks, f"{image} missing on " + ", ".join(f"rank {r}" for r in lacking),
                            "sparkstack ship")
    return None


def stop_command() -> str:
    return f"docker rm -f {CONTAINER} >/dev/null 2>&1; true"
