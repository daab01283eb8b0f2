"""The load-time memory watcher (launcher/onrank/memwatch.py) run here as a rank runs it, with
this interpreter: a real /proc/meminfo-format file it reads, real shell commands for the relief,
the real Docker CLI for the hard floor (its kill of a real engine: on the sandbox). The guard across a sandbox cluster is in
tests/sandbox/test_memory_guard.py."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
import uuid
from pathlib import Path

from launcher import onrank
from launcher.sandbox import meminfo as gb10
from local_probe import coverage_env, local_command

GIB = 1024 ** 3
KIB = 1024


def write_meminfo(path: Path, free_kb: int, available_kb: int) -> None:
    """A GB10's meminfo with MemFree and MemAvailable set (the rest as the sandbox's)."""
    lines = []
    for line in gb10.meminfo(0).splitlines():
        name = line.split(":")[0]
        value = {"MemFree": free_kb, "MemAvailable": available_kb}.get(name)
        lines.append(f"{name + ':':<16}{value:>8} kB" if value is not None else line)
    path.write_text("\n".join(lines) + "\n")


def start_watcher(tmp_path: Path, **args) -> subprocess.Popen:
    spec = {"soft_free": 8 * GIB, "hard_available": 3 * GIB, "interval": 0.1, "cooldown": 0.5,
            "relief": "true", "container": f"sparkstack-test-{uuid.uuid4().hex[:8]}",
            "meminfo": str(tmp_path / "meminfo"), "max_s": 30, **args}
    command, _ = onrank.invocation("memwatch", spec)
    return subprocess.Popen(local_command(command, onrank.path("memwatch")), shell=True, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={"PATH": "/usr/local/bin:/usr/bin:/bin", **coverage_env()})


def records(process: subprocess.Popen, until, limit_s: float = 20) -> list[dict]:
    """Lines until `until(record)` holds (or the watcher ends)."""
    seen, deadline = [], time.monotonic() + limit_s
    for line in process.stdout:
        seen.append(json.loads(line))
        if until(seen[-1]) or time.monotonic() > deadline:
            break
    return seen


def test_plenty_of_memory_is_only_sampled(tmp_path):
    write_meminfo(tmp_path / "meminfo", free_kb=100 * GIB // KIB, available_kb=110 * GIB // KIB)
    marker = tmp_path / "relieved"
    process = start_watcher(tmp_path, relief=f"touch {shlex.quote(str(marker))}")
    try:
        seen = records(process, lambda r: r["t"] >= 0.5)
    finally:
        process.kill()
    assert seen[0]["event"] == "start" and seen[0]["soft_free"] == 8 * GIB
    samples = [r for r in seen if "event" not in r]
    assert samples and all(r["avail"] == 110 * GIB and r["free"] == 100 * GIB for r in samples)
    assert not marker.exists()


def test_below_the_soft_floor_it_relieves_and_reads_again(tmp_path):
    """The relief command runs (here it frees memory as a drop of page caches would) and the
    record carries MemFree as read after it; a second low sample within the cooldown waits."""
    meminfo = tmp_path / "meminfo"
    write_meminfo(meminfo, free_kb=5 * GIB // KIB, available_kb=60 * GIB // KIB)
    count = tmp_path / "count"
    relief = (f"echo x >> {shlex.quote(str(count))}; {shlex.quote(sys.executable)} -c "
              f"{shlex.quote(_rewrite_script(meminfo, free_kb=50 * GIB // KIB, available_kb=60 * GIB // KIB))}")
    process = start_watcher(tmp_path, relief=relief, cooldown=30)
    try:
        seen = records(process, lambda r: r.get("event") == "relief")
        write_meminfo(meminfo, free_kb=5 * GIB // KIB, available_kb=60 * GIB // KIB)  # low again
        more = records(process, lambda r: r.get("t", 0) > seen[-1]["t"] + 1.0)
    finally:
        process.kill()
    relief_record = seen[-1]
    assert relief_record["rc"] == 0 and relief_record["free"] == 50 * GIB
    assert count.read_text() == "x\n", "a second relief ran inside the cooldown"
    assert any(r.get("free") == 5 * GIB for r in more), "the watcher stopped sampling"


def _rewrite_script(path: Path, free_kb: int, available_kb: int) -> str:
    text = "".join(
        f"{line.split(':')[0] + ':':<16}{({'MemFree': free_kb, 'MemAvailable': available_kb})[line.split(':')[0]]:>8} kB\n"
        if line.split(":")[0] in ("MemFree", "MemAvailable") else line + "\n"
        for line in gb10.meminfo(0).splitlines())
    return f"open({str(path)!r}, 'w').write({text!r})"


def test_a_failing_relief_is_reported_with_its_words(tmp_path):
    write_meminfo(tmp_path / "meminfo", free_kb=5 * GIB // KIB, available_kb=60 * GIB // KIB)
    process = start_watcher(tmp_path, relief="echo 'sudo: a password is required' >&2; exit 1")
    try:
        seen = records(process, lambda r: r.get("event") == "relief")
    finally:
        process.kill()
    assert seen[-1]["rc"] == 1 and seen[-1]["why"] == "sudo: a password is required"


def test_a_missing_engine_container_is_reported_not_hidden(tmp_path):
    write_meminfo(tmp_path / "meminfo", free_kb=1 * GIB // KIB, available_kb=2 * GIB // KIB)
    process = start_watcher(tmp_path, container="sparkstack-no-such-container")
    seen = records(process, lambda r: False)
    assert process.wait(timeout=30) == 3
    assert [r.get("event") for r in seen] == ["start", "hard", "killed"]
    assert seen[1]["avail"] == 2 * GIB and seen[1]["free"] == 1 * GIB
    assert seen[2]["rc"] != 0 and "sparkstack-no-such-container" in seen[2]["why"]


def test_it_ends_when_nobody_reads(tmp_path):
    """The launcher closing its channel is the watcher's stop: its next write fails."""
    write_meminfo(tmp_path / "meminfo", free_kb=100 * GIB // KIB, available_kb=110 * GIB // KIB)
    process = start_watcher(tmp_path)
    process.stdout.readline()
    process.stdout.close()
    assert process.wait(timeout=10) == 0


# -- the serving mode: detached on the rank, its events in a file, ended by its container -------

def serving_watcher(tmp_path: Path, container_id: str, **args) -> subprocess.Popen:
    """The watcher as launcher/apply/servguard.py starts it (log and pid file relative to its
    directory), stdout unread: in this mode it writes nothing there."""
    return start_watcher(tmp_path, container_id=container_id, log=str(tmp_path / "events.jsonl"),
                         pidfile=str(tmp_path / "guard.pid"), max_s=0, **{"check_s": 0.3, **args})


def logged(tmp_path: Path) -> list[dict]:
    path = tmp_path / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_logged(tmp_path: Path, test, limit_s: float = 20) -> list[dict]:
    deadline = time.monotonic() + limit_s
    while not test(logged(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return logged(tmp_path)


def test_serving_mode_logs_its_events_with_figures_and_ends_with_its_container(tmp_path):
    """A cache drop below the soft floor is logged with the figures before and after, the floor
    and the container's ID; no sample goes to the file, nothing to stdout (nobody reads it);
    a container Docker does not know ends the watcher within its check interval."""
    meminfo = tmp_path / "meminfo"
    write_meminfo(meminfo, free_kb=5 * GIB // KIB, available_kb=60 * GIB // KIB)
    relief = f"{shlex.quote(sys.executable)} -c " + shlex.quote(
        _rewrite_script(meminfo, free_kb=50 * GIB // KIB, available_kb=60 * GIB // KIB))
    cid = f"sparkstack-test-gone-{uuid.uuid4().hex}"
    process = serving_watcher(tmp_path, cid, relief=relief)
    assert process.wait(timeout=30) == 0
    assert process.stdout.read() == ""
    seen = logged(tmp_path)
    assert [e["event"] for e in seen] == ["start", "relief", "end"], seen
    relief_event = seen[1]
    assert relief_event["free_before"] == 5 * GIB and relief_event["free"] == 50 * GIB
    assert relief_event["soft_free"] == 8 * GIB and relief_event["rc"] == 0
    assert all(e["container_id"] == cid and e["at"] > 1.7e9 for e in seen)
    assert seen[-1]["why"] == "the engine container is gone"


def test_serving_mode_hard_floor_kills_the_container_by_id(tmp_path):
    """Below the hard floor it kills the container it was started for (its ID, not the name a
    newer container may hold) and logs the figures and the floor."""
    write_meminfo(tmp_path / "meminfo", free_kb=1 * GIB // KIB, available_kb=2 * GIB // KIB)
    cid = f"sparkstack-test-id-{uuid.uuid4().hex}"
    process = serving_watcher(tmp_path, cid)
    assert process.wait(timeout=30) == 3
    seen = logged(tmp_path)
    assert [e["event"] for e in seen] == ["start", "hard", "killed"], seen
    assert seen[1]["avail"] == 2 * GIB and seen[1]["hard_available"] == 3 * GIB
    assert seen[2]["rc"] != 0 and cid in seen[2]["why"]


def test_serving_mode_gives_way_to_a_newer_guard(tmp_path):
    """One guard per rank: when a newer one writes its pid, this one ends (the pid file is read
    before Docker is asked, so the unknown container here is not what ends it)."""
    write_meminfo(tmp_path / "meminfo", free_kb=100 * GIB // KIB, available_kb=110 * GIB // KIB)
    process = serving_watcher(tmp_path, f"sparkstack-test-{uuid.uuid4().hex}", check_s=2)
    try:
        wait_logged(tmp_path, lambda e: e and (tmp_path / "guard.pid").exists())
        assert (tmp_path / "guard.pid").read_text() == str(process.pid) or process.poll() is None
        (tmp_path / "guard.pid").write_text("1")
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
    assert logged(tmp_path)[-1]["why"] == "a newer guard took over"
