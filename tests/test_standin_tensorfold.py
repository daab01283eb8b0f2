"""The sandbox's stand-in `tensorfold` (launcher/sandbox/standins/standin_tensorfold.py), run as the image
runs it: `python3 -m tensorfold.cli ...` over the image's own dist-packages layout
(debian_image.standin_site_packages), as a real process on 127.0.0.1.

GLM-5.3's engine runs at --tp 4 only, so serving is tested as rank 0 (or a follower) of four with
standin_dist replaced by a stub that records how it was called: forming the cluster over the
network is standin_dist's job, tested with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.sandbox import model_fixture as checkpoint, debian_image
from test_standin_vllm import chat, free_port, http, metric, stream

ROOT = Path(__file__).resolve().parents[1]
SANDBOX = ROOT / "launcher" / "sandbox" / "standins"
GOLDEN_PLAN = ROOT / "tests" / "golden" / "plan-tensorfold.json"
STUB_DIST = '''"""Test stub of standin_dist: records the call; answers STUB_DIST_ANSWER (else success)."""
import json, os

def form_cluster(*, node_rank, nnodes, master_addr, master_port, env, timeout_s, stop, log):
    with open(os.environ["STUB_DIST_CALL"], "w") as f:
        json.dump({"node_rank": node_rank, "nnodes": nnodes, "master_addr": master_addr,
                   "master_port": master_port, "env": dict(env), "timeout_s": timeout_s}, f)
    return os.environ.get("STUB_DIST_ANSWER") or None
'''


def site(tmp: Path, stub_dist: bool) -> Path:
    """The stand-in image's dist-packages, written under tmp; standin_dist stubbed if asked."""
    root = tmp / "site"
    for rel, data in debian_image.standin_site_packages().items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    if stub_dist:
        (root / "standin_dist.py").write_text(STUB_DIST)
    return root


def model(tmp: Path, **changes) -> Path:
    """The sandbox checkpoint's config.json (an EXL3 glm_moe_dsa), with `changes` (None drops a key)."""
    cfg = {k: v for k, v in {**checkpoint.CONFIG, **changes}.items() if v is not None}
    path = tmp / "models" / "glm53"
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    return path


class Tensorfold:
    """One `python3 -m tensorfold.cli` process; its output goes to a file, never a pipe."""

    def __init__(self, tmp: Path, argv: list[str], env: dict | None = None, stub_dist: bool = False):
        self.record, self.call, self.log = tmp / "record.json", tmp / "dist-call.json", tmp / "out.log"
        self.argv = argv
        full_env = {**os.environ, "PYTHONPATH": str(site(tmp, stub_dist)),
                    "SANDBOX_TENSORFOLD_RECORD": str(self.record), "STUB_DIST_CALL": str(self.call),
                    **(env or {})}
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "tensorfold.cli", *argv], cwd=tmp,
                                         env=full_env, stdout=out, stderr=subprocess.STDOUT)

    @property
    def output(self) -> str:
        return self.log.read_text()

    def wait_log(self, text: str) -> None:
        deadline = time.monotonic() + 10
        while text not in self.output:
            assert time.monotonic() < deadline and self.proc.poll() is None, self.output
            time.sleep(0.05)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=10)


def run_once(tmp: Path, argv: list[str], **kw) -> tuple[int, str]:
    proc = Tensorfold(tmp, argv, **kw)
    return proc.proc.wait(timeout=20), proc.output


def serve_argv(model_dir: Path, port: int, rank: int = 0, *extra: str) -> list[str]:
    """The plan's per-rank command line (launcher/engines/tensorfold.py: TensorFold.managed), on loopback."""
    return ["serve", str(model_dir), "--tp", "4", "--rank", str(rank), "--master", "127.0.0.1",
            "--port", str(port), "--host", "127.0.0.1", "--name", "glm-5.3-tf",
            "--context", "32768", "--parallel", "4", *extra]


