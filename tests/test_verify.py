"""`verify`'s judging (pure, launcher/check/verify.py) and its reading of a served API
(launcher/apply/verify.py) against the stand-in vLLM run as a real process on loopback: a good
image passes, an overlay whose logits are noise fails, one that is wrong only at 4+ concurrent
requests fails only crowded, and a server without prompt logprobs is refused."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from launcher.apply import verify as verifying
from launcher.check import verify as judging
from launcher.check.verify import Baseline, Measured, ProbeAnswer, TextFigure
from launcher.transport import api
from test_standin_vllm import Standin

HELDOUT = Path(verifying.HELDOUT_DIR)


def figure(name="prose", ppl=3.0, sha="a" * 64) -> TextFigure:
    return TextFigure(name, sha, 1000, 1, ppl)


def answers(wrong_at=()) -> tuple[ProbeAnswer, ...]:
    out = []
    for n in judging.CONCURRENCY:
        for p in judging.PROBES:
            got = " garbage" if n in wrong_at else " " + p.expected
            out.append(ProbeAnswer(p.name, n, p.expected, got, judging.answered(p, got)))
    return tuple(out)


def measured(figures=(figure(),), wrong_at=(), missing=None) -> Measured:
    return Measured("quick", tuple(figures), answers(wrong_at), 1.0, missing)


# ---------------------------------------------------------------- judging (pure)

def test_without_a_baseline_the_sane_bound_judges():
    assert judging.judge(measured([figure(ppl=40.0)]), None).ok
    bad = judging.judge(measured([figure(ppl=600.0)]), None)
    assert not bad.ok and [line.what for line in bad.failed] == ["perplexity prose"]
    assert "sane bound" in bad.failed[0].bound and "gibberish" in bad.fix
    assert any("--record-baseline" in note for note in bad.notes)


def test_a_baseline_holds_each_text_to_two_percent_of_itself():
    base = Baseline({"profile": "x"}, (figure(ppl=3.0),), "2026-12-02T00:00:00+00:00")
    assert judging.judge(measured([figure(ppl=3.05)]), base).ok  # +1.7 %
    moved = judging.judge(measured([figure(ppl=3.1)]), base)  # +3.3 %: far below the sane bound, still a change
    assert not moved.ok and "baseline 3.000" in moved.failed[0].bound and "baseline" in moved.fix
    # a text the baseline does not know (another hash) falls back to the sane bound
    other = judging.judge(measured([figure(ppl=3.1, sha="b" * 64)]), base)
    assert other.ok and "sane bound" in other.lines[0].bound


def test_probes_wrong_only_crowded_name_the_tp_kernels():
    result = judging.judge(measured(wrong_at=(4, 8)), None)
    assert not result.ok
    assert [line.what for line in result.failed] == ["probes 4 at once", "probes 8 at once"]
    assert "concurrency" in result.fix and "'garbage'" in result.failed[0].measured


def test_missing_logprobs_refused_unless_the_engine_may_lack_them():
    m = measured(figures=(), missing="the server gave no prompt logprobs")
    refused = judging.judge(m, None, logprobs_required=True)
    assert not refused.ok and refused.failed[0].what == "prompt logprobs" and "prompt_logprobs" in refused.fix
    tensorfold = judging.judge(m, None, logprobs_required=False)
    assert tensorfold.ok and "the server gave no prompt logprobs" in tensorfold.notes


def test_the_deploy_history_keeps_a_verdict_of_status_figures_and_message():
    """history.verdict of a judged result: what `up`/`upgrade`/`rollback` record (a few hundred
    bytes: each text's perplexity, each concurrency's probes, the baseline held to)."""
    from launcher.apply import history

    base = Baseline({"profile": "x"}, (figure(ppl=3.0),), "2026-12-02T00:00:00+00:00")
    passed = history.verdict(judging.judge(measured([figure(ppl=3.01)]), base))
    assert passed["status"] == "passed"
    assert passed["figures"] == {"form": "quick", "seconds": 1.0, "perplexity": {"prose": 3.01},
                                 "probes": {"alone": "4/4 right", "4 at once": "4/4 right", "8 at once": "4/4 right"},
                                 "baseline": "2026-12-02T00:00:00+00:00"}
    assert passed["message"].startswith("verify (quick) passed: perplexity prose 3.010")
    crowded = history.verdict(judging.judge(measured(wrong_at=(4, 8)), None))
    assert crowded["status"] == "failed" and crowded["figures"]["probes"]["4 at once"] == "0/4 right"
    assert crowded["figures"]["baseline"] is None
    assert crowded["message"].splitlines()[1].startswith("  probes 4 at once: 0/4 right: counting: 'garbage'")
    assert len(json.dumps(crowded)) < 1000
    shown = SimpleNamespace(id=1, at="t", how="up", outcome="serving", profile="p", image="i", ranks=[],
                            verify=passed, downtime_s=None, error=None, note=None)
    assert "verify passed (prose 3.010)" in history.line(shown)
    missing = history.verdict(judging.judge(measured(figures=(), missing="no prompt logprobs"), None, False))
    assert missing["status"] == "passed" and missing["figures"]["no_logprobs"] == "no prompt logprobs"
    assert missing["figures"]["perplexity"] == {}


def test_a_skipped_or_unavailable_verification_is_recorded_as_such():
    from launcher.apply import history, verify as verifying_mod

    assert history.verdict(None) == {"status": "not available"}
    assert history.SKIPPED == {"status": "skipped"}
    assert verifying_mod.chosen(True) is False and verifying_mod.chosen(False) is verifying_mod.quick


def _rank0():
    return SimpleNamespace(connections=[SimpleNamespace(target=SimpleNamespace(name="rank 0 (spark1)"))])


def _seam(monkeypatch, verify):
    """deploy._verify with `verify`, the ranks' stop faked: (report, said, stops)."""
    from launcher.apply import deploy, serve

    stops, said = [], []
    monkeypatch.setattr(serve, "stop_and_say", lambda group: stops.append(group) or "every rank's container was stopped")
    report = deploy.UpReport()
    deploy._verify(None, _rank0(), report, verify, said.append)
    return report, said, stops


