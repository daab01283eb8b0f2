"""Liveness from token progress (launcher/apply/liveness.py), judged as data: the samples the
supervisor takes of rank 0's /metrics and its own probe, in; the verdict, out."""

from __future__ import annotations

import pytest

from launcher.apply.liveness import Sample, judge


def looks(*rows, every=10.0, start=0.0):
    """Samples every `every` s from `start`: (generated, running, waiting, kv, probe pending s,
    probes answered); None where /metrics was not read."""
    out = []
    for i, row in enumerate(rows):
        at = start + i * every
        if row is None:
            out.append(Sample(at, None, unread="ConnectError: refused"))
            continue
        gen, run, wait, kv, pending, answered = row
        out.append(Sample(at, gen, run, wait, kv, pending, answered))
    return out


# (case, samples, grace_s, stalled_checks, state, stalled streak, words in the why)
CASES = [
    ("within the grace period nothing is judged",
     looks((5, 0, 3, 0.1, 50, 0), (5, 0, 3, 0.1, 60, 0), (5, 0, 3, 0.1, 70, 0)), 100, 2,
     "grace", 0, ["grace period"]),
    ("idle: nothing asked, nothing moves",
     looks((5, 0, 0, 0.0, None, 0), (5, 0, 0, 0.0, None, 0)), 0, 2, "idle", 0, []),
    ("the probe answered: alive",
     looks((5, 0, 0, 0.0, None, 0), (6, 0, 0, 0.0, None, 1)), 0, 2, "progressing", 0, ["+1 tokens"]),
    ("the stand-in's wedge: requests pile up as waiting, the counter flat",
     looks((5, 0, 0, 0.0, None, 1), (5, 0, 2, 0.0, 10, 0), (5, 0, 3, 0.0, 20, 0), (5, 0, 4, 0.0, 30, 0)),
     0, 3, "wedged", 3, ["no token produced for 3 check(s)", "0 running and 4 waiting",
                         "vllm:generation_tokens_total stayed at 5", "probe unanswered for 30 s",
                         "/health still answers"]),
    ("one interval short of the limit: stalled, not yet a wedge",
     looks((5, 0, 0, 0.0, None, 1), (5, 0, 2, 0.0, 10, 0), (5, 0, 3, 0.0, 20, 0)),
     0, 3, "stalled", 2, ["2 check(s)"]),
    ("a wedge in a step: vLLM's gauges frozen at their last value, only the probe says work waits",
     looks((9, 0, 0, 0.0, None, 1), (9, 0, 0, 0.0, 10, 0), (9, 0, 0, 0.0, 20, 0)),
     0, 2, "wedged", 2, ["probe unanswered for 20 s"]),
    ("mid-request wedge: running, no token",
     looks((40, 1, 0, 0.2, None, 0), (40, 1, 0, 0.2, None, 0), (40, 1, 0, 0.2, 10, 0)),
     0, 2, "wedged", 2, ["1 running and 0 waiting"]),
    ("busy: the probe waits behind real load while tokens keep coming",
     looks((100, 8, 3, 0.5, None, 1), (380, 8, 3, 0.6, 10, 0), (660, 8, 3, 0.6, 20, 0), (940, 8, 2, 0.7, 30, 0)),
     0, 2, "busy", 0, ["probe waits 30 s behind 8 running and 2 waiting", "+280 tokens in 10 s"]),
    ("a long prompt being prefilled: no token for minutes, the KV usage grows",
     looks((7, 1, 0, 0.10, None, 0), (7, 1, 1, 0.15, 10, 0), (7, 1, 1, 0.20, 20, 0), (7, 1, 1, 0.25, 30, 0)),
     0, 2, "busy", 0, ["KV-cache usage 20.0% -> 25.0%"]),
    ("progress between stalls resets the count",
     looks((5, 1, 0, 0.1, None, 0), (5, 1, 0, 0.1, 10, 0), (6, 1, 0, 0.1, None, 1), (6, 1, 0, 0.1, 10, 0)),
     0, 2, "stalled", 1, []),
    ("a counter that went back (the engine restarted) is movement",
     looks((500, 1, 0, 0.1, 10, 0), (3, 1, 0, 0.1, 20, 0)), 0, 1, "busy", 0, []),
    ("/metrics unreadable and no probe pending: not known, not counted",
     looks((5, 0, 0, 0.0, None, 1), None, None), 0, 3, "unread", 0, ["/metrics not read: ConnectError"]),
]


@pytest.mark.parametrize("case,samples,grace,limit,state,streak,words", CASES, ids=[c[0] for c in CASES])
def test_verdict(case, samples, grace, limit, state, streak, words):
    verdict = judge(samples, grace, limit)
    assert (verdict.state, verdict.stalled) == (state, streak), verdict
    for w in words:
        assert w in verdict.why, verdict.why


def test_unreadable_metrics_with_the_probe_pending_count_as_stalled():
    samples = [Sample(0, 5, 0, 0, 0.0, None, 1), Sample(10, None, unread="ReadTimeout: timed out", probe_pending_s=10),
               Sample(20, None, unread="ReadTimeout: timed out", probe_pending_s=20)]
    verdict = judge(samples, 0, 2)
    assert (verdict.state, verdict.stalled) == ("wedged", 2)
    assert "/metrics not read: ReadTimeout: timed out" in verdict.why