# ---------------------------------------------------------------- argv

def test_version(tmp_path):
    assert run_once(tmp_path, ["--version"]) == (0, "tensorfold 0.6.5\n")


@pytest.mark.parametrize("extra, message", [
    (["--foo"], "tensorfold: error: unrecognized arguments: --foo"),
    (["--tp", "3"], "argument --tp: invalid choice: 3 (choose from 1, 2, 4)"),
    (["--rank", "4"], "argument --rank: invalid choice: 4 (choose from 0, 1, 2, 3)"),
    (["--port", "eighty"], "argument --port: invalid int value: 'eighty'"),
    (["--kv-dtype", "fp8"], "argument --kv-dtype: invalid choice: 'fp8'"),
    (["--context"], "argument --context: expected one argument"),
])
def test_refuses_what_its_parser_refuses(tmp_path, extra, message):
    status, out = run_once(tmp_path, ["serve", str(model(tmp_path)), *extra])
    assert status == 2 and message in out, out
    assert not (tmp_path / "record.json").exists()


def test_an_empty_command_is_refused(tmp_path):
    """The old plan's TensorFold command was empty: the CLI needs one."""
    status, out = run_once(tmp_path, [])
    assert status == 2 and "the following arguments are required: command" in out


# ---------------------------------------------------------------- what `serve` refuses

