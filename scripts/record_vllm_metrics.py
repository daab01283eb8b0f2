#!/usr/bin/env python3
"""Record what vLLM's own /metrics exposes, from vLLM's own code: its v1 Prometheus stat logger
(vllm/v1/metrics/loggers.py `PrometheusStatLogger`, the one `vllm serve` registers) built over a
small stand-in VllmConfig on a CPU machine, fed one engine step's scheduler and iteration stats
(a request running, one waiting, a first token, a finished request, a speculative step), then
`prometheus_client.generate_latest()` of the registry the API server's /metrics serves (the
global one with one API server). Only the `vllm:` families are kept: names, HELP, TYPE, every
sample's labels and a value. Not a test; needs vLLM installed:

    /work/vllm033/venv/bin/python scripts/record_vllm_metrics.py > tests/golden/vllm-metrics-0.33.0.txt

The kit's tests compare the sandbox stand-in's /metrics with that file
(tests/test_standin_metrics.py), without vLLM.
"""

from __future__ import annotations

import sys
from importlib import metadata
from types import SimpleNamespace

import prometheus_client
import vllm
from vllm.config import CacheConfig, ObservabilityConfig
from vllm.v1.engine import FinishReason
from vllm.v1.metrics.loggers import PrometheusStatLogger
from vllm.v1.metrics.stats import (FinishedRequestStats, IterationStats, PrefillStats,
                                   PrefixCacheStats, SchedulerStats)
from vllm.v1.spec_decode.metrics import SpecDecodingStats

SERVED = "GLM-5.3-EXL3"
SPEC_TOKENS = 3  # the keys profiles' MTP k


def config():
    """What PrometheusStatLogger reads of a VllmConfig: vLLM's own Cache and Observability
    configs (their defaults), the served model's name and length, MTP with k speculative
    tokens; no LoRA, KV or EC transfer, watermark."""
    return SimpleNamespace(
        model_config=SimpleNamespace(served_model_name=SERVED, max_model_len=202752,
                                     is_diffusion=False),
        speculative_config=SimpleNamespace(num_speculative_tokens=SPEC_TOKENS, method="mtp"),
        cache_config=CacheConfig(), observability_config=ObservabilityConfig(),
        kv_transfer_config=None, ec_transfer_config=None, lora_config=None,
        watermark_config=None, parallel_config=SimpleNamespace(data_parallel_size=1))


def one_step(logger: PrometheusStatLogger) -> None:
    prefix = PrefixCacheStats()
    prefix.record(num_tokens=120, num_hits=0, preempted=False)
    spec = SpecDecodingStats.new(SPEC_TOKENS)
    spec.observe_draft(num_draft_tokens=SPEC_TOKENS, num_accepted_tokens=2)
    sched = SchedulerStats(num_running_reqs=1, num_waiting_reqs=1, kv_cache_usage=0.25,
                           prefix_cache_stats=prefix, spec_decoding_stats=spec)
    it = IterationStats()
    it.num_generation_tokens = 3
    prefill = PrefillStats()
    prefill.set(num_prompt_tokens=120, num_local_cached_tokens=0, num_external_cached_tokens=0)
    it.prompt_token_stats.update_from_output(prefill)
    it.time_to_first_tokens_iter.append(0.42)
    it.inter_token_latencies_iter.append(0.08)
    it.max_num_generation_tokens_iter.append(64)
    it.n_params_iter.append(1)
    it.finished_requests.append(FinishedRequestStats(
        finish_reason=FinishReason.LENGTH, num_prompt_tokens=120, num_generation_tokens=64,
        max_tokens_param=64, queued_time=0.01, prefill_time=0.4, inference_time=5.5,
        decode_time=5.1, mean_time_per_output_token=0.08))
    logger.record(scheduler_stats=sched, iteration_stats=it, engine_idx=0)
    logger.log_engine_initialized()


def vllm_families(text: str) -> str:
    """The exposition's `vllm:` blocks only (the registry also holds the process's python_*
    and process_* collectors, which a real server has too but which say nothing of vLLM)."""
    out, keep = [], False
    for line in text.splitlines():
        if line.startswith("# HELP "):
            keep = line.split()[2].startswith("vllm:")
        if keep:
            out.append(line)
    return "\n".join(out) + "\n"


def main() -> None:
    logger = PrometheusStatLogger(config(), [0])
    one_step(logger)
    text = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    sys.stdout.write(f"# vLLM {vllm.__version__}'s /metrics (its vllm: families), prometheus_client "
                     f"{metadata.version('prometheus_client')}\n"
                     f"# recorded by scripts/record_vllm_metrics.py: PrometheusStatLogger after one "
                     f"step (1 running, 1 waiting, MTP k={SPEC_TOKENS}, served name {SERVED})\n")
    sys.stdout.write(vllm_families(text))


if __name__ == "__main__":
    main()
