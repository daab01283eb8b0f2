"""vLLM's own /metrics on rank 0 (the Prometheus text the API server serves): the names of the
families the kit reads, as vLLM 0.33 writes them (tests/golden/vllm-metrics-0.33.0.txt), and the
text read into sums."""

from __future__ import annotations

import re

import httpx

GENERATED = "vllm:generation_tokens_total"  # counter: tokens the engine produced
PROMPT = "vllm:prompt_tokens_total"  # counter: prompt tokens, counted at each prompt's first token
RUNNING = "vllm:num_requests_running"  # gauge: requests the scheduler runs (in the batch)
WAITING = "vllm:num_requests_waiting"  # gauge: requests queued, not yet scheduled
KV_USAGE = "vllm:kv_cache_usage_perc"  # gauge: KV cache in use, 1 = all (grows while prefilling)
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
DRAFTS = "vllm:spec_decode_num_drafts_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"  # label `position`

_SAMPLE = re.compile(r'^([A-Za-z_:][\w:]*)(\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?\s+(\S+)')


def parse(text: str) -> dict[str, float]:
    """Metric name -> value summed over its label sets (engines, models, positions), from the
    Prometheus text format. Comments, NaN and malformed lines are skipped."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if not m:
            continue
        try:
            value = float(m[3])
        except ValueError:
            continue
        if value == value:  # not NaN
            totals[m[1]] = totals.get(m[1], 0.0) + value
    return totals


def read(url: str, headers: dict[str, str] | None = None, timeout: float = 5.0) -> tuple[dict[str, float] | None, str]:
    """GET `url`/metrics: (the sums, "") or (None, why it could not be read)."""
    try:
        r = httpx.get(f"{url}/metrics", headers=headers or {}, timeout=timeout)
    except httpx.HTTPError as e:
        return None, f"{type(e).__name__}: {e}"
    if r.status_code != 200:
        return None, f"/metrics answered HTTP {r.status_code}"
    return parse(r.text), ""
