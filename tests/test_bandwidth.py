"""`check --bandwidth`: the all-reduce script (its pure helpers and its no-torch error path, run
with this machine's python, which has no torch), the per-rank `docker run` lines, reading the
script's output and the judgement, and the real thing on the sandbox (the stand-in image has no
torch: every rank's row is a WARN "not measured").

The output fixtures are the script's real lines: RUN_A_* and NCCL_DEBUG_OUT were printed on two
H200s (torch 2.11.0+cu130, NCCL 2.28.9), the error lines there too and on the sandbox, the docker
errors by the sandbox ranks' Docker 26.1 (Debian trixie's docker.io, a current engine as on a
Spark; `docker run --pull never`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shlex
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest
import yaml
from click.testing import CliRunner

from local_probe import sandbox_rank_facts
from launcher.apply import bandwidth as running, preflight
from launcher.check import bandwidth, report as check
from planned import build_plan
from launcher.inputs import config
from launcher.facts.docker import Docker, Image
from launcher.status import Finding, Status
from launcher.check.bandwidth import Outcome, outcome
from launcher.cli.commands import main

IMAGE = "sparkstack/keys:0123456789abcdef"
MiB = 1 << 20


def load_script():
    spec = importlib.util.spec_from_file_location("nccl_allreduce", bandwidth.SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


script = load_script()


# --- real output lines --------------------------------------------------------------------------

RUN_A_0 = ('{"algbw_gbps": 289.085, "busbw_gbps": 289.085, "bytes": 268435456, "correct": true, "device": '
           '"cuda:0", "device_name": "NVIDIA H200", "dtype": "bfloat16", "iters": 20, "nccl_version": '
           '"2.28.9", "rank": 0, "seconds": 0.018571, "torch_version": "2.11.0+cu130", "warmup": 5, "world": 2}')
NCCL_DEBUG_OUT = """\
vm:707:707 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so
vm:707:707 [0] NCCL INFO NET/IB : No device found.
vm:707:707 [0] NCCL INFO NET/Socket : Using [0]eth0:192.0.2.2<0>
vm:707:707 [0] NCCL INFO comm 0xc1953b0 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0
vm:707:707 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM
{"algbw_gbps": 330.392, "busbw_gbps": 330.392, "bytes": 1073741824, "correct": true, "device": "cuda:0", "device_name": "NVIDIA H200", "dtype": "bfloat16", "iters": 50, "nccl_version": "2.28.9", "rank": 0, "seconds": 0.162495, "torch_version": "2.11.0+cu130", "warmup": 5, "world": 2}
vm:707:1029 [0] NCCL INFO comm 0xc1953b0 rank 0 nranks 2 cudaDev 0 busId 1000 - Destroy COMPLETE
"""
NO_TORCH = ('{"bytes": 268435456, "correct": false, "dtype": "bfloat16", "error": "no usable torch in '
            '/usr/bin/python3 (3.11.2): ModuleNotFoundError: No module named \'torch\'", "rank": 2, '
            '"stage": "import", "world": 4}')
RENDEZVOUS = ('{"bytes": 268435456, "correct": false, "device": "cuda:1", "device_name": "NVIDIA H200", '
              '"dtype": "bfloat16", "error": "tcp://127.0.0.1:29599 (rank 1 of 2): DistNetworkError: The client '
              'socket has timed out after 10000ms while trying to connect to (127.0.0.1, 29599).", '
              '"nccl_version": "2.28.9", "rank": 1, "stage": "rendezvous", "torch_version": "2.11.0+cu130", "world": 2}')
DEADLINE = ('{"bytes": 268435456, "correct": false, "device": "cuda:0", "device_name": "NVIDIA H200", "dtype": '
            '"bfloat16", "error": "timed out after 8 s in stage rendezvous", "nccl_version": "2.28.9", "rank": 0, '
            '"stage": "rendezvous", "timeout": true, "torch_version": "2.11.0+cu130", "world": 2}')
NO_IMAGE = ("docker: Error response from daemon: No such image: nosuch/image:tag.\n"
            "See 'docker run --help'.\n")
NO_PYTHON = ('docker: Error response from daemon: failed to create task for container: failed to create shim '
             'task: OCI runtime create failed: runc '
             'create failed: unable to start container process: exec: "python3x": executable file not found '
             'in $PATH: unknown.\n')


def measured(rank: int, world: int = 4, busbw: float = 21.0, **changes) -> Outcome:
    """A run-A line as rank `rank` of `world` would print it at `busbw` GB/s."""
    m = json.loads(RUN_A_0)
    algbw = busbw / script.bus_factor(world)
    m.update(rank=rank, world=world, busbw_gbps=busbw, algbw_gbps=round(algbw, 3),
             seconds=round(m["bytes"] / algbw / 1e9 * m["iters"], 6), device="cuda:0", device_name="NVIDIA GB10")
    m.update(changes)
    return outcome(rank, 0, json.dumps(m, sort_keys=True) + "\n")


# --- the script ----------------------------------------------------------------------------------

def test_bus_bandwidth_is_nccl_tests_definition():
    assert [script.bus_factor(n) for n in (1, 2, 4, 8)] == [0.0, 1.0, 1.5, 1.75]
    # run A's own figures, recomputed: 256 MiB in 18.571 ms / 20 iterations, two ranks
    assert script.algbw_gbps(268435456, 0.018571 / 20) == pytest.approx(289.085, abs=0.01)
    assert script.busbw_gbps(268435456, 0.018571 / 20, 2) == pytest.approx(289.085, abs=0.01)
    # four ranks: busbw = algbw x 1.5
    assert script.busbw_gbps(256 * MiB, 0.02, 4) == pytest.approx(256 * MiB / 0.02 / 1e9 * 1.5)
    # the check's sum: element i of rank r holds (i % 7) + r + 1; exact in bf16 (< 256) to 16 ranks
    assert script.expected_sum(4, 0) == 10 and script.expected_sum(4, 6) == 34
    assert script.expected_sum(16, script.PATTERN - 1) < 256


def test_script_arguments_from_env_and_json():
    env = {"RANK": "2", "WORLD_SIZE": "4", "MASTER_ADDR": "172.31.240.11", "MASTER_PORT": "29517"}
    args = script.parse_args(["-", json.dumps({"iters": 3})], env)
    assert (args["rank"], args["world"], args["master_addr"], args["master_port"]) == (2, 4, "172.31.240.11", 29517)
    assert (args["bytes"], args["dtype"], args["iters"], args["device"]) == (256 * MiB, "bfloat16", 3, "cuda:0")
    assert script.parse_args(["-", '{"rank": 0, "world": 2}'], env)["rank"] == 0  # arguments win
    for argv, environ, words in ((["-"], {}, "RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT not set"),
                                 (["-", "{bad"], env, "not JSON"),
                                 (["-", '{"dtype": "int8"}'], env, "dtype 'int8'"),
                                 (["-", '{"rank": 4}'], env, "rank 4 outside world size 4")):
        with pytest.raises(script.Failure) as e:
            script.parse_args(argv, environ)
        assert e.value.stage == "args" and words in str(e.value)


def run_script(args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The script as a rank runs it, `python3 - '<args>'` with the script on stdin; -S: no
    site-packages, so no torch whatever this machine has."""
    return subprocess.run([sys.executable, "-S", "-", args], input=bandwidth.SCRIPT.read_bytes(),
                          capture_output=True, timeout=60, env=env or {"PATH": "/usr/bin:/bin"})


