"""Commands as a user types them: `profiles`; on the sandbox `logs -f` (a real process, a real
Ctrl+C), `status`'s table, `prep --no-drop` and `ship` with no image (the profile's, as `plan`
names it) and its table. Each puts back what it changed on the ranks."""

from __future__ import annotations

import json
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from test_check_rows import prebuilt_config
from test_ship import rank_config
from launcher.cli.commands import main
from launcher.plan.cluster_plan import CONTAINER_NAME

ROOT = Path(__file__).resolve().parents[1]
SPARKSTACK = Path(sys.executable).parent / "sparkstack"  # installed beside the venv's python


def cli(*args):
    result = CliRunner().invoke(main, list(args))
    assert "Traceback" not in result.output, result.output
    return result


def test_profiles_lists_each_profile_with_engine_seeds_and_description():
    """Every env/profiles/*.yaml, by the name cluster.yaml's `profile:` takes, with its engine,
    the seeds it comes from and its description; --json the same for scripts."""
    want = {p.stem: yaml.safe_load(p.read_text()) for p in sorted((ROOT / "env" / "profiles").glob("*.yaml"))}
    assert len(want) >= 5
    result = cli("profiles")
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert len(lines) == 2 * len(want)
    for (name, doc), (head, text) in zip(want.items(), zip(lines[::2], lines[1::2])):
        assert head == f"{name} ({doc['engine']}, seeds {', '.join(doc['seeds'])})"
        assert text == "  " + doc["description"]
    listed = json.loads(cli("profiles", "--json").output)
    assert listed == [{"name": name, "engine": doc["engine"], "seeds": doc["seeds"],
                       "description": doc["description"]} for name, doc in want.items()]


@pytest.mark.sandbox  # asks the local Docker engine whether the image is here
def test_ship_without_an_image_takes_the_chain_top_plan_names(tmp_path):
    """A chain profile with nothing built here: `ship` with no --image looks for the chain's
    top, the very tag `plan` says `up` serves, and says to build it (exit 1, no rank touched)."""
    from launcher.sandbox import model_fixture as checkpoint
    from test_check import sandbox_cluster

    checkpoint.write_patches(tmp_path / "patches")
    base = f"sparkstack-test/no-such-base:{uuid.uuid4().hex[:8]}"  # not here: the tags hash its name
    cfg = sandbox_cluster(tmp_path, images={"base": base, "patches_dir": str(tmp_path / "patches")}).path
    planned = cli("plan", "-c", str(cfg), "--offline")
    assert planned.exit_code == 0, planned.output
    image = next(line.split()[1] for line in planned.output.splitlines() if line.startswith("image "))
    assert re.fullmatch(r"sparkstack/keys:[0-9a-f]{16}", image), image
    result = cli("ship", "-c", str(cfg))
    assert result.exit_code == 1
    assert f"error: image {image} is not on this host: run `sparkstack build` first" in result.output


@pytest.mark.sandbox  # asks the local Docker engine whether the image is here
def test_ship_takes_the_profile_flag(tmp_path):
    """`ship --profile NAME` with no --image ships NAME's serving image, not cluster.yaml's:
    here a prebuilt one this host lacks, refused before any rank is reached (exit 1)."""
    from test_check import sandbox_cluster

    cfg = str(sandbox_cluster(tmp_path).path)  # names the sandbox profile
    planned = cli("plan", "-c", cfg, "--offline", "--profile", "pollard-180k")
    assert "image   pollard-vllm:local" in planned.output.splitlines(), planned.output
    result = cli("ship", "-c", cfg, "--dry-run", "--profile", "pollard-180k")
    assert result.exit_code == 1, result.output
    assert "error: image pollard-vllm:local is not on this host" in result.output


