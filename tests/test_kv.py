"""KV sizing against the figures the seeds publish."""

import pytest

from launcher.plan import kv, plan
from launcher.facts.checkpoint import ModelShape
from launcher.inputs.profile import load_profile

GLM53 = ModelShape(num_hidden_layers=78, num_nextn_predict_layers=1, kv_lora_rank=512,
                   qk_rope_head_dim=64, index_head_dim=128)
GB10_MEM = plan.GB10_MEM_AVAILABLE  # a GB10's MemAvailable with page caches dropped, ≈ 117.1 GiB
GIB = kv.GIB


def test_layout_entry_sizes():
    assert kv.mla_entry_bytes("fp8_ds_mla", 512, 64) == 656  # 512 fp8 + 16 B scales + 64 bf16 rope
    assert kv.mla_entry_bytes("fp8", 512, 64) == 576
    assert kv.mla_entry_bytes("bf16", 512, 64) == 1152
    assert kv.indexer_entry_bytes(128) == 132
    assert kv.indexer_entry_bytes(0) == 0
    with pytest.raises(ValueError, match="unknown KV layout"):
        kv.mla_entry_bytes("nvfp4", 512, 64)


def test_seed_003_57_kb_per_token_incl_indexer():
    """Pollard: fp8 KV, MTP k=3, no DCP: "~57 KB/token incl. indexer cache"."""
    profile = load_profile("pollard-180k")
    bpt = kv.bytes_per_token(profile.shape(), profile.kv.layout, mtp=True)
    assert bpt == 79 * (576 + 132)
    assert abs(bpt - 57_000) / 57_000 < 0.05


def seed_000_budget() -> kv.KvBudget:
    """Seed 000: 75 GiB weights + 5 GiB MTP per rank, MemAvailable ≈ 117.1 GiB, 14 GiB runtime."""
    return kv.KvBudget(GB10_MEM, 80 * GIB, 14 * GIB, 8 * GIB)


def test_seed_000_one_million_needs_dcp():
    bpt = kv.bytes_per_token(GLM53, "fp8_ds_mla", mtp=True)
    with pytest.raises(kv.KvDoesNotFit, match=r"--max-model-len 1000000 needs .* GiB.*decode-context"):
        kv.size_kv(bpt, seed_000_budget(), 1_000_000)
    stock = kv.size_kv(bpt, seed_000_budget(), None)
    assert 250_000 < stock.max_tokens < 350_000  # "the stock stack tops out ~300K"
    sharded = kv.size_kv(kv.bytes_per_token(GLM53, "fp8_ds_mla", mtp=True, dcp=4), seed_000_budget(), 1_000_000)
    assert sharded.max_tokens >= 1_000_000
    assert sharded.kv_cache_memory_bytes == stock.kv_cache_memory_bytes
    assert sharded.kv_cache_memory_bytes % kv.MIB == 0


def test_seed_001_fixed_kv_bytes_hold_200k():
    """keys35 200K: --kv-cache-memory-bytes 14092861440 at fp8 must hold the 200K context."""
    bpt = kv.bytes_per_token(GLM53, "fp8_ds_mla", mtp=True)
    budget = kv.KvBudget(GB10_MEM, int(67.5 * GIB), 14 * GIB, 8 * GIB)
    sizing = kv.size_kv(bpt, budget, 200_000, fixed_bytes=14092861440)
    assert sizing.fixed and sizing.kv_cache_memory_bytes == 14092861440
    assert 200_000 <= sizing.max_tokens < 250_000


def test_fixed_bytes_beyond_the_budget_are_refused():
    bpt = kv.bytes_per_token(GLM53, "fp8_ds_mla", mtp=True)
    with pytest.raises(kv.KvDoesNotFit, match="exceeds what the fullest rank can give"):
        kv.size_kv(bpt, seed_000_budget(), 1000, fixed_bytes=40 * GIB)


def test_mtp_layer_counts_only_when_it_drafts():
    assert kv.bytes_per_token(GLM53, "fp8", mtp=False) == 78 * 708
    assert kv.bytes_per_token(GLM53, "fp8", mtp=True) == 79 * 708


def test_no_memory_left_is_refused_with_the_numbers():
    budget = kv.KvBudget(GB10_MEM, 110 * GIB, 14 * GIB, 8 * GIB)
    with pytest.raises(kv.KvDoesNotFit, match=r"MemAvailable 117.1 GiB − weights 110.0 GiB"):
        kv.size_kv(1000, budget, None)
