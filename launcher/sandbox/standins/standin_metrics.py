"""SANDBOX STAND-IN: vLLM 0.33's /metrics exposition, for standin_vllm.py's fake engine.
Standard library only (Python 3.8), installed beside standin_vllm.py in the stand-in image.

The families below are vLLM 0.33's own (vllm/v1/metrics/loggers.py, vllm/v1/spec_decode/
metrics.py; recorded from its code in tests/golden/vllm-metrics-0.33.0.txt by
scripts/record_vllm_metrics.py): their names, types, HELP texts and labels, written as
prometheus_client 0.26 writes them (counters as `_total` plus a `_created` gauge, histograms
with `_bucket`/`_count`/`_sum` and `_created`, labels sorted). The stand-in exposes those of
them its engine really keeps; their meanings are vLLM's:
- vllm:num_requests_running / _waiting: the scheduler's requests, not HTTP connections: a
  request waits until it is scheduled (fewer than --max-num-seqs running, and its prompt fits
  in the free KV cache); `_waiting_by_reason` splits waiting into capacity and deferred;
- vllm:kv_cache_usage_perc: the KV cache the running requests hold (1 = all of it);
- vllm:prompt_tokens / generation_tokens: counted when produced (a prompt at its first token);
- vllm:spec_decode_*: drafts, draft tokens, accepted tokens, and accepted tokens per draft
  position (only with --speculative-config).
"""

from __future__ import annotations

# vLLM 0.33's bucket families (vllm/v1/metrics/buckets.py).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)

# name (as registered, before prometheus_client's suffixes) -> (type, HELP, labels beyond
# model_name and engine), in vLLM's registration order.
FAMILIES = {
    "vllm:spec_decode_num_drafts": ("counter", "Number of spec decoding drafts.", ()),
    "vllm:spec_decode_num_draft_tokens": ("counter", "Number of draft tokens.", ()),
    "vllm:spec_decode_num_accepted_tokens": ("counter", "Number of accepted tokens.", ()),
    "vllm:spec_decode_num_accepted_tokens_per_pos": (
        "counter", "Accepted tokens per draft position.", ("position",)),
    "vllm:num_requests_running": ("gauge", "Number of requests in model execution batches.", ()),
    "vllm:num_requests_waiting": ("gauge", "Number of requests waiting to be processed.", ()),
    "vllm:num_requests_waiting_by_reason": (
        "gauge", "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
        "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV "
        "transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
        ("reason",)),
    "vllm:engine_sleep_state": (
        "gauge", "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine "
        "is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
        ("sleep_state",)),
    "vllm:kv_cache_usage_perc": ("gauge", "KV-cache usage. 1 means 100 percent usage.", ()),
    "vllm:num_preemptions": ("counter", "Cumulative number of preemption from the engine.", ()),
    "vllm:prompt_tokens": ("counter", "Number of prefill tokens processed.", ()),
    "vllm:generation_tokens": ("counter", "Number of generation tokens processed.", ()),
    "vllm:request_success": ("counter", "Count of successfully processed requests.",
                             ("finished_reason",)),
    "vllm:time_to_first_token_seconds": (
        "histogram", "Histogram of time to first token in seconds.", ()),
    "vllm:inter_token_latency_seconds": (
        "histogram", "Histogram of inter-token latency in seconds.", ()),
    "vllm:e2e_request_latency_seconds": (
        "histogram", "Histogram of e2e request latency in seconds.", ()),
    "vllm:request_queue_time_seconds": (
        "histogram", "Histogram of time spent in WAITING phase for request.", ()),
}
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")  # vLLM's FinishReason


class Histogram:
    def __init__(self, buckets: tuple):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last: +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.sum += value
        self.counts[next((i for i, b in enumerate(self.buckets) if value <= b), len(self.buckets))] += 1


def go_float(value: float) -> str:
    """prometheus_client's floatToGoString: 1.0, +Inf, 1.7e+09 for large values."""
    value = float(value)
    if value == float("inf"):
        return "+Inf"
    if value == float("-inf"):
        return "-Inf"
    if value != value:
        return "NaN"
    text = repr(value)
    dot = text.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return text


def labels(pairs: dict) -> str:
    def escape(v: str) -> str:
        return str(v).replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")

    return "{" + ",".join(f'{k}="{escape(v)}"' for k, v in sorted(pairs.items())) + "}"


def exposition(model: str, created: float, values: dict) -> str:
    """The text of /metrics: `values` maps a family of FAMILIES to [(extra labels, value)]
    (a Histogram as the value of a histogram family); families absent are not exposed."""
    base = {"engine": "0", "model_name": model}
    out = []
    for name, (kind, doc, _) in FAMILIES.items():
        if name not in values:
            continue
        series = [({**base, **extra}, v) for extra, v in values[name]]
        shown = name + "_total" if kind == "counter" else name
        out += [f"# HELP {shown} {doc}", f"# TYPE {shown} {kind}"]
        for lab, v in series:
            if kind == "histogram":
                out += histogram_lines(name, lab, v)
            else:
                out.append(f"{shown}{labels(lab)} {go_float(v)}")
        if kind != "gauge":
            out += [f"# HELP {name}_created {doc}", f"# TYPE {name}_created gauge"]
            out += [f"{name}_created{labels(lab)} {go_float(created)}" for lab, _ in series]
    return "\n".join(out) + "\n"


def histogram_lines(name: str, lab: dict, h: Histogram) -> list:
    lines, cumulative = [], 0
    for bound, n in zip((*h.buckets, float("inf")), h.counts):
        cumulative += n
        lines.append(f"{name}_bucket{labels({**lab, 'le': go_float(bound)})} {go_float(cumulative)}")
    return lines + [f"{name}_count{labels(lab)} {go_float(cumulative)}",
                    f"{name}_sum{labels(lab)} {go_float(h.sum)}"]


def per_position(drafts: int, accepted_per_draft: float, k: int) -> list:
    """Accepted tokens at each of the k draft positions over `drafts` drafts: a draft's tokens
    are accepted up to the first rejection, so position i is accepted with probability a^(i+1);
    a is chosen so the positions add up to `accepted_per_draft` (capped at k)."""
    target = min(max(accepted_per_draft, 0.0), float(k))
    low, high = 0.0, 1.0
    for _ in range(60):  # bisection: the sum grows with a
        a = (low + high) / 2
        low, high = (a, high) if sum(a ** (i + 1) for i in range(k)) < target else (low, a)
    return [round(drafts * low ** (i + 1)) for i in range(k)]