def test_up_verifies_through_the_seam_and_a_failure_stops_every_rank(monkeypatch):
    from launcher.apply import deploy

    good = judging.judge(measured(), None)
    report, said, stops = _seam(monkeypatch, lambda loaded: good)
    assert report.verify["status"] == "passed" and "verified" in report.steps and not stops
    assert any(line.startswith("  verify (quick) passed") for line in said)

    bad = judging.judge(measured(wrong_at=(4, 8)), None)
    with pytest.raises(deploy.VerifyFailed) as raised:
        deploy._verify(None, _rank0(), deploy.UpReport(), lambda loaded: bad, lambda line: None)
    message = raised.value.message
    assert "answers, but what it serves failed verification, so it is not serving" in message
    assert "probes 4 at once: 0/4 right" in message and "every rank's container was stopped" in message
    assert "fix: the model answers right alone but wrong when requests batch" in message

    skipped, said, stops = _seam(monkeypatch, False)
    assert skipped.verify == {"status": "skipped"} and "verified" not in skipped.steps and not stops
    assert said == ["not verified (--no-verify): nothing has checked that the model answers right"]
    none, said, _ = _seam(monkeypatch, None)
    assert none.verify == {"status": "not available"} and not said


def test_a_verification_that_cannot_run_stops_every_rank(monkeypatch):
    from launcher.apply import deploy, serve
    from launcher.errors import SparkstackError

    def cannot(loaded):
        raise SparkstackError("verify: rank 0's API at http://x did not answer")

    monkeypatch.setattr(serve, "stop_and_say", lambda group: "every rank's container was stopped")
    with pytest.raises(deploy.VerifyFailed) as raised:
        deploy._verify(None, _rank0(), deploy.UpReport(), cannot, lambda line: None)
    assert raised.value.message.startswith("the verification could not run: verify: rank 0's API")
    assert raised.value.message.endswith("the model is not serving: every rank's container was stopped")


def test_card_figures_are_context_only():
    result = judging.judge(measured([figure(ppl=50.0)]), None)  # far above every card's 2.9-4.8
    assert result.ok
    assert any("3.560" in f for _c, f in result.context)
    assert result.to_json()["context_not_thresholds"][0]["figures"].startswith("prose 3.560")


def test_held_out_texts_are_shipped_with_a_cc0_header_and_hashed():
    readme = (HELDOUT / "README.md").read_text()
    assert "CC0" in readme
    for text in verifying.held_out():
        data = (HELDOUT / f"{text.name}.txt").read_bytes()
        assert len(data) > 8000 and text.sha256 == hashlib.sha256(data).hexdigest()
        assert text.sha256 in readme  # the README names the hash each figure is recorded with


def test_chunks_cut_at_line_breaks_and_lose_nothing():
    text = verifying.held_out()[1].text
    pieces = verifying.chunked(text, 1000)
    assert "".join(pieces) == text and all(len(p) <= 1000 for p in pieces)
    assert all(p.endswith("\n") for p in pieces[:-1])


