"""`sparkstack plan`: golden plans per profile, the seeds' flags verbatim, the KV figures."""

import json
import re
import shlex

import pytest
from click.testing import CliRunner

from conftest import ROOT
from launcher.cli.commands import main
from launcher.inputs.profile import load_profile, profile_names
from test_checkpoint import checkpoint  # noqa: F401  (a small real checkpoint fixture)

GOLDEN = ROOT / "tests" / "golden"
SEEDS = ROOT / "tests" / "fixtures" / "seeds"  # the lines of the shared seeds these tests read (its README)


def plan_json(path, *extra):
    result = CliRunner().invoke(main, ["plan", "-c", str(path), "--json", "--offline", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.mark.parametrize("profile", profile_names())
def test_plan_matches_golden(write_config, profile, monkeypatch, golden):
    # a state dir that cannot exist: `plan` reads the generated API key, never makes it
    monkeypatch.setenv("XDG_STATE_HOME", "/nonexistent/state")
    data = plan_json(write_config(lambda d: d.update(profile=profile)))
    golden.check(GOLDEN / f"plan-{profile}.json", json.dumps(data, indent=2) + "\n")


def test_plan_json_shape(write_config):
    data = plan_json(write_config())
    assert set(data) == {"profile", "ranks", "kv", "vllm_guard", "api", "load", "assumed", "notes", "keep",
                         "memory_guard_serving"}
    assert data["keep"]["liveness"] == {"enabled": True, "interval_s": 30.0, "grace_s": 300.0,
                                        "stalled_checks": 6}
    assert data["memory_guard_serving"]["soft_free_gib"] == 6.0  # the defaults shown (config.py says why)
    assert data["memory_guard_serving"]["hard_available_gib"] == 3.0
    assert data["profile"] == {"name": "keys-1m-dcp4", "source": "config"}
    assert set(data["kv"]) == {"bytes_per_token", "kv_cache_memory_bytes", "max_tokens", "policy",
                               "target", "free_floor", "per_rank"}
    assert set(data["kv"]["per_rank"][0]) == {"rank", "kv_cache_memory_bytes", "max_tokens",
                                              "mem_available", "free_while_serving"}
    assert [r["rank"] for r in data["ranks"]] == [0, 1, 2, 3]
    assert set(data["ranks"][0]) == {"rank", "host", "env", "docker_run", "engine"}


def test_plan_shows_the_supervisors_settings(write_config):
    cfg = write_config(lambda d: d.update(keep={"liveness": {"interval_s": 5, "stalled_checks": 4}}))
    text = CliRunner().invoke(main, ["plan", "-c", str(cfg), "--offline"]).output
    assert ("keep up --keep: every 10 s each rank's container and /health (3 misses fail); liveness "
            "every 5 s after 300 s: 4 checks in a row with requests and no token are a wedge") in " ".join(text.split()), text


def seed_text(name):
    (path,) = SEEDS.glob(f"{name}_*.txt")
    return path.read_text()


def engine_line(write_config, profile, rank=0):
    data = plan_json(write_config(lambda d: d.update(profile=profile)))
    return shlex.join(data["ranks"][rank]["engine"]), data


def test_seed_001_key_settings_appear_verbatim(write_config):
    settings = re.search(r"Key settings \(TP = 4\): (.*?)\. Weights take", seed_text("001")).group(1)
    line, data = engine_line(write_config, "keys35-200k")
    assert settings in line
    assert data["kv"]["kv_cache_memory_bytes"] == 14092861440
    assert data["ranks"][0]["env"]["VLLM_ROCE_ALLGATHER_MAX_SIZE"] == "4MB"


def test_seed_001_one_million_profile(write_config):
    assert "--max-model-len 1000000 --decode-context-parallel-size 4" in seed_text("001")
    line, data = engine_line(write_config, "keys35-1m-dcp4")
    assert "--max-model-len 1000000 --decode-context-parallel-size 4" in line
    assert data["kv"]["max_tokens"] >= 1_000_000


def test_seed_003_flags_appear_verbatim(write_config):
    text = seed_text("003")
    line, data = engine_line(write_config, "pollard-180k")
    for flags in ["--attention-backend CUSTOM --block-size 256 --kv-cache-dtype fp8",
                  "--max-model-len 180000"]:
        assert flags in text and flags in line
    # the seed's 0.84 (vLLM 0.28) leaves less than the margin under 0.33's startup guard
    assert "--gpu-memory-utilization 0.84" in text and "--gpu-memory-utilization 0.82" in line
    assert data["vllm_guard"]["note"].startswith("profile pollard-180k's --gpu-memory-utilization 0.84 lowered to 0.82")
    assert '--speculative-config \'{"method":"mtp","num_speculative_tokens":3}\'' in line


def test_multi_node_flags_per_rank(write_config):
    data = plan_json(write_config())
    for r, rank in enumerate(data["ranks"]):
        engine = rank["engine"]
        assert engine[:3] == ["vllm", "serve", "/models/keys-GLM-5.3-EXL3"]  # templates/engine/vllm.j2
        assert engine[engine.index("--node-rank") + 1] == str(r)
        assert engine[engine.index("--nnodes") + 1] == "4"
        assert engine[engine.index("--master-addr") + 1] == "10.0.0.11"  # ring: management address
        assert engine[engine.index("--master-port") + 1] == "29521"  # Mia's MASTER_PORT (seed 000)
        assert ("--headless" in engine) == (r > 0)
        assert engine[engine.index("--kv-cache-memory-bytes") + 1] == str(data["kv"]["kv_cache_memory_bytes"])
        run = rank["docker_run"]
        assert "nofile=1048576:1048576" in run and "memlock=-1:-1" in run
        assert run[-1] == "sparkstack/keys:unbuilt"
        assert rank["env"]["NCCL_IB_SUBNET_AWARE_ROUTING"] == "1"


def test_ray_head_then_workers(write_config):
    """multinode: ray -- rank 0 starts the Ray head and then `vllm serve` with the Ray executor;
    ranks 1-3 join the head at rank 0's rendezvous address and block. No --nnodes family."""
    data = plan_json(write_config(lambda d: d.update(multinode="ray")))
    head = data["ranks"][0]["engine"]
    assert head[:2] == ["sh", "-c"] and len(head) == 3
    line = shlex.split(head[2])
    # the head advertises the address the workers join, and runs no dashboard
    assert line[:6] == ["ray", "start", "--head", "--port=6379", "--node-ip-address=10.0.0.11",
                        "--include-dashboard=false"]
    served = line[line.index("&&") + 1:]
    assert served[:4] == ["exec", "vllm", "serve", "/models/keys-GLM-5.3-EXL3"]
    assert served[served.index("--distributed-executor-backend") + 1] == "ray"
    assert served[served.index("--kv-cache-memory-bytes") + 1] == str(data["kv"]["kv_cache_memory_bytes"])
    assert not {"--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless"} & set(served)
    for r in (1, 2, 3):
        assert data["ranks"][r]["engine"] == ["ray", "start", "--block", "--address=10.0.0.11:6379",
                                              f"--node-ip-address=10.0.0.1{r + 1}"]
    # and the plan says what Ray leaves open, which no flag closes
    assert data["notes"][0].startswith("Ray head on rank 0, joined at 10.0.0.11:6379")  # then the 1M context's
    assert "listen on every interface" in data["notes"][0] and "firewall those ports" in data["notes"][0]
    assert "master_port / --master-port apply to multinode: native only" in data["notes"][0]
    text = CliRunner().invoke(main, ["plan", "-c", str(write_config(lambda d: d.update(multinode="ray"))),
                                     "--offline"]).output
    assert "note    Ray head on rank 0, joined at 10.0.0.11:6379" in text
    assert not any("Ray" in n for n in plan_json(write_config())["notes"])  # native multi-node: no Ray


def test_master_port_is_explicit_and_configurable(write_config):
    """Every multi-node plan names its rendezvous port: cluster.yaml's master_port, else a
    --master-port in the flags, else the engine's default (vLLM 29521 from Mia's .env.tp4, which
    seeds 000/004 serve with; TensorFold its own 29551)."""
    def port(data, r=1, flag="--master-port"):
        engine = data["ranks"][r]["engine"]
        return engine[engine.index(flag) + 1]

    assert {port(plan_json(write_config()), r) for r in range(4)} == {"29521"}
    assert port(plan_json(write_config(lambda d: d.update(master_port=29600)))) == "29600"
    by_flag = write_config(lambda d: d["overrides"].update(engine_args=["--master-port 29700"]))
    engine = plan_json(by_flag)["ranks"][2]["engine"]
    assert engine.count("--master-port") == 1 and port(plan_json(by_flag), 2) == "29700"
    assert {port(plan_json(write_config(tensorfold)), r) for r in range(4)} == {"29551"}
    assert port(plan_json(write_config(lambda d: tensorfold(d) or d.update(master_port=29600)))) == "29600"
    result = CliRunner().invoke(main, ["plan", "-c", str(write_config(lambda d: d.update(master_port=70000))),
                                       "--offline"])
    assert result.exit_code == 2 and "master_port" in result.output and "Traceback" not in result.output


def test_switch_uses_fabric_ips_and_no_ring_settings(write_config):
    data = plan_json(write_config(lambda d: d.update(topology="switch")))
    engine = data["ranks"][2]["engine"]
    assert engine[engine.index("--master-addr") + 1] == "192.168.177.1"
    assert data["ranks"][2]["env"]["VLLM_HOST_IP"] == "192.168.178.3"
    assert "NCCL_IB_MERGE_NICS" not in data["ranks"][2]["env"]


def test_overrides_replace_profile_flags_in_place(write_config):
    def edit(d):
        d["overrides"]["engine_args"] = ["--max-model-len 500000", "--max-num-seqs 4"]
        d["overrides"]["api_port"] = 9000
    data = plan_json(write_config(edit))
    line = shlex.join(data["ranks"][0]["engine"])
    assert "--kv-cache-dtype fp8 --max-model-len 500000 --speculative-config" in line
    assert "--max-num-seqs 4" in line and "--port 9000" in line and "1000000" not in line


def test_api_key_is_masked_unless_asked(write_config):
    path = write_config(lambda d: d["overrides"].update(api_key="s3cret"))
    masked = plan_json(path)
    assert "s3cret" not in json.dumps(masked) and masked["ranks"][0]["env"]["VLLM_API_KEY"] == "***"
    assert masked["api"] == {"key": "***", "source": "config", "file": None, "warning": None}
    shown = plan_json(path, "--show-secrets")
    assert shown["ranks"][0]["env"]["VLLM_API_KEY"] == "s3cret" and shown["api"]["key"] == "s3cret"


def test_offline_plan_lists_what_it_assumed(write_config):
    assumed = plan_json(write_config())["assumed"]
    assert any(a.startswith("model shape: profile keys-1m-dcp4") for a in assumed)
    assert any("75 GiB + 5 GiB MTP" in a or "75.0 GiB + 5.0 GiB MTP" in a for a in assumed)
    assert "MemAvailable: 117.1 GiB of MemTotal 121.7 GiB per rank (a GB10 with page caches dropped) " \
        "for ranks whose /proc/meminfo was not read" in assumed


def flag(engine, name):
    return [engine[i + 1] for i, token in enumerate(engine) if token == name]


@pytest.mark.parametrize("profile", profile_names())
def test_every_vllm_profile_clears_the_startup_guard(write_config, profile):
    """vLLM 0.33 refuses to start when free < MemTotal × utilisation (default 0.92): every vLLM
    plan passes one utilisation that every rank clears with the margin (offline: a GB10 with
    caches dropped, 117.1 of 121.7 GiB, less 14 GiB of runtime: 0.82)."""
    data = plan_json(write_config(lambda d: d.update(profile=profile)))
    guard = data["vllm_guard"]
    if load_profile(profile).engine != "vllm":
        assert guard is None and all(not flag(r["engine"], "--gpu-memory-utilization") for r in data["ranks"])
        return
    assert guard["gpu_memory_utilization"] == guard["highest"] == 0.82 and guard["margin"] == 0.02
    for rank, g in zip(data["ranks"], guard["ranks"]):
        assert flag(rank["engine"], "--gpu-memory-utilization") == ["0.82"]
        assert g["mem_total"] == 127_600_000 * 1024 and g["mem_available"] == 122_771_456 * 1024
        assert g["free"] == g["mem_available"] - 14 * 2**30
        assert g["need"] == -(-g["mem_total"] * 82 // 100) <= g["free"] and not g["refused"]
        assert (g["free"] - g["need"]) / g["mem_total"] >= 0.02


def test_planned_utilization_follows_the_kv_flag(write_config):
    engine = plan_json(write_config())["ranks"][1]["engine"]
    at = engine.index("--kv-cache-memory-bytes")
    assert engine[at + 2:at + 4] == ["--gpu-memory-utilization", "0.82"]


def test_profile_utilization_kept_only_when_it_clears(tmp_path, write_config):
    """pollard-180k's 0.84 is lowered (with the reason); a profile's 0.80 is kept."""
    data = plan_json(write_config(lambda d: d.update(profile="pollard-180k")))
    guard = data["vllm_guard"]
    assert guard["source"] == "plan" and guard["note"] == (
        "profile pollard-180k's --gpu-memory-utilization 0.84 lowered to 0.82: rank 0: "
        "(MemAvailable 117.1 − runtime 14.0) / MemTotal 121.7 GiB − margin 0.02 = 0.8271")
    assert flag(data["ranks"][0]["engine"], "--gpu-memory-utilization") == ["0.82"]

    text = (ROOT / "env" / "profiles" / "pollard-180k.yaml").read_text()
    (tmp_path / "mine.yaml").write_text(text.replace("--gpu-memory-utilization 0.84", "--gpu-memory-utilization 0.80"))
    data = plan_json(write_config(lambda d: d.update(profile="mine", profiles_dir=str(tmp_path))))
    assert data["vllm_guard"]["source"] == "profile" and data["vllm_guard"]["note"] == ""
    assert flag(data["ranks"][0]["engine"], "--gpu-memory-utilization") == ["0.80"]


def test_users_utilization_is_kept_and_its_refusal_said(write_config):
    data = plan_json(write_config(lambda d: d["overrides"].update(engine_args=["--gpu-memory-utilization 0.9"])))
    guard = data["vllm_guard"]
    assert flag(data["ranks"][0]["engine"], "--gpu-memory-utilization") == ["0.9"]
    assert guard["source"] == "config" and all(g["refused"] for g in guard["ranks"])
    assert guard["note"].startswith("cluster.yaml's --gpu-memory-utilization 0.9 is refused by vLLM's "
                                    "guard on ranks 0, 1, 2, 3 (`check` fails, `up` starts nothing); use ≤ 0.82")


def test_utilization_margin_is_a_config_knob(write_config):
    data = plan_json(write_config(lambda d: d["overrides"].update(utilization_margin=0.05)))
    assert data["vllm_guard"]["gpu_memory_utilization"] == 0.79  # 0.8471 − 0.05, rounded down


@pytest.mark.parametrize("value, message", [
    ("banana", "overrides.engine_args: --gpu-memory-utilization: invalid float value 'banana'"),
    ("0", "overrides.engine_args: --gpu-memory-utilization '0': expected a fraction"),
    ("1.5", "overrides.engine_args: --gpu-memory-utilization '1.5': expected a fraction")])
def test_utilization_that_is_not_a_fraction_is_refused(write_config, value, message):
    path = write_config(lambda d: d["overrides"].update(engine_args=[f"--gpu-memory-utilization {value}"]))
    result = CliRunner().invoke(main, ["plan", "-c", str(path), "--offline"])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_plan_refuses_when_no_utilization_clears_the_guard(write_config):
    def edit(d):
        d["profile"] = "sandbox"  # tiny weights and KV: only the guard can refuse
        d["overrides"].update(runtime_overhead_gib=115, headroom_gib=0)
    result = CliRunner().invoke(main, ["plan", "-c", str(write_config(edit)), "--offline"])
    assert result.exit_code == 3, result.output
    out = " ".join(result.output.split())
    assert ("profile sandbox cannot start: no --gpu-memory-utilization clears vLLM's guard: rank 0: "
            "(MemAvailable 117.1 − runtime 115.0) / MemTotal 121.7 GiB − margin 0.02 = -0.0029") in out
    assert "Traceback" not in result.output


def test_plan_shows_the_guard_arithmetic(write_config):
    result = CliRunner().invoke(main, ["plan", "-c", str(write_config(lambda d: d.update(profile="pollard-180k"))),
                                       "--offline"])
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "guard --gpu-memory-utilization 0.82 (planned; with margin 0.02 every rank clears up to 0.82)" in out
    assert ("rank 3: free 103.1 GiB (MemAvailable 117.1 − runtime 14.0) ≥ MemTotal 121.7 GiB × 0.82 "
            "= 99.8 GiB") in out
    assert "note: profile pollard-180k's --gpu-memory-utilization 0.84 lowered to 0.82" in out


def test_readable_checkpoint_replaces_the_profile_figures(write_config, checkpoint):  # noqa: F811
    data = plan_json(write_config(lambda d: d["model"].update(path=str(checkpoint))))
    assert not any(a.startswith(("model shape", "weights per rank")) for a in data["assumed"])
    # 2 layers + 1 MTP layer, fp8_ds_mla + indexer, DCP 4
    assert data["kv"]["bytes_per_token"] == -(-3 * (656 + 132) // 4)


def test_plan_that_does_not_fit_is_refused(write_config):
    path = write_config(lambda d: d.update(profile="pollard-180k") or d["overrides"].update(headroom_gib=20))
    result = CliRunner().invoke(main, ["plan", "-c", str(path), "--offline"])
    assert result.exit_code == 3
    assert "pollard-180k does not fit: --max-model-len 180000 needs" in result.output
    assert "headroom 20.0 GiB" in result.output


def test_kv_policy_max_keeps_all_that_fits(write_config):
    """keys35 at 1M: the target is seed 001's 1.23M-token pool; `kv_policy: max` the whole budget."""
    target = plan_json(write_config(lambda d: d.update(profile="keys35-1m-dcp4")))["kv"]
    most = plan_json(write_config(lambda d: d.update(profile="keys35-1m-dcp4")
                                  or d["overrides"].update(kv_policy="max")))["kv"]
    assert (target["policy"], most["policy"]) == ("target", "max")
    assert target["max_tokens"] == 1_230_020 < most["max_tokens"]
    assert most["per_rank"][0]["free_while_serving"] < target["per_rank"][0]["free_while_serving"]


def test_plan_below_the_free_floor_is_refused(write_config):
    path = write_config(lambda d: d.update(profile="pollard-180k") or d["overrides"].update(headroom_gib=4))
    result = CliRunner().invoke(main, ["plan", "-c", str(path), "--offline"])
    assert result.exit_code == 3, result.output
    out = " ".join(result.output.split())
    assert "rank 0" in out and "would keep 4.0 GiB free while serving, below overrides.free_floor_gib 8.0 GiB" in out
    assert "− KV 18.1 GiB (target, capped)" in out and "kv_policy: max only makes the pool larger" in out
    floor_lowered = write_config(lambda d: d.update(profile="pollard-180k")
                                 or d["overrides"].update(headroom_gib=4, free_floor_gib=4))
    assert CliRunner().invoke(main, ["plan", "-c", str(floor_lowered), "--offline"]).exit_code == 0


def tensorfold(d):
    d["profile"] = "tensorfold"


def test_tensorfold_runs_its_cli_on_every_rank(write_config):
    """Seed 001's recipe: the same `tensorfold serve` on every rank with its own --rank, rank 0's
    rendezvous address as --master, the API on :8890 reachable from outside; no launcher env."""
    data = plan_json(write_config(tensorfold))
    for r, rank in enumerate(data["ranks"]):
        assert rank["engine"] == [
            "python3", "-m", "tensorfold.cli", "serve", "/models/keys-GLM-5.3-EXL3", "--tp", "4",
            "--rank", str(r), "--master", "10.0.0.11", "--master-port", "29551", "--port", "8890", "--host", "0.0.0.0",
            "--name", "GLM-5.3-EXL3", "--context", "32768", "--parallel", "4"]
        assert not {"NODES", "MODEL", "CONTEXT", "PARALLEL", "VLLM_HOST_IP"} & set(rank["env"])
        assert rank["env"]["NCCL_IB_SUBNET_AWARE_ROUTING"] == "1"  # the ring's NCCL settings


def test_tensorfold_on_a_switch_and_with_overrides(write_config):
    def edit(d):
        tensorfold(d)
        d["topology"] = "switch"
        d["model"].pop("served_name")
        d["overrides"].update(api_port=9000, engine_args=["--context 65536", "--no-drafts"])
    engine = plan_json(write_config(edit))["ranks"][2]["engine"]
    assert engine[engine.index("--master") + 1] == "192.168.177.1"  # rank 0's fabric IP
    assert engine[engine.index("--port") + 1] == "9000"
    assert engine[engine.index("--name") + 1] == "glm-5.3-tf"  # the profile's: the recipe's name
    assert engine[-5:] == ["--parallel", "4", "--context", "65536", "--no-drafts"]  # the last --context wins


@pytest.mark.parametrize("edit, message", [
    (lambda o: o.update(engine_args=["--rank 2"]),
     "overrides.engine_args: --rank is set by the plan (from ranks)"),
    (lambda o: o.update(engine_args=["--host=127.0.0.1"]),
     "overrides.engine_args: --host is set by the plan (0.0.0.0, so the API is reachable)"),
    (lambda o: o.update(engine_args=["--master-port 29600"]),
     "overrides.engine_args: --master-port is set by the plan (from master_port)"),
    (lambda o: o.update(api_key="s3cret"), "overrides.api_key: TensorFold's server checks no API key"),
])
def test_tensorfold_refuses_what_the_plan_manages_or_cannot_do(write_config, edit, message):
    path = write_config(lambda d: tensorfold(d) or edit(d["overrides"]))
    result = CliRunner().invoke(main, ["plan", "-c", str(path), "--offline"])
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output


def test_tensorfold_ranks_get_their_own_fabric_env(tmp_path):
    """Like vLLM's ranks: each its own NCCL/Gloo pins from its own sysfs (spark3's fabric IP sits
    on its second port), through the real probe of the sandbox's fixture trees."""
    import yaml

    from launcher.inputs import config
    from planned import build_plan
    from launcher.apply import serve
    from launcher.sandbox import cluster, fabric_fixture as sfabric
    from local_probe import sandbox_rank_facts

    ranks = [{"name": f"spark{i + 1}", "address": f"172.31.240.{11 + i}", "user": "spark",
              "fabric_ips": [sfabric.fabric_truth(i)["fabric_ip"]], "sysfs_root": "/sandbox/sysfs"}
             for i in range(4)]
    doc = {"profile": "tensorfold", "topology": "ring", "ranks": ranks, "model": {"path": cluster.MODEL_PATH}}
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(doc))
    found = {r: sandbox_rank_facts(tmp_path / f"spark{r + 1}", r) for r in range(4)}
    built = build_plan(config.load(tmp_path / "cluster.yaml"), found)
    assert not any(a.startswith("fabric environment") for a in built.assumed)
    for r, rank in enumerate(built.ranks):
        truth = sfabric.fabric_truth(r)
        # a ring: sockets on the management network (the sandbox's eth0), RDMA on both cabled
        # ports' addressed HCAs, rings only
        assert (rank.env["NCCL_SOCKET_IFNAME"], rank.env["GLOO_SOCKET_IFNAME"]) == ("=eth0", "eth0")
        assert rank.env["NCCL_IB_HCA"] == "=" + ",".join(truth["hcas_in_use"])
        assert rank.env["NCCL_ALGO"] == "Ring" and b"NCCL_SOCKET_IFNAME==eth0\n" in serve.run_command(rank)[1]
        assert "VLLM_API_KEY" not in rank.env  # TensorFold reads no key
        assert rank.engine[rank.engine.index("--master") + 1] == "172.31.240.11"


# --- the fabric env from each rank's facts ---------------------------------------------------------

def example_facts(mgmt_names=("enP7s7", "eno1", "enP7s7", "enP7s7"), **kw):
    """Each example rank's facts: its fabric IP on the port the example config says (spark3's on
    port 1), its management port (named as given) holding its configured address."""
    from test_fabric import spark

    fabric_ips = ["192.168.177.1", "192.168.177.2", "192.168.178.3", "192.168.178.4"]
    return {r: spark({"enp1s0f1np1" if r == 2 else "enp1s0f0np0": fabric_ips[r]},
                     mgmt=(mgmt_names[r], f"10.0.0.1{r + 1}/24"), **kw) for r in range(4)}


def build(path, found):
    from launcher.inputs import config
    from planned import build_plan

    return build_plan(config.load(path), found)


def test_ring_sockets_and_master_on_each_ranks_management_interface(write_config):
    p = build(write_config(), example_facts())
    for r, rank in enumerate(p.ranks):
        iface = "eno1" if r == 1 else "enP7s7"
        env = rank.env
        assert (env["NCCL_SOCKET_IFNAME"], env["GLOO_SOCKET_IFNAME"], env["VLLM_HOST_IP"]) == \
            (f"={iface}", iface, f"10.0.0.1{r + 1}")
        assert env["NCCL_IB_HCA"] == ("=rocep1s0f1" if r == 2 else "=rocep1s0f0")  # the twins are unaddressed
        assert (env["NCCL_ALGO"], env["NCCL_NET"]) == ("Ring", "IB") and "NCCL_IB_GID_INDEX" not in env
        assert rank.engine[rank.engine.index("--master-addr") + 1] == "10.0.0.11"


def test_ring_master_is_rank_0s_management_ip_even_when_its_address_is_a_host_name(write_config):
    path = write_config(lambda d: d["ranks"][0].update(address="spark1.lan"))
    p = build(path, example_facts(ssh_address=None) | {0: example_facts(ssh_address="10.0.0.11")[0]})
    assert p.ranks[1].engine[p.ranks[1].engine.index("--master-addr") + 1] == "10.0.0.11"
    assert p.ranks[0].env["VLLM_HOST_IP"] == "10.0.0.11"
    assert ("management network of rank 0 (spark1): spark1.lan is a host name: sockets on enP7s7 (10.0.0.11), "
            "where the kit's SSH connection arrived") in p.assumed


def test_switch_keeps_sockets_on_the_fabric_and_no_ring_algorithm(write_config):
    p = build(write_config(lambda d: d.update(topology="switch")), example_facts())
    env = p.ranks[2].env
    assert (env["NCCL_SOCKET_IFNAME"], env["VLLM_HOST_IP"], env["NCCL_NET"]) == ("=enp1s0f1np1", "192.168.178.3", "IB")
    assert "NCCL_ALGO" not in env and "NCCL_IB_MERGE_NICS" not in env
    assert p.ranks[2].engine[p.ranks[2].engine.index("--master-addr") + 1] == "192.168.177.1"


def test_gid_index_only_when_pinned(write_config):
    assert "NCCL_IB_GID_INDEX" not in plan_json(write_config())["ranks"][0]["env"]
    pinned = plan_json(write_config(lambda d: d.update(fabric={"gid_index": 3})))
    assert {r["env"]["NCCL_IB_GID_INDEX"] for r in pinned["ranks"]} == {"3"}
    assert build(write_config(lambda d: d.update(fabric={"gid_index": 3})), example_facts()).ranks[0] \
        .env["NCCL_IB_GID_INDEX"] == "3"


def test_host_nccl_is_mounted_and_preloaded(write_config):
    lib = "/opt/nccl-2.30.7/lib/libnccl.so.2"
    data = plan_json(write_config(lambda d: d.update(
        nccl={"host_lib": lib, "env": {"NCCL_SWITCHLESS_RING_ONLY": "1"}})))
    for rank in data["ranks"]:
        run = rank["docker_run"]
        assert run[run.index(f"{lib}:{lib}:ro") - 1] == "-v"
        assert {k: rank["env"][k] for k in ("LD_PRELOAD", "VLLM_NCCL_SO_PATH", "NCCL_SWITCHLESS_RING_ONLY")} == \
            {"LD_PRELOAD": lib, "VLLM_NCCL_SO_PATH": lib, "NCCL_SWITCHLESS_RING_ONLY": "1"}
    assert not any("libnccl" in t for t in plan_json(write_config())["ranks"][0]["docker_run"])


# ---- --profile: another profile than cluster.yaml's, the file untouched -------------------------

def test_profile_flag_plans_that_profile(write_config):
    """`plan --profile NAME` gives NAME's plan (engine flags, image, KV), as a cluster.yaml naming
    NAME would, and says it came from the flag; the config file is not changed."""
    path = write_config(lambda d: d.update(name="lab"))  # names keys-1m-dcp4
    text = path.read_text()
    flagged = plan_json(path, "--profile", "pollard-180k")
    named = plan_json(write_config(lambda d: d.update(profile="pollard-180k", name="lab"), name="pollard.yaml"))
    assert flagged.pop("profile") == {"name": "pollard-180k", "source": "--profile"}
    assert named.pop("profile") == {"name": "pollard-180k", "source": "config"}
    assert flagged == named
    assert "--attention-backend CUSTOM" in shlex.join(flagged["ranks"][0]["engine"])
    assert path.read_text() == text
    shown = CliRunner().invoke(main, ["plan", "-c", str(path), "--offline", "--profile", "pollard-180k"])
    assert shown.exit_code == 0, shown.output
    assert shown.output.startswith("profile pollard-180k (--profile): Pollard")


@pytest.mark.parametrize("command", [["plan", "--offline"], ["build", "--render-only", "rendered"],
                                     ["ship", "--dry-run"], ["up"]])
@pytest.mark.parametrize("name, why", [("nope", "no {dir}/nope.yaml"),
                                       ("../keys35-200k", "not a profile name")])
def test_unknown_profile_flag_is_refused_listing_the_profiles(write_config, tmp_path, command, name, why):
    """A --profile that names no profile is bad input (exit 2) before anything is read or
    touched, worded as for cluster.yaml's own `profile:`, with the profiles there are."""
    result = CliRunner().invoke(main, [command[0], "-c", str(write_config()), "--profile", name,
                                       *command[1:]])
    assert result.exit_code == 2, result.output
    why = why.format(dir=ROOT / "env" / "profiles")
    assert f"error: --profile: profile {name!r}: {why}" in result.output
    assert f"(known profiles: {', '.join(profile_names())})" in result.output
    assert not (tmp_path / "rendered").exists()


def test_profile_flag_looks_in_the_configs_profiles_dir(write_config, tmp_path):
    """With `profiles_dir:` in cluster.yaml, --profile names a profile there, and an unknown
    name lists that directory's profiles."""
    mine = tmp_path / "profiles"
    mine.mkdir()
    (mine / "mine.yaml").write_text((ROOT / "env" / "profiles" / "pollard-180k.yaml").read_text())
    path = write_config(lambda d: d.update(profiles_dir=str(mine)))
    assert plan_json(path, "--profile", "mine")["profile"] == {"name": "mine", "source": "--profile"}
    result = CliRunner().invoke(main, ["plan", "-c", str(path), "--offline", "--profile", "pollard-180k"])
    assert result.exit_code == 2
    assert f"no {mine}/pollard-180k.yaml (known profiles: mine)" in result.output


def test_keys_1m_carries_mias_tp4_knobs_and_keeps_the_guards_utilisation(write_config):
    """Seeds 000/004 serve through Mia's start-tp4.sh: its .env.tp4 knobs MAX_NUM_SEQS=8 and
    MAX_NUM_BATCHED_TOKENS=2048 reach vLLM; its GPU_MEM_UTIL=0.75 does not: the KV pool is sized
    explicitly, and the utilisation passed is the plan's (the highest that clears vLLM's guard)."""
    data = plan_json(write_config())
    engine = data["ranks"][0]["engine"]
    assert engine[engine.index("--max-num-seqs") + 1] == "8"
    assert engine[engine.index("--max-num-batched-tokens") + 1] == "2048"
    guard = data["vllm_guard"]
    assert guard["source"] == "plan" and guard["gpu_memory_utilization"] == guard["highest"] != 0.75
    assert engine[engine.index("--gpu-memory-utilization") + 1] == str(guard["highest"])


def test_containers_carry_the_cluster_name(write_config):
    """The config's `name`, else its file's name: two clusters on the same ranks are told apart."""
    named = plan_json(write_config(lambda d: d.update(name="lab-a")))
    assert "org.sparkstack.cluster=lab-a" in named["ranks"][0]["docker_run"]
    unnamed = plan_json(write_config(name="my cluster.yaml"))
    assert "org.sparkstack.cluster=my-cluster" in unnamed["ranks"][1]["docker_run"]
    bad = CliRunner().invoke(main, ["plan", "--offline", "-c", str(write_config(lambda d: d.update(name="a b")))])
    assert bad.exit_code == 2 and "name" in bad.output

