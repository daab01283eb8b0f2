"""The cluster lock: its holder script run here as rank 0 runs it (the real flock, the real
heartbeat timeout), and on the sandbox through the real CLI: a second `down` refuses naming the
holder, waits with --wait-lock, takes over a lock whose holder went silent, and read-only
commands never wait. Issue 33: another local user on rank 0 (a second user made in the rank's
container) can neither turn the lock into a write on a file of theirs choosing, nor read a file
through its note, nor hold it; and a command whose own lock lapsed stops before its next step."""

from __future__ import annotations

import json
import os
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


def test_a_planted_link_is_neither_followed_nor_changed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("secret bytes\n")
    victim.chmod(0o600)
    folder = tmp_path / "lock"
    folder.mkdir()
    (folder / "cluster.lock").symlink_to(victim)
    holder = start_holder(folder / "cluster.lock", {"user": "a"})
    said = answer(holder)
    assert holder.wait(timeout=10) == 3
    assert said["held"] is False and "is a symbolic link" in said["refused"], said
    assert "secret" not in json.dumps(said)
    assert victim.read_text() == "secret bytes\n" and victim.stat().st_mode & 0o777 == 0o600


def test_the_lock_is_made_for_its_user_alone_and_others_files_refused(tmp_path):
    path = tmp_path / "lock" / "cluster.lock"
    first = start_holder(path, {"user": "a"})
    assert answer(first)["held"]
    first.stdin.close()
    assert first.wait(timeout=10) == 0
    assert path.parent.stat().st_mode & 0o777 == 0o700 and path.stat().st_mode & 0o777 == 0o600
    os.chown(path, 65534, 65534)  # now another user's file
    second = start_holder(path, {"user": "b"})
    said = answer(second)
    assert second.wait(timeout=10) == 3 and "owned by" in said["refused"] and "uid 65534" in said["refused"]
    path.unlink()
    (tmp_path / "other").write_text("mine\n")
    os.link(tmp_path / "other", path)  # a hard link to another file of this user's
    third = start_holder(path, {"user": "c"})
    assert third.wait(timeout=10) == 3 and "2 hard links" in answer(third)["refused"]
    assert (tmp_path / "other").read_text() == "mine\n"


def test_a_folder_others_may_write_is_narrowed_when_ours_and_refused_when_not(tmp_path):
    folder = tmp_path / "lock"
    folder.mkdir()
    folder.chmod(0o777)  # as older versions made it
    first = start_holder(folder / "cluster.lock", {"user": "a"})
    assert answer(first)["held"]
    first.stdin.close()
    first.wait(timeout=10)
    assert folder.stat().st_mode & 0o777 == 0o700
    (folder / "cluster.lock").unlink()
    os.chown(folder, 65534, 65534)
    folder.chmod(0o777)
    second = start_holder(folder / "cluster.lock", {"user": "b"})
    said = answer(second)
    assert second.wait(timeout=10) == 3 and "uid 65534" in said["refused"] and "0777" in said["refused"]
    assert not (folder / "cluster.lock").exists()


def test_a_note_that_is_not_a_holders_is_described_never_shown(tmp_path):
    path = tmp_path / "cluster.lock"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"root:$6$hash:19000:0:99999:7:::\n")
    os.close(fd)
    holder = start_holder(path, {"user": "a"})
    said = answer(holder)
    holder.stdin.close()
    holder.wait(timeout=10)
    assert said["held"] and "hash" not in json.dumps(said)
    assert "hash" not in cluster_lock.describe(said["previous"])
    assert cluster_lock.describe({"unreadable": said["previous"]["unreadable"]}).endswith("not a holder's note)")


def test_each_heartbeat_is_answered(tmp_path):
    holder = start_holder(tmp_path / "cluster.lock", {"user": "a"}, stale_s=5)
    assert answer(holder)["held"]
    holder.stdin.write(b".\n.\n")
    holder.stdin.flush()
    assert holder.stdout.read(2) == b"++"
    holder.stdin.close()
    assert holder.wait(timeout=10) == 0


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
        lock.__exit__(None, None, None)
    assert result.exit_code == 0, result.output
    assert "note: took over the cluster lock left by" in result.output
    assert "@crashed-laptop running `sparkstack up`" in result.output


# -- another local user on rank 0 (issue 33) -------------------------------------------------

RANK0 = "sparkstack-spark1"
LOCK_DIR = "/tmp/sparkstack-lock"


def as_root(*command: str, user: str = "root", check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["docker", "exec", "-u", user, RANK0, *command], capture_output=True, text=True,
                          timeout=60)
    assert not check or done.returncode == 0, done.stderr
    return done


