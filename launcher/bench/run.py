"""`sparkstack bench`: decode tok/s, TTFT, speculative acceptance and a needle test, measured
from any OpenAI-compatible server the way the seeds published theirs.

Definitions (seed 000's): TTFT is the time from a request going onto the wire to its first
non-empty content or reasoning token; decode tok/s is completion tokens ÷ (wall − TTFT), so
prefill is excluded; a (task, concurrency) cell reports the per-stream median and the
aggregate, the per-stream rates summed. Completion tokens come from the usage chunk
(`stream_options.include_usage`); a server that sends none has its content chunks counted, and
the results say so. Accepted tokens per step = 1 + Δaccepted / Δdrafts of vLLM's spec-decode
counters over a cell, read from `/metrics`.

The top half is pure (parsing, statistics, prompts, result shapes); the bottom half talks
HTTP (httpx, asyncio for concurrent streams). Output formats live in report.py.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import statistics
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Callable

import httpx

from ..errors import SparkstackError
from ..status import Status

DEFAULT_TASKS = ("prose", "code", "list", "essay")
DEFAULT_CONCURRENCY = (1, 2, 4, 8)
# Seed 000 measured at temperature 0.6 / top_p 0.95; a profile's `bench` section may differ.
DEFAULT_TEMPERATURE, DEFAULT_TOP_P = 0.6, 0.95
WARMUP_TOKENS = 16
NEEDLE_MAX_TOKENS = 64  # the answer is one short sentence; thinking on needs --max-tokens more
TOKENS_PER_WORD = 1.3  # English prose through a BPE tokenizer, for sizing needle prompts only
RESULTS_FORMAT = 1  # bump when the JSON shape changes incompatibly

ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
DRAFTS = "vllm:spec_decode_num_drafts_total"
REASONING_FIELDS = ("reasoning_content", "reasoning")  # vLLM's older and newer delta names


class BenchError(SparkstackError):
    """The server could not be measured: unreachable, refused, or answered nonsense."""


# ---------------------------------------------------------------- inputs

@dataclass(frozen=True)
class Target:
    url: str  # the server's root, without /v1
    model: str | None  # None: the first model the server lists
    api_key: str | None = field(default=None, repr=False)
    source: str = "--url"  # where url/model/key came from, for the report

    def to_json(self) -> dict:
        return {"url": self.url, "model": self.model, "source": self.source,
                "api_key": "***" if self.api_key else None}


@dataclass(frozen=True)
class Settings:
    tasks: tuple[str, ...] = DEFAULT_TASKS
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    max_tokens: int = 256
    temperature: float = DEFAULT_TEMPERATURE
    top_p: float = DEFAULT_TOP_P
    thinking: bool = False
    needle: tuple[int, ...] = ()  # prompt sizes in tokens
    needle_position: float = 0.5  # where the fact sits: 0 = start of the filler, 1 = end
    timeout_s: float = 900.0  # the longest silence tolerated mid-request (prefill at depth)

    @property
    def total_requests(self) -> int:
        return 1 + len(self.tasks) * sum(self.concurrency) + len(self.needle)


def normalize_url(url: str) -> str:
    """`host:8888`, `http://host:8888/`, `http://host:8888/v1` all name the same server root."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    url = url.rstrip("/")
    if not re.match(r"https?://[^/\s]+", url):
        raise ValueError(f"{url!r} is not a server address like http://HOST:PORT")
    return url.removesuffix("/v1")


def target_from_config(loaded, url: str | None = None, api_key: str | None = None,
                       model: str | None = None) -> Target:
    """The cluster's API (launcher.transport.api.endpoint: rank 0, the profile's or overridden port, key
    and served name). Flags given on the command line (`url` already normalized) win over each."""
    from ..transport.api import endpoint

    ep = endpoint(loaded)
    rank0 = loaded.cluster.ranks[0]
    return Target(url=url or ep.url, model=model or ep.model, api_key=api_key or ep.api_key,
                  source=f"{loaded.path}" + ("" if url else f" (rank 0 {rank0.label})"))


def profile_sampling(profile) -> tuple[float, float]:
    """(temperature, top_p) from the profile's `bench` section, else seed 000's."""
    if profile is None:
        return DEFAULT_TEMPERATURE, DEFAULT_TOP_P
    return profile.bench.temperature, profile.bench.top_p


