"""What `sparkstack metrics write-config DIR` writes for an owner's Prometheus, Alertmanager and
Grafana: pure data, from the exporter's address and a few choices.

- prometheus.yml: scrapes the exporter (`sparkstack metrics serve`), loads the rules, sends alerts
  to Alertmanager;
- sparkstack-rules.yml: a rank below its planned memory floor, an engine container down, a rank
  whose sampler stopped, a restart loop, a wedged engine (requests running, no token produced),
  fabric error counters rising, speculative acceptance below the recipe's figure;
- alertmanager.yml: every alert to one webhook (dgx-spark-cli's way: a URL the owner's chat or
  pager takes);
- sparkstack-dashboard.json: the Grafana dashboard (plan/dashboard.py).

The series are the exporter's (launcher/apply/exporter.py) and vLLM 0.33's own names.
"""

from __future__ import annotations

import json

import yaml

from .dashboard import dashboard

RULES_FILE = "sparkstack-rules.yml"
DASHBOARD_FILE = "sparkstack-dashboard.json"
# seed 000 (keys 3.0 bpw, MTP k=3): 1.8-2.5 accepted tokens per step; below the low end, the
# draft model or its weights are wrong for the served model
ACCEPTANCE_FLOOR = 1.8
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
DRAFTS = "vllm:spec_decode_num_drafts_total"


def acceptance_expr(window: str) -> str:
    """Accepted tokens per step (each step emits one token plus those accepted), per cluster."""
    return (f"1 + sum by (cluster) (rate({ACCEPTED}[{window}])) "
            f"/ sum by (cluster) (rate({DRAFTS}[{window}]))")


def _alert(name: str, expr: str, duration: str, severity: str, summary: str, fix: str) -> dict:
    return {"alert": name, "expr": expr, "for": duration, "labels": {"severity": severity},
            "annotations": {"summary": summary, "fix": fix}}


def alert_rules(acceptance_floor: float = ACCEPTANCE_FLOOR) -> dict:
    rank = "{{ $labels.cluster }} rank {{ $labels.rank }} ({{ $labels.host }})"
    return {"groups": [{"name": "sparkstack", "rules": [
        _alert("SparkstackMemoryBelowFloor",
               "sparkstack_memory_available_bytes < on (cluster, rank, host) sparkstack_memory_floor_bytes",
               "1m", "critical", f"{rank}: MemAvailable {{{{ $value | humanize1024 }}}}B, below the planned floor",
               "a GB10 out of unified memory freezes: stop what else holds memory on the rank, or plan a "
               "smaller KV pool (`sparkstack plan`)"),
        _alert("SparkstackEngineDown", "sparkstack_engine_running == 0", "1m", "critical",
               f"{rank}: the engine container is not running",
               "`sparkstack status` and `sparkstack logs` name the cause; `up --keep` re-deploys"),
        _alert("SparkstackRankNotSampled", "sparkstack_sampler_up == 0", "2m", "warning",
               f"{rank}: no sample from the rank (SSH or the rank itself is down)",
               "check the rank answers SSH (`sparkstack check`)"),
        _alert("SparkstackRestartLoop", "increase(sparkstack_restarts_total[1h]) >= 3", "0m", "critical",
               "{{ $labels.cluster }}: the supervisor re-deployed {{ $value | printf \"%.0f\" }} times in the last hour",
               "`sparkstack status` shows the last cause; fix it before the supervisor gives up"),
        _alert("SparkstackWedged",
               "sum by (cluster) (vllm:num_requests_running) > 0 "
               "and sum by (cluster) (rate(vllm:generation_tokens_total[2m])) == 0",
               "2m", "critical", "{{ $labels.cluster }}: requests run but no token was produced for 2 minutes",
               "a stuck scheduler still answers /health: `sparkstack down && sparkstack up`"),
        _alert("SparkstackFabricErrors", "increase(sparkstack_fabric_errors_total[5m]) > 0", "0m", "warning",
               f"{rank}: {{{{ $labels.hca }}}} {{{{ $labels.counter }}}} rose in the last 5 minutes",
               "errors before NCCL fails: check the cable and `sparkstack check` (link, MTU, GID)"),
        _alert("SparkstackSpecAcceptanceLow", f"{acceptance_expr('10m')} < {acceptance_floor:g}", "10m", "warning",
               "{{ $labels.cluster }}: {{ $value | printf \"%.2f\" }} accepted tokens per step, "
               f"below the recipe's {acceptance_floor:g}",
               "the speculator does not match the served weights: check the profile's image and checkpoint"),
    ]}]}


def prometheus_config(exporter: str, alertmanager: str, scrape_interval: str = "5s") -> dict:
    return {"global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
            "rule_files": [RULES_FILE],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
            "scrape_configs": [{"job_name": "sparkstack", "static_configs": [{"targets": [exporter]}],
                                "honor_labels": True}]}


def alertmanager_config(webhook_url: str) -> dict:
    return {"route": {"receiver": "webhook", "group_by": ["cluster", "alertname"],
                      "group_wait": "10s", "group_interval": "1m", "repeat_interval": "4h"},
            "receivers": [{"name": "webhook", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}]}


def files(exporter: str, alertmanager: str, webhook_url: str, scrape_interval: str = "5s",
          acceptance_floor: float = ACCEPTANCE_FLOOR) -> dict[str, str]:
    """File name -> content, as `write-config` writes them."""
    def dump(doc: dict) -> str:
        return yaml.safe_dump(doc, sort_keys=False, width=120)

    return {"prometheus.yml": dump(prometheus_config(exporter, alertmanager, scrape_interval)),
            RULES_FILE: dump(alert_rules(acceptance_floor)),
            "alertmanager.yml": dump(alertmanager_config(webhook_url)),
            DASHBOARD_FILE: json.dumps(dashboard(acceptance_floor), indent=2) + "\n"}
