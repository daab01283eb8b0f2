"""`sparkstack stage` on the sandbox (issue 15): `up` refuses an unstaged local path, stage then
serve from it, an interrupted stage resumed, a corrupted staged shard caught by `check --deep`
with its rank, a short disk refused before anything is copied."""

import json
import signal
import subprocess
import sys
import time

import pytest
import yaml

from launcher.sandbox import cluster, nfs_link

from serving import cli, engine_record, mgmt_if

LOCAL = "/home/spark/staged/glm53"
SHARD = "model-00002-of-00003.safetensors"


def write_cfg(sandbox, tmp_path, local: str) -> str:
    data = yaml.safe_load(open(sandbox.config))
    data["model"]["local_path"] = local
    path = tmp_path / "staged.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def on_all(sandbox, command: str) -> None:
    for name in sandbox.names:
        rc, _out, err = sandbox.run(name, command)
        assert rc == 0, f"{name}: {err}"


@pytest.fixture
def cfg(sandbox, tmp_path):
    on_all(sandbox, f"rm -rf {LOCAL}")
    path = write_cfg(sandbox, tmp_path, LOCAL)
    yield path
    cli("down", "-c", path)
    on_all(sandbox, f"rm -rf {LOCAL}")


def checkpoint_bytes(sandbox) -> int:
    rc, out, err = sandbox.run(sandbox.names[0], f"find {sandbox_model(sandbox)} -maxdepth 1 -type f "
                               "! -name '.*' -printf '%s\\n'")
    assert rc == 0, err
    return sum(int(n) for n in out.split())


def sandbox_model(sandbox) -> str:
    return yaml.safe_load(open(sandbox.config))["model"]["path"]


def rows(cfg, *extra) -> dict:
    result = cli("check", "-c", cfg, "--json", *extra)
    return {(r["rank"], c["name"]): c for r in json.loads(result.stdout)["ranks"] for c in r["checks"]}


def stage(cfg, *extra) -> dict:
    result = cli("stage", "-c", cfg, "--json", *extra)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_up_refuses_an_unstaged_copy_then_stage_and_serve_from_it(sandbox, cfg):
    found = rows(cfg)
    for r in range(4):
        assert found[(r, "staged")]["status"] == "fail" and "sparkstack stage" in found[(r, "staged")]["fix"]
        assert found[(r, "checkpoint")]["status"] == "fail" and "sparkstack stage" in found[(r, "checkpoint")]["fix"]
    refused = cli("up", "-c", cfg)
    assert refused.exit_code != 0 and "nothing was started" in refused.output
    assert "rank 2 (spark3) staged:" in refused.output
    rc, out, _ = sandbox.run(sandbox.names[0], "docker ps -aq --filter name=sparkstack-engine")
    assert out.strip() == ""

    assert cli("manifest", "-c", cfg).exit_code == 0  # of model.path: every copy is verified
    total = checkpoint_bytes(sandbox)
    planned = stage(cfg, "--dry-run")
    assert planned["plan"]["manifest"] and "ranks" not in planned
    assert [r["to_copy"] for r in planned["plan"]["ranks"]] == [total] * 4
    done = stage(cfg)
    assert [(r["copied"], r["error"]) for r in done["ranks"]] == [(total, None)] * 4
    again = stage(cfg)
    assert [r["copied"] for r in again["ranks"]] == [0] * 4 and again["plan"]["to_copy"] == 0

    found = rows(cfg)
    for r in range(4):
        assert found[(r, "staged")]["status"] == "pass", found[(r, "staged")]
        assert found[(r, "checkpoint")]["value"].startswith(LOCAL)
        assert "from the local disk" in found[(r, "load")]["value"]
    up = cli("up", "-c", cfg)
    assert up.exit_code == 0, up.output
    for name in sandbox.names:
        record = engine_record(sandbox, name)
        assert record["model"] == LOCAL, record
    rc, out, err = sandbox.run(sandbox.names[1], "docker inspect -f '{{json .Mounts}}' sparkstack-engine")
    mounts = {m["Destination"]: m for m in json.loads(out)}
    assert mounts[LOCAL]["Source"] == LOCAL and not mounts[LOCAL]["RW"]
    assert sandbox_model(sandbox) not in mounts