def test_script_without_torch_prints_one_json_error_and_fails():
    p = run_script(json.dumps({"rank": 1, "world": 4, "master_addr": "127.0.0.1", "master_port": 29517}))
    assert p.returncode == 3, p
    lines = p.stdout.decode().splitlines()
    assert len(lines) == 1, p.stdout
    got = json.loads(lines[0])
    assert got["stage"] == "import" and "No module named 'torch'" in got["error"], got
    assert (got["rank"], got["world"], got["bytes"], got["correct"]) == (1, 4, 256 * MiB, False)
    assert b"Traceback" not in p.stdout + p.stderr
    assert outcome(1, p.returncode, p.stdout.decode(), p.stderr.decode()).kind == "no_torch"


def test_script_bad_arguments_are_a_json_error_too():
    p = run_script("{not json")
    assert p.returncode == 2
    got = json.loads(p.stdout)
    assert got["stage"] == "args" and got["error"].startswith("arguments are not JSON")


# --- the command lines ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ring(tmp_path_factory):
    """The sandbox's ring as a real Spark's cluster.yaml would give it (GPU, RDMA devices, the
    seeds' ulimits), with an API key and an extra env, and each rank's facts from its fixture
    sysfs through the real probe."""
    from launcher.sandbox import cluster, fabric_fixture as sfabric

    d = tmp_path_factory.mktemp("ring")
    ranks = [{"name": f"spark{i + 1}", "address": f"172.31.240.{11 + i}", "user": "spark",
              "fabric_ips": [sfabric.fabric_truth(i)["fabric_ip"]], "sysfs_root": "/sandbox/sysfs"}
             for i in range(4)]
    doc = {"profile": "sandbox", "topology": "ring", "ranks": ranks, "model": {"path": cluster.MODEL_PATH},
           "overrides": {"api_key": "sk-not-on-a-command-line",
                         "env": {"NCCL_DEBUG": "WARN", "HF_TOKEN": "hf-not-on-a-command-line"}}}
    (d / "cluster.yaml").write_text(yaml.safe_dump(doc))
    found = {r: sandbox_rank_facts(d / f"spark{r + 1}", r) for r in range(4)}
    return SimpleNamespace(loaded=config.load(d / "cluster.yaml"), facts=found,
                           truth=[sfabric.fabric_truth(i) for i in range(4)])


