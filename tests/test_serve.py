"""`up`, `status`, `logs`, `down` on the sandbox: what each rank's engine was really started with."""

import json
import time
from pathlib import Path

import httpx
import pytest
import yaml

from serving import VLLM_RECORD, cli, engine_record, mgmt_if





@pytest.fixture(scope="module")
def cfg(sandbox):
    path = str(sandbox.config)
    yield path
    cli("down", "-c", path)


@pytest.fixture(scope="module")
def started(cfg):
    result = cli("up", "-c", cfg)
    assert result.exit_code == 0, result.output
    return result


def record(sandbox, name):
    return engine_record(sandbox, name, VLLM_RECORD)


def test_each_rank_runs_the_planned_engine(sandbox, cfg, started):
    plan = json.loads(cli("plan", "-c", cfg, "--json", "--show-secrets").stdout)
    head = sandbox.rank("spark1")["address"]
    for r, name in enumerate(sandbox.names):
        rec = record(sandbox, name)
        argv = rec["argv"]
        assert argv[:2] == ["serve", "/models/glm53-sandbox"]
        assert argv[argv.index("--tensor-parallel-size") + 1] == "4"
        assert argv[argv.index("--nnodes") + 1] == "4"
        assert argv[argv.index("--node-rank") + 1] == str(r)
        assert argv[argv.index("--master-addr") + 1] == head
        assert ("--headless" in argv) == (r > 0)
        assert rec["mode"] == ("headless" if r else "api")
        assert argv[argv.index("--kv-cache-memory-bytes") + 1] == str(plan["kv"]["kv_cache_memory_bytes"])
        # the utilisation that clears vLLM's startup guard on this rank's (sandbox) meminfo
        guard = plan["vllm_guard"]
        assert argv[argv.index("--gpu-memory-utilization") + 1] == str(guard["gpu_memory_utilization"])
        assert not guard["ranks"][r]["refused"] and guard["ranks"][r]["need"] <= guard["ranks"][r]["free"]
        assert ["vllm", *argv] == plan["ranks"][r]["engine"]  # templates/engine/vllm.j2
        for key, value in plan["ranks"][r]["env"].items():
            assert rec["env"][key] == value
        # its own fabric pins, from its own facts (spark3's fabric IP sits on the second port);
        # a ring's sockets on the management interface every rank reaches
        truth = sandbox.truth[name]
        iface = mgmt_if(sandbox, name)
        assert (rec["env"]["NCCL_SOCKET_IFNAME"], rec["env"]["GLOO_SOCKET_IFNAME"]) == ("=" + iface, iface)
        assert rec["env"]["VLLM_HOST_IP"] == sandbox.rank(name)["address"]
        assert truth["hca"] in rec["env"]["NCCL_IB_HCA"].lstrip("=").split(",")
        assert (rec["env"]["NCCL_ALGO"], rec["env"]["NCCL_NET"]) == ("Ring", "IB")
        # the image chain's patches are what the engine imports (dcp, mul1, keys stages)
        assert set(rec["patches"]) >= {"vllm/v1/attention/backends/mla/sm120_dcp.py",
                                       "vllm/model_executor/layers/quantization/exl3.py",
                                       "vllm/model_executor/layers/sparse_attn_indexer.py"}


def test_the_api_asks_for_the_generated_key(sandbox, cfg, started):
    """No api_key in the sandbox's config: `up` generated one, which the engine got on stdin
    (never on a command line) and the API asks for; `status` and `wait` send it."""
    key = cli("api-key", "-c", cfg).stdout.strip()
    assert len(key) >= 40
    assert record(sandbox, "spark1")["env"]["VLLM_API_KEY"] == key
    url = json.loads(cli("api-key", "-c", cfg, "--json").stdout)["url"]
    assert httpx.get(f"{url}/models", timeout=10).status_code == 401
    assert httpx.get(f"{url}/models", headers={"Authorization": f"Bearer {key}"}, timeout=10).status_code == 200
    # every command line on the rank, the engine's included, as `ps` would show them
    rc, ps, _ = sandbox.run("spark1", "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done 2>/dev/null")
    assert "serve /models/glm53-sandbox" in ps and key not in ps


def test_second_up_changes_nothing(sandbox, cfg, started):
    before = json.loads(cli("status", "-c", cfg, "--json").stdout)
    again = cli("up", "-c", cfg)
    assert again.exit_code == 0 and "already running as planned" in again.output
    after = json.loads(cli("status", "-c", cfg, "--json").stdout)
    assert [r["started_at"] for r in after["ranks"]] == [r["started_at"] for r in before["ranks"]]
    assert after["api"]["healthy"]
    assert {r["state"] for r in after["ranks"]} == {"running"}
    # each rank's MemAvailable now, read from its /proc/meminfo (issue 14)
    assert all(isinstance(r["mem_available"], int) and r["mem_available"] > 0 for r in after["ranks"])


