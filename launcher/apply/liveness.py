"""Liveness while serving (`up --keep`), judged from token progress, not from /health.

A wedged engine (a scheduler stuck in a step: a hung collective, a stuck kernel) still answers
/health. So every `keep.liveness.interval_s` the supervisor reads rank 0's own /metrics (vLLM's
generation-token counter, its running and waiting requests, its KV-cache usage) and keeps one
tiny completion (max_tokens 1) of its own in flight. An interval is *stalled* when work is there
(requests running or waiting, or the supervisor's probe unanswered) and nothing moved: no token
produced, the KV usage unchanged (it grows while a long prompt is prefilled, which produces no
token for minutes: seed 000's 979K prompt took ~52 min to its first token), no probe answered.
`stalled_checks` stalled intervals in a row, after `grace_s` from the start of serving, is a
wedge. A probe that waits behind real load while tokens keep coming is busy, not wedged.

`judge` is the whole judgement, pure (samples in, verdict out); `Watch` takes the samples.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

import httpx

from ..transport import engine_metrics as em
from ..transport.api import Endpoint


@dataclass(frozen=True)
class Sample:
    """One look at rank 0, `at` seconds after the cluster started serving."""

    at: float
    generated: float | None  # vllm:generation_tokens_total; None: /metrics not read
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    probe_pending_s: float | None = None  # how long the supervisor's probe has gone unanswered
    answered: int = 0  # probes answered with a token since the previous sample
    unread: str = ""  # why /metrics was not read


@dataclass(frozen=True)
class Verdict:
    state: str  # "grace" | "idle" | "unread" | "progressing" | "busy" | "stalled" | "wedged"
    stalled: int  # stalled intervals in a row
    why: str


def _moved(prev: Sample, cur: Sample) -> bool:
    """The engine did something between two looks (a counter that went back: it restarted)."""
    if cur.answered:
        return True
    for a, b in ((prev.generated, cur.generated), (prev.kv_usage, cur.kv_usage)):
        if a is not None and b is not None and a != b:
            return True
    return False


def _work(s: Sample) -> bool:
    return (s.running or 0) + (s.waiting or 0) > 0 or s.probe_pending_s is not None


def judge(samples: list[Sample], grace_s: float, stalled_checks: int) -> Verdict:
    """The verdict on the latest sample, from the samples so far (oldest first)."""
    looked = [s for s in samples if s.at >= grace_s]
    if len(looked) < 2:
        return Verdict("grace", 0, f"within the grace period ({grace_s:g} s after serving)")
    streak = 0
    for prev, cur in zip(looked, looked[1:]):
        streak = streak + 1 if _work(cur) and not _moved(prev, cur) else 0
    prev, cur = looked[-2], looked[-1]
    if streak >= stalled_checks:
        return Verdict("wedged", streak, _stalled_why(looked[-1 - streak:], streak))
    if streak:
        return Verdict("stalled", streak, _stalled_why(looked[-1 - streak:], streak))
    if not _moved(prev, cur):
        if cur.generated is None:
            return Verdict("unread", 0, f"/metrics not read: {cur.unread}")
        return Verdict("idle", 0, "no request running or waiting")
    if cur.probe_pending_s is not None and cur.probe_pending_s > cur.at - prev.at:
        return Verdict("busy", 0, f"the liveness probe waits {cur.probe_pending_s:.0f} s behind "
                                  f"{_load(cur)}; {_progress(prev, cur)}")
    return Verdict("progressing", 0, _progress(prev, cur))


def _load(s: Sample) -> str:
    if s.running is None:
        return "an unknown load"
    return f"{s.running:.0f} running and {s.waiting or 0:.0f} waiting request(s)"


def _progress(prev: Sample, cur: Sample) -> str:
    if prev.generated is not None and cur.generated is not None and cur.generated != prev.generated:
        return f"{cur.generated - prev.generated:+.0f} tokens in {cur.at - prev.at:.0f} s"
    if cur.answered:
        return "the liveness probe answered"
    return f"KV-cache usage {prev.kv_usage:.1%} -> {cur.kv_usage:.1%} (a prompt being prefilled)"


def _stalled_why(window: list[Sample], streak: int) -> str:
    first, last = window[0], window[-1]
    counter = (f"{em.GENERATED} stayed at {last.generated:.0f}" if last.generated is not None
               else f"/metrics not read: {last.unread}")
    probe = (f", the liveness probe unanswered for {last.probe_pending_s:.0f} s"
             if last.probe_pending_s is not None else "")
    return (f"no token produced for {streak} check(s) in a row ({last.at - first.at:.0f} s) with "
            f"{_load(last)} ({counter}{probe}); /health still answers")


class Watch:
    """Takes the samples: rank 0's /metrics every `interval_s`, and one probe kept in flight."""

    def __init__(self, ep: Endpoint, settings, clock=time.monotonic):
        self.ep, self.settings, self.clock = ep, settings, clock
        self.started = clock()
        self.samples: deque[Sample] = deque(maxlen=settings.stalled_checks + 2)
        self.last_at: float | None = None
        self._lock = threading.Lock()
        self._pending_since: float | None = None
        self._answered = 0

    def due(self) -> bool:
        return self.last_at is None or self.clock() - self.last_at >= self.settings.interval_s * 0.95

    def look(self) -> Verdict:
        """Read /metrics, note the probe's state, judge; then send a probe if none is pending."""
        now = self.clock()
        metrics, why = em.read(self.ep.url, self.ep.headers, timeout=min(10.0, self.settings.interval_s))
        with self._lock:
            pending = None if self._pending_since is None else now - self._pending_since
            answered, self._answered = self._answered, 0
        got = metrics or {}
        self.samples.append(Sample(now - self.started, got.get(em.GENERATED) if metrics else None,
                                   got.get(em.RUNNING), got.get(em.WAITING), got.get(em.KV_USAGE),
                                   pending, answered, why))
        self.last_at = now
        self._probe()
        return judge(list(self.samples), self.settings.grace_s, self.settings.stalled_checks)

    def _probe(self) -> None:
        with self._lock:
            if self._pending_since is not None:
                return
            self._pending_since = self.clock()
        threading.Thread(target=self._send, daemon=True, name="liveness-probe").start()

    def _send(self) -> None:
        """One completion of one token; it may wait as long as a wedge takes to be judged."""
        body = {"model": self.ep.model, "max_tokens": 1, "messages": [{"role": "user", "content": "ping"}]}
        limit = self.settings.interval_s * (self.settings.stalled_checks + 2)
        answered = False
        try:
            r = httpx.post(f"{self.ep.url}/v1/chat/completions", json=body, headers=self.ep.headers,
                           timeout=limit)
            answered = r.status_code == 200 and (r.json().get("usage") or {}).get("completion_tokens", 0) > 0
        except (httpx.HTTPError, ValueError):
            pass  # unanswered: the next look sees the probe as no longer pending, and no answer
        with self._lock:
            self._pending_since = None
            self._answered += answered
