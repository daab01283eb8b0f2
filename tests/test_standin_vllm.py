"""The sandbox's stand-in `vllm` (launcher/sandbox/standins/standin_vllm.py), run as a real process on
127.0.0.1 and spoken to over real HTTP with the standard library only."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.inputs import vllm_flags
from launcher.cli.commands import main as cli_main
from launcher.inputs.profile import load_profile, profile_names
from standin_env import gb10_meminfo, model_dir, roomy_env

ROOT = Path(__file__).resolve().parents[1]
STANDIN = ROOT / "launcher" / "sandbox" / "standins" / "standin_vllm.py"
FLAGS = vllm_flags.FLAGS_FILE  # the table the sandbox image carries
SEED_FLAGS = [
    "--kv-cache-dtype", "fp8", "--max-model-len", "200000", "--max-num-seqs", "8",
    "--kv-cache-memory-bytes", "14092861440", "--async-scheduling",
    "--compilation-config.pass_config.fuse_allreduce_rms=true",
    "--cudagraph-capture-sizes", "1", "2", "3", "4", "6", "8", "12", "24",
    "--speculative-config", '{"method":"mtp","num_speculative_tokens":2}',
    "--tensor-parallel-size", "4", "--decode-context-parallel-size", "4",
]
KEY = "sk-sandbox"
RATE, TTFT = 50.0, 0.1


def load_module():
    """Imported by file path: launcher/sandbox/standins/ has no package marker this test may rely on."""
    spec = importlib.util.spec_from_file_location("standin_vllm", STANDIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Standin:
    """One `vllm` process; stderr goes to a file so a chatty server can never block on a pipe.
    Unless a test says otherwise the rank has all its memory free and the worker holds nothing,
    so vLLM's startup guard passes; the guard's own tests give it a GB10's figures."""

    def __init__(self, tmp: Path, args: list[str], env: dict | None = None, serve=True,
                 config: dict | None = None):
        self.port = free_port()
        self.record = tmp / "log" / "record.json"
        self.stderr_path = tmp / "stderr.log"
        self.model = model_dir(tmp)
        if config is not None:
            (self.model / "config.json").write_text(json.dumps(config))
        self.env = {**os.environ, "SANDBOX_VLLM_FLAGS": str(FLAGS),
                    "SANDBOX_VLLM_RECORD": str(self.record), "STANDIN_TEST_MARK": "42",
                    **roomy_env(tmp), **(env or {})}
        head = ["serve", str(self.model), "--host", "127.0.0.1", "--port", str(self.port)]
        self.argv = (head if serve else []) + args
        with open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen([sys.executable, str(STANDIN), *self.argv], env=self.env,
                                         stdout=subprocess.PIPE, stderr=err, text=True)

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def wait_healthy(self) -> "Standin":
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.stderr
            try:
                if http(self.port, "/health")[0] == 200:
                    return self
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"never healthy:\n{self.stderr}")

    def wait_log(self, text: str) -> None:
        deadline = time.monotonic() + 10
        while text not in self.stderr:
            assert time.monotonic() < deadline and self.proc.poll() is None, self.stderr
            time.sleep(0.05)

    def stop(self, sig=signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=10)


def http(port: int, path: str, body: dict | None = None, key: str | None = None):
    """(status, body bytes) of one request; HTTP errors are answers, not exceptions."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def chat(max_tokens=20, text="Tell me about four small machines.", **extra) -> dict:
    return {"model": extra.pop("model", None) or "glm", "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": text}], **extra}


def stream(port: int, body: dict, key: str | None = KEY) -> tuple[float, list[tuple[float, str]]]:
    """Start time and every SSE `data:` payload with the moment it arrived."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                 data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Authorization": f"Bearer {key}"} if key else {})
    t0, events = time.monotonic(), []
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        for line in resp:
            line = line.decode().strip()
            if line.startswith("data: "):
                events.append((time.monotonic(), line[6:]))
    return t0, events


def metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.fixture(scope="module")
def seed(tmp_path_factory):
    """The seed-001 TP4 command line, with an API key and a served name, at a known rate."""
    tmp = tmp_path_factory.mktemp("seed")
    env = {"SANDBOX_VLLM_TOKENS_PER_S": str(RATE), "SANDBOX_VLLM_TTFT_S": str(TTFT)}
    args = [*SEED_FLAGS, "--api-key", KEY, "--served-model-name", "glm", "glm-alias"]
    server = Standin(tmp, args, env).wait_healthy()
    yield server
    assert server.stop() == 0, server.stderr


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """No key, no speculative decoding, a short context, fast tokens."""
    tmp = tmp_path_factory.mktemp("plain")
    server = Standin(tmp, ["--max-model-len", "1000"], {"SANDBOX_VLLM_TOKENS_PER_S": "400"})
    yield server.wait_healthy()
    assert server.stop(signal.SIGINT) == 0, server.stderr


# ---------------------------------------------------------------- argv

def run_once(tmp_path, args, env=None, serve=True, config=None) -> subprocess.CompletedProcess:
    server = Standin(tmp_path, args, env, serve, config)
    server.proc.wait(timeout=10)
    return subprocess.CompletedProcess(server.argv, server.proc.returncode,
                                       server.proc.stdout.read(), server.stderr)


def test_version(tmp_path):
    assert run_once(tmp_path, ["--version"], serve=False).stdout.strip() == "0.33.0"
    out = run_once(tmp_path, ["--version"], {"SANDBOX_VLLM_VERSION": "0.33.1"}, serve=False)
    assert out.stdout.strip() == "0.33.1"


