"""`up --keep` on the sandbox, run as a user runs it (the console script, a subprocess): a worker's
engine killed -> the supervisor names the rank and the cause, re-deploys every rank and the API
answers again; a rank that stays broken -> backoff, then "giving up" naming it, nothing left
running; SIGTERM while watching leaves the cluster serving. `status` shows the restarts.
Liveness: rank 0's engine wedged (SIGUSR1: /health answers, no token) is found within the
configured checks and re-deployed; a busy engine (slow completions under concurrent load, the
probe waiting behind them, tokens still coming) is not counted as a wedge."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from launcher.apply import exporter, supervisor
from launcher.inputs import config
from launcher.transport import api
from serving import cli

SPARKSTACK = Path(sys.executable).parent / "sparkstack"


LIVENESS = {"interval_s": 1, "grace_s": 2, "stalled_checks": 3}


@pytest.fixture
def keep_cfg(sandbox, tmp_path, monkeypatch):
    """The sandbox's config with a supervisor that looks every second and backs off one second;
    its log under this test's own state dir."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    data = yaml.safe_load(open(sandbox.config))
    data["keep"] = {"check_interval_s": 1, "api_failures": 2, "backoff_s": 1, "backoff_max_s": 2,
                    "max_restarts_per_hour": 2, "liveness": LIVENESS}
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    yield str(path)
    assert cli("down", "-c", str(path)).exit_code == 0


def events(tmp_path) -> list[dict]:
    logs = list((tmp_path / "state" / "sparkstack" / "keep").glob("*.jsonl"))
    return [json.loads(line) for p in logs for line in p.read_text().splitlines()]


def wait_for(tmp_path, process, predicate, limit_s=300) -> list[dict]:
    deadline = time.monotonic() + limit_s
    while True:
        seen = events(tmp_path)
        if predicate(seen):
            return seen
        assert process.poll() is None, process.stdout.read()
        assert time.monotonic() < deadline, f"not within {limit_s} s: {seen}"
        time.sleep(0.3)


def engines(sandbox) -> list[str]:
    return [n for n in sandbox.names
            if sandbox.run(n, "docker ps -q --filter name=^sparkstack-engine$")[1].strip()]


