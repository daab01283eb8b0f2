"""SANDBOX STAND-IN for vLLM 0.33's engine configuration (not vLLM): what `create_engine_config`
and the attention-backend choice refuse before any weight is loaded, with vLLM's own messages.
Standard library only (Python 3.8); imported by standin_vllm.py (its sibling in the image).

Each message is copied from vLLM 0.33.0's source (the wheel vllm-0.33.0-cp38-abi3), and is what
vLLM 0.33.0 said when run (tests/fixtures/vllm033_engine_config, recorded by
scripts/check_engine_config_with_vllm.py; tests/test_engine_config_fixtures.py compares):
- `vllm/config/model.py` `_get_and_verify_max_len`: a --max-model-len above the checkpoint's
  derived maximum (the smallest of max_position_embeddings, n_positions, ... in config.json,
  times the RoPE scaling factor) without VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (`vllm/envs.py`: "1" or
  "true");
- `vllm/config/model.py` `_verify_quantization`: config.json's `quantization_config.quant_method`
  (or --quantization) must be one of QUANTIZATION_METHODS
  (`vllm/model_executor/layers/quantization/__init__.py`) plus what a plugin registered
  (`register_quantization_config` appends). A `quantization_config.json` beside config.json is not
  read by vLLM: the model is configured unquantized, without a word (the kit's `check` says so);
- `vllm/config/model.py` `verify_with_parallel_config` (VllmConfig's __post_init__, after
  ModelConfig and ParallelConfig): config.json's `num_attention_heads` must divide by
  --tensor-parallel-size ("Total number of attention heads (2) must be divisible by tensor
  parallel size (4)."). vLLM 0.33 has no like rule for pipeline parallelism and
  num_hidden_layers (it splits layers unevenly; it refuses only a model without SupportsPP, and
  GLM-5's implementation has it);
- `vllm/v1/executor/ray_utils.py` `assert_ray_available` (called from `vllm/config/parallel.py`
  for --distributed-executor-backend ray): "Failed to import Ray: ...";
- `vllm/platforms/cuda.py` (`get_attn_backend_cls`) with `vllm/v1/attention/backend.py`'s reasons:
  on compute capability 12.x (a GB10 is 12.1) the MLA candidates are TRITON_MLA and
  FLASHINFER_MLA_SPARSE_SM120; a sparse-MLA model (GLM-5's DSA indexer) with
  --decode-context-parallel-size > 1 has none: "No valid attention backend found for cuda ...";
  `vllm/v1/attention/backends/registry.py` `get_path`: "Backend CUSTOM must be registered before
  use. ...".

What the image registers: a file of the image's `vllm` package (a patch a chain stage copied in,
as the real overlays and plugins register on import) that says
`SANDBOX_REGISTERS = ["quantization:exl3", "attention:sparse-mla-dcp", "attention:CUSTOM"]`.
The same names are the capabilities the kit's profiles need and its stages bring
(images/<stage>/stage.yaml `brings`).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import sys

# vLLM 0.33.0's QuantizationMethods, in its order (get_args of the Literal).
QUANTIZATION_METHODS = [
    "awq", "auto_awq", "fp8", "fbgemm_fp8", "fp_quant", "modelopt", "modelopt_fp4",
    "modelopt_mxfp8", "modelopt_mixed", "auto_gptq", "gptq", "gptq_marlin", "awq_marlin",
    "humming", "compressed-tensors", "experts_int8", "quark", "moe_wna16", "torchao", "inc",
    "mxfp4", "gpt_oss_mxfp4", "deepseek_v4_fp8", "online", "fp8_per_tensor", "fp8_per_block",
    "fp8_per_channel", "int8_per_channel_weight_only", "nvfp4_per_token", "mxfp8",
]
# vLLM's derive_max_model_len_and_key (transformers_utils/model_arch_config_convertor.py)
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                "model_max_length", "max_target_positions", "max_sequence_length",
                "max_seq_length", "seq_len")
LONG_WARNING = ("VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution. If the model "
                "uses relative position encoding (RoPE), positions exceeding derived_max_model_len "
                "lead to nan. If the model uses absolute position encoding, positions exceeding "
                "derived_max_model_len will cause a CUDA array out-of-bounds error.")
REGISTERS = re.compile(rb"^SANDBOX_REGISTERS\s*=\s*(\[[^\]]*\])", re.M)
DCP_BACKEND = "attention:sparse-mla-dcp"


def registered() -> dict[str, str]:
    """capability -> the file of the image's `vllm` package that registers it."""
    found: dict[str, str] = {}
    for site in sys.path:
        root = os.path.join(site or ".", "vllm")
        for folder, _, files in os.walk(root):
            for name in sorted(files):
                path = os.path.join(folder, name)
                try:
                    with open(path, "rb") as f:
                        match = REGISTERS.search(f.read(8192))
                except OSError:
                    continue
                if match:
                    try:
                        names = ast.literal_eval(match.group(1).decode())
                    except (ValueError, SyntaxError):
                        continue
                    for capability in names:
                        found.setdefault(str(capability), path)
    return found