# Messages as vLLM 0.33's own parser prints them (confirmed by scripts/check_profiles_with_vllm.py);
# vLLM's Optional wrapper names the converter by its repr, whose address varies.
@pytest.mark.parametrize("args, message", [
    (["--foo"], "vllm: error: unrecognized arguments: --foo"),
    (["--foo.bar=1"], 'vllm: error: unrecognized arguments: --foo {"bar": 1}'),
    (["--all2all-backend", "bogus"],
     "argument --all2all-backend: invalid choice: 'bogus' (choose from 'allgather_reducescatter', "),
    (["--port.x", "1"], """argument --port: invalid int value: '{"x": 1}'"""),
    (["--max-num-seqs", "eight"], "argument --max-num-seqs: invalid int value: 'eight'"),
    (["--max-num-seqs", "1.5"], "argument --max-num-seqs: invalid int value: '1.5'"),
    (["--max-model-len", "1.5K"], "argument --max-model-len: Decimals are not allowed with binary "
                                  "suffixes like K. Did you mean to use 1.5k instead?"),
    (["--max-model-len", "long"],
     "argument --max-model-len: invalid human_readable_int_or_auto value: 'long'"),
    (["--gpu-memory-utilization", "high"],
     "argument --gpu-memory-utilization/--device-memory-utilization: invalid float value: 'high'"),
    (["--kv-cache-memory-bytes", "banana"], "argument --kv-cache-memory-bytes: Value banana cannot "
                                            "be converted to <function human_readable_int at 0x"),
    (["--kv-cache-memory-bytes", "none"],  # only `None` is None
     "argument --kv-cache-memory-bytes: Value none cannot be converted to <function"),
    (["--numa-bind-nodes", "0", "1.5"],
     "argument --numa-bind-nodes: Value 1.5 cannot be converted to <class 'int'>."),
    (["--kv-offloading-size", "big"],
     "argument --kv-offloading-size: Value big cannot be converted to <class 'float'>."),
    (["--speculative-config", '{"method": mtp}'], 'argument --speculative-config/-sc: Value '
     '{"method": mtp} cannot be converted to <function loads at 0x'),
    (["--limit-mm-per-prompt", "{bad"],
     "argument --limit-mm-per-prompt: Value {bad cannot be converted to <function loads at 0x"),
    (["--hf-overrides", "{bad}"], "argument --hf-overrides: Value {bad} cannot be converted to"),
    (["--dcp-comm-backend", "bogus"],
     "argument --dcp-comm-backend: invalid choice: 'bogus' (choose from 'a2a', 'ag_rs', None)"),
    (["--tool-strict-level", "none"], "argument --tool-strict-level: invalid choice: 'none' "
                                      "(choose from 'auto', 'function', 'parameter', None)"),
    (["--collect-detailed-traces", "all", "bogus"],
     "argument --collect-detailed-traces: invalid choice: 'bogus'"),
    (["--moe-backend", "bogus"], "argument --moe-backend: invalid choice: 'bogus' (choose from"),
    (["--log-level", "info"], "argument --log-level: invalid choice: 'info'"),
    (["--async-scheduling=yes"], "argument --async-scheduling/--no-async-scheduling: "
                                 "ignored explicit argument 'yes'"),
    (["--cudagraph-capture-sizes", "1", "x"],
     "argument --cudagraph-capture-sizes: invalid int value: 'x'"),
    (["--lora-modules", "{bad"], "vllm serve: error: Invalid JSON format for --lora-modules: {bad"),
    # config dataclasses: pydantic's ValidationError, as vLLM's parse_dataclass reports it
    (["--compilation-config", "[1]"], "argument --compilation-config/-cc: 1 validation error for "
     "CompilationConfig\n  Input should be an object [type=dataclass_type, input_value=[1], "
     "input_type=list]\n    For further information visit "
     "https://errors.pydantic.dev/2.14/v/dataclass_type"),
    (["--compilation-config", "{bad"], "1 validation error for CompilationConfig\n  Invalid JSON: "
     "key must be a string at line 1 column 2 [type=json_invalid, input_value='{bad', "
     "input_type=str]"),
    (["-cc.pass_config.fuse_allreduce_rmz=true"], "argument --compilation-config/-cc: 1 validation "
     "error for CompilationConfig\npass_config.fuse_allreduce_rmz\n  Unexpected keyword argument "
     "[type=unexpected_keyword_argument, input_value=True, input_type=bool]"),
])
def test_refuses_what_vllm_refuses(tmp_path, args, message):
    out = run_once(tmp_path, args)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert not (tmp_path / "log" / "record.json").exists()


def recorded(tmp_path, args) -> dict:
    out = run_once(tmp_path, args, {"SANDBOX_VLLM_FAIL": "exit:0"})
    assert out.returncode == 0, out.stderr
    return json.loads((tmp_path / "log" / "record.json").read_text())["options"]


def test_flexible_argv_forms(tmp_path):
    """--a_b spelling, --opt=value, aliases, dotted keys of one option string merged (a second
    spelling of the option replaces them, as in vLLM), -O3."""
    options = recorded(tmp_path, [
        "--max_num_batched_tokens=8k", "-tp", "2", "-cc.mode=3",
        "-cc.pass_config.fuse_allreduce_rms", "true", "-cc.custom_ops+", "+a,-b",
        "-cc.custom_ops+=+c", "--no-async-scheduling", "--max-model-len", "auto",
        "--hf-overrides", "plain-string", "-ac.backend=FLASHINFER",
        "--attention-config.use_trtllm_attention=false", "-O3"])
    assert options["max_num_batched_tokens"] == 8000 and options["tensor_parallel_size"] == 2
    assert options["compilation_config"] == {"mode": 3, "pass_config": {"fuse_allreduce_rms": True},
                                             "custom_ops": ["+a", "-b", "+c"]}
    assert options["attention_config"] == {"use_trtllm_attention": False}
    assert options["async_scheduling"] is False and options["max_model_len"] == -1
    assert options["hf_overrides"] == "plain-string" and options["optimization_level"] == "3"