def parse_counts(text: str) -> tuple[int, ...]:
    """`1,2,4,8` -> (1, 2, 4, 8): positive, unique, in the order given."""
    values = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if not part.isdigit() or int(part) < 1:
            raise ValueError(f"{part!r} is not a positive whole number")
        if int(part) not in values:
            values.append(int(part))
    if not values:
        raise ValueError("give at least one value, e.g. 1,2,4,8")
    return tuple(values)


def parse_sizes(text: str) -> tuple[int, ...]:
    """`8k,32k,128k` -> (8000, 32000, 128000) tokens; `1m` = 1,000,000; case does not matter."""
    values = []
    for part in filter(None, (p.strip().lower() for p in text.split(","))):
        m = re.fullmatch(r"(\d+(?:\.\d+)?)([km]?)", part)
        if not m:
            raise ValueError(f"{part!r} is not a size like 8k, 32k or 1m")
        tokens = int(float(m[1]) * {"": 1, "k": 1000, "m": 1_000_000}[m[2]])
        if tokens < 100:
            raise ValueError(f"{part!r} is too small for a needle test (at least 100 tokens)")
        values.append(tokens)
    if not values:
        raise ValueError("give at least one size, e.g. 8k,32k")
    return tuple(values)


def size_label(tokens: int) -> str:
    if tokens >= 1_000_000 and tokens % 100_000 == 0:
        return f"{tokens / 1_000_000:g}m"
    return f"{tokens / 1000:g}k" if tokens >= 1000 else str(tokens)


def load_prompts() -> dict[str, list[dict]]:
    """Task name -> chat messages, from launcher/bench/data/bench_prompts.json."""
    raw = json.loads(resources.files("launcher.bench").joinpath("data/bench_prompts.json").read_text())
    return {name: task["messages"] for name, task in raw.items() if not name.startswith("_")}


def check_tasks(tasks: tuple[str, ...], prompts: dict) -> None:
    unknown = [t for t in tasks if t not in prompts]
    if unknown:
        raise ValueError(f"unknown task {', '.join(unknown)} (known: {', '.join(prompts)})")


def request_body(model: str, messages: list[dict], max_tokens: int, s: Settings) -> dict:
    """One streamed chat completion. GLM-5.3's template has no enable_thinking switch: thinking
    is chosen with reasoning_effort (seed 003); other templates ignore the unknown kwarg."""
    return {"model": model, "messages": messages, "max_tokens": max_tokens,
            "temperature": s.temperature, "top_p": s.top_p, "stream": True,
            "stream_options": {"include_usage": True},
            "chat_template_kwargs": {"reasoning_effort": "high" if s.thinking else "low"}}


# ---------------------------------------------------------------- statistics

def decode_rate(completion_tokens: int, wall_s: float, ttft_s: float | None) -> float | None:
    """The seeds' decode tok/s; None when there was no decode phase to time."""
    if ttft_s is None or completion_tokens < 2 or wall_s <= ttft_s:
        return None
    return completion_tokens / (wall_s - ttft_s)


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def parse_prometheus(text: str) -> dict[str, float]:
    """Metric name -> value summed over its label sets (engines, models, positions), from the
    Prometheus text format. Comments, NaN and malformed lines are skipped."""
    totals: dict[str, float] = {}
    sample = re.compile(r'^([A-Za-z_:][\w:]*)(\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?\s+(\S+)')
    for line in text.splitlines():
        m = sample.match(line.strip())
        if not m:
            continue
        try:
            value = float(m[3])
        except ValueError:
            continue
        if value == value:  # not NaN
            totals[m[1]] = totals.get(m[1], 0.0) + value
    return totals


@dataclass(frozen=True)
class SpecCounters:
    accepted: float
    drafts: float

    @classmethod
    def from_metrics(cls, metrics: dict[str, float] | None) -> SpecCounters | None:
        if not metrics or ACCEPTED not in metrics or DRAFTS not in metrics:
            return None
        return cls(metrics[ACCEPTED], metrics[DRAFTS])