def read_config(model: str) -> dict:
    try:
        with open(os.path.join(model, "config.json")) as f:
            cfg = json.load(f)
        return cfg if isinstance(cfg, dict) else {}
    except (OSError, ValueError):
        return {}


def derived_max_len(cfg: dict) -> tuple[float | int | None, str | None]:
    """(derived max_model_len, the key it came from): None when config.json names none."""
    derived, key = None, None
    for k in MAX_LEN_KEYS:
        value = cfg.get(k)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if derived is None or value < derived:
                derived, key = value, k
    if isinstance(cfg.get("model_max_length"), (int, float)):
        derived, key = cfg["model_max_length"], "model_max_length"
    if derived is None:
        return None, None
    # transformers gives every RoPE model rope parameters (rope_type default, no factor): vLLM
    # multiplies by the scaling factor (1.0 without one), which makes the figure a float
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if rope is not None or "rope_theta" in cfg:
        rope = rope if isinstance(rope, dict) else {}
        kind = rope.get("rope_type", rope.get("type", "default"))
        factor = 1.0
        if kind not in ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"):
            factor = rope.get("factor", 1.0)
        derived = derived * float(1.0 if factor is None else factor)
    return derived, key


def check_max_len(cfg: dict, options: dict, env) -> str | None:
    wanted = options.get("max_model_len")
    if not isinstance(wanted, int) or wanted == -1:
        return None
    derived, key = derived_max_len(cfg)
    if derived is None or wanted <= derived:
        return None
    model_max_length = cfg.get("model_max_length")
    if model_max_length is not None and wanted <= model_max_length:
        return None
    msg = (f"User-specified max_model_len ({wanted}) is greater than the derived max_model_len "
           f"({key}={derived} or model_max_length={model_max_length} in model's config.json).")
    if env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0").strip().lower() in ("1", "true"):
        return None  # vLLM logs the warning and goes on
    return (f"ValueError: {msg} To allow overriding this maximum, set the env var "
            f"VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. {LONG_WARNING}")


def warn_max_len(cfg: dict, options: dict) -> str | None:
    """The warning vLLM logs when the override is set."""
    wanted = options.get("max_model_len")
    derived, key = derived_max_len(cfg)
    if not isinstance(wanted, int) or derived is None or wanted == -1 or wanted <= derived:
        return None
    return (f"User-specified max_model_len ({wanted}) is greater than the derived max_model_len "
            f"({key}={derived} or model_max_length={cfg.get('model_max_length')} in model's "
            f"config.json). {LONG_WARNING}")


def check_quantization(cfg: dict, options: dict, plugins: dict) -> str | None:
    quant_cfg = cfg.get("quantization_config") or cfg.get("compression_config")
    method = quant_cfg.get("quant_method") if isinstance(quant_cfg, dict) else None
    method = method if method != "" else None
    given = options.get("quantization")
    if given is not None and method is not None and given != method:
        return ("ValueError: Quantization method specified in the model config "
                f"({method}) does not match the quantization method specified in the "
                f"`quantization` argument ({given}).")
    chosen = given if given is not None else method
    supported = QUANTIZATION_METHODS + [c.split(":", 1)[1] for c in plugins
                                        if c.startswith("quantization:")
                                        and c.split(":", 1)[1] not in QUANTIZATION_METHODS]
    if chosen is not None and chosen not in supported:
        return f"ValueError: Unknown quantization method: {chosen}. Must be one of {supported}."
    return None