def test_values_converted_like_vllm(tmp_path):
    """What vLLM's parser makes of each kind of value (scripts/check_profiles_with_vllm.py
    compares the same argv with vLLM itself)."""
    options = recorded(tmp_path, VALUE_FORMS)
    assert options == {
        "kv_cache_memory_bytes": 13 * 2**30, "max_num_seqs": 8, "gpu_memory_utilization": 0.84,
        "dcp_comm_backend": None, "moe_backend": "marlin", "served_model_name": ["a", None],
        "enable_prefix_caching": False, "hf_token": True, "middleware": ["x", "y"],
        "device_ids": [0, "gpu-1"], "reasoning_parser": "", "numa_bind_nodes": [0, 1],
        "kv_offloading_size": 1.5, "compilation_config": {"max_cudagraph_capture_size": 8000},
        "speculative_config": [1], "distributed_executor_backend": "rya",
        "kv_transfer_config": {"kv_port": 14000},
        "lora_modules": [{"name": "a", "path": "/p"}], "host": "127.0.0.1", "port": options["port"],
    }


# Each kind of value vLLM takes. `rya` is taken too: vLLM's parser accepts any string there (a
# class name); only starting the executor fails.
VALUE_FORMS = [
    "--kv-cache-memory-bytes", "13G", "--max-num-seqs", "8", "--gpu-memory-utilization", "0.84",
    "--dcp-comm-backend", "None", "--moe-backend", "Marlin", "--served-model-name", "a", "None",
    "--disable-prefix-caching", "--hf-token", "--middleware", "x", "--middleware", "y",
    "--device-ids", "0, gpu-1", "--reasoning-parser", "NONE", "--numa-bind-nodes", "0", "1",
    "--kv-offloading-size", "1.5", "-cc.max_cudagraph_capture_size", "8k",
    "--speculative-config", "[1]", "--distributed-executor-backend", "rya",
    "--kv-transfer-config", '{"kv_port": 14k}',
    "--lora-modules", "a=/p",
]


def serve_argv(engine: list[str]) -> list[str] | None:
    """The tokens after `vllm serve`, also inside the Ray head's `sh -c '... && exec vllm serve ...'`."""
    tokens = shlex.split(engine[2]) if engine[:2] == ["sh", "-c"] else engine
    at = next((i for i in range(len(tokens)) if tokens[i:i + 2] == ["vllm", "serve"]), None)
    return None if at is None else list(itertools.takewhile(lambda t: t != "&&", tokens[at + 2:]))