def spec_delta(before: SpecCounters | None, after: SpecCounters | None) -> SpecCounters | None:
    """The counters' growth over a cell; None if unknown or they went back (a server restart)."""
    if before is None or after is None:
        return None
    delta = SpecCounters(after.accepted - before.accepted, after.drafts - before.drafts)
    return None if delta.accepted < 0 or delta.drafts < 0 else delta


def accepted_per_step(deltas: list[SpecCounters | None]) -> float | None:
    """1 + Δaccepted / Δdrafts over the deltas (each step emits one token plus those accepted)."""
    known = [d for d in deltas if d is not None]
    drafts = sum(d.drafts for d in known)
    if not known or drafts <= 0:
        return None
    return 1 + sum(d.accepted for d in known) / drafts


# ---------------------------------------------------------------- results

@dataclass
class Request:
    """One streamed request as measured by the client."""

    ttft_s: float | None
    wall_s: float
    completion_tokens: int
    prompt_tokens: int | None
    tokens_from: str  # "usage", or "chunks" when the server sent no usage
    finish_reason: str | None
    content: str = ""
    reasoning: str = ""

    @property
    def decode_tok_s(self) -> float | None:
        return decode_rate(self.completion_tokens, self.wall_s, self.ttft_s)

    def to_json(self) -> dict:
        return {"ttft_s": self.ttft_s, "wall_s": self.wall_s,
                "completion_tokens": self.completion_tokens, "prompt_tokens": self.prompt_tokens,
                "tokens_from": self.tokens_from, "finish_reason": self.finish_reason,
                "decode_tok_s": self.decode_tok_s}


@dataclass
class Cell:
    """One task at one concurrency: `concurrency` requests started together."""

    task: str
    concurrency: int
    requests: list[Request]
    spec: SpecCounters | None  # counter deltas over the cell; None: not exposed

    def rates(self) -> list[float]:
        return [r for r in (q.decode_tok_s for q in self.requests) if r is not None]

    @property
    def per_stream_tok_s(self) -> float | None:
        rates = self.rates()
        return statistics.median(rates) if rates else None

    @property
    def aggregate_tok_s(self) -> float | None:
        rates = self.rates()
        return sum(rates) if rates else None

    def ttft(self, q: float) -> float | None:
        return percentile([r.ttft_s for r in self.requests if r.ttft_s is not None], q)

    def to_json(self) -> dict:
        return {"task": self.task, "concurrency": self.concurrency,
                "per_stream_tok_s": self.per_stream_tok_s, "aggregate_tok_s": self.aggregate_tok_s,
                "ttft_s": {"median": self.ttft(50), "p90": self.ttft(90)},
                "accepted_per_step": accepted_per_step([self.spec]),
                "spec_decode": asdict(self.spec) if self.spec else None,
                "requests": [r.to_json() for r in self.requests]}


@dataclass
class Needle:
    tokens: int  # the size asked for
    position: float
    expected: str
    request: Request

    @property
    def passed(self) -> bool:
        answer = f"{self.request.content}\n{self.request.reasoning}".lower()
        return self.expected.lower() in answer

    @property
    def prefill_tok_s(self) -> float | None:
        r = self.request
        return r.prompt_tokens / r.ttft_s if r.prompt_tokens and r.ttft_s else None

    def to_json(self) -> dict:
        r = self.request
        return {"depth": size_label(self.tokens), "target_tokens": self.tokens,
                "position": self.position, "prompt_tokens": r.prompt_tokens,
                "prompt_tokens_from": "usage" if r.tokens_from == "usage" else "estimate",
                "ttft_s": r.ttft_s, "prefill_tok_s": self.prefill_tok_s,
                "decode_tok_s": r.decode_tok_s, "passed": self.passed,
                "expected": self.expected, "answer": r.content[:300]}


