"""The cluster lock: its holder script run here as rank 0 runs it (the real flock, the real
heartbeat timeout), and on the sandbox through the real CLI: a second `down` refuses naming the
holder, waits with --wait-lock, takes over a lock whose holder went silent, and read-only
commands never wait."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest

from launcher import onrank
from launcher.apply import cluster_lock
from launcher.inputs import config
from launcher.gather import probe as gather
from serving import cli


def start_holder(path: Path, who: dict, stale_s: float = 30) -> subprocess.Popen:
    command, script = onrank.invocation_keeping_stdin("lock_holder", {"path": str(path), "holder": who,
                                                                     "stale_s": stale_s})
    process = subprocess.Popen(command, shell=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    process.stdin.write(script)
    process.stdin.flush()
    return process


def answer(process: subprocess.Popen) -> dict:
    return json.loads(process.stdout.readline())


def test_one_holder_at_a_time_and_a_clean_release(tmp_path):
    path = tmp_path / "lock" / "cluster.lock"
    first = start_holder(path, {"user": "a"})
    assert answer(first) == {"held": True, "previous": None}
    second = start_holder(path, {"user": "b"})
    assert answer(second) == {"held": False, "holder": {"user": "a"}}
    assert second.wait(timeout=10) == 1
    first.stdin.close()  # the launcher done: the file is cleared
    assert first.wait(timeout=10) == 0
    assert path.read_text() == ""
    third = start_holder(path, {"user": "c"})
    assert answer(third) == {"held": True, "previous": None}
    third.stdin.close()
    third.wait(timeout=10)


def test_a_silent_holder_lapses_and_is_named_by_the_next(tmp_path):
    path = tmp_path / "cluster.lock"
    first = start_holder(path, {"user": "a"}, stale_s=0.5)
    assert answer(first)["held"]
    first.stdin.write(b".\n")
    first.stdin.flush()  # one heartbeat, then silence
    assert first.wait(timeout=10) == 2
    second = start_holder(path, {"user": "b"})
    assert answer(second) == {"held": True, "previous": {"user": "a"}}
    second.stdin.close()
    second.wait(timeout=10)


def test_heartbeats_keep_it(tmp_path):
    path = tmp_path / "cluster.lock"
    first = start_holder(path, {"user": "a"}, stale_s=0.5)
    assert answer(first)["held"]
    for _ in range(6):
        first.stdin.write(b".\n")
        first.stdin.flush()
        time.sleep(0.2)
    assert first.poll() is None
    first.stdin.close()
    assert first.wait(timeout=10) == 0


# -- on the sandbox --------------------------------------------------------------------------

@pytest.fixture
def group(sandbox):
    loaded = config.load(Path(sandbox.config))
    with gather.open_group(loaded) as g:
        yield loaded, g


def test_a_second_operator_is_refused_with_the_holder(sandbox, group):
    loaded, g = group
    who = {**cluster_lock.holder(loaded, ["up"]), "user": "alice", "host": "laptop"}
    with cluster_lock.ClusterLock(g.connections[0], who):
        result = cli("down", "-c", str(sandbox.config))
        status = cli("status", "-c", str(sandbox.config), "--json")
    text = " ".join(result.output.split())
    assert result.exit_code == 1, result.output
    assert "rank 0 (spark1): the cluster is busy: alice@laptop running `sparkstack up` since" in text
    assert "--wait-lock SECONDS" in text
    assert status.exit_code == 0  # read-only: never waits, never refused
    assert cli("down", "-c", str(sandbox.config)).exit_code == 0  # released on exit


def test_wait_lock_waits_for_the_holder(sandbox, group):
    loaded, g = group
    lock = cluster_lock.ClusterLock(g.connections[0], cluster_lock.holder(loaded, ["prep"]))
    lock.__enter__()
    releaser = threading.Timer(3, lock.__exit__, args=(None, None, None))
    releaser.start()
    try:
        started = time.monotonic()
        result = cli("down", "-c", str(sandbox.config), "--wait-lock", "60")
        waited = time.monotonic() - started
    finally:
        releaser.join()
    assert result.exit_code == 0, result.output
    assert "waiting for the cluster lock:" in result.output and "running `sparkstack prep`" in result.output
    assert waited >= 2.5


def test_a_lock_whose_holder_went_silent_is_taken_over_with_a_note(sandbox, group):
    loaded, g = group
    who = {**cluster_lock.holder(loaded, ["up"]), "host": "crashed-laptop"}
    lock = cluster_lock.ClusterLock(g.connections[0], who, stale_s=2)
    lock.__enter__()
    lock._stop.set()  # its host "died": no more heartbeats, the channel left open
    try:
        time.sleep(3)
        result = cli("down", "-c", str(sandbox.config))
    finally:
        lock._channel.close()
    assert result.exit_code == 0, result.output
    assert "note: took over the cluster lock left by" in result.output
    assert "@crashed-laptop running `sparkstack up`" in result.output
