"""KV-cache sizing for MLA models with a sparse indexer (GLM-5.3, DeepSeek-V3.2 style).

Per-token bytes, per rank:

    layers_with_kv × (MLA entry in the layout + indexer key entry) ÷ decode-context-parallel size

- layers_with_kv = num_hidden_layers, + num_nextn_predict_layers when the MTP block runs as the
  speculator (it is a full decoder layer with its own KV).
- MLA entry per token per layer, by vLLM's cache layout (kv_lora_rank=512, qk_rope_head_dim=64):
  `fp8_ds_mla` (the sparse-MLA backends' fp8): 512 fp8 latent + 16 B of scales (4 fp32, one per
  128 values) + 64 bf16 rope = 656 B; plain `fp8`: 512 + 64 = 576 B; `bf16`: (512 + 64) × 2 = 1152 B.
- indexer key entry: index_head_dim fp8 + one fp32 scale = 128 + 4 = 132 B.
- MLA's latent KV is replicated on every TP rank; only decode-context parallelism shards it.

KV bytes per rank = MemAvailable − weights on the rank − runtime overhead − headroom,
where the runtime overhead (~14 GiB: CUDA context, NCCL buffers, activations, graphs) is what the
worker holds before vLLM measures anything (seed 000), and the headroom keeps a unified-memory
GB10 from freezing. All ranks get the smallest rank's figure, rounded down to a MiB.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..facts.checkpoint import ModelShape

GIB = 1 << 30
MIB = 1 << 20


def mla_entry_bytes(layout: str, kv_lora_rank: int, rope_dim: int) -> int:
    """Bytes of one token's MLA cache entry in one layer."""
    if layout == "fp8_ds_mla":
        return kv_lora_rank + 4 * (kv_lora_rank // 128) + 2 * rope_dim
    if layout == "fp8":
        return kv_lora_rank + rope_dim
    if layout == "bf16":
        return 2 * (kv_lora_rank + rope_dim)
    raise ValueError(f"unknown KV layout {layout!r} (expected fp8_ds_mla, fp8 or bf16)")



def indexer_entry_bytes(index_head_dim: int) -> int:
    """The sparse indexer's key cache: fp8 keys plus one fp32 scale per token per layer."""
    return index_head_dim + 4 if index_head_dim else 0


def bytes_per_token(shape: ModelShape, layout: str, *, mtp: bool, dcp: int = 1) -> int:
    """KV bytes one token costs on one rank (see the module docstring)."""
    layers = shape.num_hidden_layers + (shape.num_nextn_predict_layers if mtp else 0)
    per_layer = mla_entry_bytes(layout, shape.kv_lora_rank, shape.qk_rope_head_dim)
    per_layer += indexer_entry_bytes(shape.index_head_dim)
    return -(-layers * per_layer // dcp)


@dataclass(frozen=True)
class KvBudget:
    """What one rank has for the KV cache, and from what."""

    mem_available: int
    weights: int
    runtime_overhead: int
    headroom: int

    @property
    def kv_bytes(self) -> int:
        free = self.mem_available - self.weights - self.runtime_overhead - self.headroom
        return max(0, free) // MIB * MIB

    def explain(self) -> str:
        return (f"MemAvailable {gib(self.mem_available)} − weights {gib(self.weights)} − runtime "
                f"{gib(self.runtime_overhead)} − headroom {gib(self.headroom)} = {gib(self.kv_bytes)}")


@dataclass(frozen=True)
class KvTarget:
    """The tokens the pool should hold and where that figure comes from."""

    tokens: int
    source: str


TARGET, MAX = "target", "max"  # the policies cluster.yaml may ask for


@dataclass(frozen=True)
class KvSizing:
    bytes_per_token: int
    kv_cache_memory_bytes: int
    max_tokens: int
    budget: KvBudget
    fixed: bool  # the profile set --kv-cache-memory-bytes itself
    policy: str = MAX  # what sized the pool: "fixed", "target", "target, capped" or "max"
    target: KvTarget | None = None

    def free_while_serving(self, mem_available: int) -> int:
        """What a rank with this MemAvailable keeps free once the engine holds its memory."""
        b = self.budget
        return mem_available - b.weights - b.runtime_overhead - self.kv_cache_memory_bytes


class KvDoesNotFit(ValueError):
    pass


def size_kv(bpt: int, budget: KvBudget, max_model_len: int | None,
            fixed_bytes: int | None = None, target: KvTarget | None = None,
            policy: str = TARGET) -> KvSizing:
    """The `--kv-cache-memory-bytes` to pass and the tokens it holds; refuses what cannot serve.

    `fixed_bytes` is a figure the profile states (seed 001's 14092861440): it is kept when it
    fits the budget and refused when it does not. Otherwise the `target` policy holds
    `target.tokens` (rounded up to a MiB) within the budget, and `max` (or no target) the budget."""
    if fixed_bytes is not None and fixed_bytes > budget.kv_bytes:
        raise KvDoesNotFit(
            f"the profile's --kv-cache-memory-bytes {fixed_bytes} ({gib(fixed_bytes)}) exceeds what "
            f"the fullest rank can give: {budget.explain()}")
    kv_bytes, chosen = _pool(bpt, budget, fixed_bytes, target, policy)
    max_tokens = kv_bytes // bpt
    if max_tokens == 0 or (max_model_len and max_model_len > max_tokens):
        need = (max_model_len or 1) * bpt
        raise KvDoesNotFit(
            f"--max-model-len {max_model_len} needs {gib(need)} of KV per rank at {bpt} B/token, "
            f"but only {max_tokens} tokens fit: {budget.explain()}. Use decode-context "
            f"parallelism, a smaller --max-model-len, or less headroom")
    return KvSizing(bpt, kv_bytes, max_tokens, budget, fixed_bytes is not None, chosen, target)


def _pool(bpt: int, budget: KvBudget, fixed_bytes: int | None, target: KvTarget | None,
          policy: str) -> tuple[int, str]:
    """The pool's bytes and the policy that chose them."""
    if fixed_bytes is not None:
        return fixed_bytes, "fixed"
    if policy == MAX or target is None:
        return budget.kv_bytes, MAX
    wanted = -(-target.tokens * bpt // MIB) * MIB
    return (wanted, TARGET) if wanted <= budget.kv_bytes else (budget.kv_bytes, "target, capped")


def gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"
