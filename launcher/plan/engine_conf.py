"""What vLLM 0.33's engine configuration will say of the planned argv, decided in the plan (issue
32; ../shared/DESIGN.md, "What vLLM itself checks before it loads anything"):

- the context: a --max-model-len above the checkpoint's own maximum (config.json
  max_position_embeddings) is refused by vLLM unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. A profile
  that wants it says so with its evidence (`long_context:`): the plan sets the variable on every
  rank and says why in its notes; otherwise the plan refuses (exit 3) with both figures;
- the image: every capability the profile names (`needs:`) or its flags and the checkpoint need
  (launcher/inputs/capabilities.derived) must be brought by the serving image (its base or
  prebuilt image's `image.brings`, its chain stages' `brings`); the plan refuses one that is
  missing, naming the stage that brings it.

Pure: the checkpoint's limits and the image's capabilities come in the Gathered value.
"""

from __future__ import annotations

from ..errors import PlanRefused
from ..facts.checkpoint import ModelLimits
from ..inputs import capabilities, vllm_flags
from ..inputs.capabilities import ImageCaps
from ..inputs.config import Loaded

LONG_ENV = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"


def long_context(loaded: Loaded, limits: ModelLimits | None) -> tuple[dict[str, str], list[str]]:
    """(env every rank gets, notes): the override when the profile asks for a longer context;
    PlanRefused when it is above the model's maximum and nobody said it is wanted."""
    wanted = vllm_flags.converted(loaded.flags, "max_model_len")
    if not loaded.engine.startup_guard or limits is None or limits.max_len is None:
        return {}, []  # not vLLM, or a model whose maximum is not known here
    if not isinstance(wanted, int) or wanted <= 0 or wanted <= limits.max_len:
        return {}, []
    name = loaded.profile.name
    figures = (f"--max-model-len {wanted} is above the checkpoint's own maximum "
               f"({limits.max_len_key} {limits.max_len} in config.json)")
    given = loaded.cluster.overrides.env.get(LONG_ENV)
    if given is not None and given.strip().lower() in ("1", "true"):
        return {}, [f"{figures}: cluster.yaml overrides.env sets {LONG_ENV}={given}, so vLLM takes it"]
    if loaded.profile.long_context is None:
        raise PlanRefused(
            f"profile {name}: {figures}; vLLM 0.33 refuses it (\"User-specified max_model_len ({wanted}) is "
            f"greater than the derived max_model_len ...\") unless {LONG_ENV}=1. Lower --max-model-len to "
            f"{limits.max_len} or less, or say in the profile that the longer context is wanted, with its "
            f"evidence (long_context: {{evidence: ...}}); the plan then sets {LONG_ENV}=1")
    return ({LONG_ENV: "1"},
            [f"{figures}: {LONG_ENV}=1 is set on every rank because profile {name} wants the longer "
             f"context ({loaded.profile.long_context.evidence}); vLLM logs its caution (RoPE positions "
             f"beyond {limits.max_len} can give nan) and starts"])


def refuse_heads(loaded: Loaded, limits: ModelLimits | None, tp: int) -> None:
    """vLLM splits the attention heads across the tensor-parallel ranks and refuses a count they
    do not divide (ModelConfig.verify_with_parallel_config), before loading a byte."""
    heads = limits.attention_heads if limits else None
    if not loaded.engine.startup_guard or not heads or tp <= 1 or heads % tp == 0:
        return
    raise PlanRefused(
        f"profile {loaded.profile.name}: the checkpoint has {heads} attention heads (config.json "
        f"num_attention_heads) and tensor parallelism is {tp}; vLLM 0.33 refuses it (\"Total number of "
        f"attention heads ({heads}) must be divisible by tensor parallel size ({tp}).\"). Serve a checkpoint "
        f"whose head count {tp} divides, or a tensor-parallel size that divides {heads}")


def needs(loaded: Loaded, limits: ModelLimits | None) -> list[tuple[str, str]]:
    """(capability, why) the serving image must bring: the profile's own list, and what the
    flags and the checkpoint need (capabilities.derived)."""
    flags = loaded.flags
    dcp = vllm_flags.converted(flags, "decode_context_parallel_size")
    backend = vllm_flags.converted(flags, "attention_backend")
    quant = vllm_flags.converted(flags, "quantization") or (limits.quant_method if limits else None)
    sparse = limits.sparse if limits else loaded.profile.defaults.model_shape.index_head_dim > 0
    out = {c: f"profile {loaded.profile.name} names it in `needs`" for c in loaded.profile.needs}
    for capability, why in capabilities.derived(quant, sparse, int(dcp or 1), backend):
        out[capability] = why
    return sorted(out.items())


def missing(loaded: Loaded, limits: ModelLimits | None, caps: ImageCaps | None) -> list[str]:
    """One line per capability the serving image lacks (empty: none, or the image is not known)."""
    if caps is None or not caps.declared or not loaded.engine.startup_guard:
        return []
    lines = []
    for capability, why in needs(loaded, limits):
        if caps.has(capability):
            continue
        stages = caps.brought_by(capability)
        fix = (f"the stage {' or '.join(stages)} brings it: add it to image.chain" if stages and not
               loaded.profile.image.prebuilt else
               "use an image that registers it (and say so in image.brings)")
        lines.append(f"the serving image lacks {capability} ({why}); {fix}")
    return lines


def refuse_missing(loaded: Loaded, limits: ModelLimits | None, caps: ImageCaps | None) -> None:
    lines = missing(loaded, limits, caps)
    if lines:
        raise PlanRefused(f"profile {loaded.profile.name} cannot start on its serving image: "
                          + "; ".join(lines))


