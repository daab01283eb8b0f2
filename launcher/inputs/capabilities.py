"""What a serving image must register for a profile's argv to get past vLLM's engine
configuration (docs/architecture.md; ../shared/DESIGN.md, "What vLLM itself checks before it loads
anything"). A stock vLLM 0.33 refuses, before loading anything:

- `quantization:<method>`: a checkpoint whose config.json says `quant_method: <method>` that stock
  vLLM does not know ("Unknown quantization method: exl3. Must be one of [...]");
- `attention:sparse-mla-dcp`: a sparse-MLA model (GLM-5's DSA indexer) with
  --decode-context-parallel-size > 1 on compute capability 12.x (a GB10): "No valid attention
  backend found ... {TRITON_MLA: [sparse not supported], FLASHINFER_MLA_SPARSE_SM120: [DCP not
  supported]}";
- `attention:CUSTOM`: --attention-backend CUSTOM ("Backend CUSTOM must be registered before use").

(Ray for `multinode: ray` is the Ray engine's own ImageNeed: launcher/engines/vllm_ray.py.)

A profile names what its flags need (`needs:`), its base or prebuilt image what it brings
(`image.brings`), each chain stage what it brings (images/<stage>/stage.yaml `brings`). The plan
also derives the needs from the flags and the checkpoint (`derived`), so a profile that forgets
one is refused all the same. Stdlib only, pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# vLLM 0.33.0's QuantizationMethods (vllm/model_executor/layers/quantization/__init__.py)
STOCK_QUANTIZATION = frozenset((
    "awq", "auto_awq", "fp8", "fbgemm_fp8", "fp_quant", "modelopt", "modelopt_fp4",
    "modelopt_mxfp8", "modelopt_mixed", "auto_gptq", "gptq", "gptq_marlin", "awq_marlin",
    "humming", "compressed-tensors", "experts_int8", "quark", "moe_wna16", "torchao", "inc",
    "mxfp4", "gpt_oss_mxfp4", "deepseek_v4_fp8", "online", "fp8_per_tensor", "fp8_per_block",
    "fp8_per_channel", "int8_per_channel_weight_only", "nvfp4_per_token", "mxfp8"))
DCP_BACKEND = "attention:sparse-mla-dcp"
CUSTOM_BACKEND = "attention:CUSTOM"
NAME = re.compile(r"^(quantization:[a-z0-9_.-]+|attention:sparse-mla-dcp|attention:CUSTOM)$")


def check_name(value: str) -> str:
    if not NAME.match(value):
        raise ValueError(f"{value!r} is not an image capability (quantization:<method>, "
                         f"{DCP_BACKEND}, {CUSTOM_BACKEND})")
    return value


@dataclass(frozen=True)
class ImageCaps:
    """What the serving image brings, by source (`image.brings` of the profile: the base or the
    prebuilt image; then each chain stage), and what every defined stage would bring."""

    brings: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (source, capabilities), base first
    catalog: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (stage, capabilities) of images/
    declared: bool = True  # False: the profile's image.brings is absent, nothing can be judged

    def has(self, capability: str) -> bool:
        return any(capability in caps for _, caps in self.brings)

    def brought_by(self, capability: str) -> list[str]:
        return [stage for stage, caps in self.catalog if capability in caps]


def derived(quant_method: str | None, sparse: bool, dcp: int, attention_backend: str | None,
            ) -> list[tuple[str, str]]:
    """(capability, why) the flags and the checkpoint need from the image."""
    out = []
    if quant_method and quant_method not in STOCK_QUANTIZATION:
        out.append((f"quantization:{quant_method}",
                    f"the checkpoint's config.json says quant_method {quant_method}, which stock vLLM "
                    "0.33 does not register"))
    if sparse and dcp > 1 and attention_backend is None:
        out.append((DCP_BACKEND, f"--decode-context-parallel-size {dcp} with sparse MLA on a GB10 "
                                 "(compute capability 12.1): stock vLLM 0.33 has no such backend"))
    if attention_backend == "CUSTOM":
        out.append((CUSTOM_BACKEND, "--attention-backend CUSTOM needs a plugin that registers it"))
    return out