@dataclass
class Results:
    target: Target
    settings: Settings
    started_at: str = field(default_factory=lambda: _now())
    finished_at: str | None = None
    model: str | None = None  # the served name actually benched
    cells: list[Cell] = field(default_factory=list)
    needles: list[Needle] = field(default_factory=list)
    status: Status = Status.RUNNING  # then COMPLETE, INTERRUPTED or FAILED
    error: str | None = None

    @property
    def started(self) -> bool:
        """The server answered (its model list): from here on, results are worth keeping."""
        return self.model is not None

    def finish(self, status: Status, error: str | None = None) -> None:
        self.status, self.error, self.finished_at = status, error, _now()

    def task_accepted_per_step(self, task: str) -> float | None:
        return accepted_per_step([c.spec for c in self.cells if c.task == task])

    @property
    def spec_exposed(self) -> bool:
        return any(c.spec is not None for c in self.cells)

    def notes(self) -> list[str]:
        out = []
        counted = sum(r.tokens_from == "chunks" for c in self.cells for r in c.requests)
        if counted:
            out.append(f"completion tokens of {counted} request(s) were counted from stream "
                       "chunks: the server sent no usage chunk; with speculative decoding one "
                       "chunk can carry several tokens, so those tok/s may read low")
        if self.cells and not self.spec_exposed:
            out.append("accepted tokens per step: not shown, the server exposes no "
                       f"{ACCEPTED} / {DRAFTS} on /metrics")
        return out

    def to_json(self) -> dict:
        return _rounded(self._json())

    def _json(self) -> dict:
        s = self.settings
        return {"format": RESULTS_FORMAT, "started_at": self.started_at,
                "finished_at": self.finished_at, "status": self.status, "error": self.error,
                "target": {**self.target.to_json(), "model": self.model or self.target.model},
                "settings": {"tasks": list(s.tasks), "concurrency": list(s.concurrency),
                             "max_tokens": s.max_tokens, "temperature": s.temperature,
                             "top_p": s.top_p, "thinking": s.thinking,
                             "needle": [size_label(n) for n in s.needle],
                             "needle_position": s.needle_position},
                "definitions": {"decode_tok_s": "completion tokens / (wall - TTFT), per request",
                                "per_stream_tok_s": "median of the cell's requests",
                                "aggregate_tok_s": "sum of the cell's requests",
                                "accepted_per_step":
                                    "1 + delta accepted / delta drafts on /metrics"},
                "results": [c.to_json() for c in self.cells],
                "tasks": {t: {"accepted_per_step": self.task_accepted_per_step(t)}
                          for t in dict.fromkeys(c.task for c in self.cells)},
                "needle": [n.to_json() for n in self.needles],
                "notes": self.notes()}


def _rounded(value, digits: int = 4):
    """Floats to `digits` decimals throughout: timings finer than 0.1 ms are noise."""
    if isinstance(value, float):
        return round(value, digits)
    if isinstance(value, dict):
        return {k: _rounded(v, digits) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v, digits) for v in value]
    return value


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ---------------------------------------------------------------- the needle prompt

FILLER = [
    "The morning tide came in slowly over the flat grey sand.",
    "A pair of oystercatchers worked the edge of the water without hurry.",
    "Someone had left a blue rowing boat pulled high above the wrack line.",
    "By noon the wind had turned and carried the smell of cut hay from the fields inland.",
    "The harbour master walked the length of the quay and counted the moorings twice.",
    "Gulls argued over the remains of a crab on the slipway.",
    "In the village the baker sold the last of the rye loaves before eleven.",
    "A tractor crossed the causeway towing a trailer of seaweed for the gardens.",
    "Clouds built over the headland and then thinned without any rain.",
    "The ferry was late again because of a fault in its steering gear.",
    "Children collected smooth stones and lined them up along the sea wall.",
    "An old man repaired a lobster pot with orange twine and a wooden netting tool.",
    "The church clock ran four minutes slow, as it had done all summer.",
    "Late in the afternoon the light turned the wet sand the colour of brass.",
    "A heron stood in the shallows of the estuary for the better part of an hour.",
    "The shop on the corner put out a board advertising fresh mackerel.",
    "Two walkers asked the way to the standing stones and were sent up the lane.",
    "Evening brought a swell from the west and the boats rode it at anchor.",
    "The lamp in the lighthouse was lit at dusk and turned all night.",
    "Nothing else of note happened on the island that day.",
]
INTRO = ("Below is a long journal of ordinary days on a small island. One sentence in it states "
         "a fact that you will be asked about afterwards.")
