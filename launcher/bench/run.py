"""`sparkstack bench`: decode tok/s, TTFT, speculative acceptance and a needle test, measured
from any OpenAI-compatible server the way the seeds published theirs.

Definitions (seed 000's): TTFT is the time from a request going onto the wire to its first
non-empty content or reasoning token; decode tok/s is completion tokens ÷ (wall − TTFT), so
prefill is excluded; a (task, concurrency) cell reports the per-stream median and the
aggregate, the per-stream rates summed. Completion tokens come from the usage chunk
(`stream_options.include_usage`); a server that sends none has its content chunks counted, and
the results say so. Accepted tokens per step = 1 + Δaccepted / Δdrafts of vLLM's spec-decode
counters over a cell, read from `/metrics`.

Here: the inputs (target, settings, prompts) and the HTTP client that measures (httpx, asyncio
for concurrent streams). Pure parts beside it: stats.py (the arithmetic), results.py (what was
measured), needle.py (the needle prompt), stream.py (one stream read); output formats in report.py.
"""

from __future__ import annotations

import asyncio
import re
import json
import random
import time
from importlib import resources
from typing import Callable
from urllib.parse import urlsplit

import httpx

from ..status import Status
from .needle import TOKENS_PER_WORD, needle_fact, needle_messages
from .results import (DEFAULT_TEMPERATURE, DEFAULT_TOP_P, Cell, Needle, Request, Results, Settings, Target,
                      size_label)
from .stats import SpecCounters, parse_prometheus, spec_delta
from .stream import BenchError, StreamReader, error_text

WARMUP_TOKENS = 16
NEEDLE_MAX_TOKENS = 64  # the answer is one short sentence; thinking on needs --max-tokens more

# ---------------------------------------------------------------- inputs

def normalize_url(url: str) -> str:
    """`host:8888`, `http://host:8888/`, `http://host:8888/v1` all name the same server root.
    Anything else is refused here, before any lookup: a scheme other than http(s), a host that is
    not a host name or an IP address, a port that is not 1-65535, credentials, a query, spaces."""
    from ..inputs.config import control_chars, is_host

    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    url = url.rstrip("/")
    bad = ValueError(f"{url!r} is not a server address like http://HOST:PORT")
    if control_chars(url) or any(c.isspace() for c in url) or not url.isascii():
        raise bad
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise bad from None
    if (parts.scheme not in ("http", "https") or not parts.hostname or not is_host(parts.hostname)
            or "@" in parts.netloc or parts.query or parts.fragment or port == 0
            or url.endswith("?") or url.endswith("#")):
        raise bad
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
