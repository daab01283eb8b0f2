"""The engine config row (rank 0 only): does the serving image's own engine take the planned
argv with the checkpoint's config (launcher/gather/engine_config.py asks it: on real Sparks vLLM
0.33's parser, create_engine_config and the attention backend's choice; in the sandbox the
stand-in's same checks)? And what the engine would take without a word but the kit knows is
wrong: a quantization method written only in a quantization_config.json, which vLLM never
reads (the model would be configured unquantized).
"""

from __future__ import annotations

from ...facts.record import Facts
from ...status import Status
from . import row
from .case import Case, RankReport

NAME = "engine config"


def fix_for(message: str) -> str:
    """The fix for the engine's refusal, by its words (vLLM 0.33's messages)."""
    if "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in message:
        return ("lower --max-model-len to the checkpoint's maximum, or say in the profile that the longer "
                "context is wanted (long_context: {evidence: ...}): the plan then sets VLLM_ALLOW_LONG_MAX_MODEL_LEN=1")
    if "Unknown quantization method" in message:
        return ("serve from an image that registers the checkpoint's method (a chain stage that brings "
                "quantization:<method>, e.g. mul1 for exl3), and name it in the profile's needs")
    if "No valid attention backend" in message:
        return "add the dcp stage to image.chain (it brings attention:sparse-mla-dcp), or drop --decode-context-parallel-size"
    if "must be registered before use" in message:
        return "serve from an image whose plugin registers the CUSTOM attention backend (image.brings: [attention:CUSTOM])"
    if "Failed to import Ray" in message:
        return "use an image with Ray installed, or multinode: native"
    return "fix the profile's flags (or overrides.engine_args) or the image, then `sparkstack check` again"


@row(NAME, order=35, reads=("engine", "model"), sometimes=True)  # where it was asked: check, up
def _check_engine_config(inp: Case, r: int, f: Facts, rr: RankReport) -> None:
    if r != 0:
        return
    model = inp.gathered.model
    limits = model.limits if model else None
    if limits is not None and limits.ignored_quant:
        rr.add(NAME, Status.FAIL,
               f"the checkpoint's quantization ({limits.ignored_quant}) is only in quantization_config.json, "
               "which vLLM 0.33 never reads: it would configure the model as unquantized",
               "put it in config.json as its quantization_config object (as the checkpoint's converter writes it)")
        return
    answer = inp.gathered.engine_answer
    if answer is None:
        if inp.gathered.engine_unasked:  # asked for (check), but not askable yet
            rr.add(NAME, Status.WARN, "not asked: " + inp.gathered.engine_unasked,
                   "`sparkstack check` again once the plan is made and the image is on rank 0")
        return  # not this caller's question (`up` asks once the image is shipped)
    if answer.ok is None:
        rr.add(NAME, Status.WARN, f"not asked: {answer.error}", "fix the image row first")
        return
    took = f"{answer.seconds:.1f} s in {answer.image}" + (
        f"; remembered from {answer.asked_at}: the same image, argv, env and config.json" if answer.asked_at else "")
    if answer.ok:
        rr.add(NAME, Status.PASS, f"the image's engine takes the planned argv ({answer.message}; {took})")
    else:
        rr.add(NAME, Status.FAIL, f"the image's engine refuses the planned argv: {answer.message} ({took})",
               fix_for(answer.message))