QUESTION = "What is the secret code for the east vault? Reply with the code only."
WORDS = ["KESTREL", "ORCHID", "GRANITE", "LANTERN", "MARIGOLD", "TIMBER", "FALCON", "SAFFRON"]


def needle_fact(rng: random.Random) -> tuple[str, str]:
    """(the sentence to hide, the answer expected back): unique per request, so a cached or
    memorised reply cannot pass."""
    answer = f"{rng.randint(1000, 9999)}-{rng.choice(WORDS)}"
    return f"The secret code for the east vault is {answer}.", answer


def needle_messages(tokens: int, position: float, fact: str, nonce: int = 0) -> list[dict]:
    """A user message of about `tokens` tokens: filler sentences with `fact` at `position`
    (0..1) of the filler, then the question. Sized in words at TOKENS_PER_WORD; the server's
    usage gives the true count. The nonce opens the prompt so that no two needle prompts share
    a prefix: a prefix-cache hit would make prefill look faster than it is."""
    intro = f"Journal {nonce}. {INTRO}"
    budget = round(tokens / TOKENS_PER_WORD) - len(f"{intro} {fact} {QUESTION}".split())
    sentences: list[str] = []
    words = 0
    while words < budget:
        sentence = FILLER[len(sentences) % len(FILLER)]
        sentences.append(sentence)
        words += len(sentence.split())
    sentences.insert(round(position * len(sentences)), fact)
    body = " ".join(sentences)
    return [{"role": "user", "content": f"{intro}\n\n{body}\n\n{QUESTION}"}]


# ---------------------------------------------------------------- reading a stream

class StreamReader:
    """Folds the SSE lines of one chat-completion stream into a Request. Pure: the arrival time
    of each line is passed in."""

    def __init__(self, started: float, where: str):
        self.started, self.where = started, where
        self.first_token_at: float | None = None
        self.ended_at: float | None = None
        self.done = False
        self.usage: dict | None = None
        self.chunks_with_text = 0
        self.finish_reason: str | None = None
        self.content: list[str] = []
        self.reasoning: list[str] = []

    def feed(self, line: str, now: float) -> None:
        line = line.strip()
        if not line.startswith("data:"):
            return  # blank separators, `event:`, `: keep-alive` comments
        data = line[5:].strip()
        self.ended_at = now
        if data == "[DONE]":
            self.done = True
            return
        chunk = self._parse(data)
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk["choices"]:
            self._choice(choice, data, now)

    def _parse(self, data: str) -> dict:
        shown = data if len(data) <= 160 else data[:160] + "…"
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError as e:
            raise BenchError(f"{self.where} sent a malformed stream chunk (not JSON: {e.msg}): "
                             f"data: {shown}") from None
        if isinstance(chunk, dict) and "error" in chunk:
            raise BenchError(f"{self.where} reported an error mid-stream: {error_text(chunk)}")
        if not isinstance(chunk, dict) or not isinstance(chunk.get("choices"), list):
            raise BenchError(f"{self.where} sent a stream chunk without a `choices` list: "
                             f"data: {shown}")
        return chunk

    def _choice(self, choice, data: str, now: float) -> None:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if not isinstance(delta, dict):
            raise BenchError(f"{self.where} sent a choice without a `delta` object: data: "
                             f"{data[:160]}")
        text = delta.get("content") or ""
        thought = next((delta[k] for k in REASONING_FIELDS if delta.get(k)), "")
        if not isinstance(text, str) or not isinstance(thought, str):
            raise BenchError(f"{self.where} sent non-text content in a delta: data: {data[:160]}")
        if text or thought:
            self.chunks_with_text += 1
            if self.first_token_at is None:
                self.first_token_at = now
        self.content.append(text)
        self.reasoning.append(thought)
        self.finish_reason = choice.get("finish_reason") or self.finish_reason

    def result(self) -> Request:
        if not self.done and self.finish_reason is None:
            raise BenchError(f"{self.where} ended the stream before the reply was complete "
                             "(no finish_reason, no [DONE])")
        end = self.ended_at if self.ended_at is not None else self.started
        usage = self.usage or {}
        tokens = usage.get("completion_tokens")
        return Request(
            ttft_s=None if self.first_token_at is None else self.first_token_at - self.started,
            wall_s=end - self.started,
            completion_tokens=tokens if isinstance(tokens, int) else self.chunks_with_text,
            prompt_tokens=usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int)
            else None,
            tokens_from="usage" if isinstance(tokens, int) else "chunks",
            finish_reason=self.finish_reason,
            content="".join(self.content), reasoning="".join(self.reasoning))