def argv_of(job: bandwidth.Job) -> list[str]:
    cleanup, run = job.command.split("; ", 1)
    assert cleanup == "docker rm -f sparkstack-bandwidth >/dev/null 2>&1"
    return shlex.split(run)


GOLDEN_ARGV = [
    "docker", "run", "--rm", "--pull", "never", "--name", "sparkstack-bandwidth",
    "--network", "host", "--ipc", "host", "--gpus", "all", "--shm-size", "16g",
    "--ulimit", "nofile=1048576:1048576", "--ulimit", "memlock=-1:-1", "--device", "/dev/infiniband",
    "--security-opt", "no-new-privileges", "--cap-drop", "ALL",  # launcher/plan/cluster_plan.py host_settings
    "--env-file", "/dev/stdin",
    "--entrypoint", "python3", IMAGE, "-c", bandwidth.SCRIPT.read_text(),
    '{"bytes": 268435456, "deadline_s": 180, "device": "cuda:0", "dtype": "bfloat16", "iters": 20, '
    '"timeout_s": 60, "warmup": 5}',
]
GOLDEN_ENV_RANK_2 = """\
GLOO_SOCKET_IFNAME=eth0
HF_TOKEN=hf-not-on-a-command-line
LOCAL_RANK=0
MASTER_ADDR=172.31.240.11
MASTER_PORT=29517
NCCL_ALGO=Ring
NCCL_DEBUG=WARN
NCCL_IB_HCA==rocep1s0f0,rocep1s0f1
NCCL_IB_MERGE_NICS=0
NCCL_IB_SUBNET_AWARE_ROUTING=1
NCCL_NET=IB
NCCL_NET_PLUGIN=none
NCCL_SOCKET_IFNAME==eth0
RANK=2
UCX_NET_DEVICES=rocep1s0f0:1,rocep1s0f1:1
VLLM_HOST_IP=172.31.240.13
WORLD_SIZE=4
"""


def test_command_per_rank_golden(ring):
    envs, notes = bandwidth.rank_envs(ring.loaded, ring.facts)
    assert notes == []
    jobs = bandwidth.commands(ring.loaded, IMAGE, envs)
    assert argv_of(jobs[2]) == GOLDEN_ARGV
    assert jobs[2].stdin.decode() == GOLDEN_ENV_RANK_2  # `docker run --env-file /dev/stdin`
    for r, job in jobs.items():
        truth = ring.truth[r]
        assert job.command == jobs[2].command  # what differs per rank is on stdin
        assert job.timeout == 180 + bandwidth.START_MARGIN_S
        e = job.env
        assert (e["RANK"], e["WORLD_SIZE"], e["MASTER_ADDR"], e["MASTER_PORT"]) == (str(r), "4", "172.31.240.11", "29517")
        # the rank's OWN pins: RDMA on both ports' addressed HCAs (the twins are unaddressed), the
        # sockets on its management interface (a ring: every rank reaches every other there)
        assert e["NCCL_IB_HCA"] == "=" + ",".join(port["hcas"][0] for port in truth["ports"])
        assert (e["NCCL_SOCKET_IFNAME"], e["GLOO_SOCKET_IFNAME"]) == ("=eth0", "eth0")
        assert e["VLLM_HOST_IP"] == f"172.31.240.{11 + r}"
        # the env on stdin, no value on the command line (`ps` on the rank shows that to all)
        assert job.stdin.decode() == "".join(f"{k}={e[k]}\n" for k in sorted(e))
        assert not any(f"{k}={v}" in job.command for k, v in e.items())
        assert "hf-not-on-a-command-line" not in job.command and "-e" not in argv_of(job)
        assert "VLLM_API_KEY" not in e and b"sk-not-on-a-command-line" not in job.stdin
    assert {jobs[r].env["NCCL_IB_HCA"] for r in jobs} == {"=rocep1s0f0,rocep1s0f1"}