def partial_bytes(sandbox, name) -> int:
    rc, out, _ = sandbox.run(name, f"cat {LOCAL}/.*.partial 2>/dev/null | wc -c")
    return int(out.strip() or 0)


def test_an_interrupted_stage_resumes_and_moves_only_the_rest(sandbox, cfg):
    total = checkpoint_bytes(sandbox)
    command = [sys.executable, "-c", "from launcher.cli.commands import main; main()",
               "stage", "-c", cfg, "--from", "nfs", "--bwlimit", "0.5"]  # the 4.5 MB first shard takes 9 s: a wide window
    p = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while partial_bytes(sandbox, sandbox.names[3]) < 2_500_000:  # 5 s: past a progress line (2 s)
        assert time.monotonic() < deadline and p.poll() is None, "the copy did not get going"
        time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, out + err
    assert "re-run `sparkstack stage` to resume" in err and "Traceback" not in err
    assert "MB/s, ETA" in err  # the progress lines came
    time.sleep(1.5)  # the copies end on the ranks at their next progress line
    for name in sandbox.names:
        rc, ps, _ = sandbox.run(name, "pgrep -fa '\"[m]ode\": \"copy\"' || true")
        assert ps.strip() == "", f"{name}: the copy still runs: {ps}"
    plan = stage(cfg, "--dry-run")["plan"]
    left = [r["to_copy"] for r in plan["ranks"]]
    assert all(0 < n < total for n in left), left
    assert any(f["state"] == "partial" for r in plan["ranks"] for f in r["files"])
    done = stage(cfg)
    assert [r["copied"] for r in done["ranks"]] == left  # only the rest moved
    assert all(rows(cfg)[(r, "staged")]["status"] == "pass" for r in range(4))


def test_a_corrupted_staged_shard_is_named_with_its_rank_by_check_deep(sandbox, cfg):
    assert cli("manifest", "-c", cfg).exit_code == 0
    stage(cfg)
    flip = (f"python3 -c \"import os; p='{LOCAL}/{SHARD}'; s=os.stat(p); f=open(p,'r+b'); f.seek(4096); "
            "b=f.read(1); f.seek(4096); f.write(bytes([b[0] ^ 1])); f.close(); "
            "os.utime(p, ns=(s.st_atime_ns, s.st_mtime_ns))\"")
    rc, _out, err = sandbox.run("spark3", flip)
    assert rc == 0, err
    cheap = rows(cfg)
    assert cheap[(2, "staged")]["status"] == "pass"  # same size and mtime: only a hash sees it
    rc, _out, err = sandbox.run("spark2", f"touch {LOCAL}/model-00009-of-00009.safetensors")
    assert rc == 0, err
    stale = rows(cfg)[(1, "staged")]
    assert stale["status"] == "warn" and "model-00009-of-00009.safetensors" in stale["value"], stale
    rc, _out, err = sandbox.run("spark2", f"rm {LOCAL}/model-00009-of-00009.safetensors")
    assert rc == 0, err
    deep = rows(cfg, "--deep")
    assert deep[(2, "hashes")]["status"] == "fail"
    assert deep[(2, "hashes")]["value"].startswith(f"rank 2: {SHARD} differs from the manifest")
    assert f"rm {LOCAL}/{SHARD}" in deep[(2, "hashes")]["fix"]
    assert all(deep[(r, "hashes")]["status"] == "pass" for r in (0, 1, 3))


def test_a_short_disk_is_refused_before_anything_is_copied(sandbox, tmp_path):
    local = "/tmp/staged-glm53"  # the ranks' /tmp is a 512 MB tmpfs
    cfg = write_cfg(sandbox, tmp_path, local)
    filler = "/tmp/stage-test-filler"
    on_all(sandbox, f"rm -rf {local} {filler}")
    free = "$(($(df -B1 --output=avail /tmp | tail -1) - 4000000))"
    rc, _out, err = sandbox.run("spark2", f"fallocate -l {free} {filler}")
    assert rc == 0, err
    try:
        result = cli("stage", "-c", cfg)
        assert result.exit_code != 0
        assert f"rank 1 (spark2): {local} needs " in result.output and "are free at /tmp" in result.output
        assert "nothing was copied" in result.output and "rank 0" not in result.output.split("nothing was copied")[1]
        for name in sandbox.names:
            rc, _out, _err = sandbox.run(name, f"test -e {local}")
            assert rc != 0, f"{name}: something was copied"
    finally:
        on_all(sandbox, f"rm -rf {local} {filler}")


