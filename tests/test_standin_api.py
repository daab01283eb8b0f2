"""The stand-in vLLM's HTTP API against vLLM 0.33's own server, as recorded by
scripts/record_vllm_api.py (tests/fixtures/vllm033_api/cases.json: vLLM's app, serving classes,
renderer and AsyncLLM over a fake engine core that generates with the stand-in's own small model,
standin_lm). The stand-in runs as a real process with the recorded checkpoint config (so its model
is seeded alike) and `vllm serve MODEL --max-model-len 1000 --served-model-name glm`; each case is
sent to it and its status and body compared: errors to the letter, completions bodies whole
(ids, times and the configuration hash aside), chat bodies and stream chunks by their fields."""

from __future__ import annotations

import json
import math
import re
import urllib.request
from pathlib import Path

import pytest

from launcher.transport import api
from test_standin_vllm import Standin, http, load_module

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "vllm033_api" / "cases.json"
RECORDED = json.loads(FIXTURE.read_text())
CASES = RECORDED["cases"]
VARYING = ("id", "created", "system_fingerprint")  # per run, per configuration


def server(tmp_path_factory, name: str, extra: list[str]) -> Standin:
    tmp = tmp_path_factory.mktemp(name)
    config = json.loads(RECORDED["meta"]["config_json"])
    args = ["--max-model-len", "1000", "--served-model-name", "glm", *extra]
    return Standin(tmp, args, {"SANDBOX_VLLM_TOKENS_PER_S": "2000", "SANDBOX_VLLM_TTFT_S": "0"},
                   config=config).wait_healthy()


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    s = server(tmp_path_factory, "plain", [])
    yield s
    assert s.stop() == 0, s.stderr


@pytest.fixture(scope="module")
def parser(tmp_path_factory):
    s = server(tmp_path_factory, "parser", ["--reasoning-parser", "glm45"])
    yield s
    assert s.stop() == 0, s.stderr


def ask(port: int, path: str, body: dict):
    """(status, body or the list of SSE payloads)."""
    if not body.get("stream"):
        status, raw = http(port, path, body)
        return status, json.loads(raw)
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=30) as resp:
        events = [line.decode()[6:].strip() for line in resp if line.startswith(b"data: ")]
    return 200, [e if e == "[DONE]" else json.loads(e) for e in events]


def without_varying(body):
    if isinstance(body, list):
        return [without_varying(b) for b in body]
    if isinstance(body, dict):
        return {k: without_varying(v) for k, v in body.items() if k not in VARYING}
    return body


