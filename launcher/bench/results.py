"""What a bench run measured and against what (Target, Settings), as data: one Request per stream, a Cell per (task, concurrency), a
Needle per depth, and the Results with their JSON (format RESULTS_FORMAT). Pure."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field

from ..status import Status
from .stats import ACCEPTED, DRAFTS, SpecCounters, accepted_per_step, decode_rate, percentile

RESULTS_FORMAT = 1  # bump when the JSON shape changes incompatibly
DEFAULT_TASKS = ("prose", "code", "list", "essay")
DEFAULT_CONCURRENCY = (1, 2, 4, 8)
# Seed 000 measured at temperature 0.6 / top_p 0.95; a profile's `bench` section may differ.
DEFAULT_TEMPERATURE, DEFAULT_TOP_P = 0.6, 0.95


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


def size_label(tokens: int) -> str:
    if tokens >= 1_000_000 and tokens % 100_000 == 0:
        return f"{tokens / 1_000_000:g}m"
    return f"{tokens / 1000:g}k" if tokens >= 1000 else str(tokens)


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