def error_text(body) -> str:
    """The message of an OpenAI/vLLM/FastAPI error body, whatever its shape."""
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body.get("message")))
        if isinstance(err, dict):
            return str(err.get("message") or err)
        if err is not None:
            return str(err)
    return str(body)[:300]


# ---------------------------------------------------------------- HTTP

Report = Callable[[str, int], None]  # (what is running, requests just finished)


class Client:
    """The server's API, with every transport failure turned into a BenchError naming the URL."""

    def __init__(self, target: Target, settings: Settings):
        self.target = target
        headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
        peak = max(settings.concurrency)
        self.http = httpx.AsyncClient(
            base_url=target.url, headers=headers,
            timeout=httpx.Timeout(settings.timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=peak + 2, max_keepalive_connections=peak + 2))

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.http.aclose()

    def transport_error(self, e: httpx.HTTPError, what: str) -> BenchError:
        url = self.target.url
        if isinstance(e, httpx.ConnectError):
            return BenchError(f"cannot connect to {url} ({_reason(e)}): is the model being "
                              f"served there? Start it (`sparkstack up`), check the address and "
                              f"port (`--url`, or rank 0 and api_port in the config), or wait "
                              f"until it has finished loading")
        if isinstance(e, httpx.TimeoutException):
            return BenchError(f"{url} went silent for longer than the timeout during {what} "
                              f"({type(e).__name__}); a deep prefill may need a larger --timeout")
        return BenchError(f"{url} broke off during {what}: {_reason(e)}")

    def status_error(self, status: int, body, what: str) -> BenchError:
        url = self.target.url
        if status in (401, 403):
            shown = "no key was sent" if not self.target.api_key else "the key sent was refused"
            return BenchError(f"the server at {url} wants an API key ({status}, {shown}): "
                              f"pass --api-key or set overrides.api_key (`sparkstack api-key` prints "
                              f"the cluster's)")
        return BenchError(f"{url} answered {status} to {what}: {error_text(body)}")

    async def served_models(self) -> list[str] | None:
        """What /v1/models lists; None when the server has no such endpoint."""
        try:
            resp = await self.http.get("/v1/models")
        except httpx.HTTPError as e:
            raise self.transport_error(e, "GET /v1/models") from None
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            raise self.status_error(resp.status_code, _json_or_text(resp), "GET /v1/models")
        try:
            return [m["id"] for m in resp.json()["data"]]
        except (ValueError, KeyError, TypeError):
            raise BenchError(f"{self.target.url}/v1/models is not an OpenAI model list: "
                             f"{resp.text[:160]!r}") from None

    async def spec_counters(self) -> SpecCounters | None:
        """The spec-decode counters now; None when /metrics is absent or lacks them."""
        try:
            resp = await self.http.get("/metrics", timeout=10.0)
        except httpx.HTTPError:
            return None
        if resp.status_code != 200:
            return None
        return SpecCounters.from_metrics(parse_prometheus(resp.text))

    async def stream(self, body: dict) -> Request:
        what = "POST /v1/chat/completions"
        sent: list[float] = []

        async def trace(event: str, info: dict) -> None:
            # The clock starts when the request goes onto the wire, not when this coroutine was
            # scheduled: at C8 on a busy client, event-loop queueing is ours, not the server's.
            if event.endswith("send_request_headers.started") and not sent:
                sent.append(time.perf_counter())

        called = time.perf_counter()
        try:
            async with self.http.stream("POST", "/v1/chat/completions", json=body,
                                        extensions={"trace": trace}) as resp:
                reader = StreamReader(sent[0] if sent else called, self.target.url)
                if resp.status_code != 200:
                    await resp.aread()
                    raise self.status_error(resp.status_code, _json_or_text(resp), what)
                kind = resp.headers.get("content-type", "")
                if not kind.startswith("text/event-stream"):
                    await resp.aread()
                    raise BenchError(f"{self.target.url} answered a streamed request with "
                                     f"{kind or 'no content type'}, not an event stream: "
                                     f"{resp.text[:160]!r}")
                async for line in resp.aiter_lines():
                    reader.feed(line, time.perf_counter())
                    if reader.done:
                        break
        except httpx.HTTPError as e:
            raise self.transport_error(e, what) from None
        return reader.result()