def test_command_mounts_the_host_nccl_the_env_preloads(ring):
    lib = "/opt/nccl-2.30.7/lib/libnccl.so.2"
    loaded = ring.loaded.model_copy(update={"cluster": ring.loaded.cluster.model_copy(update={
        "nccl": ring.loaded.cluster.nccl.model_copy(update={"host_lib": lib})})})
    envs, _ = bandwidth.rank_envs(loaded, ring.facts)
    job = bandwidth.commands(loaded, IMAGE, envs)[1]
    argv = argv_of(job)
    assert argv[argv.index(f"{lib}:{lib}:ro") - 1] == "-v" and f"LD_PRELOAD={lib}\n".encode() in job.stdin


def test_command_env_is_the_plans_serving_env(ring):
    """The probe gets exactly the env `up` gives the engine, less the API key and the compile
    caches' paths (the probe mounts no cache), plus its own five."""
    from launcher.plan import caches

    envs, _ = bandwidth.rank_envs(ring.loaded, ring.facts)
    served = build_plan(ring.loaded, ring.facts)
    for r, rank_plan in enumerate(served.ranks):
        assert set(caches.ENV) <= set(rank_plan.env)
        want = {k: v for k, v in rank_plan.env.items() if k != "VLLM_API_KEY" and k not in caches.ENV}
        assert envs[r] == want
        job_env = bandwidth.job_env(envs[r], r, 4, "10.0.0.1", 1234)
        assert {k: v for k, v in job_env.items() if k not in bandwidth.JOB_ENV} == want


def test_command_without_gpu_or_devices_and_other_sizes(ring):
    loaded = ring.loaded.model_copy(update={"cluster": ring.loaded.cluster.model_copy(update={
        "container": ring.loaded.cluster.container.model_copy(update={"gpus": None, "devices": []})})})
    envs, _ = bandwidth.rank_envs(loaded, ring.facts)
    job = bandwidth.commands(loaded, IMAGE, envs, master="192.168.177.1", port=29600, args={"bytes": 1 << 30})[0]
    argv = argv_of(job)
    assert "--gpus" not in argv and "--device" not in argv
    assert b"MASTER_ADDR=192.168.177.1\n" in job.stdin and b"MASTER_PORT=29600\n" in job.stdin
    assert json.loads(argv[-1])["bytes"] == 1 << 30 and argv[-3] == "-c"


# --- reading the output --------------------------------------------------------------------------

def test_outcome_from_real_output():
    a = outcome(0, 0, RUN_A_0 + "\n")
    assert a.kind == "measured" and a.result["busbw_gbps"] == 289.085
    mixed = outcome(0, 0, NCCL_DEBUG_OUT)  # NCCL_DEBUG=INFO writes to stdout too
    assert mixed.kind == "measured" and mixed.result["bytes"] == 1 << 30
    assert outcome(2, 3, NO_TORCH + "\n").kind == "no_torch"
    assert outcome(1, 3, RENDEZVOUS + "\n").kind == "waiting"
    assert outcome(0, 3, DEADLINE + "\n").kind == "waiting"
    nccl = json.dumps(dict(json.loads(RENDEZVOUS), stage="nccl_init", error="DistBackendError: NCCL error"))
    assert outcome(1, 3, nccl).kind == "error" and outcome(1, 3, nccl).causes_others
    assert outcome(3, 125, "", NO_IMAGE).kind == "no_image"
    assert outcome(3, 127, "", NO_PYTHON).kind == "no_python"
    assert outcome(3, 137, "", "").kind == "waiting"
    broken = outcome(3, None, "", "", "rank 3 (spark4): connection lost (EOFError: ...)")
    assert broken.kind == "broken" and broken.problem.startswith("rank 3")
    assert outcome(3, 1, "Segmentation fault\n").kind == "broken"


