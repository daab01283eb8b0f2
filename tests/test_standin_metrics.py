"""The stand-in engine's /metrics is vLLM 0.33's (tests/golden/vllm-metrics-0.33.0.txt, recorded
from vLLM's own stat logger by scripts/record_vllm_metrics.py): the same family names, types,
HELP texts and labels; its running/waiting gauges are the scheduler's (requests beyond
--max-num-seqs wait); its KV usage grows while a long prompt is prefilled; and its wedge mode
(SIGUSR1) keeps /health answering while requests pile up and no token is produced.
No vLLM needed: the stand-in runs as a local process."""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from launcher.transport import engine_metrics
from test_standin_vllm import Standin, chat, http

GOLDEN = Path(__file__).resolve().parent / "golden" / "vllm-metrics-0.33.0.txt"
SAMPLE = re.compile(r'^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+\S+$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
# labels whose values are vLLM's own vocabulary (the rest: the model's name, engine, position)
VOCABULARY = ("le", "finished_reason", "reason", "sleep_state")
# what the kit reads (#29's liveness, the bench) and #32 names: the stand-in must expose them
REQUIRED = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
            "vllm:generation_tokens_total", "vllm:prompt_tokens_total",
            "vllm:time_to_first_token_seconds", "vllm:spec_decode_num_drafts_total",
            "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total",
            "vllm:spec_decode_num_accepted_tokens_per_pos_total")


def families(text: str) -> dict[str, dict]:
    """Exposition text -> family (its HELP name) -> type, HELP, and per sample name the label
    names and the values of VOCABULARY labels seen."""
    out: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            _, _, name, *doc = line.split(" ", 3)
            current = out.setdefault(name, {"help": " ".join(doc), "type": None, "samples": {}})
        elif line.startswith("# TYPE "):
            name = line.split()[2]
            current = out.setdefault(name, {"help": None, "type": None, "samples": {}})
            current["type"] = line.split()[3]
        elif line and not line.startswith("#"):
            m = SAMPLE.match(line)
            assert m, line
            labels = dict(LABEL.findall(m[2] or ""))
            seen = current["samples"].setdefault(m[1], {"labels": set(), "values": {}})
            seen["labels"].add(tuple(sorted(labels)))
            for k in VOCABULARY:
                if k in labels:
                    seen["values"].setdefault(k, set()).add(labels[k])
    return out


@pytest.fixture(scope="module")
def mtp(tmp_path_factory):
    """MTP k=3 as the keys profiles serve, two sequences at most, fast tokens."""
    tmp = tmp_path_factory.mktemp("mtp")
    server = Standin(tmp, ["--served-model-name", "glm", "--max-num-seqs", "2", "--speculative-config",
                           '{"method":"mtp","num_speculative_tokens":3}'],
                     {"SANDBOX_VLLM_TOKENS_PER_S": "200", "SANDBOX_VLLM_PREFILL_TOKENS_PER_S": "100"})
    yield server.wait_healthy()
    assert server.stop() == 0, server.stderr


def scrape(server) -> str:
    status, body = http(server.port, "/metrics")
    assert status == 200
    return body.decode()


def differences(text: str) -> list[str]:
    """How an exposition differs from vLLM 0.33's: families the kit needs that it lacks, and
    per family it has: not vLLM's, another type or HELP, other samples or labels."""
    real, ours = families(GOLDEN.read_text()), families(text)
    found = [f"{name}: missing" for name in REQUIRED if name not in ours]
    for name, fam in ours.items():
        if name not in real:
            found.append(f"{name}: not a vLLM 0.33 metric")
        elif (fam["type"], fam["help"]) != (real[name]["type"], real[name]["help"]):
            found.append(f"{name}: {fam['type']} {fam['help']!r}, vLLM's: {real[name]['type']} {real[name]['help']!r}")
        elif fam["samples"] != real[name]["samples"]:
            found.append(f"{name}: samples {fam['samples']}, vLLM's: {real[name]['samples']}")
    return found


def test_the_exposition_has_vllm_0_33s_names_types_help_and_labels(mtp):
    assert http(mtp.port, "/v1/chat/completions", chat(12))[0] == 200  # every series has a value
    assert differences(scrape(mtp)) == []


def test_the_old_exposition_fails_the_comparison():
    """The comparison can fail: the stand-in's exposition before (no HELP, no `_created`, `le`
    last, no waiting gauge, no KV usage, no per-position counter) is not vLLM's."""
    labels = 'engine="0",model_name="glm"'
    old = (f"# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{{{labels}}} 5.0\n"
           f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{{labels}}} 0.0\n")
    found = differences(old)
    assert "vllm:num_requests_waiting: missing" in found and "vllm:kv_cache_usage_perc: missing" in found
    assert any(f.startswith("vllm:generation_tokens_total: counter None") for f in found), found


