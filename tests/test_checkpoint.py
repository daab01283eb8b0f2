"""Per-rank weight bytes from real safetensors shards (written by the safetensors library)."""

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from launcher.facts.checkpoint import CheckpointError, ModelShape, read_shape, split_weights

CONFIG = {"model_type": "glm_moe_dsa", "num_hidden_layers": 2, "num_nextn_predict_layers": 1,
          "kv_lora_rank": 512, "qk_rope_head_dim": 64, "index_head_dim": 128}


def f16(*shape):
    return np.zeros(shape, dtype=np.float16)


# name -> (array, replicated on every TP rank?)
SHARD_1 = {
    "model.embed_tokens.weight": (f16(1000, 64), False),            # 128000 B, vocab-parallel
    "model.layers.0.input_layernorm.weight": (f16(64), True),       # 128
    "model.layers.0.self_attn.kv_a_proj_with_mqa.weight": (f16(576, 64), True),  # 73728
    "model.layers.0.self_attn.q_b_proj.weight": (f16(256, 64), False),           # 32768
    "model.layers.0.self_attn.indexer.wk.weight": (f16(128, 64), True),          # 16384
    "model.layers.0.mlp.gate.weight": (np.zeros((8, 64), np.float32), True),     # 2048
    "model.layers.0.mlp.experts.0.down_proj.trellis": (np.zeros((4, 4, 256), np.int16), False),  # 8192
}
SHARD_2 = {
    "model.layers.1.post_attention_layernorm.weight": (f16(64), True),  # 128
    "model.layers.1.self_attn.o_proj.weight": (f16(64, 256), False),    # 32768
    "model.layers.1.mlp.shared_experts.gate_proj.weight": (f16(128, 64), False),  # 16384
    "model.norm.weight": (f16(64), True),                               # 128
    "lm_head.weight": (f16(1000, 64), False),                           # 128000
}
MTP_SHARD = {  # seed 003 keeps eh_proj in a shard of its own, outside the index
    "model.layers.2.eh_proj.weight": (f16(64, 128), True),                   # 16384
    "model.layers.2.mlp.experts.0.up_proj.weight": (f16(128, 64), False),   # 16384
}


@pytest.fixture
def checkpoint(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    weight_map = {}
    for name, tensors in [("model-00001-of-00002.safetensors", SHARD_1),
                          ("model-00002-of-00002.safetensors", SHARD_2)]:
        save_file({k: v for k, (v, _) in tensors.items()}, str(tmp_path / name))
        weight_map.update({k: name for k in tensors})
    save_file({k: v for k, (v, _) in MTP_SHARD.items()}, str(tmp_path / "model-mtp.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return tmp_path


def share(tensors, tp):
    return sum(a.nbytes if replicated else -(-a.nbytes // tp) for a, replicated in tensors.values())


def test_shape_from_config(checkpoint):
    assert read_shape(checkpoint) == ModelShape(2, 1, 512, 64, 128)


def test_tp4_split_counts_replicated_tensors_on_every_rank(checkpoint):
    split = split_weights(checkpoint, read_shape(checkpoint), tp=4)
    assert split.per_rank_bytes == share(SHARD_1, 4) + share(SHARD_2, 4)
    # by hand: replicated 128+73728+16384+2048+128+128, sharded (128000+32768+8192+32768+16384+128000)/4
    assert split.per_rank_bytes == 92544 + 86528
    assert split.mtp_per_rank_bytes == 16384 + 16384 // 4
    assert split.total_bytes == sum(a.nbytes for t in (SHARD_1, SHARD_2, MTP_SHARD) for a, _ in t.values())
    assert split.shards == 3


def test_tp1_holds_everything(checkpoint):
    split = split_weights(checkpoint, read_shape(checkpoint), tp=1)
    assert split.per_rank_bytes + split.mtp_per_rank_bytes == split.total_bytes


def test_pipeline_stages_take_contiguous_layers(checkpoint):
    """PP 2: stage 0 has the embeddings and layer 0; stage 1 layer 1, the head and the MTP block."""
    split = split_weights(checkpoint, read_shape(checkpoint), tp=2, pp=2)
    stage0 = share(SHARD_1, 2)
    stage1 = share(SHARD_2, 2) + share(MTP_SHARD, 2)
    assert split.per_rank_bytes + split.mtp_per_rank_bytes == max(stage0, stage1)


def test_missing_or_broken_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="config.json: cannot read"):
        read_shape(tmp_path)
    (tmp_path / "config.json").write_text('{"num_hidden_layers": 2}')
    with pytest.raises(CheckpointError, match="missing kv_lora_rank"):
        read_shape(tmp_path)
    with pytest.raises(CheckpointError, match="no safetensors shards"):
        split_weights(tmp_path, ModelShape(2, 1, 512, 64, 128), tp=4)
