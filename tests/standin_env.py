"""What a stand-in engine run as a local process needs from its "rank": a checkpoint directory
as vLLM looks for one, and a /proc/meminfo for vLLM's startup guard."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GB10_DROPPED = ROOT / "tests" / "facts_cases" / "meminfo_gb10_caches_dropped.json"


def model_dir(tmp: Path) -> Path:
    """A checkpoint as vLLM looks for one: config.json and the safetensors index."""
    model = tmp / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text('{"architectures": ["GlmMoeDsaForCausalLM"]}')
    (model / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    return model


def write_meminfo(path: Path, total_kb: int, available_kb: int) -> Path:
    path.write_text(f"MemTotal:       {total_kb} kB\nMemFree:        {available_kb} kB\n"
                    f"MemAvailable:   {available_kb} kB\n")
    return path


def gb10_meminfo(path: Path) -> Path:
    """A GB10 with caches dropped, as the repo's own fixture records it (117.1 of 121.7 GiB)."""
    path.write_text(json.loads(GB10_DROPPED.read_text())["raw"]["text"])
    return path


def roomy_env(tmp: Path) -> dict[str, str]:
    """All memory free and nothing held by the worker: vLLM's startup guard passes, for tests
    about something else (the guard's own tests give it a GB10's figures)."""
    meminfo = write_meminfo(tmp / "meminfo", 127_600_000, 127_600_000)
    return {"SANDBOX_VLLM_MEMINFO": str(meminfo), "SANDBOX_VLLM_HELD_GIB": "0"}