def test_requests_beyond_max_num_seqs_wait_and_the_counters_add_up(mtp):
    before = engine_metrics.parse(scrape(mtp))
    done = []
    threads = [threading.Thread(target=lambda: done.append(http(mtp.port, "/v1/chat/completions", chat(60))))
               for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.15)
    busy = engine_metrics.parse(scrape(mtp))
    for t in threads:
        t.join()
    after = engine_metrics.parse(scrape(mtp))
    assert (busy[engine_metrics.RUNNING], busy[engine_metrics.WAITING]) == (2, 2), busy
    assert busy[engine_metrics.KV_USAGE] > 0
    assert [s for s, _ in done] == [200] * 4
    assert after[engine_metrics.GENERATED] - before[engine_metrics.GENERATED] == 240
    assert (after[engine_metrics.RUNNING], after[engine_metrics.WAITING], after[engine_metrics.KV_USAGE]) == (0, 0, 0)
    text = scrape(mtp)
    positions = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                 if line.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total{")]
    assert len(positions) == 3 and positions[0] >= positions[1] >= positions[2] > 0, positions
    assert sum(positions) == after[engine_metrics.ACCEPTED]
    assert abs(1 + after[engine_metrics.ACCEPTED] / after[engine_metrics.DRAFTS] - 2.5) < 0.1


def test_a_long_prompt_fills_the_kv_cache_while_it_is_prefilled(mtp):
    """No token for seconds, yet the engine is busy: the KV usage grows (what liveness reads)."""
    long = " ".join(["word"] * 300)  # 390 tokens at 100 tok/s of prefill: ~4 s
    thread = threading.Thread(target=lambda: http(mtp.port, "/v1/chat/completions", chat(2, text=long)))
    thread.start()
    time.sleep(0.5)
    first = engine_metrics.parse(scrape(mtp))
    time.sleep(1.0)
    second = engine_metrics.parse(scrape(mtp))
    thread.join()
    assert first[engine_metrics.RUNNING] == 1
    assert second[engine_metrics.GENERATED] == first[engine_metrics.GENERATED]
    assert second[engine_metrics.KV_USAGE] > first[engine_metrics.KV_USAGE] > 0


def test_a_wedged_engine_answers_health_but_produces_no_token(tmp_path):
    server = Standin(tmp_path, ["--max-num-seqs", "1", "--served-model-name", "glm"], {"SANDBOX_VLLM_TOKENS_PER_S": "100"}).wait_healthy()
    try:
        assert http(server.port, "/v1/chat/completions", chat(5))[0] == 200
        before = engine_metrics.parse(scrape(server))
        server.proc.send_signal(signal.SIGUSR1)
        server.wait_log("scheduler wedged")
        for _ in range(3):
            threading.Thread(target=lambda: http(server.port, "/v1/chat/completions", chat(5)),
                             daemon=True).start()
        time.sleep(1.0)
        wedged = engine_metrics.parse(scrape(server))
        assert http(server.port, "/health")[0] == 200
        assert wedged[engine_metrics.GENERATED] == before[engine_metrics.GENERATED] == 5
        assert wedged[engine_metrics.WAITING] == 3 and wedged[engine_metrics.RUNNING] == 0, wedged
    finally:
        assert server.stop() == 0, server.stderr  # SIGTERM still ends a wedged engine
    assert "SANDBOX STAND-IN" in server.stderr or "sandbox-standin" in server.stderr


def test_wedged_mid_request_the_request_stays_running(tmp_path):
    server = Standin(tmp_path, ["--served-model-name", "glm"], {"SANDBOX_VLLM_TOKENS_PER_S": "20"}).wait_healthy()
    try:
        threading.Thread(target=lambda: http(server.port, "/v1/chat/completions", chat(100)),
                         daemon=True).start()
        time.sleep(0.5)
        server.proc.send_signal(signal.SIGUSR1)
        server.wait_log("scheduler wedged")
        first = engine_metrics.parse(scrape(server))
        time.sleep(0.5)
        second = engine_metrics.parse(scrape(server))
        assert first[engine_metrics.RUNNING] == second[engine_metrics.RUNNING] == 1
        assert 0 < first[engine_metrics.GENERATED] == second[engine_metrics.GENERATED] < 100
    finally:
        assert server.stop() == 0, server.stderr


def test_the_exposition_escapes_and_writes_floats_as_prometheus_client_does():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "standin_metrics", Path(__file__).resolve().parents[1] / "launcher/sandbox/standins/standin_metrics.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    assert [m.go_float(v) for v in (1, 0.25, float("inf"), 1796171862.7899)] == ["1.0", "0.25", "+Inf", "1.7961718627899e+09"]
    assert m.labels({"model_name": 'a"b', "engine": "0"}) == '{engine="0",model_name="a\\"b"}'
    assert m.per_position(1000, 1.5, 3) == sorted(m.per_position(1000, 1.5, 3), reverse=True)
    assert abs(sum(m.per_position(1000, 1.5, 3)) - 1500) <= 2
    assert json.dumps(m.per_position(10, 5.0, 2)) == "[10, 10]"  # capped at k: all accepted