# ---------------------------------------------------------------- through a served API

def fault_site(tmp: Path, fault: str | None) -> dict:
    """An image's `vllm` package whose overlay declares `fault`, on the stand-in's PYTHONPATH."""
    site = tmp / "site"
    (site / "vllm" / "model_executor").mkdir(parents=True)
    body = "SANDBOX_PATCH = 'exl3'\n" + (f"SANDBOX_FAULT = {fault!r}\n" if fault else "")
    (site / "vllm" / "model_executor" / "exl3.py").write_text(body)
    return {"PYTHONPATH": str(site), "SANDBOX_VLLM_TOKENS_PER_S": "200", "SANDBOX_VLLM_TTFT_S": "0.2"}  # long enough that 4 probes overlap on a loaded machine


@pytest.fixture
def served(tmp_path):
    running = []

    def start(fault: str | None) -> api.Endpoint:
        s = Standin(tmp_path / (fault or "good").replace(":", "-"), ["--max-model-len", "8192",
                    "--served-model-name", "glm"], fault_site(tmp_path / (fault or "good").replace(":", "-"), fault))
        running.append(s.wait_healthy())
        return api.Endpoint(f"http://127.0.0.1:{s.port}", "glm", None)

    yield start
    for s in running:
        assert s.stop() == 0, s.stderr


def test_the_good_image_passes(served):
    result = judging.judge(verifying.measure(served(None), quick=True), None)
    assert result.ok, result.lines
    assert {f.name for f in result.measured.figures} == {"prose", "code"}
    assert all(20 < f.perplexity < 60 for f in result.measured.figures)
    assert sorted({a.concurrency for a in result.measured.answers}) == [1, 4, 8]


def test_an_overlay_whose_logits_are_noise_fails(served):
    result = judging.judge(verifying.measure(served("noise"), quick=True), None)
    assert not result.ok
    failed = {line.what for line in result.failed}
    assert {"perplexity prose", "perplexity code", "probes alone"} <= failed
    assert all(f.perplexity > 400 for f in result.measured.figures)


def test_an_overlay_wrong_only_crowded_fails_only_crowded(served):
    result = judging.judge(verifying.measure(served("crowded:4"), quick=True), None)
    assert not result.ok
    assert [line.what for line in result.failed] == ["probes 4 at once", "probes 8 at once"]


def test_the_full_form_reads_every_chunk(served):
    full = verifying.measure(served(None), quick=False)
    quick_tokens = verifying.QUICK_CHARS - 1
    assert all(f.chunks >= 2 and f.tokens > 2 * quick_tokens for f in full.figures)
    assert len(full.answers) == verifying.FULL_ROUNDS * sum(judging.CONCURRENCY)


class NoLogprobs(BaseHTTPRequestHandler):
    """An OpenAI-compatible server that ignores prompt_logprobs (as a non-vLLM one may)."""

    def do_GET(self):
        self._send({"data": [{"id": "glm"}]})

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self._send({"choices": [{"index": 0, "text": " 42", "finish_reason": "stop"}]})

    def _send(self, obj):
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_a_server_without_prompt_logprobs_is_refused_with_a_clear_message():
    server = ThreadingHTTPServer(("127.0.0.1", 0), NoLogprobs)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        ep = api.Endpoint(f"http://127.0.0.1:{server.server_address[1]}", "glm", None)
        m = verifying.measure(ep, quick=True)
    finally:
        server.shutdown()
    assert m.figures == () and "gave no prompt logprobs" in m.no_logprobs
    result = judging.judge(m, None, logprobs_required=True)
    assert not result.ok and "prompt logprobs" in {line.what for line in result.failed}


def test_a_noisy_answer_with_special_tokens_still_decodes():
    """Noise emits any token, specials included: the stand-in's reply text leaves them out (vLLM's
    skip_special_tokens) instead of failing the request."""
    import sys

    sys.path.insert(0, str(Path(verifying.__file__).parents[1] / "sandbox" / "standins"))
    import standin_lm
    import standin_requests

    seen_special = False
    for seed in range(40):
        job = standin_requests.Completion({"prompt": "Count on: 1, 2, 3,", "max_tokens": 16}, ["m"], None,
                                          standin_lm.Model(seed, noise=True), "unused")
        seen_special |= any(256 <= t != standin_lm.EOS for t in job.tokens)
        assert bytes(job.text_tokens).decode("utf-8", errors="replace") is not None
    assert seen_special
