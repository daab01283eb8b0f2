"""The served OpenAI-compatible API on rank 0: where it is, waiting until it answers, and the
prompt logprobs it gives (a teacher-forced perplexity through the served API)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import httpx

from ..errors import SparkstackError
from ..inputs import apikey
from ..inputs.config import Loaded


class NotServing(SparkstackError):
    pass


@dataclass(frozen=True)
class Endpoint:
    url: str
    model: str
    api_key: str | None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


_CLIENT: httpx.Client | None = None


def _http() -> httpx.Client:
    """One client for the process: each new one loads the CA bundle (~30 ms, even for http://),
    which `httpx.get` did at every request ('up' on a serving cluster asks three times). No
    connection is kept between requests: an engine restarted meanwhile is asked afresh."""
    global _CLIENT
    if _CLIENT is None:
        _CLIENT = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))
    return _CLIENT


def endpoint(loaded: Loaded) -> Endpoint:
    """Rank 0's API as the config and profile say (the head serves it), with the key it checks
    (launcher/inputs/apikey.py: the config's, else the one `up` generated)."""
    cluster, profile = loaded.cluster, loaded.profile
    port = cluster.overrides.api_port or profile.api_port
    return Endpoint(f"http://{cluster.ranks[0].address}:{port}",
                    cluster.model.served_name or profile.served_name, apikey.resolve(loaded).value)


def health_check(ep: Endpoint, timeout: float = 3.0) -> tuple[bool, str]:
    """Whether /health answers 200, and what it answered (or why nothing did)."""
    try:
        r = _http().get(f"{ep.url}/health", headers=ep.headers, timeout=timeout)
    except httpx.HTTPError as e:
        return False, f"{type(e).__name__}: {e}"
    return r.status_code == 200, f"HTTP {r.status_code}"


def health(ep: Endpoint, timeout: float = 3.0) -> bool:
    return health_check(ep, timeout)[0]


POLL_S = 0.25  # the API is asked this often: up returns within it of the engine being ready
WATCH_EVERY_S = 1.0  # `watch` (a round trip to every rank) at most this often


def wait_ready(ep: Endpoint, timeout: float, say=print, poll_s: float = POLL_S, watch=None) -> float:
    """/health, then /v1/models lists the model, then one short completion answers.
    `watch()` runs between polls, at most every WATCH_EVERY_S (e.g. raising when a rank's engine
    died meanwhile). Returns the seconds it took; raises NotServing naming the step it was stuck at."""
    started = time.monotonic()
    deadline = started + timeout
    watched = 0.0
    for step, probe in (("/health", lambda e: health_check(e, timeout=5)), ("/v1/models", _model_listed),
                        ("a completion", _completes)):
        last = "no answer yet"
        while True:
            if watch and time.monotonic() - watched >= WATCH_EVERY_S:
                watch()
                watched = time.monotonic()
            try:
                ok, last = probe(ep)
            except httpx.HTTPError as e:
                ok, last = False, f"{type(e).__name__}: {e}"
            if ok:
                say(f"  {step}: ok after {time.monotonic() - started:.1f} s")
                break
            if time.monotonic() > deadline:
                raise NotServing(f"{ep.url} not serving after {timeout:.0f} s: stuck at {step} ({last})")
            time.sleep(poll_s)
    if watch:
        watch()  # every rank still up once the head answers
    return time.monotonic() - started


def answers_now(ep: Endpoint) -> list[str] | None:
    """wait_ready's three steps once each, no waiting: what it would say when every step answers
    at once, else None."""
    said, started = [], time.monotonic()
    for step, probe in (("/health", lambda e: health_check(e, timeout=5)), ("/v1/models", _model_listed),
                        ("a completion", _completes)):
        try:
            ok, _ = probe(ep)
        except httpx.HTTPError:
            return None
        if not ok:
            return None
        said.append(f"  {step}: ok after {time.monotonic() - started:.1f} s")
    return said


def _model_listed(ep: Endpoint) -> tuple[bool, str]:
    r = _http().get(f"{ep.url}/v1/models", headers=ep.headers, timeout=5)
    if r.status_code != 200:
        return False, f"HTTP {r.status_code}"
    names = [m.get("id") for m in r.json().get("data", [])]
    return ep.model in names, f"models listed: {', '.join(map(str, names)) or 'none'}"


def _completes(ep: Endpoint) -> tuple[bool, str]:
    body = {"model": ep.model, "max_tokens": 4,
            "messages": [{"role": "user", "content": "Say OK."}]}
    r = _http().post(f"{ep.url}/v1/chat/completions", json=body, headers=ep.headers, timeout=60)
    if r.status_code != 200:
        return False, f"HTTP {r.status_code}: {r.text[:200]}"
    return bool(r.json().get("choices")), "no choices in the answer"


class ApiRefused(SparkstackError):
    """The server answered, with an error: its status and vLLM's message."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class PromptToken:
    token_id: int | None  # None for the first token: vLLM names no id for it
    text: str | None  # the token decoded alone
    logprob: float | None  # None for the first token: nothing precedes it
    rank: int | None


@dataclass(frozen=True)
class PromptLogprobs:
    """The model's logprob of each prompt token given the ones before it (teacher forcing)."""

    tokens: tuple[PromptToken, ...]

    @property
    def nll(self) -> float:
        """Mean negative log-likelihood per scored token (all but the first), in nats."""
        scored = [t.logprob for t in self.tokens if t.logprob is not None]
        if not scored:
            raise ValueError("a one-token prompt has no scored token")
        return -sum(scored) / len(scored)

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll)


def prompt_logprobs(ep: Endpoint, prompt: str | list[int], timeout: float = 300.0) -> PromptLogprobs:
    """The served model's prompt logprobs for `prompt` (text or token ids), from vLLM's
    /v1/completions with prompt_logprobs=0 (only each prompt token's own entry). max_tokens is 1:
    vLLM refuses 0, and a prompt that alone does not fit the context is its 400 (ApiRefused)."""
    body = {"model": ep.model, "prompt": prompt, "max_tokens": 1, "prompt_logprobs": 0}
    r = _http().post(f"{ep.url}/v1/completions", json=body, headers=ep.headers, timeout=timeout)
    if r.status_code != 200:
        raise ApiRefused(f"{ep.url} answered {r.status_code} to POST /v1/completions: "
                         f"{_error_message(r)}", r.status_code)
    rows = r.json()["choices"][0].get("prompt_logprobs")
    if not rows or rows[0] is not None:
        raise ApiRefused(f"{ep.url}/v1/completions gave no prompt_logprobs (first must be null): "
                         f"{str(rows)[:200]}", r.status_code)
    return PromptLogprobs(tuple(_prompt_token(i, row) for i, row in enumerate(rows)))


def _prompt_token(position: int, row: dict | None) -> PromptToken:
    if row is None:
        return PromptToken(None, None, None, None)
    if len(row) != 1:
        raise ApiRefused(f"prompt_logprobs position {position} has {len(row)} entries, not the "
                         "prompt token's alone (asked with prompt_logprobs=0)", 200)
    (token_id, entry), = row.items()
    return PromptToken(int(token_id), entry.get("decoded_token"), float(entry["logprob"]),
                       entry.get("rank"))


def _error_message(r: httpx.Response) -> str:
    try:
        return str(r.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return r.text[:300]


def greedy(ep: Endpoint, prompt: str, max_tokens: int, timeout: float = 120.0) -> str:
    """The served model's greedy continuation of `prompt` (temperature 0) from /v1/completions."""
    body = {"model": ep.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    r = httpx.post(f"{ep.url}/v1/completions", json=body, headers=ep.headers, timeout=timeout)
    if r.status_code != 200:
        raise ApiRefused(f"{ep.url} answered {r.status_code} to POST /v1/completions: "
                         f"{_error_message(r)}", r.status_code)
    return str(r.json()["choices"][0].get("text") or "")


def context_length(ep: Endpoint) -> int | None:
    """The served model's context (vLLM lists max_model_len in /v1/models), None when unsaid."""
    r = httpx.get(f"{ep.url}/v1/models", headers=ep.headers, timeout=10)
    if r.status_code != 200:
        return None
    for m in r.json().get("data", []):
        if m.get("id") == ep.model and isinstance(m.get("max_model_len"), int):
            return m["max_model_len"]
    return None