# --- the judgement -------------------------------------------------------------------------------

def judge(outcomes):
    return bandwidth.judge({o.rank: o for o in outcomes}, image=IMAGE, master="172.31.240.11")


def test_pass_at_the_expected_figure_warn_below():
    floor = bandwidth.EXPECTED_BUSBW_GBPS * bandwidth.TOLERANCE
    found = judge([measured(0, busbw=21.4), measured(1, busbw=floor), measured(2, busbw=floor - 0.1),
                   measured(3, busbw=6.1)])
    assert [found[r].status for r in range(4)] == [Status.PASS, Status.PASS, Status.WARN, Status.WARN]
    assert found[0].value == ("busbw 21.4 GB/s (algbw 14.3), 256 MiB bfloat16 all-reduce x20 over 4 ranks, "
                              f"NCCL 2.28.9; expected >= {floor:.1f} GB/s (20 x 0.75)")
    assert found[0].fix == ""
    assert "below the expected" in found[3].value and "NET/IB" in found[3].fix


def test_wrong_sum_fails():
    bad = json.loads(RUN_A_0)
    bad.update(world=4, rank=1, correct=False, stage="verify", error="all-reduce sum wrong in 12 of 134217728 elements")
    found = judge([measured(0), outcome(1, 3, json.dumps(bad)), measured(2), measured(3)])
    assert found[1].status == Status.FAIL and found[1].value.startswith("wrong result: all-reduce sum wrong in 12")
    assert found[0].status == Status.PASS


def test_a_rank_without_torch_makes_every_row_not_measured():
    waiting = outcome(0, 3, json.dumps(dict(json.loads(DEADLINE), world=4)))
    found = judge([waiting, outcome(1, 137, "", ""), outcome(2, 3, NO_TORCH), outcome(3, 137, "", "")])
    assert {f.status for f in found.values()} == {Status.WARN}
    assert found[2].value.startswith(f"not measured: {IMAGE} has no torch (no usable torch")
    for r in (0, 1, 3):
        assert found[r].value.startswith(f"not measured: rank 2 could not take part: {IMAGE} has no torch"), found[r]
    assert "sparkstack build && sparkstack ship" in found[0].fix


def test_failures_of_the_measurement_fail_with_their_fix():
    alone = judge([outcome(0, 0, RUN_A_0), outcome(1, 3, RENDEZVOUS)])
    assert alone[1].status == Status.FAIL and alone[1].value.startswith("rendezvous failed: tcp://127.0.0.1:29599")
    assert "tcp://172.31.240.11:29517" in alone[1].fix
    nccl = json.dumps(dict(json.loads(RENDEZVOUS), stage="nccl_init", error="DistBackendError: NCCL error in: "
                           "remote process exited or there was a network error"))
    found = judge([outcome(0, 3, DEADLINE), outcome(1, 3, nccl)])
    assert found[1].status == Status.FAIL and found[1].value.startswith("NCCL failed in nccl_init: DistBackendError")
    assert "NCCL_IB_HCA" in found[1].fix
    assert found[0].status == Status.FAIL and found[0].value.startswith("not measured: rank 1 could not take part: NCCL")
    no_gpu = json.dumps(dict(json.loads(NO_TORCH), stage="cuda", error="torch 2.9.0 sees no CUDA device"))
    assert judge([outcome(0, 3, no_gpu)])[0].value.startswith("no GPU for the probe")
    lost = judge([outcome(0, None, "", "", "rank 0 (spark1): connection lost")])
    assert lost[0].status == Status.FAIL and "connection lost" in lost[0].value


def test_notes_on_ranks_without_fabric_env_are_shown():
    found = bandwidth.judge({0: measured(0)}, image=IMAGE, master="m", notes=["fabric environment of rank 3: not derived"])
    assert found[0].value.endswith("; fabric environment of rank 3: not derived")