@pytest.fixture
def mallory(sandbox):
    """A second local user on rank 0; the lock folder as it was found is put back after."""
    before = as_root("sh", "-c", f"stat -c '%a %U' {LOCK_DIR} 2>/dev/null || echo absent").stdout.strip()
    as_root("useradd", "-m", "mallory")
    as_root("rm", "-rf", LOCK_DIR)
    yield "mallory"
    as_root("sh", "-c", "pkill -u mallory; true", check=False)
    as_root("userdel", "-r", "-f", "mallory", check=False)
    as_root("rm", "-rf", LOCK_DIR, "/home/spark/victim")
    if before != "absent":
        mode, owner = before.split()
        as_root("install", "-d", "-m", mode, "-o", owner, LOCK_DIR)


def test_another_user_planting_a_link_gets_no_write_and_no_bytes(sandbox, mallory):
    as_root("sh", "-c", "printf 'spark-secret-bytes\\n' > /home/spark/victim && chmod 600 /home/spark/victim",
            user="spark")
    as_root("sh", "-c", f"mkdir -m 777 {LOCK_DIR} && ln -s /home/spark/victim {LOCK_DIR}/cluster.lock",
            user=mallory)
    result = cli("down", "-c", str(sandbox.config))
    text = " ".join(result.output.split())
    victim = as_root("sh", "-c", "stat -c %a /home/spark/victim; cat /home/spark/victim").stdout
    assert victim == "600\nspark-secret-bytes\n", victim  # neither opened to all nor emptied
    assert "spark-secret-bytes" not in result.output
    assert result.exit_code == 1, result.output
    assert "cannot take the cluster lock" in text and "belongs to mallory" in text, text


def test_another_user_cannot_hold_the_lock(sandbox, mallory):
    assert cli("down", "-c", str(sandbox.config)).exit_code == 0  # the kit's user makes the lock
    grab = subprocess.Popen(
        ["docker", "exec", "-u", mallory, RANK0, "python3", "-c",
         "import fcntl, sys, time\n"
         f"f = open('{LOCK_DIR}/cluster.lock')\n"
         "fcntl.flock(f, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(30)"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = grab.stdout.readline()
        result = cli("down", "-c", str(sandbox.config))
    finally:
        grab.kill()
        grab.wait()
    assert first == "", "mallory holds the cluster lock"
    assert result.exit_code == 0, result.output


def test_a_command_whose_lock_lapsed_stops_before_its_next_step(sandbox, group):
    from launcher.apply import prep

    loaded, g = group
    lock = cluster_lock.ClusterLock(g.connections[0], cluster_lock.holder(loaded, ["prep"]), stale_s=2)
    lock.__enter__()
    try:
        cluster_lock.ensure_held()  # held: goes on
        lock._stop.set()  # this host "slept": no heartbeat reaches rank 0 any more
        time.sleep(3)
        taken = cli("down", "-c", str(sandbox.config))  # a second operator takes the lapsed lock
        assert taken.exit_code == 0 and "took over the cluster lock" in taken.output, taken.output
        with pytest.raises(cluster_lock.LockLost, match="lost the cluster lock.*stopped before its next step"):
            prep.prepare(loaded, g, drop=False)
    finally:
        lock.__exit__(None, None, None)
    cluster_lock.ensure_held()  # released: nothing held, nothing to check


def test_an_up_that_waited_for_the_lock_looks_again(sandbox, group):
    """`up` begins its look while it takes the lock (launcher/gather/ahead.py). One that had to
    wait looks again: what the holder changed meanwhile (rank 2's engine stopped) is seen, not
    the serving cluster its first look found."""
    loaded, g = group
    cfg = str(sandbox.config)
    was_serving = "already running as planned" in (first := cli("up", "-c", cfg)).output
    assert first.exit_code == 0, first.output
    lock = cluster_lock.ClusterLock(g.connections[0], cluster_lock.holder(loaded, ["prep"]))
    lock.__enter__()

    def change_then_release():
        assert sandbox.run("spark3", "docker stop -t 1 sparkstack-engine")[0] == 0
        lock.__exit__(None, None, None)

    releaser = threading.Timer(3, change_then_release)
    releaser.start()
    try:
        result = cli("up", "-c", cfg, "--wait-lock", "60", "--no-verify")
    finally:
        releaser.join()
    assert result.exit_code == 0, result.output
    assert "waiting for the cluster lock:" in result.output
    assert "not as planned: " in result.output and "rank 2 (spark3): sparkstack-engine" in result.output
    assert "already running as planned" not in result.output
    if not was_serving:
        assert cli("down", "-c", cfg).exit_code == 0