def fabric_rx(sandbox, name) -> int:
    """Bytes received on the rank's interfaces other than lo and its management one."""
    mgmt = mgmt_if(sandbox, name)
    rc, out, err = sandbox.run(name, f"cd /sys/class/net && for i in *; do [ $i = lo ] || [ $i = {mgmt} ] || "
                                     "cat $i/statistics/rx_bytes; done")
    assert rc == 0, err
    return sum(int(n) for n in out.split())


def test_peers_copy_over_the_fabric_and_auto_takes_the_faster(sandbox, cfg):
    total = checkpoint_bytes(sandbox)
    ranks_dir = cluster.paths(sandbox.state_dir)["ranks"]
    try:  # the sandbox's NFS link (nfs_link): a server port far faster than the cables, then slower
        nfs_link.set_speed(sandbox.state_dir, ranks_dir, 10_000_000)
        auto = stage(cfg, "--dry-run")["plan"]
        assert auto["via"] == "nfs" and auto["estimates"]["nfs"] < auto["estimates"]["peer"], auto
        nfs_link.set_speed(sandbox.state_dir, ranks_dir, 10_000)
        auto = stage(cfg, "--dry-run")["plan"]
        assert auto["via"] == "peer" and auto["estimates"]["peer"] < auto["estimates"]["nfs"], auto
    finally:
        nfs_link.set_speed(sandbox.state_dir, ranks_dir, None)
    planned = stage(cfg, "--dry-run", "--from", "peer")["plan"]
    routes = [(r["peer"], r["phase"]) for r in planned["ranks"]]
    assert routes[0] == (None, 0) and routes[1] == (0, 1) and routes[3] == (0, 1) and routes[2][1] == 2, routes
    before = {name: fabric_rx(sandbox, name) for name in sandbox.names}
    done = stage(cfg, "--from", "peer")
    assert [(r["copied"], r["error"]) for r in done["ranks"]] == [(total, None)] * 4
    got = {name: fabric_rx(sandbox, name) - before[name] for name in sandbox.names}
    assert all(got[name] >= total for name in sandbox.names[1:]), got  # the copy came over a cable
    assert got[sandbox.names[0]] < total, got  # rank 0 read model.path
    found = rows(cfg)
    assert all(found[(r, "staged")]["status"] == "pass" for r in range(4))


def test_another_users_planted_partial_link_is_not_written_through(sandbox, tmp_path):
    """Issue 33: model.local_path in a folder other users may write (a shared scratch disk): a
    second user on rank 0 plants the temp file of a shard as a link to a file of the kit's user."""
    shared = "/tmp/sparkstack-shared-scratch"
    local = f"{shared}/glm53"

    def on(name: str, *command: str, user: str = "root") -> str:
        done = subprocess.run(["docker", "exec", "-u", user, f"sparkstack-{name}", *command],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    rank0 = sandbox.names[0]
    try:
        for name in sandbox.names:
            on(name, "install", "-d", "-m", "1777", shared, local)
        on(rank0, "useradd", "-m", "mallory")
        on(rank0, "sh", "-c", "printf 'the kit user file\\n' > /home/spark/victim && chmod 600 /home/spark/victim",
           user="spark")
        on(rank0, "ln", "-s", "/home/spark/victim", f"{local}/.{SHARD}.partial", user="mallory")
        result = cli("stage", "-c", write_cfg(sandbox, tmp_path, local), "--from", "nfs")
        text = " ".join(result.output.split())
        assert on(rank0, "sh", "-c", "stat -c %a /home/spark/victim; cat /home/spark/victim") == "600\nthe kit user file\n"
        assert result.exit_code == 1, result.output
        assert f"rank 0" in text and f".{SHARD}.partial is a symbolic link" in text, text
    finally:
        subprocess.run(["docker", "exec", f"sparkstack-{rank0}", "sh", "-c",
                        "pkill -u mallory; userdel -r -f mallory; rm -f /home/spark/victim"],
                       capture_output=True, timeout=60)
        for name in sandbox.names:
            on(name, "rm", "-rf", shared)
