"""The sandbox refuses what vLLM 0.33's engine configuration refuses (issue 32): each test starts
the planned cluster with ONE thing as the kit used to plan it, and the stand-in stops it with
vLLM's own message (launcher/sandbox/standins/standin_engine_config.py); then the plan as the
kit makes it now serves."""

from __future__ import annotations

import dataclasses
import subprocess

import pytest

from launcher.apply import deploy, serve
from launcher.apply import preflight
from launcher.check.report import CheckFailed
from launcher.errors import PlanRefused
from launcher.inputs import vllm_flags
from launcher.gather import cluster as gather_cluster
from launcher.transport import api
from test_sandbox_refuses import loaded, ranks, start_expecting_failure, with_env  # noqa: F401 (module fixtures)

LONG = ("ValueError: User-specified max_model_len (1000000) is greater than the derived max_model_len "
        "(max_position_embeddings=202752.0 or model_max_length=None in model's config.json). To allow "
        "overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.")


@pytest.fixture(scope="module")
def planned(loaded, ranks):
    deploy.up(loaded, ranks, say=lambda _m: None)
    serve.stop(ranks)
    return deploy.preflight(loaded, ranks)


def with_engine(plan, change):
    """The plan with each rank's engine argv changed by change(argv) (a copy)."""
    return dataclasses.replace(plan, ranks=[dataclasses.replace(rp, engine=change(list(rp.engine)))
                                            for rp in plan.ranks])


def with_image(plan, image: str):
    return dataclasses.replace(plan, image=image, ranks=[
        dataclasses.replace(rp, docker_run=rp.docker_run[:-1] + [image]) for rp in plan.ranks])


def set_flag(flag: str, value: str):
    def change(argv):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
        return argv
    return change


def serves(loaded, ranks, plan) -> None:
    serve.start(plan, ranks, say=lambda _m: None)
    try:
        api.wait_ready(api.endpoint(loaded), 90, say=lambda _m: None, watch=lambda: serve.watch(ranks))
    finally:
        serve.stop(ranks)


def test_a_context_beyond_the_checkpoints_maximum(loaded, ranks, planned):
    """The 1M profiles' --max-model-len 1000000 as the kit planned it (no override) on a checkpoint
    whose config.json says max_position_embeddings 202752: vLLM refuses on every rank. With
    VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 it serves (and warns)."""
    old = with_engine(planned, set_flag("--max-model-len", "1000000"))
    text = start_expecting_failure(loaded, ranks, old)
    assert LONG in text, text
    serves(loaded, ranks, with_env(old, lambda _r, env: env.update(VLLM_ALLOW_LONG_MAX_MODEL_LEN="1")))


EXL3_FILE = "vllm/model_executor/layers/quantization/exl3.py"
DCP_FILE = "vllm/v1/attention/backends/mla/sm120_dcp.py"


@pytest.fixture(scope="module")
def lacking(loaded, ranks, sandbox):
    """make(name, files): the sandbox's serving image with `files` of its vllm package emptied (so
    they register nothing), on every rank; removed here and there afterwards."""
    made = []

    def make(name: str, files: tuple[str, ...]) -> str:
        tag = f"sparkstack-test/{name}:engineconf"
        work = f"sparkstack-test-{name}"
        subprocess.run(["docker", "rm", "-f", work], capture_output=True)
        empty = " && ".join(f"for d in /usr/lib/python3/dist-packages; do : > $d/{f}; done" for f in files)
        subprocess.run(["docker", "run", "--name", work, planned_image(loaded), "sh", "-c", empty],  # the entrypoint kept
                       check=True, capture_output=True)
        subprocess.run(["docker", "commit", work, tag], check=True, capture_output=True)
        subprocess.run(["docker", "rm", work], check=True, capture_output=True)
        made.append(tag)
        deploy._ensure_images(loaded, tag, ranks, deploy.UpReport(), lambda _m: None)
        return tag

    yield make
    for tag in made:
        ranks.each(lambda c, t=tag: c.run(f"docker rmi {t} >/dev/null 2>&1; true", timeout=60))
        subprocess.run(["docker", "rmi", tag], capture_output=True)


def planned_image(loaded) -> str:
    from launcher.images import build

    return build.serving_image(loaded)[0]


