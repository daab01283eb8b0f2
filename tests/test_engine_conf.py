"""The plan decides what vLLM 0.33's engine configuration will say (issue 32,
launcher/plan/engine_conf.py): the checkpoint's own maximum length and the override a profile
asks for with its evidence, and the image capabilities the flags need."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from launcher.cli.commands import main
from launcher.errors import PlanRefused
from launcher.facts.checkpoint import ModelLimits, read_limits
from launcher.images import chain
from launcher.inputs import config
from launcher.inputs.profile import ImageSpec
from launcher.plan import engine_conf
from test_checkpoint import checkpoint  # noqa: F401  (a small real checkpoint fixture)


def plan(path, *extra):
    return CliRunner().invoke(main, ["plan", "-c", str(path), "--offline", *extra])


@pytest.mark.parametrize("profile", ["keys-1m-dcp4", "keys35-1m-dcp4"])
def test_the_1m_profiles_plan_the_override_and_say_why(write_config, profile):
    result = plan(write_config(lambda d: d.update(profile=profile)), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert all(r["env"]["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] == "1" for r in data["ranks"])
    note = next(n for n in data["notes"] if "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 is set" in n)
    assert "--max-model-len 1000000 is above the checkpoint's own maximum (max_position_embeddings 202752" in note
    assert ("979K" if profile == "keys-1m-dcp4" else "905K") in note
    assert any(a.startswith(f"model limits: profile {profile}'s figures (max_position_embeddings 202752")
               for a in data["assumed"])


def test_a_context_within_the_models_maximum_sets_nothing(write_config):
    data = json.loads(plan(write_config(lambda d: d.update(profile="keys35-200k")), "--json").output)
    assert all("VLLM_ALLOW_LONG_MAX_MODEL_LEN" not in r["env"] for r in data["ranks"])


def short_checkpoint(src, dst, **config):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(config)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_a_longer_context_nobody_asked_for_is_refused_with_both_figures(write_config, checkpoint, tmp_path):  # noqa: F811
    model = short_checkpoint(checkpoint, tmp_path / "short", max_position_embeddings=131072,
                             quantization_config={"quant_method": "exl3"})
    result = plan(write_config(lambda d: d.update(profile="keys35-200k") or d["model"].update(path=str(model))))
    assert result.exit_code == 3, result.output
    assert ("profile keys35-200k: --max-model-len 200000 is above the checkpoint's own maximum "
            "(max_position_embeddings 131072 in config.json)") in result.output
    assert "Lower --max-model-len to 131072 or less" in result.output
    # the override written in cluster.yaml is taken, and said
    path = write_config(lambda d: d.update(profile="keys35-200k") or d["model"].update(path=str(model))
                        or d["overrides"].setdefault("env", {}).update(VLLM_ALLOW_LONG_MAX_MODEL_LEN="1"))
    result = plan(path)
    assert result.exit_code == 0 and "overrides.env sets VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in result.output


def test_limits_come_from_config_json_and_a_quantization_config_json_is_ignored(checkpoint, tmp_path):  # noqa: F811
    model = short_checkpoint(checkpoint, tmp_path / "m", max_position_embeddings=202752, n_positions=4096)
    (model / "quantization_config.json").write_text('{"quant_method": "exl3", "bits": 3.0}')
    limits = read_limits(model)
    assert (limits.max_len, limits.max_len_key) == (4096, "n_positions")  # vLLM takes the smallest key
    assert limits.quant_method is None and limits.ignored_quant == "exl3"
    assert engine_conf.quant_notes(limits)[0].startswith("the checkpoint's quantization (exl3) is written "
                                                         "only in quantization_config.json")
    both = ModelLimits.from_config({"quantization_config": {"quant_method": "exl3"}}, {"quant_method": "exl3"})
    assert both.quant_method == "exl3" and both.ignored_quant is None


def loaded_with(write_config, profile, **image):
    loaded = config.load(write_config(lambda d: d.update(profile=profile)))
    spec = loaded.profile.image.model_dump()
    spec.update(image)
    return loaded.model_copy(update={"profile": loaded.profile.model_copy(update={"image": ImageSpec(**spec)})})


GLM = ModelLimits(202752, "max_position_embeddings", "exl3", "config.json", sparse=True)


def test_every_vllm_profile_has_what_its_flags_need(write_config):
    for profile in ("keys-1m-dcp4", "keys35-200k", "keys35-1m-dcp4", "pollard-180k", "sandbox"):
        loaded = loaded_with(write_config, profile)
        assert engine_conf.missing(loaded, GLM, chain.image_caps(loaded)) == [], profile


def test_an_image_without_a_stage_is_refused_naming_the_stage(write_config):
    loaded = loaded_with(write_config, "keys-1m-dcp4", chain=[])  # Mia's base alone: EXL3, no DCP backend
    lines = engine_conf.missing(loaded, GLM, chain.image_caps(loaded))
    assert lines == ["the serving image lacks attention:sparse-mla-dcp (--decode-context-parallel-size 4 with "
                     "sparse MLA on a GB10 (compute capability 12.1): stock vLLM 0.33 has no such backend); the "
                     "stage dcp brings it: add it to image.chain"]
    with pytest.raises(PlanRefused, match="profile keys-1m-dcp4 cannot start on its serving image"):
        engine_conf.refuse_missing(loaded, GLM, chain.image_caps(loaded))
    stock = loaded_with(write_config, "keys-1m-dcp4", chain=["dcp"], brings=[])  # a stock vLLM base
    lines = engine_conf.missing(stock, GLM, chain.image_caps(stock))
    assert len(lines) == 1 and "lacks quantization:exl3" in lines[0] and "the stage mul1 brings it" in lines[0]


def test_an_image_that_does_not_say_what_it_brings_is_not_judged_but_said(write_config):
    loaded = loaded_with(write_config, "pollard-180k", brings=None)
    caps = chain.image_caps(loaded)
    assert engine_conf.missing(loaded, GLM, caps) == []
    note = engine_conf.undeclared_notes(loaded, GLM, caps)[0]
    assert "does not say what its image brings (image.brings)" in note and "attention:CUSTOM" in note


def test_a_prebuilt_image_that_does_not_say_it_brings_the_custom_backend(write_config):
    loaded = loaded_with(write_config, "pollard-180k", brings=["quantization:exl3"])
    lines = engine_conf.missing(loaded, GLM, chain.image_caps(loaded))
    assert lines == ["the serving image lacks attention:CUSTOM (--attention-backend CUSTOM needs a plugin that "
                     "registers it); use an image that registers it (and say so in image.brings)"]


def test_a_stock_quantization_needs_nothing(write_config):
    loaded = loaded_with(write_config, "keys35-200k", brings=[])
    fp8 = ModelLimits(202752, "max_position_embeddings", "fp8", "config.json", sparse=True)
    profile = loaded.profile.model_copy(update={"needs": []})
    assert engine_conf.missing(loaded.model_copy(update={"profile": profile}), fp8, chain.image_caps(loaded)) == []


def test_a_capability_name_is_checked(write_config):
    with pytest.raises(ValueError, match="is not an image capability"):
        ImageSpec(prebuilt="x", brings=["attention:dcp"])


# ----------------------------------------------- check's engine config row (part C)

from launcher.check import report as check_report  # noqa: E402
from launcher.gather import engine_config  # noqa: E402
from launcher.gather.engine_config import EngineAnswer  # noqa: E402
from test_check import fabric_facts, inputs, row, sandbox_config  # noqa: E402,F401


def test_the_question_is_rank_0s_container_without_network_running_the_script():
    docker_run = ["docker", "run", "-d", "--name", "sparkstack-engine", "--network", "host", "--ipc", "host",
                  "--gpus", "all", "-v", "/models/m:/models/m:ro", "--label", "org.sparkstack.rank=0",
                  "--env-file", "/dev/stdin", "sparkstack/keys:abc"]
    line = engine_config.command(docker_run, ["vllm", "serve", "/models/m", "--max-model-len", "1000000"])
    import shlex
    argv = shlex.split(line)
    assert argv[:5] == ["docker", "run", "--rm", "--network", "none"]
    assert "-d" not in argv and "--name" not in argv and "--label" not in argv and "host" not in argv
    assert argv[argv.index("--gpus") + 1] == "all" and "/models/m:/models/m:ro" in argv
    assert argv[argv.index("--entrypoint") + 1:][:3] == ["python3", "sparkstack/keys:abc", "-c"]
    assert json.loads(argv[-1]) == {"argv": ["/models/m", "--max-model-len", "1000000"]}
    ray_head = ["sh", "-c", "ray start --head --port=6379 && exec vllm serve /m --distributed-executor-backend ray"]
    assert engine_config.serve_argv(ray_head) == ["/m", "--distributed-executor-backend", "ray"]
    assert engine_config.command(docker_run, ["ray", "start", "--block"]) is None


LONG_MSG = ("ValueError: User-specified max_model_len (1000000) is greater than the derived max_model_len "
            "(max_position_embeddings=202752.0 or model_max_length=None in model's config.json). To allow "
            "overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.")


def engine_row(loaded, facts, **kw):
    return row(check_report.evaluate(inputs(loaded, facts, **kw)), 0, "engine config")


def test_the_row_fails_with_the_engines_message_and_the_fix(sandbox_config, fabric_facts):  # noqa: F811
    found = engine_row(sandbox_config, fabric_facts,
                       engine_answer=EngineAnswer(False, LONG_MSG, 1.4, "sparkstack/keys:abc"))
    assert found.status == "fail" and LONG_MSG in found.value and "1.4 s in sparkstack/keys:abc" in found.value
    assert "long_context" in found.fix
    ok = engine_row(sandbox_config, fabric_facts, engine_answer=EngineAnswer(True, "max_model_len=65536", 0.9, "i"))
    assert ok.status == "pass" and "takes the planned argv" in ok.value
    unasked = engine_row(sandbox_config, fabric_facts, engine_unasked="i is not on rank 0 yet")
    assert unasked.status == "warn"
    report = check_report.evaluate(inputs(sandbox_config, fabric_facts))  # not asked by this caller: no row
    assert "engine config" not in [c.name for c in report.ranks[0].checks]
    assert all("engine config" not in [c.name for c in r.checks] for r in report.ranks[1:])


def test_the_row_refuses_a_quantization_config_json_the_engine_would_ignore(sandbox_config, fabric_facts, tmp_path):  # noqa: F811
    from launcher.gather.value import ModelFacts

    gathered = inputs(sandbox_config, fabric_facts)
    limits = ModelLimits(202752, "max_position_embeddings", None, None, "exl3", True)
    gathered.model = ModelFacts(gathered.model.shape, gathered.model.weights, gathered.model.assumed, limits)
    gathered.engine_answer = EngineAnswer(True, "quantization=None", 0.5, "i")  # the engine says nothing
    found = row(check_report.evaluate(gathered), 0, "engine config")
    assert found.status == "fail" and "only in quantization_config.json" in found.value
    assert "unquantized" in found.value and "config.json" in found.fix


def test_a_fusion_pass_under_breakable_cuda_graphs_gets_a_note(write_config):
    data = json.loads(plan(write_config(lambda d: d.update(profile="keys35-200k")), "--json").output)
    note = next(n for n in data["notes"] if "fuse_allreduce_rms" in n)
    assert note.startswith("--compilation-config.pass_config.fuse_allreduce_rms=true has no effect on vLLM 0.33 "
                           "for GlmMoeDsaForCausalLM")
    # opting out of breakable graphs (the variable set) makes the pass run: no note
    path = write_config(lambda d: d.update(profile="keys35-200k")
                        or d["overrides"].setdefault("env", {}).update(VLLM_USE_BREAKABLE_CUDAGRAPH="0"))
    assert not any("fuse_allreduce_rms" in n for n in json.loads(plan(path, "--json").output)["notes"])


def test_heads_tensor_parallelism_does_not_divide_are_refused_in_the_plan(write_config):
    """vLLM 0.33 refuses TP4 on a checkpoint with 2 attention heads (seen running it: "Total number
    of attention heads (2) must be divisible by tensor parallel size (4)."); the plan says so first."""
    loaded = loaded_with(write_config, "keys-1m-dcp4")
    two = ModelLimits.from_config({"num_attention_heads": 2, "max_position_embeddings": 202752})
    assert two.attention_heads == 2
    with pytest.raises(PlanRefused) as e:
        engine_conf.refuse_heads(loaded, two, 4)
    assert ("Total number of attention heads (2) must be divisible by tensor parallel size (4)." in str(e.value)
            and "profile keys-1m-dcp4" in str(e.value))
    engine_conf.refuse_heads(loaded, ModelLimits.from_config({"num_attention_heads": 64}), 4)  # GLM-5: 64
    engine_conf.refuse_heads(loaded, GLM, 4)  # heads not known: not judged
    engine_conf.refuse_heads(loaded, two, 1)


def test_only_a_yes_is_remembered_and_only_for_the_same_question(tmp_path):
    """check gives back the image's yes to the very same question (image ID, argv, env, config.json)
    instead of a `docker run` on rank 0; a no is asked afresh every time."""
    from launcher.gather import engine_config as ec

    key = ec.question_key(["docker", "run", "img"], ["vllm", "serve", "m"], b"A=1\n", "sha256:1", "c0")
    assert key != ec.question_key(["docker", "run", "img"], ["vllm", "serve", "m"], b"A=1\n", "sha256:2", "c0")
    assert key != ec.question_key(["docker", "run", "img"], ["vllm", "serve", "m"], b"A=2\n", "sha256:1", "c0")
    assert key != ec.question_key(["docker", "run", "img"], ["vllm", "serve", "m"], b"A=1\n", "sha256:1", "c1")
    ec.remember(tmp_path, key, ec.EngineAnswer(False, "ValueError: no", 0.6, "img"))
    assert ec.remembered(tmp_path, key) is None
    ec.remember(tmp_path, key, ec.EngineAnswer(True, "max_model_len=65536", 0.6, "img"))
    back = ec.remembered(tmp_path, key)
    assert back.ok and back.message == "max_model_len=65536" and back.asked_at.endswith("UTC")
    (tmp_path / f"{key}.json").write_text("{not json")
    assert ec.remembered(tmp_path, key) is None
