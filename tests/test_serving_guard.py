"""The memory guard while serving (issue 29), on the sandbox's GB10 memory model, through the
real CLI: the stand-in engine's prefill takes memory on the rank serving the API, so a long
prompt drives a rank toward its floors while it serves.

- soft floor: a page cache that ate MemFree is dropped by the rank's guard, the long prompt's
  prefill then fits and is answered (without the guard the same prompt kills the engine with
  NV_ERR_NO_MEMORY);
- hard floor: the guard stops that rank's engine, the rank still answers SSH, `up --keep` names
  the rank, the floor and the figures, waits until memory is back, and serves again;
- a rank that keeps its memory: no loop, the supervisor gives up naming it;
- the control host gone (its `up --keep` killed with SIGKILL): the guard still stops the engine.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from launcher.inputs import config
from launcher.sandbox import meminfo
from launcher.transport import api
from serving import cli, states

GIB = 1 << 30
KB_PER_GIB = 1 << 20
SPARKSTACK = Path(sys.executable).parent / "sparkstack"
MIB_PER_TOKEN = 1024  # the stand-in's prefill takes 1 MiB per prompt token here: 1,000 tokens ~ 1 GiB


@pytest.fixture
def guarded(sandbox, tmp_path, monkeypatch):
    """The sandbox's config with a guard that looks four times a second (soft floor 10 GiB of
    MemFree, hard floor 3 GiB of MemAvailable), a prefill that takes 1 MiB a prompt token over
    1,000 tokens a second, and a supervisor that looks every second; its own state dir. After
    the test: every squeeze undone, every engine stopped."""
    if not meminfo.enabled():
        pytest.fail("the sandbox runs without its memory model (SPARKSTACK_SANDBOX_MEMINFO=host)")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    data = yaml.safe_load(Path(sandbox.config).read_text())
    data.setdefault("overrides", {}).setdefault("env", {}).update(
        SANDBOX_VLLM_PREFILL_KIB_PER_TOKEN=str(MIB_PER_TOKEN), SANDBOX_VLLM_PREFILL_TOKENS_PER_S="1000")
    data["memory_guard"] = {"serving": {"interval_s": 0.25, "cooldown_s": 1, "soft_free_gib": 10,
                                        "hard_available_gib": 3, "memory_back_s": 20}}
    data["keep"] = {"check_interval_s": 1, "api_failures": 2, "backoff_s": 1, "backoff_max_s": 2,
                    "max_restarts_per_hour": 3}
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    try:
        yield str(path)
    finally:
        for name in sandbox.names:
            meminfo.unsqueeze(sandbox.state_dir, name)
        assert cli("down", "-c", str(path)).exit_code == 0


def prompt(cfg: str, tokens: int, timeout: float = 120) -> httpx.Response:
    """A chat completion whose prompt counts `tokens` tokens (the stand-in counts 1.3 a word)."""
    endpoint = api.endpoint(config.load(cfg))
    words = " ".join(["memory"] * round(tokens / 1.3))
    body = {"messages": [{"role": "user", "content": words}], "max_tokens": 4}
    return httpx.post(f"{endpoint.url}/v1/chat/completions", json=body, headers=endpoint.headers, timeout=timeout)


def guard_events(sandbox, name: str) -> list[dict]:
    rc, out, err = sandbox.run(name, "cat ~/.cache/sparkstack/memguard/events.jsonl 2>/dev/null; true")
    assert rc == 0, err
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def engine_running(sandbox, name: str) -> bool:
    return bool(sandbox.run(name, "docker ps -q --filter name=^sparkstack-engine$")[1].strip())


def keep_events(tmp_path) -> list[dict]:
    logs = list((tmp_path / "state" / "sparkstack" / "keep").glob("*.jsonl"))
    return [json.loads(line) for p in logs for line in p.read_text().splitlines()]


def wait_for(test, what: str, limit_s: float = 300, process: subprocess.Popen | None = None):
    deadline = time.monotonic() + limit_s
    while True:
        got = test()
        if got:
            return got
        if process is not None:
            assert process.poll() is None, process.stdout.read()
        assert time.monotonic() < deadline, f"not within {limit_s} s: {what}"
        time.sleep(0.2)


def start_keep(cfg) -> subprocess.Popen:
    """`up --keep --no-verify`: verification's own prefills (2,048-token prompts, 2 GiB each at
    this test's 1 MiB a token) would raise the engine's prefill high-water mark before the squeeze,
    and the figures below are sized from an engine that has served no long prompt yet."""
    return subprocess.Popen([str(SPARKSTACK), "up", "--keep", "--no-verify", "-c", cfg], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def serving(tmp_path) -> int:
    return [e["event"] for e in keep_events(tmp_path)].count("serving")


def fill_cache_and_prompt(sandbox, cfg: str) -> tuple[float, httpx.Response | None]:
    """spark1 (the API's rank) with 16 GiB available and its page cache refilled until MemFree is
    under 1 GiB; then, once MemFree is back above the soft floor (or after 5 s), an 8,000-token
    prompt (8 GiB of prefill). (when the cache was filled, the answer or None: the engine died)."""
    meminfo.squeeze_available(sandbox.state_dir, "spark1", 16 * GIB)
    since = time.time()
    meminfo.fill_page_cache(sandbox.state_dir, "spark1", 64 * GIB)
    meminfo.wait_for(sandbox.state_dir, "spark1", lambda f: f["MemFree"] > 14 * KB_PER_GIB, timeout=5)
    try:
        return since, prompt(cfg, 8000)
    except httpx.HTTPError:
        return since, None


def test_without_the_guard_a_long_prompt_on_a_full_page_cache_kills_the_engine(sandbox, guarded):
    """What the guard is for: with memory_guard.serving off, the 8 GiB prefill cannot take the
    page cache on a GB10 and the engine dies with NV_ERR_NO_MEMORY."""
    doc = yaml.safe_load(Path(guarded).read_text())
    doc["memory_guard"]["serving"]["enabled"] = False
    off = Path(guarded).with_name("unguarded.yaml")
    off.write_text(yaml.safe_dump(doc))
    up = cli("up", "-c", str(off))
    assert up.exit_code == 0, up.output
    _since, answer = fill_cache_and_prompt(sandbox, str(off))
    assert answer is None or answer.status_code != 200
    wait_for(lambda: not engine_running(sandbox, "spark1"), "the unguarded engine's death", 30)
    _rc, logs, _ = sandbox.run("spark1", "docker logs sparkstack-engine 2>&1 | tail -n 5")
    assert "NV_ERR_NO_MEMORY" in logs, logs


def test_the_soft_floor_drops_caches_and_the_long_prompt_is_served(sandbox, guarded):
    """The same squeeze, cache and prompt with the guard on: it drops caches and compacts
    (logged on the rank with the figures and the floor), the prompt is answered, the rank keeps
    serving; `status` shows the guard watching and its drop."""
    up = cli("up", "-c", guarded)
    assert up.exit_code == 0, up.output
    assert "memory guard on every rank while serving" in up.output
    since, answer = fill_cache_and_prompt(sandbox, guarded)
    assert answer is not None and answer.status_code == 200, answer and answer.text
    assert engine_running(sandbox, "spark1")
    reliefs = [e for e in guard_events(sandbox, "spark1") if e["event"] == "relief" and e["at"] >= since]
    assert reliefs and reliefs[0]["rc"] == 0 and reliefs[0]["free_before"] < 10 * GIB, reliefs
    assert reliefs[0]["soft_free"] == 10 * GIB and isinstance(reliefs[0]["free"], int)  # read at once after
    # the drop: the sandbox's memory daemon shows it a tick later, a kernel at once
    happened = [e[1:] for e in meminfo.events(sandbox.state_dir, "spark1", since)]
    assert ("drop_caches", "3") in happened and ("compact_memory", "1") in happened
    shown = json.loads(cli("status", "-c", guarded, "--json").stdout)["memory_guard"]
    assert shown[0]["watching"] and shown[0]["events"][-1]["event"] == "relief"
    assert all(g["watching"] for g in shown)
    assert "dropped page caches and compacted memory" in cli("status", "-c", guarded).output


def test_the_hard_floor_stops_the_engine_and_keep_redeploys_once_memory_is_back(sandbox, guarded, tmp_path):
    """spark1 squeezed to 9 GiB available while serving, then a 7,000-token prompt: its prefill
    takes MemAvailable under the 3 GiB floor, the guard kills spark1's engine, spark1 answers SSH;
    the supervisor's cause names the rank, the floor and the figures; it waits while spark1's
    memory is short of the plan's figure and serves again once the squeeze is gone."""
    state = sandbox.state_dir
    keep = start_keep(guarded)
    try:
        wait_for(lambda: serving(tmp_path) == 1, "serving", process=keep)
        meminfo.squeeze_available(state, "spark1", 9 * GIB)
        squeezed = time.monotonic()
        try:
            prompt(guarded, 7000, timeout=30)
        except httpx.HTTPError:
            pass  # the engine was stopped under it
        wait_for(lambda: not engine_running(sandbox, "spark1"), "the guard's stop", 30)
        stopped_s = time.monotonic() - squeezed
        assert sandbox.run("spark1", "echo alive")[1] == "alive\n"  # the box survived
        failure = wait_for(lambda: [e for e in keep_events(tmp_path) if e["event"] == "failure"], "failure",
                           process=keep)[0]
        wait_for(lambda: any(e["event"] == "restart" for e in keep_events(tmp_path)), "the restart", process=keep)
        wait_for(lambda: not any(engine_running(sandbox, n) for n in sandbox.names), "every rank down", 60)
        time.sleep(2)  # the re-deploy waits: spark1's MemAvailable is under the plan's figure
        assert serving(tmp_path) == 1
        meminfo.unsqueeze(state, "spark1")
        wait_for(lambda: serving(tmp_path) == 2, "serving again", process=keep)
        keep.send_signal(signal.SIGTERM)
        output, _ = keep.communicate(timeout=60)
    finally:
        if keep.poll() is None:
            keep.kill()
    cause = failure["cause"]
    assert cause.startswith("rank 0 (spark1): the memory guard stopped its engine at "), cause
    assert re.search(r"MemAvailable [12]\.\d GiB, MemFree \d+\.\d GiB, under the hard floor of 3 GiB", cause), cause
    assert "waiting for MemAvailable" in output and "rank 0 (spark1)" in output
    assert "Traceback" not in output
    hard = [e for e in guard_events(sandbox, "spark1") if e["event"] == "hard"]
    assert hard and hard[-1]["avail"] < 3 * GIB
    assert stopped_s < 20


def test_a_rank_that_keeps_its_memory_ends_in_giving_up(sandbox, guarded, tmp_path):
    """spark3 squeezed under its hard floor while serving (something else holds the memory): its
    guard stops its engine, the supervisor stops every rank and waits for memory that never
    comes back: it gives up naming spark3, after one restart, not a loop."""
    keep = start_keep(guarded)
    try:
        wait_for(lambda: serving(tmp_path) == 1, "serving", process=keep)
        meminfo.squeeze_available(sandbox.state_dir, "spark3", 2 * GIB)
        output, _ = keep.communicate(timeout=150)
    finally:
        if keep.poll() is None:
            keep.kill()
    kinds = [e["event"] for e in keep_events(tmp_path)]
    assert keep.returncode == 1, output
    assert kinds[-1] == "gave up" and kinds.count("restart") == 1, kinds
    cause = keep_events(tmp_path)[-1]["cause"]
    assert "did not give its memory back" in cause and "rank 2 (spark3): MemAvailable 2." in cause, cause
    assert "giving up" in output and "Traceback" not in output
    assert not any(engine_running(sandbox, n) for n in sandbox.names)
    assert sandbox.run("spark3", "echo alive")[1] == "alive\n"


def test_the_guard_works_with_the_control_host_gone(sandbox, guarded, tmp_path):
    """`up --keep` killed with SIGKILL (its SSH connections die with it, nothing cleans up):
    squeezed under its hard floor, spark2's guard still stops spark2's engine and records it;
    `logs --guard` shows it."""
    keep = start_keep(guarded)
    try:
        wait_for(lambda: serving(tmp_path) == 1, "serving", process=keep)
    finally:
        keep.kill()
        keep.communicate(timeout=60)
    assert keep.returncode == -signal.SIGKILL
    assert engine_running(sandbox, "spark2")
    meminfo.squeeze_available(sandbox.state_dir, "spark2", 2 * GIB)
    wait_for(lambda: not engine_running(sandbox, "spark2"), "the guard's stop without the control host", 30)
    hard = [e for e in guard_events(sandbox, "spark2") if e["event"] == "hard"]
    assert hard and hard[-1]["avail"] == 2 * GIB and hard[-1]["hard_available"] == 3 * GIB
    assert states(guarded)[1] == "exited"
    shown = cli("logs", "-c", guarded, "--rank", "1", "--guard")
    assert shown.exit_code == 0 and '"event": "hard"' in shown.output


def test_a_ranks_record_read_back_names_the_stop_of_the_container_there_now():
    """What `status` and the supervisor read from a rank (servguard.parse): the hard floor's
    event counts for the container there now only, and reads with its floor and figures; a line
    cut short by a reset is skipped, not fatal."""
    from launcher.apply import servguard

    old = {"event": "hard", "at": 1764637200.0, "container_id": "old", "avail": 1 * GIB, "free": GIB,
           "hard_available": 3 * GIB}
    now = dict(old, container_id="new", avail=2 * GIB + GIB // 10, free=2 * GIB, at=1764637260.5)
    text = "idle\ncontainer new\n" + "\n".join(json.dumps(e) for e in (old, now)) + '\n{"event": "rel'
    guard = servguard.parse(0, "rank 0 (spark1)", text)
    assert not guard.watching and guard.container_id == "new" and len(guard.events) == 2
    assert guard.stopped_engine() == now
    assert servguard.describe(now) == ("the memory guard stopped its engine at 01:01:00 UTC: MemAvailable 2.1 GiB, "
                                       "MemFree 2.0 GiB, under the hard floor of 3 GiB")
    assert servguard.parse(0, "rank 0 (spark1)", "watching\ncontainer old\n" + json.dumps(now)).stopped_engine() is None


def test_a_guard_counts_as_watching_only_for_the_container_there_now():
    """`status` said "watching" for any live pid in the pid file: a guard that had not yet seen
    its container go (it looks every CHECK_S) hid a new engine's missing guard. Watching is a
    live memwatch whose command line names the container there now."""
    from launcher.apply import servguard

    cmd = 'watching python3 memwatch.py {"container_id": "%s", "soft_free": 1} '
    assert servguard.parse(1, "rank 1 (spark2)", cmd % "new" + "\ncontainer new\n").watching
    assert not servguard.parse(1, "rank 1 (spark2)", cmd % "old" + "\ncontainer new\n").watching
    assert not servguard.parse(1, "rank 1 (spark2)", "watching sleep 600 \ncontainer new\n").watching
    assert not servguard.parse(1, "rank 1 (spark2)", "idle\ncontainer new\n").watching