def check_ray(options: dict) -> str | None:
    if options.get("distributed_executor_backend") != "ray":
        return None
    try:
        found = importlib.util.find_spec("ray")
    except (ImportError, ValueError) as e:
        found, err = None, str(e)
    else:
        err = "No module named 'ray'"
    if found is None:
        return f"ValueError: Failed to import Ray: {err}.Please install Ray with `pip install ray`."
    return None


def check_heads(cfg: dict, options: dict) -> str | None:
    """Each tensor-parallel rank holds an equal share of the attention heads."""
    heads = cfg.get("num_attention_heads", 0)  # vLLM reads 0 when config.json names none
    tp = int(options.get("tensor_parallel_size") or 1)
    if not isinstance(heads, int) or isinstance(heads, bool) or tp < 1 or heads % tp == 0:
        return None
    return (f"ValueError: Total number of attention heads ({heads}) must be divisible by "
            f"tensor parallel size ({tp}).")


def compute_capability(env) -> tuple[int, int]:
    major, _, minor = env.get("SANDBOX_VLLM_COMPUTE_CAPABILITY", "12.1").partition(".")
    return int(major), int(minor or 0)


def check_attention(cfg: dict, options: dict, plugins: dict, env) -> str | None:
    """The attention backend every layer picks (vllm/platforms/cuda.py), for MLA models."""
    backend = (options.get("attention_backend")
               or (options.get("attention_config") or {}).get("backend"))
    if backend == "CUSTOM":
        if "attention:CUSTOM" not in plugins:
            return ("ValueError: Backend CUSTOM must be registered before use. Use "
                    "register_backend(Backend.CUSTOM, 'your.module.YourClass')")
        return None
    if backend is not None or "kv_lora_rank" not in cfg:
        return None  # a named backend's own checks, or not an MLA model: not modelled
    sparse = "index_topk" in cfg
    dcp = int(options.get("decode_context_parallel_size") or 1) > 1
    major, _ = compute_capability(env)
    if major != 12 or not (sparse and dcp) or DCP_BACKEND in plugins:
        return None
    head_size = int(cfg.get("kv_lora_rank", 0)) + int(cfg.get("qk_rope_head_dim", 0))
    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    config = (f"AttentionSelectorConfig(head_size={head_size}, dtype=torch.{dtype}, "
              f"kv_cache_dtype={options.get('kv_cache_dtype', 'auto')}, "
              f"block_size={options.get('block_size')}, use_mla=True, has_sink=False, "
              f"use_sparse=True, use_mm_prefix=False, use_per_head_quant_scales=False, "
              f"attn_type=AttentionType.DECODER, has_sliding_window=False, use_non_causal=False, "
              f"use_batch_invariant=False, use_kv_connector=False, "
              f"use_adaptive_verification=False, use_pcp=False, use_dcp=True, use_rswa=False)")
    reasons = "{TRITON_MLA: [sparse not supported], FLASHINFER_MLA_SPARSE_SM120: [DCP not supported]}"
    return f"ValueError: No valid attention backend found for cuda with {config}. Reasons: {reasons}."


def engine_config(model: str, options: dict, env=None) -> str | None:
    """create_engine_config's refusals, in vLLM's order (ModelConfig's max length, then its
    quantization, then ParallelConfig's executor, then VllmConfig's heads per tensor-parallel
    rank): the first error, or None."""
    env = os.environ if env is None else env
    cfg = read_config(model)
    plugins = registered()
    return (check_max_len(cfg, options, env) or check_quantization(cfg, options, plugins)
            or check_ray(options) or check_heads(cfg, options))


def attention(model: str, options: dict, env=None) -> str | None:
    """The attention backend's choice (each worker, when the model is built)."""
    env = os.environ if env is None else env
    return check_attention(read_config(model), options, registered(), env)