def test_an_image_without_the_exl3_method(loaded, ranks, planned, lacking):
    """The serving image with nothing registering EXL3 (stock vLLM's set of methods): the EXL3
    checkpoint is refused on start; check's engine config row asks the same in seconds."""
    stock = lacking("stock", (EXL3_FILE, DCP_FILE))
    text = start_expecting_failure(loaded, ranks, with_image(planned, stock))
    assert "ValueError: Unknown quantization method: exl3. Must be one of ['awq', 'auto_awq'," in text, text
    answer = preflight.ask_rank0(ranks, with_image(planned, stock))
    assert answer.ok is False and "Unknown quantization method: exl3" in answer.message, answer
    print(f"engine config row on an image without EXL3: FAIL in {answer.seconds:.2f} s")
    assert answer.seconds < 30
    fixed = preflight.ask_rank0(ranks, planned)  # the plan's own image: its chain registers it
    assert fixed.ok is True, fixed
    print(f"engine config row on the plan's image: PASS in {fixed.seconds:.2f} s ({fixed.message})")


def test_an_image_without_the_dcp_backend(loaded, ranks, planned, lacking):
    """EXL3 registered, the DCP sparse-MLA backend not (Mia's base without the dcp stage): every
    rank's attention layers find no backend for DCP 4 on a GB10."""
    no_dcp = lacking("nodcp", (DCP_FILE,))
    text = start_expecting_failure(loaded, ranks, with_image(planned, no_dcp))
    assert "ValueError: No valid attention backend found for cuda with AttentionSelectorConfig(head_size=576" in text
    assert "Reasons: {TRITON_MLA: [sparse not supported], FLASHINFER_MLA_SPARSE_SM120: [DCP not supported]}." in text
    # the kit now refuses a profile whose image lacks it before anything starts, naming the stage
    spec = loaded.profile.image.model_copy(update={"chain": [], "brings": ["quantization:exl3"]})
    bare = loaded.model_copy(update={"profile": loaded.profile.model_copy(update={"image": spec})})
    _none, refused = deploy._plan(bare, gather_cluster.gather(bare, ranks))
    assert isinstance(refused, PlanRefused), refused
    assert "lacks attention:sparse-mla-dcp" in refused.message
    assert "the stage dcp brings it: add it to image.chain" in refused.message


def test_a_custom_attention_backend_nothing_registers(loaded, ranks, planned):
    old = with_engine(planned, set_flag("--attention-backend", "CUSTOM"))
    text = start_expecting_failure(loaded, ranks, old)
    assert "ValueError: Backend CUSTOM must be registered before use." in text, text


def test_the_engine_config_row_on_the_sandbox(loaded, ranks, planned, sandbox):
    """`check` asks the serving image (the chain's top) about the plan: PASS, in seconds; the
    kit's old 1M argv (no override) in the same image: FAIL with vLLM's message and the fix."""
    answer = preflight.ask_rank0(ranks, planned)
    assert answer.ok is True, answer
    print(f"engine config row, the sandbox plan: PASS in {answer.seconds:.2f} s ({answer.message})")
    old = preflight.ask_rank0(ranks, with_engine(planned, set_flag("--max-model-len", "1000000")))
    assert old.ok is False and LONG in old.message, old
    print(f"engine config row, --max-model-len 1000000 without the override: FAIL in {old.seconds:.2f} s")
    report = preflight.run(loaded)
    found = next(c for c in report.ranks[0].checks if c.name == "engine config")
    assert found.status == "pass" and "takes the planned argv" in found.value, found
    assert all("engine config" not in [c.name for c in r.checks] for r in report.ranks[1:])
    # asked again with the same image, argv, env and config.json: the yes is given back, not asked
    again = next(c for c in preflight.run(loaded).ranks[0].checks if c.name == "engine config")
    assert again.status == "pass" and "remembered from" in again.value, again


def test_up_stops_on_the_engines_refusal_before_starting(loaded, ranks, planned):
    """What only the engine knows: --quantization fp8 (cluster.yaml overrides.engine_args) against
    the checkpoint's exl3. The plan takes it; `up` asks the image after shipping and stops with
    vLLM's message, nothing started."""
    flags = loaded.flags + vllm_flags.parse(["--quantization", "fp8"], frozenset(), vllm_flags.CONFIG)
    wrong = loaded.model_copy(update={"flags": flags})
    with pytest.raises(CheckFailed) as failed:
        deploy.up(wrong, ranks, say=lambda _m: None, restart=True)
    text = failed.value.message
    assert "engine config: the image's engine refuses the planned argv: ValueError: Quantization method " \
           "specified in the model config (exl3) does not match the quantization method specified in the " \
           "`quantization` argument (fp8)." in text, text
    assert {s.state for s in serve.states(ranks)} == {"absent"}
