"""The checkpoint as the planner needs it: the model's shape and the weight bytes each rank holds.

Everything comes from `config.json` and the shards' safetensors headers, never the tensors.

Tensor-parallel split rule (what vLLM's DeepSeek-V2/GLM-MoE-DSA model builds per rank):
- replicated on every rank: norms, the MoE router (`mlp.gate.weight`, `e_score_correction_bias`),
  the MLA down-projections (`q_a_proj`, `kv_a_proj_with_mqa`, built as replicated linears), the
  sparse attention indexer (`indexer.*`), and the MTP block's `eh_proj`;
- split across the TP ranks (ceil(bytes / TP) each): everything else — attention up/out
  projections (`q_b_proj`, `kv_b_proj`, `o_proj`), dense and shared MLPs, routed experts (EXL3
  `trellis/suh/svh` parts included), `embed_tokens` (vocab-parallel) and `lm_head`.
Pipeline parallelism gives each stage a contiguous block of decoder layers, split as vLLM's
`get_pp_indices` does; embeddings sit on the first stage, the final norm, `lm_head` and the MTP
block on the last. A rank's figure is its stage's total; the plan uses the largest rank.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from .safetensors_header import HeaderError, read_header, tensor_bytes

_REPLICATED = re.compile(
    r"norm\.|norm$|_norm\b|\.mlp\.gate\.weight$|e_score_correction_bias|"
    r"\.q_a_proj\.|\.kv_a_proj_with_mqa\.|\.indexer\.|\.eh_proj\."
)
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


class CheckpointError(ValueError):
    pass


@dataclass(frozen=True)
class ModelShape:
    """The parts of `config.json` that set the KV cache's size."""

    num_hidden_layers: int
    num_nextn_predict_layers: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    index_head_dim: int = 0  # 0: no sparse indexer

    @classmethod
    def from_config(cls, config: dict, source: str = "config.json") -> "ModelShape":
        if isinstance(config, dict):
            config = config.get("text_config", config)
        if not isinstance(config, dict):
            raise CheckpointError(f"{source}: expected a JSON object of settings")
        missing = [k for k in ("num_hidden_layers", "kv_lora_rank", "qk_rope_head_dim") if k not in config]
        if missing:
            raise CheckpointError(f"{source}: missing {', '.join(missing)} (not an MLA model?)")
        return cls(**{key: _count(config, key, least, source) for key, least in _SHAPE_KEYS.items()})


# config.json's keys for the shape, and the least each may be (absent optional ones are 0)
_SHAPE_KEYS = {"num_hidden_layers": 1, "num_nextn_predict_layers": 0, "kv_lora_rank": 1,
               "qk_rope_head_dim": 1, "index_head_dim": 0}


def _count(config: dict, key: str, least: int, source: str) -> int:
    value = config.get(key, 0)
    if type(value) is not int or value < least:
        raise CheckpointError(f"{source}: {key} is {value!r}, expected a whole number ≥ {least}")
    return value


# vLLM 0.33's keys for the model's own maximum length, the smallest found wins
# (transformers_utils/model_arch_config_convertor.py derive_max_model_len_and_key)
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                "model_max_length", "max_target_positions", "max_sequence_length",
                "max_seq_length", "seq_len")
QUANT_FILE = "quantization_config.json"  # a file vLLM 0.33 never reads (config.json's key is what counts)


@dataclass(frozen=True)
class ModelLimits:
    """What vLLM's engine configuration reads from config.json before loading a byte: the
    model's own maximum length (and its key) and the quantization method (and which file says
    it). `ignored_quant` is a method written only in a quantization_config.json beside
    config.json: vLLM does not read that file and configures the model unquantized."""

    max_len: int | None
    max_len_key: str | None
    quant_method: str | None
    quant_source: str | None = None  # "config.json" or None
    ignored_quant: str | None = None
    sparse: bool = False  # a DSA indexer (index_topk): sparse MLA
    architectures: tuple[str, ...] = ()
    attention_heads: int | None = None  # num_attention_heads: tensor parallelism must divide it

    @classmethod
    def from_config(cls, config: dict, beside: dict | None = None) -> "ModelLimits":
        text = config.get("text_config", config) if isinstance(config, dict) else {}
        text = text if isinstance(text, dict) else {}
        max_len, key = None, None
        for k in MAX_LEN_KEYS:
            v = text.get(k)
            if type(v) is int and (max_len is None or v < max_len):
                max_len, key = v, k
        if type(text.get("model_max_length")) is int:
            max_len, key = text["model_max_length"], "model_max_length"
        quant = config.get("quantization_config") if isinstance(config, dict) else None
        method = quant.get("quant_method") if isinstance(quant, dict) else None
        method = method if isinstance(method, str) and method else None
        other = beside.get("quant_method") if isinstance(beside, dict) else None
        ignored = other if isinstance(other, str) and other and method is None else None
        archs = config.get("architectures") if isinstance(config, dict) else None
        archs = tuple(a for a in archs if isinstance(a, str)) if isinstance(archs, list) else ()
        heads = text.get("num_attention_heads")
        return cls(max_len, key, method, "config.json" if method else None, ignored,
                   "index_topk" in text, archs, heads if type(heads) is int and heads > 0 else None)