def undeclared_notes(loaded: Loaded, limits: ModelLimits | None, caps: ImageCaps | None) -> list[str]:
    """What the plan could not judge: an image whose profile does not say what it brings."""
    if caps is None or caps.declared or not loaded.engine.startup_guard:
        return []
    wanted = [c for c, _ in needs(loaded, limits)]
    if not wanted:
        return []
    return [f"profile {loaded.profile.name} does not say what its image brings (image.brings): the plan "
            f"cannot tell whether it registers {', '.join(wanted)}; `check`'s engine config row asks the image"]


def quant_notes(limits: ModelLimits | None) -> list[str]:
    """What the plan says of a method vLLM would not see (check's engine row refuses it)."""
    if limits is None or limits.ignored_quant is None:
        return []
    return [f"the checkpoint's quantization ({limits.ignored_quant}) is written only in "
            "quantization_config.json, which vLLM 0.33 does not read: it would configure the model "
            "as unquantized (`check` refuses it: put it in config.json's quantization_config)"]


# vLLM 0.33.0's config/vllm.py DEFAULT_BREAKABLE_CUDAGRAPH_ARCHITECTURES (the GLM-5 family among
# them): for these, _maybe_enable_breakable_cudagraph sets VLLM_USE_BREAKABLE_CUDAGRAPH=1 unless the
# variable is set, which sets the compilation mode to NONE: no Inductor pass runs.
BREAKABLE_CUDAGRAPH_ARCHITECTURES = frozenset((
    "DeepseekV32ForCausalLM", "DeepseekV4ForCausalLM", "DeepseekV41ForCausalLM", "Glm5NextForCausalLM",
    "Glm5NextForConditionalGeneration", "GlmMoeDsaForCausalLM", "KimiLinearForCausalLM"))


def no_effect_notes(loaded: Loaded, limits: ModelLimits | None, env: dict[str, str]) -> list[str]:
    """Flags known to have no effect on vLLM 0.33 for this model (issue 32): compile-time fusion
    passes under the breakable CUDA graphs vLLM turns on by itself for the architecture."""
    if limits is None or not loaded.engine.startup_guard:
        return []
    arch = next((a for a in limits.architectures if a in BREAKABLE_CUDAGRAPH_ARCHITECTURES), None)
    if arch is None or env.get("VLLM_USE_BREAKABLE_CUDAGRAPH", "") != "":
        return []
    passes = [f for f in loaded.flags if f.key.startswith("compilation_config.pass_config.")
              and "fuse" in f.key and (f.values or ("true",))[0].lower() in ("true", "1")]
    return [f"{f.name}={(f.values or ['true'])[0]} has no effect on vLLM 0.33 for {arch}: vLLM turns on "
            "breakable CUDA graphs for this architecture (VLLM_USE_BREAKABLE_CUDAGRAPH=1), which sets the "
            "compilation mode to NONE, so no fusion pass runs (vLLM still logs the pass as enabled)"
            for f in passes]


# vLLM 0.33.0's warnings for speculative decoding, verbatim (config/vllm.py
# _set_max_num_scheduled_tokens, config/speculative.py), as it logs them for the kit's MTP argv
# (scripts/check_engine_config_with_vllm.py; tests/fixtures/vllm033_engine_config). On a GB10
# (compute capability 12.1) `vllm serve` defaults --max-num-batched-tokens to 2048
# (EngineArgs.get_batch_defaults), and max_num_scheduled_tokens to that.
GB10_BATCHED_TOKENS = 2048
SCHEDULED_TOKENS_ENOUGH = 8192
SCHEDULED_WARNING = ("max_num_scheduled_tokens is set to {n} based on the speculative decoding settings. "
                     "This may lead to suboptimal performance. Consider increasing max_num_batched_tokens to "
                     "accommodate the additional draft token slots, or decrease num_speculative_tokens.")
SAME_MTP_WARNING = ("Enabling num_speculative_tokens > 1 will run multiple times of forward on same MTP "
                    "layer,which may result in lower acceptance rate")


def speculative_notes(loaded: Loaded) -> list[str]:
    """What vLLM 0.33 warns at every start for the profile's speculative decoding, said in the
    plan so the log's warnings are expected ones (issue 32)."""
    if not loaded.engine.startup_guard:
        return []
    spec = vllm_flags.converted(loaded.flags, "speculative_config")
    if not isinstance(spec, dict):
        return []
    notes = []
    given = vllm_flags.converted(loaded.flags, "max_num_batched_tokens")
    tokens = given if isinstance(given, int) else GB10_BATCHED_TOKENS
    if tokens < SCHEDULED_TOKENS_ENOUGH:
        source = (f"--max-num-batched-tokens {tokens}" if isinstance(given, int) else
                  f"vLLM's default --max-num-batched-tokens on a GB10, {tokens}")
        notes.append(f"vLLM 0.33 warns at start (expected: {source}, below {SCHEDULED_TOKENS_ENOUGH}, with "
                     f"speculative decoding): \"{SCHEDULED_WARNING.format(n=tokens)}\"")
    drafts = spec.get("num_speculative_tokens")
    if spec.get("method") == "mtp" and isinstance(drafts, int) and drafts > 1:
        notes.append(f"vLLM 0.33 warns at start (expected: num_speculative_tokens {drafts} with the "
                     f"checkpoint's MTP layer): \"{SAME_MTP_WARNING}\"")
    return notes
