"""`sparkstack bench` against the sandbox's stand-in vLLM, over real HTTP on 127.0.0.1: the rates,
TTFT, acceptance and needle it measures must match what the stand-in was set to, and every
failure (down, 401, malformed chunks, Ctrl+C) must end in a clear message with what was measured
kept. The pure parts (Prometheus text, statistics, the stream reader, prompts) are tested alone."""

from __future__ import annotations

import glob
import http.client
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from launcher.bench import run as bench
from launcher.bench import needle
from launcher.bench import results
from launcher.bench import stats
from launcher.bench import stream
from launcher.cli.commands import main
from standin_env import model_dir, roomy_env

ROOT = Path(__file__).resolve().parents[1]
STANDIN = ROOT / "launcher" / "sandbox" / "standins" / "standin_vllm.py"
FLAGS = ROOT / "launcher" / "inputs" / "data" / "vllm-serve-flags-0.33.json"
KEY = "sk-bench"
# Timings are checked against what the stand-in cannot beat (it never answers before its TTFT plus
# prefill, never ends a stream before its rate allows), and above that only loosely: a loaded
# 2-CPU box delays a token by hundreds of ms now and then.
RATE, TTFT, PREFILL, ACCEPTED = 50.0, 0.5, 20000.0, 1.5
SPEC = '{"method":"mtp","num_speculative_tokens":3}'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Standin:
    """One stand-in `vllm serve` process on a free loopback port."""

    def __init__(self, tmp: Path, args: list[str], env: dict[str, str] | None = None):
        self.port = free_port()
        self.stderr_path = tmp / "standin.log"
        env = {**os.environ, "SANDBOX_VLLM_FLAGS": str(FLAGS),
               "SANDBOX_VLLM_RECORD": str(tmp / "record.json"), **roomy_env(tmp), **(env or {})}
        env.pop("VLLM_API_KEY", None)  # the stand-in would take it as its key
        argv = [sys.executable, str(STANDIN), "serve", str(model_dir(tmp)), "--host", "127.0.0.1",
                "--port", str(self.port), *args]
        with open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 10
        while True:
            assert self.proc.poll() is None, self.stderr_path.read_text()
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, self.stderr_path.read_text()
                time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def generated(self) -> float:
        metrics = stats.parse_prometheus(httpx.get(f"{self.url}/metrics").text)
        return metrics["vllm:generation_tokens_total"]

    def stop(self) -> None:
        self.proc.terminate()
        assert self.proc.wait(timeout=10) == 0, self.stderr_path.read_text()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """MTP k=3 with an API key and a served name, at a known decode rate, TTFT and prefill; with
    a reasoning parser, so thinking comes as vLLM 0.33's `reasoning` field."""
    env = {"SANDBOX_VLLM_TOKENS_PER_S": str(RATE), "SANDBOX_VLLM_TTFT_S": str(TTFT),
           "SANDBOX_VLLM_PREFILL_TOKENS_PER_S": str(PREFILL),
           "SANDBOX_VLLM_ACCEPTED_PER_DRAFT": str(ACCEPTED)}
    s = Standin(tmp_path_factory.mktemp("good"), ["--served-model-name", "glm", "--api-key", KEY,
                                                   "--speculative-config", SPEC,
                                                   "--reasoning-parser", "glm45"], env)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def malformed(tmp_path_factory):
    s = Standin(tmp_path_factory.mktemp("bad"), ["--served-model-name", "glm"],
                {"SANDBOX_VLLM_FAIL": "malformed", "SANDBOX_VLLM_TOKENS_PER_S": "200"})
    yield s
    s.stop()


def run_bench(*args: str, env: dict | None = None):
    env = {"SPARKSTACK_API_KEY": None, **(env or {})}  # the runner's own environment is not used
    result = CliRunner().invoke(main, ["bench", *args], env=env)
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def written(out: Path, suffix: str) -> Path:
    files = glob.glob(str(out / f"sparkstack-bench-*.{suffix}"))
    assert len(files) == 1, files
    return Path(files[0])


def near(value: float, expected: float, tolerance: float = 0.10) -> bool:
    return abs(value - expected) <= tolerance * expected


def first_token_at(request: dict) -> float:
    """The earliest the stand-in can send a request's first token: its TTFT plus the prefill
    (less 0.1 ms: the bench's JSON rounds timings to 4 decimals)."""
    return TTFT + request["prompt_tokens"] / PREFILL - 1e-4