def start_keep(cfg) -> subprocess.Popen:
    return subprocess.Popen([str(SPARKSTACK), "up", "--keep", "-c", cfg], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def test_a_killed_worker_engine_is_brought_back(sandbox, keep_cfg, tmp_path):
    keep = start_keep(keep_cfg)
    try:
        wait_for(tmp_path, keep, lambda e: any(x["event"] == "serving" for x in e))
        assert sandbox.run("spark3", "docker kill sparkstack-engine")[0] == 0
        seen = wait_for(tmp_path, keep, lambda e: [x["event"] for x in e].count("serving") == 2)
        status = cli("status", "-c", keep_cfg, "--json")
        keep.send_signal(signal.SIGTERM)
        output, _ = keep.communicate(timeout=60)
    finally:
        if keep.poll() is None:
            keep.kill()
    kinds = [x["event"] for x in seen]
    assert kinds == ["started", "serving", "failure", "restart", "serving"], seen
    failure = seen[2]["cause"]
    assert failure.startswith("rank 2 (spark3): exited with code 137"), failure
    assert keep.returncode == 130 and "stopped supervising; the cluster keeps serving" in output, output
    assert "Traceback" not in output
    assert sorted(engines(sandbox)) == sorted(sandbox.names)  # SIGTERM left it serving
    keep_status = json.loads(status.stdout)["keep"]
    assert keep_status["restarts"] == 1 and keep_status["last_cause"] == failure
    log = next((tmp_path / "state" / "sparkstack" / "keep").glob("*.jsonl")).read_text().splitlines()
    assert {k: v for k, v in exporter.supervisor_state(log).items() if k != "last_event_at"} == {
        "restarts": 1, "serving": 1}  # what `metrics serve` exports as sparkstack_restarts_total, sparkstack_serving


def test_a_rank_that_stays_broken_ends_in_giving_up(sandbox, keep_cfg, tmp_path):
    """spark3's Docker CLI disappears while serving: every re-deploy fails there; after the
    backoff and two restarts the supervisor gives up, names spark3, and no engine runs."""
    keep = start_keep(keep_cfg)
    hidden = False
    try:
        wait_for(tmp_path, keep, lambda e: any(x["event"] == "serving" for x in e))
        assert sandbox.run("spark3", "docker kill sparkstack-engine && sudo mv /usr/bin/docker /usr/bin/docker.hidden")[0] == 0
        hidden = True
        output, _ = keep.communicate(timeout=300)
    finally:
        if hidden:
            sandbox.run("spark3", "sudo mv /usr/bin/docker.hidden /usr/bin/docker")
        if keep.poll() is None:
            keep.kill()
    seen = events(tmp_path)
    kinds = [x["event"] for x in seen]
    assert keep.returncode == 1, output
    assert kinds[:3] == ["started", "serving", "failure"] and kinds[-1] == "gave up", kinds
    assert kinds.count("restart") == 2
    assert "giving up: 2 restarts in the last hour and it failed again" in output
    assert "spark3" in seen[-1]["cause"]
    assert "Traceback" not in output
    assert [n for n in engines(sandbox) if n != "spark3"] == []  # nothing half-running


def test_summary_of_a_log(tmp_path):
    log = supervisor.EventLog(tmp_path / "keep.jsonl")
    log.add("started", profile="p")
    log.add("serving")
    log.add("failure", cause="rank 1 (spark2): exited with code 1")
    log.add("restart", attempt=1)
    log.add("serving")
    got = supervisor.summary(log.path)
    assert got["restarts"] == 1 and got["last_cause"] == "rank 1 (spark2): exited with code 1"
    assert got["last_event"]["event"] == "serving"
    log.add("started", profile="p")  # a new supervisor run counts afresh
    assert supervisor.summary(log.path)["restarts"] == 0
    assert supervisor.summary(tmp_path / "none.jsonl") is None


def completion(cfg: str, max_tokens: int = 4, timeout: float = 60) -> httpx.Response:
    ep = api.endpoint(config.load(cfg))
    return httpx.post(f"{ep.url}/v1/chat/completions", headers=ep.headers, timeout=timeout,
                      json={"model": ep.model, "max_tokens": max_tokens,
                            "messages": [{"role": "user", "content": "Tell me about four machines."}]})


@contextlib.contextmanager
def supervising(cfg: str, tmp_path):
    """`up --keep` while the block runs, serving first; then SIGTERM: yields a dict that gets
    the supervisor's `output` once it stopped."""
    keep, ran = start_keep(cfg), {}
    try:
        wait_for(tmp_path, keep, lambda e: any(x["event"] == "serving" for x in e))
        yield keep, ran
        keep.send_signal(signal.SIGTERM)
        ran["output"] = keep.communicate(timeout=60)[0]
    finally:
        if keep.poll() is None:
            keep.kill()


def test_a_wedged_engine_is_found_by_its_tokens_and_brought_back(sandbox, keep_cfg, tmp_path):
    """Rank 0's scheduler wedges (the stand-in's SIGUSR1): /health keeps answering, so only token
    progress shows it; within grace + stalled_checks intervals (+ the checks' own time) the
    supervisor names rank 0 and the figures, re-deploys every rank, and a completion answers."""
    with supervising(keep_cfg, tmp_path) as (keep, ran):
        assert completion(keep_cfg).status_code == 200
        assert sandbox.run("spark1", "docker kill -s USR1 sparkstack-engine")[0] == 0
        wedged = time.monotonic()
        wait_for(tmp_path, keep, lambda e: any(x["event"] == "failure" for x in e), limit_s=60)
        found = time.monotonic() - wedged
        seen = wait_for(tmp_path, keep, lambda e: [x["event"] for x in e].count("serving") == 2)
        answered = completion(keep_cfg)
    assert [x["event"] for x in seen] == ["started", "serving", "failure", "restart", "serving"], seen
    cause = seen[2]["cause"]
    assert cause.startswith("rank 0 (spark1): wedged: no token produced for 3 check(s) in a row"), cause
    assert "vllm:generation_tokens_total stayed at" in cause and "/health still answers" in cause, cause
    # grace (2 s) + 3 stalled intervals of >= 1 s, each after a container check over SSH
    assert found < LIVENESS["grace_s"] + 4 * (LIVENESS["stalled_checks"] + 1), found
    assert answered.status_code == 200, answered.text
    assert "Traceback" not in ran["output"]


def test_a_busy_engine_is_not_a_wedge(sandbox, keep_cfg, tmp_path):
    """Slow completions (10 tok/s) keep more requests in flight than --max-num-seqs (8): the
    supervisor's probe waits behind them for longer than stalled_checks intervals, yet tokens keep
    coming: logged as busy, never a failure, nothing re-deployed."""
    data = yaml.safe_load(open(keep_cfg))
    data.setdefault("overrides", {})["env"] = {"SANDBOX_VLLM_TOKENS_PER_S": "10"}
    Path(keep_cfg).write_text(yaml.safe_dump(data))
    with supervising(keep_cfg, tmp_path) as (keep, ran):
        time.sleep(LIVENESS["grace_s"] + 1)
        with cf.ThreadPoolExecutor(12) as pool:  # two waves of 40-token answers: ~8 s of load
            answers = list(pool.map(lambda _: completion(keep_cfg, max_tokens=40), range(16)))
        time.sleep(3 * LIVENESS["interval_s"])
        seen = events(tmp_path)
    assert [a.status_code for a in answers] == [200] * 16
    kinds = [x["event"] for x in seen]
    assert "failure" not in kinds and "restart" not in kinds, seen
    busy = [x for x in seen if x["event"] == "busy"]
    assert busy and "the liveness probe waits" in busy[0]["detail"] and "tokens in" in busy[0]["detail"], seen
    assert "busy, not wedged" in ran["output"] and "Traceback" not in ran["output"], ran["output"]
