"""The Grafana dashboard `sparkstack metrics write-config` writes: per rank memory against the
planned floor, the engine containers, GPU, fabric rates and errors, the memory guard's events; for
the cluster vLLM's tokens/s, queue, KV cache use, time to first token and speculative acceptance
(overall and per draft position). Grafana's JSON model (schemaVersion 39), a Prometheus data
source picked on import (`$datasource`) and the cluster as a variable (`$cluster`).
"""

from __future__ import annotations

C = '{cluster="$cluster"}'
R = "[$__rate_interval]"
RANK_LEGEND = "{{host}}"


def _panel(title: str, unit: str, targets: list[tuple[str, str]], kind: str = "timeseries",
           description: str = "") -> dict:
    return {"type": kind, "title": title, "description": description,
            "datasource": {"type": "prometheus", "uid": "$datasource"},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend,
                         "datasource": {"type": "prometheus", "uid": "$datasource"}}
                        for i, (expr, legend) in enumerate(targets)]}


def panels(acceptance_floor: float) -> list[dict]:
    accepted = f'sum by (cluster) (rate(vllm:spec_decode_num_accepted_tokens_total{C}{R}))'
    drafts = f'sum by (cluster) (rate(vllm:spec_decode_num_drafts_total{C}{R}))'
    return [
        _panel("MemAvailable against the planned floor", "bytes",
               [(f"sparkstack_memory_available_bytes{C}", RANK_LEGEND),
                (f"sparkstack_memory_floor_bytes{C}", "floor {{host}}")],
               description="below the floor a GB10 is one long prefill from freezing"),
        _panel("Page cache and swap used", "bytes",
               [(f"sparkstack_memory_page_cache_bytes{C}", "cache {{host}}"),
                (f"sparkstack_memory_swap_total_bytes{C} - sparkstack_memory_swap_free_bytes{C}",
                 "swap {{host}}")]),
        _panel("Engine containers", "short",
               [(f"sparkstack_engine_running{C}", RANK_LEGEND)],
               description="1 while the rank's engine container runs"),
        _panel("Engine container memory", "bytes", [(f"sparkstack_engine_memory_bytes{C}", RANK_LEGEND)]),
        _panel("GPU utilization", "percentunit", [(f"sparkstack_gpu_utilization_ratio{C}", RANK_LEGEND)],
               description="nvidia-smi; no data where the GPU is not measured (sparkstack_gpu_measured 0)"),
        _panel("GPU SM clock", "hertz", [(f"sparkstack_gpu_sm_clock_hertz{C}", RANK_LEGEND)]),
        _panel("GPU power and temperature", "watt",
               [(f"sparkstack_gpu_power_watts{C}", "W {{host}}"),
                (f"sparkstack_gpu_temperature_celsius{C}", "C {{host}}")]),
        _panel("Fabric rates (RoCE)", "Bps",
               [(f"rate(sparkstack_fabric_transmit_bytes_total{C}{R})", "out {{host}} {{hca}}"),
                (f"rate(sparkstack_fabric_receive_bytes_total{C}{R})", "in {{host}} {{hca}}")]),
        _panel("Fabric errors (increase)", "short",
               [(f"increase(sparkstack_fabric_errors_total{C}[5m])", "{{host}} {{hca}} {{counter}}")],
               description="link downed, symbol and receive errors, out-of-sequence, retries: they precede NCCL failures"),
        _panel("Memory guard events (last hour)", "short",
               [(f"increase(sparkstack_guard_events_total{C}[1h])", "{{host}} {{event}}")]),
        _panel("Tokens/s generated", "short",
               [(f"sum by (cluster) (rate(vllm:generation_tokens_total{C}{R}))", "generated"),
                (f"sum by (cluster) (rate(vllm:prompt_tokens_total{C}{R}))", "prompt")]),
        _panel("Requests: running and waiting", "short",
               [(f"sum by (cluster) (vllm:num_requests_running{C})", "running"),
                (f"sum by (cluster) (vllm:num_requests_waiting{C})", "waiting")]),
        _panel("KV cache use", "percentunit", [(f"max by (cluster) (vllm:kv_cache_usage_perc{C})", "KV")]),
        _panel("Time to first token", "s",
               [(f"histogram_quantile(0.5, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{C}{R})))", "p50"),
                (f"histogram_quantile(0.95, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{C}{R})))", "p95")]),
        _panel("Speculative decoding: accepted tokens per step", "short",
               [(f"1 + {accepted} / {drafts}", "accepted/step"),
                (f"vector({acceptance_floor:g})", "recipe's floor")]),
        _panel("Speculative decoding: acceptance per draft position", "percentunit",
               [(f"sum by (position) (rate(vllm:spec_decode_num_accepted_tokens_per_pos_total{C}{R})) "
                 f"/ ignoring (position) group_left sum(rate(vllm:spec_decode_num_drafts_total{C}{R}))",
                 "position {{position}}")]),
        _panel("Sampler CPU (share of a core)", "percentunit",
               [(f"rate(sparkstack_sampler_cpu_seconds_total{C}{R})", RANK_LEGEND)]),
    ]


def _layout(items: list[dict]) -> list[dict]:
    """Two panels a row, each 12 wide and 8 high, ids in order."""
    return [{**p, "id": i + 1, "gridPos": {"x": 12 * (i % 2), "y": 8 * (i // 2), "w": 12, "h": 8}}
            for i, p in enumerate(items)]


def dashboard(acceptance_floor: float) -> dict:
    return {
        "title": "sparkstack", "uid": "sparkstack", "schemaVersion": 39, "version": 1,
        "tags": ["sparkstack", "vllm", "dgx-spark"], "time": {"from": "now-1h", "to": "now"},
        "refresh": "10s",
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
            {"name": "cluster", "type": "query", "label": "cluster",
             "datasource": {"type": "prometheus", "uid": "$datasource"},
             "query": "label_values(sparkstack_sampler_up, cluster)", "refresh": 2},
        ]},
        "panels": _layout(panels(acceptance_floor)),
    }
