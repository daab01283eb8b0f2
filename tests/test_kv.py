"""KV sizing against the figures the seeds publish."""

import pytest

from launcher.plan import cluster_plan as plan, kv
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


def profile_target(name: str) -> kv.KvTarget:
    spec = load_profile(name).kv.target
    return kv.KvTarget(spec.tokens, spec.source)


def test_seed_001_one_million_pool_is_the_seeds_1_23m_tokens():
    """keys35 at 1M with DCP 4: seed 001's pool held 1.23M tokens; the target policy sizes the same
    pool (rounded up to a MiB), not the 27.6 GiB all-that-fits, and leaves 17.8 GiB free."""
    bpt = kv.bytes_per_token(GLM53, "fp8_ds_mla", mtp=True, dcp=4)
    budget = kv.KvBudget(GB10_MEM, int(67.5 * GIB), 14 * GIB, 8 * GIB)
    sizing = kv.size_kv(bpt, budget, 1_000_000, target=profile_target("keys35-1m-dcp4"))
    assert sizing.policy == "target" and sizing.target.tokens == 1_230_000
    assert 1_230_000 <= sizing.max_tokens < 1_230_000 + kv.MIB // bpt + 1
    assert sizing.kv_cache_memory_bytes % kv.MIB == 0
    assert round(sizing.free_while_serving(GB10_MEM) / GIB, 1) == 17.8


def test_seed_targets_match_the_seeds_figures():
    """Seed 003's 396K-token pool at 180K; seed 001's 14092861440 B at 62,252 B/token at 200K."""
    assert profile_target("pollard-180k").tokens == 396_000
    seed_001_200k = 14092861440 // kv.bytes_per_token(GLM53, "fp8_ds_mla", mtp=True)
    assert abs(profile_target("keys35-200k").tokens - seed_001_200k) / seed_001_200k < 0.001


def test_a_target_beyond_the_budget_is_capped_by_it():
    """Pollard's 396K tokens do not fit beside 81 GiB of weights: the pool is the old budget."""
    bpt = kv.bytes_per_token(GLM53, "fp8", mtp=True)
    budget = kv.KvBudget(GB10_MEM, 81 * GIB, 14 * GIB, 8 * GIB)
    sizing = kv.size_kv(bpt, budget, 180_000, target=profile_target("pollard-180k"))
    assert sizing.policy == "target, capped"
    assert sizing.kv_cache_memory_bytes == budget.kv_bytes
    assert sizing.free_while_serving(GB10_MEM) >= 8 * GIB


def test_policy_max_is_all_that_fits():
    bpt = kv.bytes_per_token(GLM53, "fp8_ds_mla", mtp=True, dcp=4)
    budget = kv.KvBudget(GB10_MEM, int(67.5 * GIB), 14 * GIB, 8 * GIB)
    target = profile_target("keys35-1m-dcp4")
    assert kv.size_kv(bpt, budget, 1_000_000, target=target, policy=kv.MAX).kv_cache_memory_bytes \
        == kv.size_kv(bpt, budget, 1_000_000).kv_cache_memory_bytes == budget.kv_bytes
    assert kv.size_kv(bpt, budget, 1_000_000, target=target, policy=kv.MAX).policy == "max"
