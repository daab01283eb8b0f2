"""The checkpoint directory as the probe read it on the rank: the hashes of its config and index,
its shard names and sizes, folded into one fingerprint to compare across ranks (the model's shape
and weight split, read on this host, are checkpoint.py's)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from .parts import Part, key


@dataclass(frozen=True)
class Checkpoint:
    dir: str
    config_sha256: str | None
    index_sha256: str | None
    shards: tuple[tuple[str, int | None], ...]
    fingerprint: str  # equal on two ranks <=> same config, index and shard names and sizes
    total_bytes: int


def parse_checkpoint(raw: dict | None) -> Checkpoint | None:
    """The probe's hashes and shard list, folded into one fingerprint to compare across ranks."""
    if not raw or "error" in raw:
        return None
    def digest(v):
        return v if isinstance(v, str) else None
    shards = tuple((name, size) for name, size in raw.get("shards", []))
    cfg, idx = digest(raw.get("config_sha256")), digest(raw.get("index_sha256"))
    doc = json.dumps({"config": cfg, "index": idx, "shards": shards}, sort_keys=True)
    return Checkpoint(raw["dir"], cfg, idx, shards, hashlib.sha256(doc.encode()).hexdigest(),
                      sum(s or 0 for _, s in shards))


CHECKPOINT = Part("checkpoint", "checkpoint", parse_checkpoint, (key("checkpoint"),))