@pytest.mark.parametrize("multinode", [None, "ray"])
@pytest.mark.parametrize("profile", [n for n in profile_names() if load_profile(n).engine == "vllm"])
def test_every_profile_argv_is_taken(write_config, tmp_path, profile, multinode):
    """Every rank's engine argv `plan` makes of every vLLM profile parses, values converted
    (scripts/check_profiles_with_vllm.py checks the same argv with vLLM 0.33 itself)."""
    config = write_config(lambda d: d.update(profile=profile, **({"multinode": multinode}
                                                                   if multinode else {})))
    result = CliRunner().invoke(cli_main, ["plan", "-c", str(config), "--json", "--offline"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    argvs = [a for a in (serve_argv(r["engine"]) for r in plan["ranks"]) if a is not None]
    assert argvs
    for argv in argvs:
        done = subprocess.run([sys.executable, str(STANDIN), "serve", *argv], text=True,
                              capture_output=True, timeout=30,
                              env={**os.environ, "SANDBOX_VLLM_FLAGS": str(FLAGS),
                                   "SANDBOX_VLLM_FAIL": "exit:0",
                                   "SANDBOX_VLLM_RECORD": str(tmp_path / "record.json")})
        assert done.returncode == 0, done.stderr
        options = json.loads((tmp_path / "record.json").read_text())["options"]
        assert options["tensor_parallel_size"] == 4 and isinstance(options["max_model_len"], int)
        assert options["kv_cache_memory_bytes"] == plan["kv"]["kv_cache_memory_bytes"]


def test_seed_flags_recorded(seed):
    record = json.loads(seed.record.read_text())
    assert record["argv"] == seed.argv and record["mode"] == "api"
    assert record["model"] == str(seed.model)
    assert record["env"]["STANDIN_TEST_MARK"] == "42" and record["pid"] == seed.proc.pid
    o = record["options"]
    assert o["kv_cache_dtype"] == "fp8" and o["max_model_len"] == 200000 and o["max_num_seqs"] == 8
    assert o["kv_cache_memory_bytes"] == 14092861440 and o["async_scheduling"] is True
    assert o["compilation_config"] == {"pass_config": {"fuse_allreduce_rms": True}}
    assert o["cudagraph_capture_sizes"] == [1, 2, 3, 4, 6, 8, 12, 24]
    assert o["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 2}
    assert o["tensor_parallel_size"] == 4 and o["decode_context_parallel_size"] == 4
    assert "gpu_memory_utilization" not in o  # only what was given is recorded
    assert "SANDBOX STAND-IN" in seed.stderr


def test_fail_exit_knob_and_guards(tmp_path):
    out = run_once(tmp_path, ["--tensor-parallel-size", "4"], {"SANDBOX_VLLM_FAIL": "exit:3"})
    assert out.returncode == 3 and "EngineCore failed" in out.stderr
    options = json.loads((tmp_path / "log" / "record.json").read_text())["options"]
    assert options["tensor_parallel_size"] == 4  # recorded before the simulated crash


def test_startup_guard_on_a_gb10_refuses_the_default_utilisation(tmp_path):
    """vLLM 0.33's request_memory on a GB10 with caches dropped: 117.1 GiB available, the worker
    holding 14 GiB, so 103.08 GiB free against 0.92 x 121.69 GiB -- refused, with vLLM's words,
    whether or not --kv-cache-memory-bytes is given. 0.84 (0.847 fits) starts."""
    gb10 = {"SANDBOX_VLLM_MEMINFO": str(gb10_meminfo(tmp_path / "gb10")),
            "SANDBOX_VLLM_HELD_GIB": "14", "SANDBOX_VLLM_STARTUP_S": "0"}
    for extra in ([], ["--kv-cache-memory-bytes", "14092861440"]):
        refused = run_once(tmp_path, extra, gb10)
        assert refused.returncode == 1, refused.stderr
        assert ("ValueError: Free memory on device cuda:0 (103.08/121.69 GiB) on startup is less "
                "than desired GPU memory utilization (0.92, 111.95 GiB). Decrease GPU memory "
                "utilization or reduce GPU memory used by other processes.") in refused.stderr
    too_high = run_once(tmp_path, ["--gpu-memory-utilization", "0.85"], gb10)
    assert too_high.returncode == 1 and "(0.85, 103.44 GiB)" in too_high.stderr
    ok = Standin(tmp_path / "ok", ["--gpu-memory-utilization", "0.84"], gb10).wait_healthy()
    assert ok.stop() == 0


def test_a_checkpoint_that_is_not_there_is_refused(tmp_path):
    """No -v mount: the model path is empty in the container, and vLLM stops before any rank."""
    absent = tmp_path / "absent"
    missing = run_once(tmp_path, ["serve", str(absent), "--port", str(free_port())], serve=False)
    assert missing.returncode == 1
    assert f"Invalid repository ID or local directory specified: '{absent}'" in missing.stderr
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text("{}")
    no_weights = run_once(tmp_path, ["serve", str(bare), "--port", str(free_port())], serve=False)
    assert no_weights.returncode == 1 and "Cannot find any model weights" in no_weights.stderr


# ---------------------------------------------------------------- API

def test_api_key_on_v1_only(seed):
    assert http(seed.port, "/v1/models")[0] == 401
    assert http(seed.port, "/v1/models", key="wrong")[0] == 401
    status, body = http(seed.port, "/v1/chat/completions", chat(), key=None)
    assert status == 401 and json.loads(body) == {"error": "Unauthorized"}
    assert http(seed.port, "/health")[0] == 200 and http(seed.port, "/metrics")[0] == 200
    status, body = http(seed.port, "/v1/models", key=KEY)
    assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == ["glm", "glm-alias"]


def test_models_default_to_model_name(plain):
    status, body = http(plain.port, "/v1/models")
    assert status == 200 and json.loads(body)["data"][0]["id"] == str(plain.model)


def test_stream_with_usage(seed):
    _, events = stream(seed.port, chat(12, stream_options={"include_usage": True}))
    assert events[-1][1] == "[DONE]"
    chunks = [json.loads(data) for _, data in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "glm" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert len(text.split()) == 12
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12
    usage = chunks[-1]["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + 12 and usage["prompt_tokens"] > 0


def test_stream_without_usage_has_no_usage_chunk(seed):
    _, events = stream(seed.port, chat(3))
    assert all(json.loads(d)["choices"] for _, d in events[:-1])


def test_decode_rate_and_ttft_per_stream(seed):
    """Four concurrent streams, each measured the way the bench does: TTFT = first non-empty
    content, no sooner than configured; each stream takes no less than its tokens at the
    configured rate, and far less than four streams sharing that rate would (4x)."""
    results = []
    n = 40

    def one():
        t0, events = stream(seed.port, chat(n, stream_options={"include_usage": True}))
        firsts = [t for t, d in events if d != "[DONE]" and
                  (json.loads(d)["choices"] or [{}])[0].get("delta", {}).get("content")]
        usage = json.loads(events[-2][1])["usage"]
        results.append((firsts[0] - t0, events[-1][0] - t0, usage["completion_tokens"]))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4
    alone = TTFT + (n - 1) / RATE  # the earliest a stream can end (prefill of a short prompt aside)
    for ttft, wall, tokens in results:
        assert tokens == n, results
        assert TTFT <= ttft < TTFT + 1.0, results
        assert alone <= wall < alone + (4 - 1) * (n - 1) / RATE / 2, results


def test_metrics_count_tokens_and_spec_decode(seed):
    before = http(seed.port, "/metrics")[1].decode()
    status, body = http(seed.port, "/v1/chat/completions", chat(30), key=KEY)
    usage = json.loads(body)["usage"]
    after = http(seed.port, "/metrics")[1].decode()

    def delta(name):
        return metric(after, name) - metric(before, name)

    assert status == 200 and usage["completion_tokens"] == 30
    assert delta("vllm:generation_tokens_total") == 30
    assert delta("vllm:prompt_tokens_total") == usage["prompt_tokens"]
    assert delta("vllm:time_to_first_token_seconds_count") == 1
    assert 'vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="glm"}' in after
    assert metric(after, "vllm:num_requests_running") == 0
    drafts, accepted = metric(after, "vllm:spec_decode_num_drafts_total"), metric(
        after, "vllm:spec_decode_num_accepted_tokens_total")
    assert delta("vllm:spec_decode_num_drafts_total") > 0
    assert abs(1 + accepted / drafts - 2.5) < 0.1  # default 1.5 accepted per draft
    assert metric(after, "vllm:spec_decode_num_draft_tokens_total") == 2 * drafts  # k = 2


def test_no_spec_metrics_without_speculative_config(plain):
    text = http(plain.port, "/metrics")[1].decode()
    assert "vllm:generation_tokens_total" in text and "spec_decode" not in text


def test_needle_answer_and_reasoning(plain):
    filler = "The sky was grey and the sea was calm. " * 20
    body = chat(64, f"{filler}The secret code is XYZ-123. {filler}\nWhat is the secret code?",
                model=str(plain.model))
    status, raw = http(plain.port, "/v1/chat/completions", body)
    reply = json.loads(raw)["choices"][0]
    assert status == 200 and reply["message"]["content"] == "The secret code is XYZ-123."
    assert reply["finish_reason"] == "stop"
    thinking = {**chat(10, model=str(plain.model)),
                "chat_template_kwargs": {"reasoning_effort": "high"}}
    _, events = stream(plain.port, thinking, key=None)
    deltas = [json.loads(d)["choices"][0]["delta"] for _, d in events[1:-1]]
    # no --reasoning-parser: vLLM leaves the thinking in the content (tests/test_standin_api.py)
    assert all(list(d) == ["content"] for d in deltas)
    assert deltas[0]["content"].startswith("<think>") and deltas[5]["content"].startswith("</think>")


def test_request_refusals(plain):
    too_long = chat(2000, model=str(plain.model))
    status, body = http(plain.port, "/v1/chat/completions", too_long)
    assert status == 400  # max_tokens above the context, whatever the prompt
    assert "max_tokens=2000 cannot be greater than max_model_len=1000" in json.loads(body)["error"]["message"]
    assert http(plain.port, "/v1/chat/completions", chat(model="other"))[0] == 404
    assert http(plain.port, "/v1/chat/completions", {"messages": "no"})[0] == 400
    assert http(plain.port, "/v1/nothing")[0] == 404


def test_malformed_knob(tmp_path):
    server = Standin(tmp_path, [], {"SANDBOX_VLLM_FAIL": "malformed"}).wait_healthy()
    try:
        _, events = stream(server.port, chat(5, model=str(server.model)), key=None)
        json.loads(events[0][1])  # the role chunk is fine ...
        with pytest.raises(json.JSONDecodeError):
            json.loads(events[1][1])  # ... the next one is not
    finally:
        assert server.stop() == 0


def test_headless_worker_meets_its_head_then_serves_nothing(tmp_path):
    """vLLM's native multi-node on loopback: the worker waits for the head's store at
    --master-addr:--master-port, both open the connections the real stack opens, then the head
    serves the API and the worker serves nothing until SIGTERM."""
    port = str(free_port())
    net = {"NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo", "VLLM_HOST_IP": "127.0.0.1",
           "SANDBOX_SYSFS_ROOT": str(tmp_path / "no-rdma")}
    common = ["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", port, *SEED_FLAGS]
    worker = Standin(tmp_path / "w", ["--headless", "--node-rank", "1", *common], net)
    head = Standin(tmp_path / "h", ["--node-rank", "0", *common], net)
    try:
        head.wait_healthy()
        worker.wait_log("headless worker rank 1 of 2")
        with pytest.raises(OSError):
            http(worker.port, "/health")
        assert json.loads(worker.record.read_text())["mode"] == "headless"
        assert "rendezvous: 2 nodes joined" in head.stderr
    finally:
        assert worker.stop() == 0 and head.stop() == 0


def test_a_head_nobody_joins_gives_up_like_torch(tmp_path):
    args = ["--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1",
            "--master-port", str(free_port())]
    out = run_once(tmp_path, args, {"SANDBOX_VLLM_DIST_TIMEOUT_S": "1", "NCCL_SOCKET_IFNAME": "lo"})
    assert out.returncode == 1
    assert "torch.distributed.DistStoreError: Timed out after 1 seconds waiting for clients. " \
           "1/2 clients joined." in out.stderr


def test_a_worker_whose_master_never_answers_gives_up_like_torch(tmp_path):
    port = free_port()
    args = ["--headless", "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
            "--master-port", str(port)]
    out = run_once(tmp_path, args, {"SANDBOX_VLLM_DIST_TIMEOUT_S": "1", "NCCL_SOCKET_IFNAME": "lo"})
    assert out.returncode == 1
    assert "torch.distributed.DistNetworkError: The client socket has timed out after " in out.stderr
    assert f"ms while trying to connect to (127.0.0.1, {port})." in out.stderr


# ---------------------------------------------------------------- pure helpers

def test_prompt_token_count_and_human_ints():
    m = load_module()
    assert m.count_prompt_tokens([{"role": "user", "content": "one two three four five six"}]) == 8
    parts = [{"role": "user", "content": [{"type": "text", "text": "a b"}, {"type": "image"}]}]
    assert m.count_prompt_tokens(parts) == 3
    parsers = m.vllm_options  # the kit's launcher/inputs/vllm_options.py, run from the repository
    assert Path(parsers.__file__).resolve() == ROOT / "launcher" / "inputs" / "vllm_options.py"
    assert parsers.human_readable_int("25.6k") == 25600 and parsers.human_readable_int("1K") == 1024
    assert parsers.human_readable_int("2G") == 2 * 1024 ** 3 and parsers.human_readable_int("7") == 7


def test_code_task_is_not_mistaken_for_a_needle():
    m = load_module()
    asks = [{"role": "user", "content": "Write code that is clear. Explain the code."}]
    assert m.find_needle(asks) is None
    tokens, finish = m.plan_tokens({"messages": asks}, 50)  # max_tokens as the checks left it
    assert len(tokens) == 50 and finish == "length"


# ---------------------------------------------------------------- the Ray stand-in

RAY = ROOT / "launcher" / "sandbox" / "standins" / "standin_ray.py"


def test_ray_head_workers_and_a_waiting_vllm(tmp_path):
    """`ray start --head` returns with the head up; workers join and block; `vllm serve
    --distributed-executor-backend ray` waits for TP nodes, then serves; a worker whose head
    goes away exits 1 (its container would end with it)."""
    port = free_port()
    pidfile = tmp_path / "head.pid"
    net = {"NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo", "VLLM_HOST_IP": "127.0.0.1",
           "SANDBOX_SYSFS_ROOT": str(tmp_path / "no-rdma")}
    env = {**os.environ, **net, "SANDBOX_RAY_RECORD": str(tmp_path / "ray.json"),
           "SANDBOX_RAY_HEAD_PIDFILE": str(pidfile), "SANDBOX_RAY_HEAD_LOG": str(tmp_path / "head.log")}
    head = subprocess.run([sys.executable, str(RAY), "start", "--head", f"--port={port}",
                           "--node-ip-address=127.0.0.1"], env=env, capture_output=True, text=True, timeout=30)
    assert head.returncode == 0 and "Ray runtime started" in head.stderr, head.stderr
    assert json.loads((tmp_path / "ray.json").read_text())["role"] == "head"
    workers = []
    try:
        server = Standin(tmp_path, ["--tensor-parallel-size", "3", "--distributed-executor-backend", "ray",
                                    "--master-port", str(free_port())],
                         {**net, "RAY_ADDRESS": f"127.0.0.1:{port}", "SANDBOX_RAY_WAIT_S": "20",
                          "PYTHONPATH": str(image_site(tmp_path, ray=True))})
        for i in (2, 3):
            wenv = {**env, "SANDBOX_RAY_RECORD": str(tmp_path / f"ray{i}.json")}
            workers.append(subprocess.Popen([sys.executable, str(RAY), "start", "--block",
                                             f"--address=127.0.0.1:{port}", f"--node-ip-address=127.0.0.{i}"],
                                            env=wenv, stderr=subprocess.PIPE, text=True))
        server.wait_healthy()
        assert "Ray cluster at 127.0.0.1:%d: 3 nodes; placement group of 3 ready" % port in server.stderr
        assert "rendezvous: 3 nodes joined" in server.stderr  # its Ray workers met the driver
        assert json.loads((tmp_path / "ray2.json").read_text())["address"] == f"127.0.0.1:{port}"
        assert server.stop() == 0
    finally:
        os.kill(int(pidfile.read_text()), signal.SIGKILL)  # the head goes away
    for w in workers:
        assert w.wait(timeout=10) == 1
        said = w.stderr.read()
        assert "NCCL and Gloo connected" in said and "the Ray head went away" in said, said


def test_vllm_on_ray_gives_up_without_enough_nodes(tmp_path):
    out = run_once(tmp_path, ["--tensor-parallel-size", "4", "--distributed-executor-backend", "ray"],
                   {"RAY_ADDRESS": f"127.0.0.1:{free_port()}", "SANDBOX_RAY_WAIT_S": "1",
                    "PYTHONPATH": str(image_site(tmp_path, ray=True))})
    assert out.returncode == 1 and "has 0 of the 4 nodes the placement group needs" in out.stderr


def test_ray_version_and_usage(tmp_path):
    done = subprocess.run([sys.executable, str(RAY), "--version"], capture_output=True, text=True, timeout=10)
    assert done.returncode == 0 and done.stdout.startswith("ray, version ")
    assert subprocess.run([sys.executable, str(RAY), "status"], capture_output=True, timeout=10).returncode == 2


def test_compile_on_an_empty_cache_then_read_it_back(tmp_path):
    """torch.compile costs SANDBOX_VLLM_COMPILE_S on an empty VLLM_CACHE_ROOT and leaves its
    graphs (and a Triton kernel) there; the next start finds them and skips the compile."""
    cache = tmp_path / "cache"
    env = {"SANDBOX_VLLM_COMPILE_S": "1.5", "VLLM_CACHE_ROOT": str(cache / "vllm"),
           "TRITON_CACHE_DIR": str(cache / "triton")}
    times = []
    for attempt in ("cold", "warm"):
        started = time.monotonic()
        server = Standin(tmp_path, [], env).wait_healthy()  # one model: one compile key
        times.append(time.monotonic() - started)
        assert server.stop() == 0, server.stderr
        if attempt == "cold":
            assert "Compiling a graph for dynamic shape takes 1.5" in server.stderr
            assert list(cache.glob("vllm/torch_compile_cache/*/rank_0_0/backbone/compiled.json"))
            assert list((cache / "triton").iterdir())
        else:
            assert "Directly load the compiled graph(s) for dynamic shape from the cache" in server.stderr
    assert times[0] - times[1] > 1.0, times


def read_bytes(pid: int) -> int:
    """The process's /proc/<pid>/io read_bytes: what it fetched from storage."""
    io = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(io["read_bytes"])


def test_the_checkpoint_is_read_at_the_links_speed_and_counted_in_read_bytes(tmp_path):
    """Every shard whole (vLLM's default loader), at the sysfs speed of the NFS link, the bytes
    counted where the real engine's are: /proc/<pid>/io read_bytes (O_DIRECT, not the page cache)."""
    model = model_dir(tmp_path)
    sizes = [(3 << 20) + 123, 1 << 20]
    for i, size in enumerate(sizes):
        (model / f"model-0000{i + 1}-of-00002.safetensors").write_bytes(os.urandom(size))
    speed = tmp_path / "sysfs" / "class" / "net" / "eth0" / "speed"
    speed.parent.mkdir(parents=True)
    speed.write_text("16\n")  # 16 Mb/s: 2 MB/s, ~2.1 s for these 4.2 MB
    env = {"SANDBOX_VLLM_NFS_PATH": str(model), "SANDBOX_SYSFS_ROOT": str(tmp_path / "sysfs")}
    started = time.monotonic()
    server = Standin(tmp_path, [], env)
    seen = []
    while server.proc.poll() is None and "Loading weights took" not in server.stderr:
        seen.append(read_bytes(server.proc.pid))
        time.sleep(0.2)
    server.wait_healthy()
    took = time.monotonic() - started
    total = read_bytes(server.proc.pid)
    assert server.stop() == 0, server.stderr
    assert total >= sum(sizes), (total, server.stderr)
    assert any(0 < b < sum(sizes) for b in seen), seen  # it moved while loading, not at once
    logged = float(re.search(r"Loading weights took ([\d.]+) seconds", server.stderr).group(1))
    assert 1.9 < logged < 4 and took >= logged, (logged, took)


def test_a_checkpoint_off_the_nfs_path_is_read_unthrottled(tmp_path):
    model = model_dir(tmp_path)
    (model / "model-00001-of-00001.safetensors").write_bytes(os.urandom(4 << 20))
    env = {"SANDBOX_VLLM_NFS_PATH": str(tmp_path / "elsewhere"), "SANDBOX_VLLM_READ_MBPS": "16"}
    server = Standin(tmp_path, [], env).wait_healthy()
    assert read_bytes(server.proc.pid) >= 4 << 20
    assert server.stop() == 0
    assert float(re.search(r"Loading weights took ([\d.]+) seconds", server.stderr).group(1)) < 1


# ------------------------------------------------- vLLM 0.33's engine configuration (issue 32)

def image_site(tmp: Path, ray: bool = False, registers: tuple[str, ...] = ()) -> Path:
    """A dist-packages of a serving image: Ray importable, and a patch of its `vllm` package that
    registers `registers` (as a chain stage's overlay does: standin_engine_config.registered)."""
    site = tmp / "site"
    (site / "vllm").mkdir(parents=True, exist_ok=True)
    if ray:
        (site / "ray").mkdir(exist_ok=True)
        (site / "ray" / "__init__.py").write_text("# stand-in ray\n")
    if registers:
        (site / "vllm" / "patch.py").write_text(f"SANDBOX_PATCH = 'patch'\nSANDBOX_REGISTERS = {list(registers)!r}\n")
    return site


GLM5 = {"architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa", "torch_dtype": "bfloat16",
        "max_position_embeddings": 202752, "rope_theta": 1000000, "kv_lora_rank": 512,
        "qk_rope_head_dim": 64, "index_topk": 2048, "quantization_config": {"quant_method": "exl3", "bits": 3.0}}
EXL3 = ("quantization:exl3",)
LONG = ("ValueError: User-specified max_model_len (1000000) is greater than the derived max_model_len "
        "(max_position_embeddings=202752.0 or model_max_length=None in model's config.json). To allow "
        "overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. "
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution.")


def test_a_context_above_the_checkpoints_maximum_needs_the_override(tmp_path):
    site = {"PYTHONPATH": str(image_site(tmp_path, registers=EXL3))}
    out = run_once(tmp_path, ["--max-model-len", "1000000"], site, config=GLM5)
    assert out.returncode == 1 and LONG in out.stderr, out.stderr
    ok = Standin(tmp_path, ["--max-model-len", "1000000"], {**site, "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"},
                 config=GLM5)
    ok.wait_healthy()
    assert "WARNING" in ok.stderr and "VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme" in ok.stderr
    assert ok.stop() == 0


def test_a_quantization_method_the_image_does_not_register(tmp_path):
    out = run_once(tmp_path, [], config=GLM5)
    assert out.returncode == 1, out.stderr
    assert ("ValueError: Unknown quantization method: exl3. Must be one of ['awq', 'auto_awq', 'fp8', "
            "'fbgemm_fp8', 'fp_quant', 'modelopt'" in out.stderr), out.stderr
    assert "'nvfp4_per_token', 'mxfp8']." in out.stderr
    assert run_once(tmp_path, ["--quantization", "fp8"], config=GLM5).stderr.count(
        "does not match the quantization method specified in the `quantization` argument (fp8)") == 1
    registered = Standin(tmp_path, [], {"PYTHONPATH": str(image_site(tmp_path, registers=EXL3))}, config=GLM5)
    registered.wait_healthy()
    assert registered.stop() == 0


def test_a_quantization_config_json_beside_config_json_is_ignored(tmp_path):
    """vLLM reads the method from config.json only: a quantization_config.json is not looked at, the
    model is configured unquantized (the kit's check refuses it; the stand-in, as vLLM, does not)."""
    cfg = {k: v for k, v in GLM5.items() if k != "quantization_config"}
    server = Standin(tmp_path, [], config=cfg)
    (server.model / "quantization_config.json").write_text('{"quant_method": "exl3"}')
    server.wait_healthy()
    assert server.stop() == 0


def test_dcp_with_sparse_mla_on_a_gb10_needs_the_dcp_backend(tmp_path):
    dcp = ["--decode-context-parallel-size", "4", "--kv-cache-dtype", "fp8"]
    stock = {"PYTHONPATH": str(image_site(tmp_path, registers=EXL3))}
    out = run_once(tmp_path, dcp, stock, config=GLM5)
    assert out.returncode == 1, out.stderr
    assert ("ValueError: No valid attention backend found for cuda with AttentionSelectorConfig(head_size=576, "
            "dtype=torch.bfloat16, kv_cache_dtype=fp8, block_size=None, use_mla=True" in out.stderr), out.stderr
    assert ("Reasons: {TRITON_MLA: [sparse not supported], FLASHINFER_MLA_SPARSE_SM120: [DCP not supported]}."
            in out.stderr)
    blackwell = Standin(tmp_path, dcp, {**stock, "SANDBOX_VLLM_COMPUTE_CAPABILITY": "10.0"}, config=GLM5)
    blackwell.wait_healthy()  # compute capability 10.x has sparse-MLA backends with DCP
    assert blackwell.stop() == 0
    serves_when_registered(tmp_path / "site2", dcp, EXL3 + ("attention:sparse-mla-dcp",))


def serves_when_registered(site, argv, registers) -> None:
    """The same argv starts and serves once an image's site-packages at `site` registers `registers`."""
    site.mkdir()
    server = Standin(site.parent, argv, {"PYTHONPATH": str(image_site(site, registers=registers))}, config=GLM5)
    server.wait_healthy()
    assert server.stop() == 0


def test_a_custom_attention_backend_must_be_registered(tmp_path):
    custom = ["--attention-backend", "CUSTOM", "--block-size", "256"]
    out = run_once(tmp_path, custom, {"PYTHONPATH": str(image_site(tmp_path, registers=EXL3))}, config=GLM5)
    assert out.returncode == 1 and ("ValueError: Backend CUSTOM must be registered before use. Use "
                                    "register_backend(Backend.CUSTOM, 'your.module.YourClass')") in out.stderr
    serves_when_registered(tmp_path / "p", custom, EXL3 + ("attention:CUSTOM",))


def test_the_ray_executor_needs_ray_importable(tmp_path):
    out = run_once(tmp_path, ["--distributed-executor-backend", "ray"])
    assert out.returncode == 1 and ("ValueError: Failed to import Ray: No module named 'ray'.Please install "
                                    "Ray with `pip install ray`.") in out.stderr, out.stderr


ENGINE_CONFIG = ROOT / "launcher" / "onrank" / "engine_config.py"


def ask_engine(tmp_path, argv, site: Path, config=None) -> subprocess.CompletedProcess:
    """launcher/onrank/engine_config.py as check's engine row runs it in the image (python3 -), the
    stand-in on the image's path."""
    model = model_dir(tmp_path)
    if config is not None:
        (model / "config.json").write_text(json.dumps(config))
    env = {**os.environ, "SANDBOX_VLLM_FLAGS": str(FLAGS),
           "PYTHONPATH": os.pathsep.join([str(site), str(STANDIN.parent)])}
    return subprocess.run([sys.executable, "-", json.dumps({"argv": [str(model), *argv]})],
                          input=ENGINE_CONFIG.read_text(), env=env, capture_output=True, text=True, timeout=30)


def test_the_engine_row_asks_the_stand_in_without_starting_it(tmp_path):
    site = image_site(tmp_path, registers=EXL3)
    started = time.monotonic()
    done = ask_engine(tmp_path, ["--max-model-len", "1000000"], site, GLM5)
    assert time.monotonic() - started < 5
    assert done.returncode == 0, done.stderr
    status, _, message = done.stdout.strip().splitlines()[-1].partition(" ")[2].partition(" ")
    assert status == "FAIL" and LONG in json.loads(message)
    done = ask_engine(tmp_path, ["--max-model-len", "200000"], site, GLM5)
    assert done.stdout.strip().splitlines()[-1].startswith("ENGINECONF OK "), done.stdout + done.stderr
    assert "quantization=exl3" in done.stdout and not (tmp_path / "log" / "record.json").exists()
    bad = ask_engine(tmp_path, ["--max-num-seqs", "eight"], site, GLM5)
    assert bad.returncode == 2 and "invalid int value: 'eight'" in bad.stdout


HEADS = "ValueError: Total number of attention heads (2) must be divisible by tensor parallel size (4)."


def test_attention_heads_must_divide_by_the_tensor_parallel_size(tmp_path):
    """vLLM 0.33's verify_with_parallel_config, as it refused the sandbox checkpoint of 2 heads at TP4:
    at the stand-in's start and in check's engine row alike."""
    site = image_site(tmp_path, registers=EXL3)
    cfg = {**GLM5, "num_attention_heads": 2}
    out = run_once(tmp_path, ["--tensor-parallel-size", "4"], {"PYTHONPATH": str(site)}, config=cfg)
    assert out.returncode == 1 and HEADS in out.stderr, out.stderr
    done = ask_engine(tmp_path, ["--tensor-parallel-size", "4"], site, cfg)
    status, _, message = done.stdout.strip().splitlines()[-1].partition(" ")[2].partition(" ")
    assert status == "FAIL" and json.loads(message) == HEADS, done.stdout + done.stderr
    assert ask_engine(tmp_path, ["--tensor-parallel-size", "2"], site, cfg).stdout.strip().splitlines()[
        -1].startswith("ENGINECONF OK ")



def test_the_sandbox_checkpoint_passes_the_sandbox_profiles_engine_configuration(tmp_path):
    """The checkpoint `sandbox up` writes, under the sandbox profile's own flags, on an image that
    registers what the profile needs: vLLM's configuration accepts it (heads divide by its TP)."""
    from launcher.sandbox import model_fixture

    profile = load_profile("sandbox")
    argv = [tok for arg in profile.args for tok in shlex.split(arg)]
    site = image_site(tmp_path, registers=tuple(profile.needs))
    done = ask_engine(tmp_path, argv, site, model_fixture.CONFIG)
    assert done.stdout.strip().splitlines()[-1].startswith("ENGINECONF OK "), done.stdout + done.stderr