def test_up_takes_the_profile_flag(sandbox, cfg, started, tmp_path):
    """`up --profile NAME` deploys NAME, not the config's profile: a cluster.yaml naming another
    profile, with --profile sandbox, finds the sandbox profile running as planned and changes nothing."""
    data = yaml.safe_load(open(cfg))
    data["profile"] = "pollard-180k"  # `up` with it would restart every rank as pollard-180k
    other = tmp_path / "cluster.yaml"
    other.write_text(yaml.safe_dump(data))
    before = json.loads(cli("status", "-c", cfg, "--json").stdout)
    again = cli("up", "-c", str(other), "--profile", "sandbox")
    assert again.exit_code == 0, again.output
    assert "already running as planned" in again.output and "serving sandbox at" in again.output
    after = json.loads(cli("status", "-c", cfg, "--json").stdout)
    assert [r["started_at"] for r in after["ranks"]] == [r["started_at"] for r in before["ranks"]]


def test_logs_of_a_worker(cfg, started):
    result = cli("logs", "-c", cfg, "--rank", "2", "--tail", "20")
    assert result.exit_code == 0 and "headless worker rank 2 of 4" in result.output


def test_wait_answers(cfg, started):
    result = cli("wait", "-c", cfg, "--timeout", "30")
    assert result.exit_code == 0 and "serves GLM-5.3-sandbox" in result.output


def test_prompt_logprobs_through_the_served_api(cfg, started):
    """#30's path: launcher.transport.api.prompt_logprobs against rank 0's API with the config's
    endpoint and key; the serving image carries the stand-in's model, so the same text gives
    the same logprobs twice."""
    from launcher.inputs.config import load
    from launcher.transport import api

    ep = api.endpoint(load(Path(cfg)))
    text = "Four small machines share one model."
    first = api.prompt_logprobs(ep, text)
    assert len(first.tokens) == len(text.encode()) and first.tokens[0].logprob is None
    assert first == api.prompt_logprobs(ep, text) and 1 < first.perplexity < 256


def test_a_rank_that_dies_at_start_stops_everyone(sandbox, cfg, started, tmp_path):
    data = yaml.safe_load(open(cfg))
    data["overrides"] = {"env": {"SANDBOX_VLLM_FAIL": "exit:3", "SANDBOX_VLLM_FAIL_NODE_RANK": "2"}}
    broken = tmp_path / "cluster.yaml"
    broken.write_text(yaml.safe_dump(data))
    result = cli("up", "-c", str(broken))
    assert result.exit_code == 1
    assert "every rank's container was stopped" in result.output
    assert "rank 2 (spark3): exited with code 3" in result.output
    assert "EngineCore failed to start (simulated" in result.output  # its log tail
    status = json.loads(cli("status", "-c", cfg, "--json").stdout)
    assert {r["state"] for r in status["ranks"]} == {"absent"}
    # and the good config brings it back
    assert cli("up", "-c", cfg).exit_code == 0


def test_down_twice_leaves_nothing(sandbox, cfg, started):
    assert cli("down", "-c", cfg).exit_code == 0
    assert cli("down", "-c", cfg).exit_code == 0
    status = json.loads(cli("status", "-c", cfg, "--json").stdout)
    assert {r["state"] for r in status["ranks"]} == {"absent"} and not status["api"]["healthy"]
    rc, out, _ = sandbox.run("spark3", "docker ps -aq --filter name=sparkstack-engine")
    assert rc == 0 and out.strip() == ""


def test_prebuilt_image_only_on_the_ranks(sandbox, cfg, started, tmp_path):
    """A prebuilt profile whose image the ranks have (pulled there) but this host does not:
    `up` starts it without building or shipping anything."""
    import subprocess

    tag = "sparkstack-test/prebuilt:ranks-only"
    base = sandbox.images["vllm"]
    assert subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode != 0
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    prof = yaml.safe_load(open("env/profiles/sandbox.yaml"))
    prof["image"] = {"prebuilt": tag}
    (profiles / "ranks-only.yaml").write_text(yaml.safe_dump(prof))
    data = yaml.safe_load(open(cfg))
    data.update(profile="ranks-only", profiles_dir=str(profiles))
    data.setdefault("images", {}).pop("base", None)
    custom = tmp_path / "cluster.yaml"
    custom.write_text(yaml.safe_dump(data))
    try:
        for name in sandbox.names:
            assert sandbox.run(name, f"docker tag {base} {tag}")[0] == 0
        result = cli("up", "-c", str(custom))
        assert result.exit_code == 0, result.output
        assert "is not on this host, but every rank has it" in result.output
        assert "shipped" not in result.output and "building" not in result.output
        assert record(sandbox, "spark2")["argv"][:2] == ["serve", "/models/glm53-sandbox"]
        # one rank without it: refused before anything starts, with the original advice
        assert cli("down", "-c", str(custom)).exit_code == 0
        assert sandbox.run("spark4", f"docker rmi {tag}")[0] == 0
        refused = cli("up", "-c", str(custom))
        assert refused.exit_code != 0 and f"image {tag} is not on this host" in refused.output
        status = json.loads(cli("status", "-c", cfg, "--json").stdout)
        assert {r["state"] for r in status["ranks"]} == {"absent"}
    finally:
        cli("down", "-c", str(custom))
        for name in sandbox.names:
            sandbox.run(name, f"docker rmi {tag} >/dev/null 2>&1; true")
        assert cli("up", "-c", cfg).exit_code == 0