def shape(value):
    """Keys all the way down, with the kind of each leaf (None, or a value)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value[:1]]
    return None if value is None else "value"


def words(n: int) -> str:
    """A chat message the stand-in counts as round(1.3 n) prompt tokens."""
    return " ".join(["x"] * n)


# ---------------------------------------------------------------- errors, to the letter

COMPLETION_ERRORS = [n for n, c in CASES.items() if n.startswith("completion") and c["status"] != 200]


@pytest.mark.parametrize("name", COMPLETION_ERRORS)
def test_completion_refusals_are_vllms(plain, name):
    """Completions count tokens as vLLM's tokenizer over standin_lm's vocabulary does (a byte a
    token), so the same request gets the same status and the same body."""
    case = CASES[name]
    assert ask(plain.port, case["request"]["path"], case["request"]["body"]) == (
        case["status"], case["response"])


# The chat cases the stand-in must refuse: the same limits, with messages the stand-in counts as
# vLLM's tokenizer counted the recorded ones (1001 tokens: at least the context + 1).
CHAT_AS = {"chat_max_tokens_0": {}, "chat_max_tokens_above_context": {}, "chat_max_tokens_not_int": {},
           "chat_prompt_too_long": {"messages": [{"role": "user", "content": words(1000)}]}}


@pytest.mark.parametrize("name", sorted(CHAT_AS))
def test_chat_refusals_are_vllms(plain, name):
    case = CASES[name]
    body = {**case["request"]["body"], **CHAT_AS[name]}
    assert ask(plain.port, "/v1/chat/completions", body) == (case["status"], case["response"])


def test_unknown_model_names_the_aliases(plain):
    case = CASES["completion_unknown_model"]
    status, body = ask(plain.port, "/v1/chat/completions",
                       {"model": "other", "messages": [{"role": "user", "content": "Hi"}]})
    assert (status, body) == (404, case["response"])


# ---------------------------------------------------------------- completions, whole bodies

COMPLETIONS = [n for n, c in CASES.items() if n.startswith("completion") and c["status"] == 200]


@pytest.mark.parametrize("name", COMPLETIONS)
def test_completion_bodies_are_vllms(plain, name):
    """Tokens, text, logprobs (float32 as the GPU gives them), prompt_logprobs, usage and every
    field vLLM serialises: the same, from the same model."""
    case = CASES[name]
    status, body = ask(plain.port, case["request"]["path"], case["request"]["body"])
    assert status == case["status"]
    assert without_varying(body) == without_varying(case["response"])
    first = body[0] if isinstance(body, list) else body
    assert re.fullmatch(r"cmpl-[0-9a-f]{16}", first["id"])
    fingerprint = (body[-2] if isinstance(body, list) else body)["system_fingerprint"]
    assert re.fullmatch(r"vllm-0\.33\.0-[0-9a-f]{8}", fingerprint)


def test_shortened_to_the_context_not_refused(plain):
    """The old stand-in answered 400 here; vLLM generates what the context leaves."""
    case = CASES["completion_shortened_to_context"]
    assert case["status"] == 200 and case["response"]["usage"]["total_tokens"] == 1000
    status, body = ask(plain.port, "/v1/completions", case["request"]["body"])
    assert status == 200 and body["usage"]["completion_tokens"] == 10
    assert body["choices"][0]["finish_reason"] == "length"


def test_prompt_logprobs_are_deterministic_and_text_scores_better_than_noise(plain, tmp_path):
    """What #30's perplexity needs: the same text gives the same logprobs; English scores better
    than random bytes; the noise seam (a broken image's logits) scores English like noise."""
    text = "Four small machines share one model and each holds a slice of every layer."

    def perplexity(prompt) -> float:
        _, body = ask(plain.port, "/v1/completions",
                      {"prompt": prompt, "max_tokens": 1, "prompt_logprobs": 0})
        rows = body["choices"][0]["prompt_logprobs"]
        assert rows[0] is None and len(rows) == body["usage"]["prompt_tokens"]
        return math.exp(-sum(next(iter(r.values()))["logprob"] for r in rows[1:]) / (len(rows) - 1))

    english = perplexity(text)
    assert english == perplexity(text)
    noise = perplexity([(i * 97 + 13) % 256 for i in range(len(text))])
    assert english < noise / 3, (english, noise)
    lm = load_module().api_modules()[1]
    broken = lm.Model(1, noise=True)
    ranks = [broken.score(t, p, 0)[1] for p, t in enumerate(lm.encode(text))]
    assert sum(map(math.log, ranks)) / len(ranks) > math.log(30), ranks  # good model: ~log 8


# ---------------------------------------------------------------- chat, by fields

def test_chat_body_fields_are_vllms(plain):
    case = CASES["chat"]
    status, body = ask(plain.port, "/v1/chat/completions", case["request"]["body"])
    assert status == 200 and shape(body) == shape(case["response"])
    assert body["choices"][0]["message"]["reasoning"] is None


def test_chat_shortened_to_the_context(plain):
    recorded = CASES["chat_shortened_to_context"]["response"]
    body = {**CASES["chat_shortened_to_context"]["request"]["body"],
            "messages": [{"role": "user", "content": words(746)}]}  # 970 tokens, as recorded's 972
    status, answer = ask(plain.port, "/v1/chat/completions", body)
    assert status == 200 and shape(answer) == shape(recorded)
    assert answer["usage"]["total_tokens"] == 1000 == recorded["usage"]["total_tokens"]
    assert answer["choices"][0]["finish_reason"] == "length"


def thinking(case: str) -> dict:
    return {**CASES[case]["request"]["body"], "chat_template_kwargs": {"reasoning_effort": "high"}}


def test_thinking_without_a_reasoning_parser_stays_in_the_content(plain):
    """vLLM splits nothing without --reasoning-parser: the <think> text is content."""
    recorded = CASES["chat"]["response"]["choices"][0]["message"]
    assert recorded["content"].startswith("<think>") and recorded["reasoning"] is None
    _, body = ask(plain.port, "/v1/chat/completions", thinking("chat"))
    message = body["choices"][0]["message"]
    assert message["content"].startswith("<think>Let") and "</think>" in message["content"]
    assert message["reasoning"] is None and "reasoning_content" not in message


def test_thinking_with_a_reasoning_parser_is_the_reasoning_field(parser):
    recorded = CASES["chat_reasoning_parser"]["response"]
    _, body = ask(parser.port, "/v1/chat/completions", thinking("chat_reasoning_parser"))
    assert shape(body) == shape(recorded)
    message = body["choices"][0]["message"]
    assert message["reasoning"].startswith("Let") and "<think>" not in message["content"]
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0


def chunk_kinds(events: list) -> list:
    """The stream's chunks by kind: role, token, last token, usage, [DONE]; each with its shape."""
    out = []
    for e in events:
        if e == "[DONE]":
            out.append(("done", None))
        elif not e["choices"]:
            out.append(("usage", shape({**e, "usage": None})))
        else:
            kind = "role" if "role" in e["choices"][0]["delta"] else (
                "last" if e["choices"][0]["finish_reason"] else "token")
            out.append((kind, shape({**e, "choices": [{**e["choices"][0], "delta": None}]})))
    return [k for i, k in enumerate(out) if i == 0 or k != out[i - 1]]  # one token per run


@pytest.mark.parametrize("name, fixture", [("chat_stream", "plain"),
                                           ("chat_stream_reasoning_parser", "parser")])
def test_chat_stream_chunks_are_vllms(name, fixture, request):
    port = request.getfixturevalue(fixture).port
    recorded = CASES[name]["response"]
    status, events = ask(port, "/v1/chat/completions", thinking(name))
    assert status == 200 and chunk_kinds(events) == chunk_kinds(recorded)
    fields = {k for e in events[1:-2] for k in e["choices"][0]["delta"]}
    assert fields == {k for e in recorded[1:-2] for k in e["choices"][0]["delta"]}
    usage = events[-2]["usage"]
    assert set(usage) == set(recorded[-2]["usage"])


# ---------------------------------------------------------------- the kit's client

def test_transport_prompt_logprobs_reads_what_vllm_answers(plain):
    """launcher/transport/api.prompt_logprobs (#30's perplexity) on the stand-in: the recorded
    vLLM rows for the same token ids, and vLLM's refusal as ApiRefused."""
    ep = api.Endpoint(f"http://127.0.0.1:{plain.port}", "glm", None)
    case = CASES["completion_token_ids_prompt_logprobs_0"]
    got = api.prompt_logprobs(ep, case["request"]["body"]["prompt"])
    rows = case["response"]["choices"][0]["prompt_logprobs"]
    assert got.tokens[0] == api.PromptToken(None, None, None, None) and len(got.tokens) == len(rows)
    for token, row in zip(got.tokens[1:], rows[1:]):
        (tid, entry), = row.items()
        assert (token.token_id, token.text, token.logprob, token.rank) == (
            int(tid), entry["decoded_token"], entry["logprob"], entry["rank"])
    scored = [t.logprob for t in got.tokens[1:]]
    assert got.perplexity == pytest.approx(math.exp(-sum(scored) / len(scored)))
    too_long = CASES["completion_prompt_too_long"]
    with pytest.raises(api.ApiRefused) as refused:
        api.prompt_logprobs(ep, too_long["request"]["body"]["prompt"])
    assert refused.value.status == 400
    assert refused.value.message.endswith(too_long["response"]["error"]["message"])


def test_chat_without_max_tokens_ends_by_itself_within_the_context(plain):
    """No max_tokens: vLLM's bound is the context left, and the answer still ends on its own
    ("stop"); only an answer longer than what is left is cut ("length")."""
    ask_ = {"model": "glm", "messages": [{"role": "user", "content": "Hi"}]}
    _, body = ask(plain.port, "/v1/chat/completions", ask_)
    assert body["choices"][0]["finish_reason"] == "stop" and body["usage"]["completion_tokens"] < 100
    tight = {**ask_, "messages": [{"role": "user", "content": words(760)}]}  # 988 tokens
    _, body = ask(plain.port, "/v1/chat/completions", tight)
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["total_tokens"] == 1000


def test_integer_fields_parse_as_the_request_model_does():
    """pydantic's lax integers: numeric strings and whole floats are taken; the recorded 400's
    body is the same error for a fractional float but with pydantic's own type and words."""
    requests = load_module().api_modules()[0]
    assert requests.parsed({"max_tokens": "5", "logprobs": 2.0}) == {"max_tokens": 5, "logprobs": 2}
    with pytest.raises(requests.Refused) as bad:
        requests.parsed({"max_tokens": 1.5})
    assert bad.value.status == 400 and bad.value.body["error"]["param"] == "body.max_tokens"
    assert "'type': 'int_from_float'" in bad.value.body["error"]["message"]