def timed_as_configured(r: dict) -> bool:
    """One request's figures: TTFT and wall no shorter than the stand-in allows; the decode rate
    is the tokens over the decode time, within a factor 2 of the configured rate (counting
    MTP steps instead of tokens would be 2.5 times off)."""
    n = r["completion_tokens"]
    return (first_token_at(r) <= r["ttft_s"] < first_token_at(r) + 1.0
            and r["wall_s"] >= first_token_at(r) + (n - 1) / RATE
            and r["decode_tok_s"] == pytest.approx(n / (r["wall_s"] - r["ttft_s"]), rel=1e-3)
            and RATE / 2 < r["decode_tok_s"] < 2 * RATE)


# ---------------------------------------------------------------- against the stand-in

def test_measures_the_rate_ttft_acceptance_and_needle(server, tmp_path):
    out = tmp_path / "out"
    result = run_bench("--url", server.url, "--api-key", KEY, "--tasks", "prose,code",
                       "--concurrency", "1,2", "--max-tokens", "48", "--needle", "1k,2k",
                       "--out", str(out), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["status"] == "complete" and data["error"] is None and data["notes"] == []
    assert data["target"] == {"url": server.url, "model": "glm", "source": "--url",
                              "api_key": "***"}
    assert [(c["task"], c["concurrency"]) for c in data["results"]] == [
        ("prose", 1), ("prose", 2), ("code", 1), ("code", 2)]
    for cell in data["results"]:
        rates = [r["decode_tok_s"] for r in cell["requests"]]
        assert len(rates) == cell["concurrency"]
        # every stream gets the full per-stream rate (a shared rate would halve it at C2)
        assert RATE / 2 < cell["per_stream_tok_s"] < 2 * RATE, cell
        assert min(rates) <= cell["per_stream_tok_s"] <= max(rates), cell
        assert cell["aggregate_tok_s"] == pytest.approx(sum(rates), abs=1e-3)
        assert cell["accepted_per_step"] == pytest.approx(1 + ACCEPTED, abs=0.05), cell
        for r in cell["requests"]:
            assert r["completion_tokens"] == 48 and r["tokens_from"] == "usage"
            assert timed_as_configured(r), r
        assert cell["ttft_s"]["median"] <= cell["ttft_s"]["p90"]
    assert data["tasks"]["code"]["accepted_per_step"] == pytest.approx(1 + ACCEPTED, abs=0.05)
    for needle, size in zip(data["needle"], (1000, 2000)):
        assert needle["passed"] and needle["expected"] in needle["answer"], needle
        assert near(needle["prompt_tokens"], size) and needle["prompt_tokens_from"] == "usage"
        assert first_token_at(needle) <= needle["ttft_s"] < first_token_at(needle) + 1.0, needle
        assert needle["prefill_tok_s"] == pytest.approx(
            needle["prompt_tokens"] / needle["ttft_s"], rel=1e-3)
    assert json.loads(written(out, "json").read_text()) == data
    png = written(out, "png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000


def test_table_and_config_target(server, tmp_path, write_config):
    """Without --url: rank 0's address, overrides.api_port/api_key, model.served_name; thinking on
    makes the first token a reasoning token, which TTFT counts."""

    def edit(d):
        d["ranks"][0]["address"] = "127.0.0.1"
        d["model"]["served_name"] = "glm"
        d["overrides"].update(api_port=server.port, api_key=KEY)

    path = write_config(edit)
    result = run_bench("-c", str(path), "--tasks", "list", "--concurrency", "1",
                       "--max-tokens", "32", "--thinking", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    data = json.loads(written(tmp_path, "json").read_text())
    accepted = data["tasks"]["list"]["accepted_per_step"]
    assert accepted == pytest.approx(1 + ACCEPTED, abs=0.1)
    for text in ("glm at http://127.0.0.1:", "tok/s", "C1", "TTFT s", "accepted/step", "list",
                 "/stream", f"{accepted:.2f}", "thinking on", f"wrote {tmp_path}"):
        assert text in result.output, result.output
    assert data["target"]["source"] == f"{path} (rank 0 spark1)"
    assert data["settings"]["temperature"] == 0.6 and data["settings"]["top_p"] == 0.95
    request = data["results"][0]["requests"][0]
    # the first 12 of the 32 tokens are reasoning at 50 tok/s: the first content token cannot
    # come before 0.24 s after the first token, so a TTFT counting only content is at least that late
    reasoning = min(len(standin_module().REASONING), 32 // 2)
    assert first_token_at(request) <= request["ttft_s"] < first_token_at(request) + reasoning / RATE, request


def test_needle_near_the_context_limit_runs(tmp_path):
    """A needle whose prompt fits but prompt + max_tokens does not: vLLM 0.33 shortens max_tokens
    (the stand-in answered 400 before, so a needle that runs on a Spark failed in the sandbox)."""
    (tmp_path / "srv").mkdir()
    s = Standin(tmp_path / "srv", ["--served-model-name", "glm", "--max-model-len", "2100"],
                {"SANDBOX_VLLM_TOKENS_PER_S": "400"})
    try:
        result = run_bench("--url", s.url, "--tasks", "list", "--concurrency", "1",
                           "--max-tokens", "256", "--needle", "2k", "--thinking",
                           "--out", str(tmp_path), "--json")
        assert result.exit_code == 0, result.output
        (needle,) = json.loads(result.stdout)["needle"]
        assert needle["passed"] and needle["prompt_tokens"] < 2100 < needle["prompt_tokens"] + 256, needle
    finally:
        s.stop()


def test_server_down_is_a_clear_error(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    result = run_bench("--url", url, "--out", str(tmp_path))
    assert result.exit_code == 1
    assert f"error: cannot connect to {url} (connection refused)" in result.output
    assert "sparkstack up" in result.output and "--url" in result.output
    assert list(tmp_path.iterdir()) == []  # nothing was measured, nothing to keep


@pytest.mark.parametrize("key", [None, "wrong"])
def test_401_asks_for_an_api_key(server, tmp_path, key):
    result = run_bench("--url", server.url, "--out", str(tmp_path),
                       env={"SPARKSTACK_API_KEY": key})
    assert result.exit_code == 1
    assert f"the server at {server.url} wants an API key" in result.output
    assert "pass --api-key or set overrides.api_key" in result.output


def test_unknown_model_names_what_is_served(server, tmp_path):
    result = run_bench("--url", server.url, "--model", "other", "--out", str(tmp_path),
                       env={"SPARKSTACK_API_KEY": KEY})  # the key from the environment
    assert result.exit_code == 1 and "serves glm, not 'other'" in result.output


def test_malformed_chunks_from_the_start(malformed, tmp_path):
    result = run_bench("--url", malformed.url, "--out", str(tmp_path))
    assert result.exit_code == 1
    assert f"error: {malformed.url} sent a malformed stream chunk (not JSON" in result.output
    assert 'data: {"id": "chatcmpl-broken"' in result.output
    data = json.loads(written(tmp_path, "json").read_text())
    assert data["status"] == "failed" and "malformed" in data["error"] and data["results"] == []


class SwitchingProxy:
    """A loopback HTTP proxy sending the first `after` chat completions to one server and the
    rest to another, passing streams through as they come: a server that goes bad mid-run."""

    def __init__(self, good: int, bad: int, after: int):
        self.count, self.lock = 0, threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                self.forward(good)

            def do_POST(self):
                with proxy.lock:
                    proxy.count += 1
                    chosen = good if proxy.count <= after else bad
                self.forward(chosen)

            def forward(self, port: int):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                keep = {k: v for k, v in self.headers.items()
                        if k.lower() in ("authorization", "content-type")}
                try:
                    conn.request(self.command, self.path, body=body or None, headers=keep)
                    resp = conn.getresponse()
                    self.send_response(resp.status)
                    self.send_header("Content-Type", resp.getheader("Content-Type", "text/plain"))
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    while data := resp.read1(65536):
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                except OSError:
                    pass  # either side hung up on a broken stream, as the bench should
                finally:
                    conn.close()

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass  # a hung-up connection; the default prints into CliRunner's captured stderr

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_malformed_chunks_mid_run_keep_what_was_measured(server, malformed, tmp_path):
    proxy = SwitchingProxy(server.port, malformed.port, after=2)  # warm-up, prose C1, then bad
    try:
        result = run_bench("--url", proxy.url, "--api-key", KEY, "--tasks", "prose,code",
                           "--concurrency", "1", "--max-tokens", "16", "--out", str(tmp_path))
    finally:
        proxy.close()
    assert result.exit_code == 1
    assert "sent a malformed stream chunk" in result.output
    assert "prose" in result.output and "the results above are what completed" in result.output
    data = json.loads(written(tmp_path, "json").read_text())
    assert data["status"] == "failed" and "malformed stream chunk" in data["error"]
    assert [(c["task"], c["concurrency"]) for c in data["results"]] == [("prose", 1)]
    assert data["results"][0]["per_stream_tok_s"] > 0
    assert written(tmp_path, "png").stat().st_size > 0


def test_ctrl_c_stops_and_keeps_what_was_measured(server, tmp_path):
    """SIGINT while the second cell streams: exit 130, the first cell written, the second not."""
    start = server.generated()
    code = ("import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "from launcher.cli.commands import main; main()")
    argv = [sys.executable, "-c", code, "bench", "--url", server.url, "--api-key", KEY,
            "--tasks", "prose,code", "--concurrency", "1", "--max-tokens", "64",
            "--out", str(tmp_path)]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        deadline = time.monotonic() + 20
        # warm-up (16 tokens) and prose C1 (64) done, code C1 ten tokens in
        while server.generated() - start < bench.WARMUP_TOKENS + 64 + 10:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, output
    assert "stopped by Ctrl+C" in output and "Traceback" not in output
    data = json.loads(written(tmp_path, "json").read_text())
    assert data["status"] == "interrupted"
    assert [(c["task"], c["concurrency"]) for c in data["results"]] == [("prose", 1)]


def test_bad_flags_are_usage_errors():
    for args, message in [(["--concurrency", "1,zero"], "'zero' is not a positive whole number"),
                          (["--tasks", "poetry"], "unknown task poetry (known: prose, code"),
                          (["--needle", "8q"], "'8q' is not a size like 8k"),
                          (["--top-p", "0"], "--top-p"),
                          (["--url", "http:///v1"], "is not a server address like http://")]:
        result = CliRunner().invoke(main, ["bench", "--url", "127.0.0.1:1", *args])
        assert result.exit_code == 2 and message in result.output, result.output


@pytest.mark.parametrize("url", ["not a url", "http://not a url", "spark1:99999", "spark1:port", "ftp://spark1",
                                 "http://-spark1-:8888", "http://spark1:8888/v1 x", "http://[::1", "http://spark1\u2028x",
                                 "http://user:pw@spark1:8888", "http://spark1:8888/?q=1", "http://spark1:８８"])
def test_a_url_that_is_no_server_address_is_a_usage_error_with_no_lookup(monkeypatch, url):
    """Issue 33, item 10: `bench --url 'not a url'` was taken (a DNS lookup for "not", then exit 1)."""
    import socket

    looked_up = []
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: looked_up.append(a) or [])
    result = CliRunner().invoke(main, ["bench", "--url", url])
    assert result.exit_code == 2 and "is not a server address like http://HOST:PORT" in result.output, result.output
    assert looked_up == [] and "Traceback" not in result.output


# ---------------------------------------------------------------- pure parts

def test_prometheus_text_sums_label_sets():
    text = "\n".join([
        "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
        "# TYPE vllm:spec_decode_num_drafts_total counter",
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="GLM 5.3 {x}"} 10.0',
        'vllm:spec_decode_num_drafts_total{engine="1",model_name="GLM 5.3 {x}"} 30 1700000000000',
        'vllm:spec_decode_num_accepted_tokens_total{model_name="a\\"b"} 55',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 7',
        "process_open_fds 12", "broken line", "nan_metric NaN", ""])
    metrics = stats.parse_prometheus(text)
    assert metrics[stats.DRAFTS] == 40 and metrics[stats.ACCEPTED] == 55
    assert metrics["process_open_fds"] == 12 and "nan_metric" not in metrics
    before = stats.SpecCounters.from_metrics({stats.ACCEPTED: 5, stats.DRAFTS: 10})
    after = stats.SpecCounters.from_metrics(metrics)
    assert stats.accepted_per_step([stats.spec_delta(before, after)]) == pytest.approx(2.66667,
                                                                                       abs=1e-4)
    assert stats.SpecCounters.from_metrics({"process_open_fds": 1}) is None
    assert stats.accepted_per_step([None]) is None
    assert stats.accepted_per_step([stats.SpecCounters(0, 0)]) is None


def test_statistics():
    assert stats.decode_rate(64, 1.5, 0.2) == pytest.approx(64 / 1.3)
    assert stats.decode_rate(1, 0.3, 0.2) is None and stats.decode_rate(10, 1.0, None) is None
    assert stats.percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.5
    assert stats.percentile([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0], 90) == \
        pytest.approx(9.1)
    assert stats.percentile([0.7], 90) == 0.7 and stats.percentile([], 50) is None


def test_inputs():
    assert bench.parse_counts("1, 2,4,8,2") == (1, 2, 4, 8)
    assert bench.parse_sizes("8k,32K,128k,1m,500") == (8000, 32000, 128000, 1_000_000, 500)
    labels = [results.size_label(n) for n in (8000, 1_000_000, 2500, 500)]
    assert labels == ["8k", "1m", "2.5k", "500"]
    for bad in ("0", "x", ""):
        with pytest.raises(ValueError):
            bench.parse_counts(bad)
    assert bench.normalize_url("spark1:8888") == "http://spark1:8888"
    assert bench.normalize_url("http://spark1:8888/v1/") == "http://spark1:8888"
    assert bench.normalize_url("https://[fd00::1]:8443/") == "https://[fd00::1]:8443"
    assert bench.normalize_url(" 10.0.0.11:8888 ") == "http://10.0.0.11:8888"
    assert bench.normalize_url("http://proxy.lan/spark/v1") == "http://proxy.lan/spark"
    with pytest.raises(ValueError):
        bench.normalize_url("http://")


def test_profile_sampling_defaults_and_overrides():
    from launcher.inputs.profile import load_profile

    assert bench.profile_sampling(None) == (0.6, 0.95)
    profile = load_profile("keys-1m-dcp4")
    assert bench.profile_sampling(profile) == (0.6, 0.95)  # seed 000's measuring settings
    tuned = profile.model_copy(update={"bench": profile.bench.model_copy(update={"temperature": 1.0})})
    assert bench.profile_sampling(tuned) == (1.0, 0.95)


def standin_module():
    spec = importlib.util.spec_from_file_location("standin_vllm", STANDIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prompts_and_needle_prompt():
    prompts = bench.load_prompts()
    assert list(prompts) == list(results.DEFAULT_TASKS)
    standin = standin_module()
    for task, messages in prompts.items():
        # a task prompt must not look like a needle question (the stand-in would answer short)
        assert standin.find_needle(messages) is None, task
        assert standin.count_prompt_tokens(messages) > 50, task
    fact = "The secret code for the east vault is 1234-ORCHID."
    for position in (0.0, 0.5, 1.0):
        messages = needle.needle_messages(8000, position, fact, nonce=417)
        text = messages[0]["content"]
        assert text.startswith("Journal 417. ")  # no prefix shared with another needle prompt
        assert text.count(fact) == 1 and text.rstrip().endswith(needle.QUESTION)
        assert near(standin.count_prompt_tokens(messages), 8000, 0.02)
        at = text.index(fact) / len(text)
        assert abs(at - position) < 0.05, (position, at)
        assert standin.find_needle(messages) == fact


def feed(reader: stream.StreamReader, *payloads, start=0.0, step=0.1) -> results.Request:
    for i, payload in enumerate(payloads):
        data = payload if isinstance(payload, str) else json.dumps(payload)
        reader.feed(f"data: {data}", start + i * step)
        reader.feed("", start + i * step)
    return reader.result()


def delta(**fields) -> dict:
    return {"choices": [{"index": 0, "delta": fields, "finish_reason": None}]}


def test_stream_reader_counts_chunks_without_usage_and_reasoning_for_ttft():
    request = feed(stream.StreamReader(0.0, "srv"), delta(role="assistant", content=""),
                   delta(reasoning="Let"), delta(content="Hi"),
                   {"choices": [{"index": 0, "delta": {"content": " there"},
                                 "finish_reason": "stop"}]}, "[DONE]")
    assert request.ttft_s == pytest.approx(0.1)  # the reasoning token, not the first content
    assert request.completion_tokens == 3 and request.tokens_from == "chunks"
    assert request.content == "Hi there" and request.reasoning == "Let"
    assert request.wall_s == pytest.approx(0.4) and request.finish_reason == "stop"
    cell = results.Cell("prose", 1, [request], None)
    measured = results.Results(results.Target("http://x", "m"), results.Settings(), cells=[cell])
    assert any("counted from stream chunks" in n for n in measured.notes())
    assert any("exposes no vllm:spec_decode" in n for n in measured.notes())


@pytest.mark.parametrize("payload, message", [
    ('{"choices": [{"delta": {"content": "oo', "malformed stream chunk (not JSON"),
    ('{"object": "chat.completion.chunk"}', "without a `choices` list"),
    ('{"error": {"message": "engine died", "code": 500}}',
     "reported an error mid-stream: engine died"),
    ('{"choices": [{"delta": {"content": 5}}]}', "non-text content"),
])
def test_stream_reader_refuses_nonsense(payload, message):
    with pytest.raises(bench.BenchError, match=message.replace("(", r"\(")):
        feed(stream.StreamReader(0.0, "srv"), payload)


def test_stream_cut_short_is_an_error():
    with pytest.raises(bench.BenchError, match="ended the stream before the reply was complete"):
        feed(stream.StreamReader(0.0, "srv"), delta(content="Hi"))