def _reason(e: BaseException) -> str:
    """The root cause in words: anyio hides a refused connection behind "All connection
    attempts failed", so the chain of causes is searched for the real one."""
    cause: BaseException | None = e
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, OSError) and cause.errno is not None and cause.strerror:
            return cause.strerror.lower()
        cause = cause.__cause__ or cause.__context__
    return str(e) or type(e).__name__


def _json_or_text(resp: httpx.Response):
    try:
        return resp.json()
    except ValueError:
        return resp.text


async def _all(coros: list) -> list:
    """Run together; the first failure cancels the rest (no stream is left running)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _choose_model(client: Client, target: Target) -> str:
    served = await client.served_models()
    if served is None:
        if target.model:
            return target.model
        raise BenchError(f"{target.url} has no /v1/models to name its model: pass --model")
    if not served:
        raise BenchError(f"{target.url}/v1/models lists no model: is it still loading?")
    if target.model and target.model not in served:
        raise BenchError(f"{target.url} serves {', '.join(served)}, not {target.model!r}: "
                         f"pass --model NAME (or fix model.served_name in the config)")
    return target.model or served[0]


async def _cell(client: Client, model: str, prompt: list[dict], task: str, c: int,
                s: Settings, report: Report) -> Cell:
    before = await client.spec_counters()

    async def one() -> Request:
        request = await client.stream(request_body(model, prompt, s.max_tokens, s))
        report(f"{task} C{c}", 1)
        return request

    requests = await _all([one() for _ in range(c)])
    return Cell(task, c, requests, spec_delta(before, await client.spec_counters()))


async def _needle(client: Client, model: str, tokens: int, s: Settings, rng: random.Random,
                  report: Report) -> Needle:
    fact, answer = needle_fact(rng)
    messages = needle_messages(tokens, s.needle_position, fact, rng.randrange(10**6))
    max_tokens = s.max_tokens if s.thinking else min(s.max_tokens, NEEDLE_MAX_TOKENS)
    request = await client.stream(request_body(model, messages, max_tokens, s))
    if request.prompt_tokens is None:  # no usage: our own estimate, marked as such in the JSON
        request.prompt_tokens = round(len(messages[0]["content"].split()) * TOKENS_PER_WORD)
    report(f"needle {size_label(tokens)}", 1)
    return Needle(tokens, s.needle_position, answer, request)


async def _run(target: Target, s: Settings, results: Results, report: Report) -> None:
    prompts = load_prompts()
    async with Client(target, s) as client:
        model = results.model = await _choose_model(client, target)
        report("warm-up", 0)
        # Not measured: the first request pays for lazy initialisation and cold caches.
        await client.stream(request_body(model, prompts[s.tasks[0]], WARMUP_TOKENS, s))
        report("warm-up", 1)
        for task in s.tasks:
            for c in s.concurrency:
                report(f"{task} C{c}", 0)
                results.cells.append(await _cell(client, model, prompts[task], task, c, s, report))
        rng = random.Random()
        for tokens in s.needle:
            report(f"needle {size_label(tokens)}", 0)
            results.needles.append(await _needle(client, model, tokens, s, rng, report))


def measure(target: Target, settings: Settings, report: Report = lambda what, n: None) -> Results:
    """Run the bench. Once the server has answered, a failure or Ctrl+C ends the run but keeps
    what was measured (status "failed" or "interrupted", with the error); a failure before that
    (server down, 401, unknown model) raises BenchError and there is nothing to keep."""
    results = Results(target, settings)
    try:
        asyncio.run(_run(target, settings, results, report))
    except KeyboardInterrupt:
        results.finish(Status.INTERRUPTED, "stopped by Ctrl+C")
        return results
    except BenchError as e:
        if not results.started:
            raise
        results.finish(Status.FAILED, e.message)
        return results
    results.finish(Status.COMPLETE)
    return results