def test_status_keeps_one_line_per_rank_at_any_width(tmp_path, monkeypatch):
    """`status` as a log or a pipe gets it (80 columns): a rank's long reason for being
    unreachable stays on its rank's line, last, and pushes the image column of the others
    aside no further than their own states; no line ends in blanks. Each reachable rank's
    MemAvailable now (issue 14), `?` where it could not be read; --json carries it in bytes."""
    import contextlib
    from launcher.apply import deploy, engine_caches, last_good, prep, serve, servguard
    from launcher.transport import api
    from test_check import sandbox_cluster

    why = "rank 3 (spark4): unreachable (connection refused): " + ("the [bold]rank's sshd[/] is down " * 4).rstrip()
    states = [serve.RankState(0, "172.31.240.11", "absent"),
              serve.RankState(1, "172.31.240.12", "running", image="img:1", started_at="2026-01-01T00:00:00Z"),
              serve.RankState(2, "172.31.240.13", "exited", image="img:1", exit_code=3),
              serve.RankState(3, "172.31.240.14", "unreachable", error=why)]
    monkeypatch.setattr(deploy, "group_for", lambda *a: contextlib.nullcontext())
    monkeypatch.setattr(serve, "states", lambda group: states)
    monkeypatch.setattr(api, "health", lambda ep: False)
    monkeypatch.setattr(servguard, "read", lambda group: {})  # no rank's guard has a record
    monkeypatch.setattr(last_good, "explain", lambda loaded, group, states: None)  # no good start kept
    asked, GIB = [], 1 << 30
    mem = {0: 117 * GIB, 1: 10 * GIB + GIB // 2, 2: "rank 2 (spark3): timed out"}
    monkeypatch.setattr(prep, "read_mem_available", lambda group, ranks: asked.append(ranks) or mem)
    # each reachable rank's compile caches (issue 15), by image; `?` where they could not be read
    cache = {0: {}, 1: {"img-1": 3 << 20, "img-0": 1 << 19}, 2: "rank 2 (spark3): timed out"}
    monkeypatch.setattr(engine_caches, "sizes", lambda loaded, group, ranks: asked.append(ranks) or cache)
    cfg = str(sandbox_cluster(tmp_path).path)
    lines = cli("status", "-c", cfg).output.splitlines()
    assert asked == [[0, 1, 2]] * 2  # not the unreachable rank
    assert lines[:4] == ["rank 0 172.31.240.11  absent              MemAvailable 117.0 GiB  compile cache empty",
                         "rank 1 172.31.240.12  running             MemAvailable 10.5 GiB   compile cache 3.5 MiB  img:1  since 2026-01-01T00:00:00Z",
                         "rank 2 172.31.240.13  exited with code 3  MemAvailable ?          compile cache ?        img:1",
                         f"rank 3 172.31.240.14  unreachable                                                               {why}"]
    assert lines[4] == "API http://172.31.240.11:8888: not answering" and len(lines) == 5
    assert json.loads(cli("status", "-c", cfg, "--json").output)["ranks"] == [
        {**s.to_json(), "mem_available": [117 * GIB, 10 * GIB + GIB // 2, None, None][s.rank],
         "compile_cache": [{}, cache[1], None, None][s.rank]} for s in states]


# --- on the sandbox -----------------------------------------------------------------------------

def engine_on(sandbox, name: str, script: str, detach: bool = True) -> None:
    """A stand-in serving container (the name `up` gives it) on rank `name`, running `script`."""
    rc, there, _ = sandbox.run(name, f"docker ps -aq --filter name=^{CONTAINER_NAME}$")
    assert rc == 0 and not there, f"{name} already has a {CONTAINER_NAME} container"
    run = f"docker run {'-d ' if detach else ''}--name {CONTAINER_NAME} --entrypoint sh {sandbox.images['vllm']}"
    rc, out, err = sandbox.run(name, f"{run} -c {shlex.quote(script)}")
    assert rc == (0 if detach else int(re.search(r"exit (\d+)", script)[1])), (out, err)


def remove_engine(sandbox, name: str) -> None:
    sandbox.run(name, f"docker rm -f {CONTAINER_NAME} >/dev/null 2>&1; true")


class Follow:
    """`sparkstack ARGS` as a process, its stdout read line by line as it comes."""

    def __init__(self, *args):
        self.proc = subprocess.Popen([str(SPARKSTACK), *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def until(self, text: str, timeout: float = 60) -> None:
        deadline, seen = time.monotonic() + timeout, []
        while text not in seen:
            try:
                seen.append(self.lines.get(timeout=max(0.1, deadline - time.monotonic())))
            except queue.Empty:
                raise AssertionError(f"{text!r} not shown within {timeout} s; shown: {seen}") from None

    def end(self, timeout: float = 30) -> tuple[int, str]:
        rc = self.proc.wait(timeout=timeout)
        return rc, self.proc.stderr.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def poll(check, timeout: float = 30, every: float = 0.3):
    deadline = time.monotonic() + timeout
    while not (got := check()):
        if time.monotonic() > deadline:
            return got
        time.sleep(every)
    return got


QUIET_ENGINE = ("echo first; until [ -e /tmp/go ]; do sleep 0.1; done; echo second; "
                "until [ -e /tmp/stop ]; do sleep 0.1; done; echo bye")


def test_logs_follow_streams_and_stops_cleanly(sandbox):
    """`logs --rank 1 -f`: lines show as the container writes them; Ctrl+C detaches (exit 0)
    and leaves nothing behind on the rank, the container running on; when the container ends,
    `logs -f` ends by itself. Without a container, a clear error and exit 1."""
    cfg = str(sandbox.config)
    engine_on(sandbox, "spark2", QUIET_ENGINE)
    follow = Follow("logs", "-c", cfg, "--rank", "1", "-f")
    try:
        follow.until("first")
        assert follow.proc.poll() is None  # still following
        assert sandbox.run("spark2", f"docker exec {CONTAINER_NAME} touch /tmp/go")[0] == 0
        follow.until("second")  # written after `logs -f` started
        follow.proc.send_signal(signal.SIGINT)
        rc, err = follow.end()
        assert rc == 0 and "Traceback" not in err, err
        running = sandbox.run("spark2", f"docker inspect -f '{{{{.State.Running}}}}' {CONTAINER_NAME}")[1]
        assert running.strip() == "true"  # the model keeps running
        # the rank's `docker logs -f` ends with it, though the container writes nothing more
        left = poll(lambda: sandbox.run("spark2", "pgrep -af '[d]ocker logs'")[1].strip() == "", timeout=15)
        assert left, sandbox.run("spark2", "pgrep -af '[d]ocker logs'")[1]

        follow = Follow("logs", "-c", cfg, "--rank", "1", "-f", "--tail", "1")
        follow.until("second")
        assert sandbox.run("spark2", f"docker exec {CONTAINER_NAME} touch /tmp/stop")[0] == 0
        follow.until("bye")
        rc, err = follow.end()
        assert rc == 0 and "Traceback" not in err, err
    finally:
        follow.kill()
        remove_engine(sandbox, "spark2")
    gone = cli("logs", "-c", cfg, "--rank", "1")
    assert gone.exit_code == 1
    assert "error: rank 1 (spark2): no serving container to show (docker logs exited 1)" in gone.output


def test_status_table_one_row_per_rank(sandbox, tmp_path):
    """`status` with spark2 serving, spark3's container exited with code 3, spark4 unreachable:
    one row per rank in rank order (rank, address, state, MemAvailable, compile cache, image, since), the image
    column aligned, then the API's line; exit 0 since some rank answered."""
    doc = yaml.safe_load(Path(sandbox.config).read_text())
    doc["ranks"][3]["port"] = 1  # nothing listens there: refused at once
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    image = sandbox.images["vllm"]
    try:
        engine_on(sandbox, "spark2", "sleep 600")
        engine_on(sandbox, "spark3", "exit 3", detach=False)
        started = sandbox.run("spark2", f"docker inspect -f '{{{{.State.StartedAt}}}}' {CONTAINER_NAME}")[1].strip()
        result = cli("status", "-c", str(cfg))
    finally:
        remove_engine(sandbox, "spark2")
        remove_engine(sandbox, "spark3")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) >= 5, lines
    addr = [r["address"] for r in doc["ranks"]]
    mem = [line.split("MemAvailable ")[1].split()[:2] if "MemAvailable " in line else None for line in lines]
    assert all(m and float(m[0]) > 0 and m[1] == "GiB" for m in mem[:3]) and mem[3] is None, lines
    # each reachable rank's compile caches (issue 15): "empty", or their size in MiB
    kept = [line.split("compile cache ")[1].split()[:1 if " cache empty" in line else 2] for line in lines[:3]]
    assert all(k in (["empty"],) or (k[1] in ("MiB", "KiB") and float(k[0]) > 0) for k in kept), lines
    cells = [line.split() for line in lines]
    assert cells[0] == ["rank", "0", addr[0], "absent", "MemAvailable", *mem[0], "compile", "cache", *kept[0]]
    assert cells[1] == ["rank", "1", addr[1], "running", "MemAvailable", *mem[1], "compile", "cache", *kept[1],
                        image, "since", started]
    assert cells[2] == ["rank", "2", addr[2], "exited", "with", "code", "3", "MemAvailable", *mem[2],
                        "compile", "cache", *kept[2], image]
    assert lines[3].startswith(f"rank 3 {addr[3]} ") and "rank 3 (spark4): " in lines[3]
    assert "unreachable (connection refused)" in lines[3]
    assert lines[1].index(image) == lines[2].index(image)  # one column
    assert lines[4] == f"API http://{addr[0]}:8888: not answering"
    # then each rank's memory guard while serving (issue 29): spark2's engine runs without one
    guard = lines[5:]
    assert guard[0].startswith("memory guard while serving (on each rank"), lines
    # (events other tests' guards left on the rank may follow: "; no event" only when none)
    assert any(g in ("  rank 1 (spark2): NOT watching", "  rank 1 (spark2): NOT watching; no event")
               for g in guard), guard
    assert guard[-1].startswith("  rank 3 (spark4): spark@") and guard[-1].count("spark4") == 1, guard


def drop_caches_on(sandbox) -> dict[str, str]:
    """What each rank's vm.drop_caches holds (the sandbox gives each rank its own /proc/sys/vm)."""
    return {n: sandbox.run(n, "cat /proc/sys/vm/drop_caches")[1].strip() for n in sandbox.names}


def test_prep_no_drop_leaves_the_page_cache(sandbox):
    """`prep --no-drop` sets what it sets but writes nothing to vm.drop_caches on any rank and
    waits for no memory; plain `prep` does write it (so the look is a true one)."""
    cfg = str(sandbox.config)
    sysctls = "cat /proc/sys/vm/swappiness /proc/sys/vm/compaction_proactiveness"
    before = {n: sandbox.run(n, sysctls)[1].split() for n in sandbox.names}
    original = drop_caches_on(sandbox)
    set_to = lambda value: [sandbox.run(n, f"sudo sh -c 'echo {value} > /proc/sys/vm/drop_caches'")  # noqa: E731
                            for n in sandbox.names]
    try:
        set_to(0)
        assert set(drop_caches_on(sandbox).values()) == {"0"}
        kept = cli("prep", "-c", cfg, "--no-drop", "--json")
        assert kept.exit_code == 0, kept.output
        data = json.loads(kept.output)
        assert [r["rank"] for r in data["ranks"]] == [0, 1, 2, 3]
        for r in data["ranks"]:
            assert not any("drop" in step for step in r["changed"] + r["already"] + r["failed"]), r
            assert r["mem_available"] is None
        assert data["mem_needed"] is None
        assert set(drop_caches_on(sandbox).values()) == {"0"}

        dropped = cli("prep", "-c", cfg, "--json")
        assert dropped.exit_code == 0, dropped.output
        assert all("drop caches" in r["changed"] for r in json.loads(dropped.output)["ranks"])
        assert set(drop_caches_on(sandbox).values()) == {"3"}
    finally:
        for n, value in original.items():
            sandbox.run(n, f"sudo sh -c 'echo {value} > /proc/sys/vm/drop_caches'")
        for n, (swappiness, compaction) in before.items():
            sandbox.run(n, f"sudo sysctl -q -w vm.swappiness={swappiness} vm.compaction_proactiveness={compaction}")


def test_ship_without_an_image_ships_the_profiles_and_prints_a_table(sandbox, tmp_path):
    """No --image: ship sends the image the profile serves, the one `plan` names. --dry-run
    says per rank what it lacks and moves nothing; then one table row per rank, shipped with
    bytes moved of missing, seconds and rate; a second ship finds every rank up to date."""
    tag = f"sparkstack-test/ship-default:{uuid.uuid4().hex[:8]}"
    subprocess.run(["docker", "tag", sandbox.images["vllm"], tag], check=True)
    cfg = str(prebuilt_config(sandbox, tmp_path, tag))
    addr = [r["address"] for r in sandbox.ranks]

    def rows(result) -> list[str]:
        """The table's rows; after them, what each rank gets (by its image store) and how this host
        reads each image (issue 34)."""
        assert result.exit_code == 0, result.output
        lines = [line for line in result.stdout.splitlines()
                 if not line.startswith("this host reads ") and " image store) gets " not in line]
        assert len(lines) == 4, lines
        return lines

    try:
        planned = cli("plan", "-c", cfg, "--offline")
        assert f"image   {tag}" in planned.output.splitlines()
        dry = cli("ship", "-c", cfg, "--dry-run")
        for r, line in enumerate(rows(dry)):
            assert line.split() == ["rank", str(r), addr[r], "planned", tag]
        assert f"rank 3 (containerd image store) gets {tag}: " in dry.stdout  # spark4's
        assert any(line.startswith(f"this host reads {tag} by ") for line in dry.stdout.splitlines()), dry.stdout
        assert all(sandbox.run(n, f"docker image inspect {tag}")[0] != 0 for n in sandbox.names)

        for r, line in enumerate(rows(cli("ship", "-c", cfg))):
            assert re.fullmatch(rf"rank {r} {re.escape(addr[r])} +shipped +{re.escape(tag)} "
                                r"\(\d+\.\d of \d+\.\d MB in \d+\.\d s, \d+\.\d MB/s\)", line), line
        want = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", tag], capture_output=True,
                              text=True, check=True).stdout.strip()
        assert {rank_config(sandbox, n, tag) for n in sandbox.names} == {want}  # by content, either store

        for r, line in enumerate(rows(cli("ship", "-c", cfg))):
            assert line.split() == ["rank", str(r), addr[r], "up-to-date", "nothing"]
    finally:
        for n in sandbox.names:
            sandbox.run(n, f"docker rmi {tag} >/dev/null 2>&1; true")  # the tag only: the image stays
        subprocess.run(["docker", "rmi", tag], capture_output=True)