def test_preconditions(ring):
    loaded = ring.loaded
    unknown = bandwidth.preconditions(loaded, None, ring.facts, "no patches dir")
    assert unknown[0].value == "not measured: the serving image is not known: no patches dir"
    three = {r: f for r, f in ring.facts.items() if r != 1}
    absent = bandwidth.preconditions(loaded, IMAGE, three, None)
    assert sorted(absent) == [0, 2, 3] and "rank 1 did not answer" in absent[0].value
    # the fixture facts come from this machine's probe: its Docker (or none) is no rank's
    image = Image("sha256:" + "a" * 64, (IMAGE,), {}, 1)
    with_image = {r: dataclasses.replace(f, docker=Docker("27.0", "27.0", "/var/lib/docker", 1, 1,
                                                                (image,) if r != 3 else ()))
                  for r, f in ring.facts.items()}
    missing = bandwidth.preconditions(loaded, IMAGE, with_image, None)
    assert missing[0] == Finding("bandwidth", Status.WARN, f"not measured: {IMAGE} missing on rank 3", "sparkstack ship")
    with_image[3] = with_image[0]
    assert bandwidth.preconditions(loaded, IMAGE, with_image, None) is None


# --- running: the first rank that cannot take part stops the others ------------------------------

class FakeConn:
    """A rank that answers `answer` at once, or (answer None) runs until its container is stopped."""

    def __init__(self, rank, answer):
        self.target = SimpleNamespace(rank=rank, name=f"rank {rank}")
        self.answer, self.stopped, self.commands = answer, threading.Event(), []

    def run(self, command, stdin=None, timeout=60.0):
        self.commands.append(command)
        if command == bandwidth.stop_command():
            self.stopped.set()
            return SimpleNamespace(exit_status=0, stdout="", stderr="", error=None)
        if self.answer is not None:
            return SimpleNamespace(exit_status=3, stdout=self.answer, stderr="", error=None)
        assert self.stopped.wait(10), "never stopped"
        return SimpleNamespace(exit_status=137, stdout="", stderr="", error=None)


def test_measure_stops_the_waiting_ranks(monkeypatch):
    monkeypatch.setattr(running, "STOP_GRACE_S", 0.2)
    conns = [FakeConn(0, None), FakeConn(1, None), FakeConn(2, NO_TORCH + "\n"), FakeConn(3, None)]
    jobs = {r: bandwidth.Job(r, f"job {r}", b"", {}, 60) for r in range(4)}
    started = time.monotonic()
    outcomes = running.measure(SimpleNamespace(connections=conns), jobs)
    assert time.monotonic() - started < 5
    assert [outcomes[r].kind for r in range(4)] == ["waiting", "waiting", "no_torch", "waiting"]
    stop = bandwidth.stop_command()
    assert [c.commands for c in conns] == [["job 0", stop], ["job 1", stop], ["job 2"], ["job 3", stop]]


# --- on the sandbox ------------------------------------------------------------------------------

def test_check_bandwidth_on_the_sandbox_is_not_measured_without_torch(sandbox):
    loaded = config.load(sandbox.config)
    report = preflight.run(loaded, image=sandbox.images["vllm"], bandwidth=True)
    for r in report.ranks:
        rows = [n for n in check.ORDER if n != "api key" or r.rank == 0]  # rank 0 serves the API
        assert [c.name for c in r.checks if c.name != "engine config"] == [*rows, "bandwidth"]  # rank 0's, asked
        row = r.checks[-1]
        assert row.status == Status.WARN and row.value.startswith(f"not measured: {sandbox.images['vllm']} has no torch"), row
        assert "sparkstack build && sparkstack ship" in row.fix
    assert report.ok  # a WARN: `up` is not refused for want of a measurement
    # the CLI: the option, and the row in --json whatever the profile's image is on the ranks
    result = CliRunner().invoke(main, ["check", "-c", str(sandbox.config), "--json", "--bandwidth"])
    rows = [next(c for c in r["checks"] if c["name"] == "bandwidth") for r in json.loads(result.output)["ranks"]]
    assert len(rows) == 4 and all(c["status"] == Status.WARN and c["value"].startswith("not measured: ") for c in rows), rows
    # no leftover probe container on any rank
    for name in sandbox.names:
        assert sandbox.run(name, "docker ps -aq --filter name=sparkstack-bandwidth")[1].strip() == ""
