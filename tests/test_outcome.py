"""The one status vocabulary (launcher/status.py) and the per-rank result of an action run on
every rank (Group.gather, launcher/transport/outcome.py), without SSH: the action is ours."""

import json
import signal
import threading
import time
from dataclasses import asdict

import pytest

from launcher.apply import prep
from launcher.errors import SparkstackError
from launcher.images.ship import RankShip
from launcher.status import Finding, Status
from launcher.gather import probe as gather
from launcher.transport import remote
from launcher.transport.outcome import RankOutcome

# What the modules wrote before the enum; JSON output and goldens hold these strings.
OLD = {"PASS": "pass", "WARN": "warn", "FAIL": "fail", "PLANNED": "planned", "SHIPPED": "shipped",
       "BUILT": "built", "UP_TO_DATE": "up-to-date", "FAILED": "failed", "RUNNING": "running",
       "COMPLETE": "complete", "INTERRUPTED": "interrupted"}


def test_every_status_is_its_old_string_in_json_text_and_comparisons():
    assert {s.name: s.value for s in Status} == OLD
    for s in Status:
        assert json.dumps({"status": s}) == json.dumps({"status": OLD[s.name]})
        assert s == OLD[s.name] and f"{s}" == str(s) == OLD[s.name] and f"{s:<12}" == f"{OLD[s.name]:<12}"
        assert Status(OLD[s.name]) is s and {OLD[s.name]: 1}[s] == 1  # read back from JSON


def test_records_serialise_as_before():
    ship = RankShip(1, "10.0.0.2", ["img"], Status.UP_TO_DATE)
    assert json.dumps(ship.to_json()) == json.dumps({**asdict(ship), "status": "up-to-date"})
    assert json.dumps(asdict(Finding("gpu", Status.FAIL, "none", "fix"))) == \
        '{"name": "gpu", "status": "fail", "value": "none", "fix": "fix"}'


class FakeConnection:
    def __init__(self, rank: int):
        self.target = remote.Target(rank, f"spark{rank + 1}", f"10.0.0.{rank + 1}")


def group(n: int = 4) -> remote.Group:
    return remote.Group([FakeConnection(r) for r in range(n)])


def test_gather_keeps_every_ranks_value_and_exception():
    done = []

    def action(conn):
        if conn.target.rank == 1:
            raise SparkstackError("rank 1 (spark2): no docker")
        if conn.target.rank == 2:
            raise ValueError("odd output")
        time.sleep(0.2)  # finishes after the others raised
        done.append(conn.target.rank)
        return conn.target.rank * 10

    outcomes = group().gather(action)
    assert [o.rank for o in outcomes] == [0, 1, 2, 3] and sorted(done) == [0, 3]
    assert [o.ok for o in outcomes] == [True, False, False, True]
    assert [o.value for o in outcomes if o.ok] == [0, 30]
    assert outcomes[1].why() == "rank 1 (spark2): no docker"  # named already: not twice
    assert outcomes[2].why() == "rank 2 (spark3): ValueError: odd output"
    with pytest.raises(ValueError):
        outcomes[2].get()


def test_map_is_all_or_nothing_after_every_rank_is_done():
    done = []

    def action(conn):
        if conn.target.rank == 0:
            raise SparkstackError("first")
        time.sleep(0.2)
        done.append(conn.target.rank)
        return conn.target.rank

    with pytest.raises(SparkstackError, match="first"):
        group().map(action)
    assert sorted(done) == [1, 2, 3]
    assert group().map(lambda c: c.target.rank) == [0, 1, 2, 3]


def test_each_gives_a_rank_that_raised_a_failed_result():
    def action(conn):
        if conn.target.rank == 3:
            raise SparkstackError("cannot write the env file")
        return remote.Result(conn.target, exit_status=0, stdout="ok")

    out = group().each(action)
    assert [r.ok for r in out.results] == [True, True, True, False]
    assert out.failed[0].why() == "rank 3 (spark4): cannot write the env file"


def test_an_interrupt_cancels_every_rank_at_once():
    """Ctrl+C while gather waits: raised at once, and every rank's action sees the cancel event
    (Connection.run then kills its command on the rank: tests/test_remote.py)."""
    started, cancelled = threading.Barrier(5), []

    def action(conn):
        started.wait(5)
        deadline = time.monotonic() + 30
        while not remote._cancel.event.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        cancelled.append(remote._cancel.event.is_set())

    def interrupt():
        started.wait(5)
        time.sleep(0.3)  # the main thread is in join by now: a signal just before it blocks is lost
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    begun = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        group().gather(action)
    assert time.monotonic() - begun < 10
    # the thread whose join was interrupted is not waited for (Python 3.11's Thread.join marks
    # it stopped): give it a moment
    deadline = time.monotonic() + 5
    while len(cancelled) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert cancelled == [True] * 4


def test_a_rank_whose_probe_raised_has_no_facts_and_the_others_keep_theirs(monkeypatch):
    def probe(conn, loaded, timeout, model_dir=None, container=None):
        if conn.target.rank == 2:
            raise KeyError("nccl")
        return gather.RankFacts(conn.target.rank, conn.target.label, None, None, 0.1)

    monkeypatch.setattr(gather, "probe_rank", probe)
    found = gather.gather(group(), loaded=None)
    assert [found[r].seconds for r in (0, 1, 3)] == [0.1] * 3
    assert found[2] == gather.RankFacts(2, "spark3", None, "rank 2 (spark3): KeyError: 'nccl'", 0.0)


def test_prep_reports_a_rank_whose_apply_raised_and_applies_the_others(monkeypatch):
    def apply_rank(conn, rp):
        if conn.target.rank == 0:
            raise SparkstackError("rank 0 (spark1): sudo vanished")
        rp.changed.append("drop caches")
        return rp

    monkeypatch.setattr(prep, "apply_rank", apply_rank)
    preps = {r: prep.RankPrep(r, f"spark{r + 1}", []) for r in range(4)}
    prep.apply(group(), preps)
    assert preps[0].error == "rank 0 (spark1): sudo vanished" and preps[0].changed == []
    assert all(preps[r].changed == ["drop caches"] and preps[r].error is None for r in (1, 2, 3))
    with pytest.raises(prep.PrepError, match=r"prep failed on 1 of 4 ranks:\nrank 0 \(spark1\): sudo vanished"):
        prep.PrepReport(list(preps.values()), None).raise_for_failures()