def test_ray_mode_head_then_workers(sandbox, cfg, started, tmp_path):
    """multinode: ray -- rank 0 runs the Ray head and `vllm serve` on the Ray executor, which
    waits for all four nodes; ranks 1-3 join rank 0's head. A worker that dies takes its
    container with it and `status` shows it."""
    data = yaml.safe_load(open(cfg))
    data["multinode"] = "ray"
    ray_cfg = tmp_path / "cluster.yaml"
    ray_cfg.write_text(yaml.safe_dump(data))
    head = sandbox.rank("spark1")["address"]
    try:
        result = cli("up", "-c", str(ray_cfg))
        assert result.exit_code == 0, result.output
        assert "(Ray)" in result.output
        rec = record(sandbox, "spark1")
        argv = rec["argv"]
        assert argv[argv.index("--distributed-executor-backend") + 1] == "ray"
        assert "--nnodes" not in argv and "--headless" not in argv
        logs = sandbox.run("spark1", "docker logs sparkstack-engine 2>&1")[1]
        assert "Ray cluster at 127.0.0.1:6379: 4 nodes; placement group of 4 ready" in logs
        for r, name in enumerate(sandbox.names):
            rc, out, _ = sandbox.run(name, "docker exec sparkstack-engine cat /var/log/sandbox-vllm/ray.json")
            ray = json.loads(out)
            assert ray["role"] == ("head" if r == 0 else "worker")
            assert ("--include-dashboard=false" in ray["argv"]) == (r == 0)  # the head runs none
            assert ray["address"] == f"{head}:6379"  # the head's own, and where each worker joins
            assert ray["env"]["NCCL_SOCKET_IFNAME"] == "=" + mgmt_if(sandbox, name)
        # the same config again: nothing changes
        again = cli("up", "-c", str(ray_cfg))
        assert again.exit_code == 0 and "already running as planned" in again.output
        # the head goes away: every worker's `ray start --block` ends, and its container with it
        sandbox.run("spark1", "docker rm -f sparkstack-engine")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            states = {r["rank"]: r["state"] for r in json.loads(cli("status", "-c", str(ray_cfg), "--json").stdout)["ranks"]}
            if all(states[r] == "exited" for r in (1, 2, 3)):
                break
            time.sleep(0.5)
        assert states == {0: "absent", 1: "exited", 2: "exited", 3: "exited"}, states
    finally:
        cli("down", "-c", str(ray_cfg))
        assert cli("up", "-c", cfg).exit_code == 0


def test_switch_topology_serves(sandbox, cfg, started):
    """The same four ranks cabled to one switch (`sandbox up --topology switch`): sockets and
    RDMA on each rank's fabric port, every pair reachable, so NCCL's own algorithm choice is
    fine (no NCCL_ALGO) and the rendezvous is rank 0's fabric IP."""
    from launcher.sandbox import cluster as sandbox_cluster
    from launcher.sandbox import fabric_fixture as fabric

    assert cli("down", "-c", cfg).exit_code == 0
    try:
        sandbox_cluster.up(sandbox.state_dir, progress=lambda _m: None, cabling="switch")
        assert yaml.safe_load(open(cfg))["topology"] == "switch"
        result = cli("up", "-c", cfg)
        assert result.exit_code == 0, result.output
        for r, name in enumerate(sandbox.names):
            truth = fabric.fabric_truth(r, len(sandbox.names), "switch")
            rec = record(sandbox, name)
            env = rec["env"]
            assert env["NCCL_SOCKET_IFNAME"] == "=" + truth["netdev"]
            assert env["VLLM_HOST_IP"] == truth["fabric_ip"] and env["NCCL_NET"] == "IB"
            assert env["NCCL_IB_HCA"] == "=" + truth["hca"] and "NCCL_ALGO" not in env
            assert rec["argv"][rec["argv"].index("--master-addr") + 1] == "192.168.177.1"
        assert json.loads(cli("status", "-c", cfg, "--json").stdout)["api"]["healthy"]
    finally:
        cli("down", "-c", cfg)
        sandbox_cluster.up(sandbox.state_dir, progress=lambda _m: None, cabling="ring")
        assert cli("up", "-c", cfg).exit_code == 0
