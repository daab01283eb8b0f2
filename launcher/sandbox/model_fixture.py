"""The sandbox's small GLM-5.3-shaped checkpoint: a scaled-down config.json, an index and three
real safetensors shards (written with launcher.facts.safetensors_header, a few MB in all).

Tensor shapes follow the config the way the real model's do (MLA: kv_a_proj_with_mqa is
[kv_lora_rank + qk_rope_head_dim, hidden]; the DSA indexer's wk is [index_head_dim, hidden]; each
routed expert has gate/up/down projections; layer `num_hidden_layers` is the MTP (nextn) layer),
so weight sizing from headers and KV sizing from config.json read real, consistent files.
The bytes are deterministic, so every `sandbox up` writes the same checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from ..facts.safetensors_header import write_safetensors

CONFIG = {
    "architectures": ["GlmMoeDsaForCausalLM"],
    "model_type": "glm_moe_dsa",
    "torch_dtype": "bfloat16",
    "hidden_size": 256,
    "intermediate_size": 256,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 6,
    "num_nextn_predict_layers": 1,
    # 4: vLLM refuses heads that do not divide by --tensor-parallel-size (the sandbox plans TP4)
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 128,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 64,
    "v_head_dim": 64,
    "index_head_dim": 128,
    "index_n_heads": 2,  # vLLM replicates the indexer on every TP rank: no rule to divide
    # GLM-5's figure: vLLM's DCP top-k merge takes only 512, 1024 or 2048, older CUDA prefill
    # paths assert 2048. No tensor's shape depends on it.
    "index_topk": 2048,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 0,
    "moe_layer_freq": 1,
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "vocab_size": 1024,
    "max_position_embeddings": 202752,
    "rope_theta": 1000000,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": [1, 2],
    "pad_token_id": 3,
    "transformers_version": "4.57.1",
    # an EXL3 checkpoint, as the seeds' keys quants are: TensorFold's GLM-5.3 engine refuses others
    "quantization_config": {"quant_method": "exl3", "bits": 2.75},
    "_sandbox_note": "scaled-down stand-in for GLM-5.3 (sparkstack sandbox); random weights",
}

N_SHARDS = 3
DTYPE = "BF16"


def _bytes(name: str, n: int) -> bytes:
    """n deterministic pseudo-random bytes for a tensor."""
    seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    return random.Random(seed).randbytes(n)


def tensor_shapes(cfg: dict = CONFIG) -> dict[str, list[int]]:
    h = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    qk_head = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    shapes: dict[str, list[int]] = {"model.embed_tokens.weight": [cfg["vocab_size"], h]}
    n_layers = cfg["num_hidden_layers"] + cfg["num_nextn_predict_layers"]
    for i in range(n_layers):
        p = f"model.layers.{i}"
        shapes[f"{p}.input_layernorm.weight"] = [h]
        shapes[f"{p}.post_attention_layernorm.weight"] = [h]
        a = f"{p}.self_attn"
        shapes[f"{a}.q_a_proj.weight"] = [cfg["q_lora_rank"], h]
        shapes[f"{a}.q_a_layernorm.weight"] = [cfg["q_lora_rank"]]
        shapes[f"{a}.q_b_proj.weight"] = [heads * qk_head, cfg["q_lora_rank"]]
        shapes[f"{a}.kv_a_proj_with_mqa.weight"] = [cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"], h]
        shapes[f"{a}.kv_a_layernorm.weight"] = [cfg["kv_lora_rank"]]
        shapes[f"{a}.kv_b_proj.weight"] = [heads * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]),
                                           cfg["kv_lora_rank"]]
        shapes[f"{a}.o_proj.weight"] = [h, heads * cfg["v_head_dim"]]
        shapes[f"{a}.indexer.wq_b.weight"] = [cfg["index_n_heads"] * cfg["index_head_dim"],
                                              cfg["q_lora_rank"]]
        shapes[f"{a}.indexer.wk.weight"] = [cfg["index_head_dim"], h]
        shapes[f"{a}.indexer.k_norm.weight"] = [cfg["index_head_dim"]]
        shapes[f"{a}.indexer.weights_proj.weight"] = [cfg["index_n_heads"], h]
        m = f"{p}.mlp"
        shapes[f"{m}.gate.weight"] = [cfg["n_routed_experts"], h]
        shapes[f"{m}.gate.e_score_correction_bias"] = [cfg["n_routed_experts"]]
        inter = cfg["moe_intermediate_size"]
        for e in range(cfg["n_routed_experts"]):
            shapes[f"{m}.experts.{e}.gate_proj.weight"] = [inter, h]
            shapes[f"{m}.experts.{e}.up_proj.weight"] = [inter, h]
            shapes[f"{m}.experts.{e}.down_proj.weight"] = [h, inter]
        shapes[f"{m}.shared_experts.gate_proj.weight"] = [inter, h]
        shapes[f"{m}.shared_experts.up_proj.weight"] = [inter, h]
        shapes[f"{m}.shared_experts.down_proj.weight"] = [h, inter]
        if i >= cfg["num_hidden_layers"]:  # the MTP layer's own pieces
            shapes[f"{p}.eh_proj.weight"] = [h, 2 * h]
            shapes[f"{p}.enorm.weight"] = [h]
            shapes[f"{p}.hnorm.weight"] = [h]
            shapes[f"{p}.shared_head.norm.weight"] = [h]
    shapes["model.norm.weight"] = [h]
    shapes["lm_head.weight"] = [cfg["vocab_size"], h]
    return shapes


def _shard_of(name: str, cfg: dict) -> int:
    if name.startswith("model.layers."):
        layer = int(name.split(".")[2])
        n_layers = cfg["num_hidden_layers"] + cfg["num_nextn_predict_layers"]
        return min(N_SHARDS - 1, layer * N_SHARDS // n_layers)
    return 0 if name == "model.embed_tokens.weight" else N_SHARDS - 1


def shard_name(i: int) -> str:
    return f"model-{i + 1:05d}-of-{N_SHARDS:05d}.safetensors"


def write_checkpoint(path: Path, cfg: dict = CONFIG) -> dict:
    """Write (or refresh) the checkpoint; files already identical are left alone. Returns a summary."""
    path.mkdir(parents=True, exist_ok=True)
    shapes = tensor_shapes(cfg)
    shards: list[dict[str, tuple[str, list[int], bytes]]] = [{} for _ in range(N_SHARDS)]
    for name, shape in shapes.items():
        n = 2
        for d in shape:
            n *= d
        shards[_shard_of(name, cfg)][name] = (DTYPE, shape, _bytes(name, n))
    weight_map, total = {}, 0
    for i, tensors in enumerate(shards):
        target = path / shard_name(i)
        tmp = target.with_suffix(".tmp")
        write_safetensors(tmp, tensors, {"format": "pt"})
        if target.exists() and target.read_bytes() == tmp.read_bytes():
            tmp.unlink()
        else:
            tmp.replace(target)
        for name, (_d, _s, data) in tensors.items():
            weight_map[name] = shard_name(i)
            total += len(data)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    _write_if_changed(path / "model.safetensors.index.json", json.dumps(index, indent=2) + "\n")
    _write_if_changed(path / "config.json", json.dumps(cfg, indent=2) + "\n")
    _write_if_changed(path / "generation_config.json",
                      json.dumps({"bos_token_id": 0, "eos_token_id": [1, 2]}, indent=2) + "\n")
    return {"path": str(path), "tensors": len(weight_map), "total_size": total,
            "shards": [shard_name(i) for i in range(N_SHARDS)]}


def _write_if_changed(path: Path, content: str | bytes) -> None:
    data = content.encode() if isinstance(content, str) else content
    if not path.exists() or path.read_bytes() != data:
        path.write_bytes(data)


PATCHES = {
    "exl3.py": "EXL3 quantized-linear loader hooks for GLM-5.3 shards",
    "sm120_dcp.py": "decode-context-parallel enablement for sm_120/sm_121 (GB10)",
    "mla_attn_dcp.py": "MLA attention with decode-context-parallel KV sharding",
    "sparse_attn_indexer.py": "DSA sparse-attention indexer cache layout fix",
    "ablit_runtime.py": "the optional o_proj transplant hook (keys3)",
    "patch_ablit_dsv2.py": "the build-time patch of deepseek_v2.py (keys3)",
}
# What a patch registers with vLLM when imported (the stand-in vLLM reads it:
# standins/standin_engine_config.py), as the real overlays do; images/<stage>/stage.yaml `brings`
# says the same of the stage that installs it.
REGISTERS = {
    "exl3.py": ["quantization:exl3"],
    "sm120_dcp.py": ["attention:sparse-mla-dcp"],
}
# exllamav3 1.4.5's compiled extension (v145): the stage checks for an ELF header.
EXTENSION = ("exllamav3_ext.so", b"\x7fELF sparkstack sandbox stand-in: exllamav3 1.4.5 extension\n")


# Broken variants of the chain (issue 30: `verify` must fail them): the patch that breaks, and
# the fault it declares to the stand-in vLLM (standins/standin_vllm.py image_fault), as a real
# broken overlay would behave: it loads without error and then answers wrong.
VARIANTS = {
    # mul1's EXL3 overlay narrowing the trellis to the declared width (seed 003): every logit is noise
    "noise": ("exl3.py", "noise", "this variant narrows each fused shard to its declared width: "
              "loads without error, emits gibberish"),
    # keys' indexer, wrong only when 4 or more requests are batched (a TP kernel's fault, seed 003)
    "crowded": ("sparse_attn_indexer.py", "crowded:4", "this variant's top-k fallback corrupts "
                "the batch once 4 or more requests run at once"),
}


def write_patches(path: Path, variant: str | None = None) -> list[str]:
    """Small stand-in patch files for the sandbox profile's image chain (plain python files);
    `variant` (a VARIANTS key) writes that broken overlay instead of the good one."""
    path.mkdir(parents=True, exist_ok=True)
    broken, fault, why = VARIANTS[variant] if variant else (None, None, None)
    for name, what in PATCHES.items():
        _write_if_changed(path / name,
                          f"# sparkstack sandbox stand-in patch: {name}\n"
                          f"# The real file comes from the serving repository's checkout; this one\n"
                          f"# only stands for: {what}.\n"
                          f"SANDBOX_PATCH = {name.removesuffix('.py')!r}\n"
                          + (f"SANDBOX_REGISTERS = {REGISTERS[name]!r}\n" if name in REGISTERS else "")
                          + (f"# BROKEN: {why}\nSANDBOX_FAULT = {fault!r}\n" if name == broken else ""))
    _write_if_changed(path / EXTENSION[0], EXTENSION[1])
    return sorted([*PATCHES, EXTENSION[0]])