REFUSALS = {
    "no such directory": ({}, ["serve", "/nonexistent/glm53"],
                          "tensorfold: /nonexistent/glm53 is neither a directory nor a Hugging Face repo id"),
    "a repo id, offline": ({}, ["serve", "zai-org/GLM-5.3"], "tensorfold: An error happened while trying"),
    "another family": ({"model_type": "qwen3"}, ["serve", "{model}"],
                       "tensorfold: TensorFold has no family for model_type 'qwen3' "
                       "(known: ['glm_moe_dsa'])"),
    "not EXL3": ({"quantization_config": None}, ["serve", "{model}"],
                 "tensorfold: GLM-5.3's CUDA engine reads EXL3 checkpoints (routed experts at any "
                 "width, other linears EXL3 or bf16); this checkpoint is unquantized."),
    "context past the window": ({}, ["serve", "{model}", "--context", "300000"],
                                "tensorfold: --context 300000 exceeds this model's 202752-token window"),
    "no master": ({}, ["serve", "{model}", "--tp", "4"],
                  "tensorfold: --tp 4 needs --master: rank 0's address on the link between the machines"),
    "rank past tp": ({}, ["serve", "{model}", "--tp", "2", "--rank", "3", "--master", "127.0.0.1"],
                     "tensorfold: --rank 3 needs --tp 4 or more (ranks are 0 to tp - 1)"),
    "tp 1": ({}, ["serve", "{model}"], "tensorfold: GLM-5.3 runs on CUDA with --tp 4, not 1"),
    "tp 2": ({}, ["serve", "{model}", "--tp", "2", "--master", "127.0.0.1"],
             "tensorfold: GLM-5.3 runs on CUDA with --tp 4, not 2"),
    "parallel not a number": ({}, ["serve", "{model}", "--tp", "4", "--master", "127.0.0.1",
                                   "--parallel", "many"], "--parallel takes a number or auto, not 'many'"),
    "experts from SSD": ({}, ["serve", "{model}", "--ssd-experts", "20"],
                         "tensorfold: --ssd-experts takes a positive GiB count for a family that streams "
                         "experts; GLM-5.3 does not"),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_refuses_what_serve_refuses(tmp_path, case):
    changes, argv, message = REFUSALS[case]
    path = str(model(tmp_path, **changes))
    status, out = run_once(tmp_path, [a.replace("{model}", path) for a in argv], stub_dist=True)
    assert status == 1 and message in out, out
    assert not (tmp_path / "dist-call.json").exists()  # refused before any connection
    assert json.loads((tmp_path / "record.json").read_text())["argv"][0] == "serve"


def test_an_unmounted_checkpoint_has_no_config(tmp_path):
    """`-v MODEL:MODEL:ro` dropped: the path exists in the image but holds nothing."""
    empty = tmp_path / "models" / "empty"
    empty.mkdir(parents=True)
    status, out = run_once(tmp_path, ["serve", str(empty), "--tp", "4", "--master", "127.0.0.1"])
    assert status == 1
    assert f"tensorfold: [Errno 2] No such file or directory: '{empty}/config.json'" in out


def test_a_cluster_that_does_not_form_stops_the_rank(tmp_path):
    message = "RuntimeError: NCCL error: remote process exited or there was a network error (rank 2 -> 0)"
    status, out = run_once(tmp_path, serve_argv(model(tmp_path), free_port(), 2), stub_dist=True,
                           env={"STUB_DIST_ANSWER": message})
    assert status == 1 and message in out, out


def test_the_placeholder_forms_a_single_rank_at_once():
    sys.path.insert(0, str(SANDBOX))
    try:
        import standin_dist
    finally:
        sys.path.remove(str(SANDBOX))
    assert standin_dist.form_cluster(node_rank=0, nnodes=1, master_addr="", master_port=29551, env={},
                                     timeout_s=1, stop=None, log=print) is None


# ---------------------------------------------------------------- serving

@pytest.fixture(scope="module")
def head(tmp_path_factory):
    """Rank 0 of four, the plan's command line, a decode rate the tests can wait for; the
    environment carries an NCCL pin and a vLLM API key (which TensorFold does not read)."""
    tmp = tmp_path_factory.mktemp("head")
    port = free_port()
    proc = Tensorfold(tmp, serve_argv(model(tmp), port), stub_dist=True,
                      env={"NCCL_SOCKET_IFNAME": "=enp1s0f1np1", "VLLM_API_KEY": "sk-unread",
                           "SANDBOX_VLLM_TOKENS_PER_S": "400", "SANDBOX_TENSORFOLD_WAIT_S": "30"})
    proc.port = port
    proc.wait_log("Uvicorn running")
    yield proc
    assert proc.stop() == 0, proc.output


def test_head_forms_the_cluster_then_serves(head):
    call = json.loads(head.call.read_text())
    assert {k: call[k] for k in ("node_rank", "nnodes", "master_addr", "master_port", "timeout_s")} == \
        {"node_rank": 0, "nnodes": 4, "master_addr": "127.0.0.1", "master_port": 29551, "timeout_s": 30}
    assert call["env"]["NCCL_SOCKET_IFNAME"] == "=enp1s0f1np1"
    out = head.output
    assert out.index("loading glm-5.3-tf: GLM-5.3 (glm_moe_dsa) on CUDA, rank 0 of 4") < out.index(
        f"serving glm-5.3-tf at http://127.0.0.1:{head.port}/v1")
    assert "SANDBOX STAND-IN, not TensorFold" in out


def test_head_record(head):
    record = json.loads(head.record.read_text())
    assert record["argv"] == head.argv and record["mode"] == "api" and record["pid"] == head.proc.pid
    o = record["options"]
    assert (o["tp"], o["rank"], o["master"], o["master_port"]) == (4, 0, "127.0.0.1", 29551)
    assert (o["context"], o["parallel"], o["name"]) == (32768, "4", "glm-5.3-tf")
    assert record["env"]["NCCL_SOCKET_IFNAME"] == "=enp1s0f1np1"


def test_head_api(head):
    assert http(head.port, "/health")[0] == 200
    status, body = http(head.port, "/v1/models")  # no key asked, VLLM_API_KEY notwithstanding
    assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == ["glm-5.3-tf"]
    _, events = stream(head.port, chat(6, model="glm-5.3-tf", stream_options={"include_usage": True}),
                       key=None)
    assert events[-1][1] == "[DONE]"
    usage = json.loads(events[-2][1])["usage"]
    assert usage["completion_tokens"] == 6 and usage["total_tokens"] == usage["prompt_tokens"] + 6
    text = http(head.port, "/metrics")[1].decode()
    drafts = metric(text, "vllm:spec_decode_num_drafts_total")
    assert drafts > 0 and metric(text, "vllm:spec_decode_num_draft_tokens_total") == 2 * drafts  # MTP k=2


def test_head_refuses_past_its_context(head):
    status, body = http(head.port, "/v1/chat/completions", chat(40000, model="glm-5.3-tf"))
    # the vLLM stand-in's HTTP engine, so vLLM 0.33's rule: more output than the context is refused
    assert status == 400 and "max_model_len=32768" in json.loads(body)["error"]["message"]


def test_a_follower_serves_nothing_until_stopped(tmp_path):
    port = free_port()
    proc = Tensorfold(tmp_path, serve_argv(model(tmp_path), port, 3), stub_dist=True)
    proc.wait_log("rank 3 ready in")
    assert "following rank 0" in proc.output
    with pytest.raises(OSError):
        http(port, "/health")
    assert json.loads(proc.record.read_text())["mode"] == "follower"
    assert json.loads(proc.call.read_text())["node_rank"] == 3
    assert proc.stop() == 0


# ---------------------------------------------------------------- the plan's command lines

def load_cli():
    sys.path.insert(0, str(SANDBOX))
    try:
        import standin_tensorfold
    finally:
        sys.path.remove(str(SANDBOX))
    return standin_tensorfold


def test_the_plans_argv_parses_and_passes_the_rank_checks():
    cli = load_cli()
    plan = json.loads(GOLDEN_PLAN.read_text())
    for r, rank in enumerate(plan["ranks"]):
        engine = rank["engine"]
        assert engine[:3] == ["python3", "-m", "tensorfold.cli"]  # templates/engine/tensorfold.j2
        args = cli.build_parser().parse_args(engine[3:])
        assert (args.command, args.model, args.tp, args.rank) == ("serve", "/models/keys-GLM-5.3-EXL3", 4, r)
        assert (args.master, args.port, args.host) == ("10.0.0.11", 8890, "0.0.0.0")
        assert (args.context, args.parallel) == (32768, "4")
        cli.check_ranks(args, "GLM-5.3", cli.FAMILIES["glm_moe_dsa"][1])
        assert cli.parallel(args.parallel) == 4


def test_the_image_carries_the_cli_beside_the_engine_it_imports():
    files = debian_image.standin_site_packages()
    assert files["tensorfold/cli.py"] == (SANDBOX / "standin_tensorfold.py").read_bytes()
    assert files["standin_vllm.py"] == (SANDBOX / "standin_vllm.py").read_bytes()
    assert files["standin_dist.py"] == (SANDBOX / "standin_dist.py").read_bytes()
    # vLLM's value parsers, the kit's own module, beside the stand-in that imports them
    assert files["vllm_options.py"] == (ROOT / "launcher" / "inputs" / "vllm_options.py").read_bytes()
    assert b"STAND-IN" in files["tensorfold/__init__.py"]
    assert "site-packages/tensorfold/cli.py" in debian_image.standin_stage().files


def test_a_change_to_the_value_parsers_rebuilds_the_standin_image(tmp_path, monkeypatch):
    """The stand-in image's tag is the hash of its files, the kit's vllm_options.py among them."""
    before = debian_image.standin_stage()
    assert before.files["site-packages/vllm_options.py"] == debian_image.value_parsers_file().read_bytes()
    changed = tmp_path / "vllm_options.py"
    changed.write_bytes(debian_image.value_parsers_file().read_bytes() + b"\n# changed\n")
    monkeypatch.setattr(debian_image, "value_parsers_file", lambda: changed)
    assert debian_image.standin_stage().tag != before.tag