def read_limits(model_dir: Path) -> ModelLimits:
    config = _read_json(model_dir / "config.json")
    beside = model_dir / QUANT_FILE
    try:
        other = json.loads(beside.read_text()) if beside.is_file() else None
    except (OSError, ValueError):
        other = None
    return ModelLimits.from_config(config if isinstance(config, dict) else {}, other)


@dataclass(frozen=True)
class WeightSplit:
    """Bytes of weights on the fullest rank: the base model and the MTP block apart."""

    per_rank_bytes: int
    mtp_per_rank_bytes: int
    total_bytes: int
    shards: int


def read_shape(model_dir: Path) -> ModelShape:
    path = model_dir / "config.json"
    return ModelShape.from_config(_read_json(path), str(path))


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror})") from None
    except (ValueError, RecursionError) as e:  # not UTF-8, not JSON, nested beyond reading
        raise CheckpointError(f"{path}: not JSON ({type(e).__name__}: {e})") from None


def _index_names(index: Path) -> list[str]:
    """The shard file names the index's weight_map points at."""
    weight_map = _read_json(index)
    weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index}: no weight_map object (tensor name -> shard file)")
    names = set(weight_map.values())
    bad = sorted(repr(n) for n in names if not isinstance(n, str) or n in ("", ".", "..") or "/" in n or "\0" in n)
    if bad:
        raise CheckpointError(f"{index}: weight_map names {', '.join(bad[:3])}, not a shard file beside it")
    return sorted(names)


def shard_paths(model_dir: Path) -> list[Path]:
    """Shards named by the index when there is one, else every *.safetensors file."""
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        names = _index_names(index)
        # Files outside the index (seed 003's separate eh_proj shard) still hold weights.
        extra = {p.name for p in model_dir.glob("*.safetensors")} - set(names)
        names += sorted(extra)
    else:
        names = sorted(p.name for p in model_dir.glob("*.safetensors"))
    if not names:
        raise CheckpointError(f"{model_dir}: no safetensors shards")
    return [model_dir / n for n in names]


def split_weights(model_dir: Path, shape: ModelShape, tp: int, pp: int = 1) -> WeightSplit:
    """Weight bytes per rank under TP×PP, from the shards' headers."""
    stage_of_layer = _pp_stages(shape.num_hidden_layers, pp)
    base = [0] * pp
    mtp = [0] * pp
    total = 0
    paths = shard_paths(model_dir)
    for path in paths:
        try:
            header = read_header(path)
        except (OSError, HeaderError) as e:
            raise CheckpointError(str(e)) from None
        for name, entry in header.items():
            size = tensor_bytes(entry)
            total += size
            share = size if _REPLICATED.search(name) else -(-size // tp)
            layer = _layer_of(name)
            if layer is not None and layer >= shape.num_hidden_layers:
                mtp[pp - 1] += share
            else:
                base[_stage_of(name, layer, stage_of_layer, pp)] += share
    worst = max(range(pp), key=lambda s: base[s] + mtp[s])
    return WeightSplit(base[worst], mtp[worst], total, len(paths))


def _layer_of(name: str) -> int | None:
    match = _LAYER.match(name)
    return int(match.group(1)) if match else None


def _stage_of(name: str, layer: int | None, stage_of_layer: list[int], pp: int) -> int:
    if layer is not None:
        return stage_of_layer[layer]
    return 0 if "embed_tokens" in name else pp - 1


def _pp_stages(num_layers: int, pp: int) -> list[int]:
    """Stage index of each decoder layer, as vLLM's get_pp_indices splits them."""
    sizes = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    return [stage for stage, n in enumerate(sizes) for _ in range(n)]
