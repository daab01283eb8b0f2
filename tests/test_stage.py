"""`sparkstack stage` without a cluster (issue 15): the plan from each rank's listing (golden), the
rank-side script on real directories here (list, copy, resume after a kill, a hash mismatch), and
`plan` serving from model.local_path. tests/test_stage_sandbox.py runs it on the sandbox."""

import hashlib
import json
import os
import resource
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ROOT
from launcher import onrank
from launcher.errors import ConfigError
from launcher.inputs import config as config_mod
from launcher.plan import staging
from test_plan import plan_json

TOKEN = "0123456789abcdef0123456789abcdef"  # a phase's token, as apply/stage.py makes them

GOLDEN = ROOT / "tests" / "golden" / "stage"
SRC, DST = "/models/glm", "/var/lib/models/glm"
MTIME = 1796000000

SOURCE = {"files": {"config.json": [1147, MTIME], "model-00001-of-00002.safetensors": [4_000_000, MTIME],
                    "model-00002-of-00002.safetensors": [3_000_000, MTIME],
                    "model.safetensors.index.json": [26486, MTIME], "tokenizer.json": [9000, MTIME]},
          "checkpoint": {"dir": SRC, "config_sha256": "a" * 64, "index_sha256": "b" * 64,
                         "shards": [["model-00001-of-00002.safetensors", 4_000_000],
                                    ["model-00002-of-00002.safetensors", 3_000_000]]}}
GB = 10**9


def listing(dst: dict, free: int = 500 * GB) -> dict:
    """A rank's listing as onrank/stage.py `list` prints it."""
    return {"src": SOURCE, "dst": dst, "free": free, "free_at": DST if "files" in dst else "/var/lib"}


LISTINGS = {
    0: ("spark1", listing({"absent": True})),  # nothing staged yet
    1: ("spark2", listing({"files": {"config.json": [1147, MTIME],  # one in place, one cut short,
                                     "model-00002-of-00002.safetensors": [3_000_000, MTIME - 60],  # one stale
                                     "model.safetensors.index.json": [26486, MTIME], "tokenizer.json": [9000, MTIME]},
                           "partial": {"model-00001-of-00002.safetensors": 1_500_000}})),
    2: ("spark3", listing({"files": SOURCE["files"], "partial": {}})),  # complete
    3: ("spark4", listing({"absent": True}, free=5_000_000)),  # its disk is short
}


def test_stage_plan_matches_golden(golden):
    plan = staging.make(SRC, DST, LISTINGS)
    golden.check(GOLDEN / "plan.json", json.dumps(plan.to_json(), indent=2) + "\n")
    golden.check(GOLDEN / "dry-run.txt", "\n".join(staging.lines(plan)) + "\n")


# a ring of four: each rank reaches its two neighbours, at the far end of each cable
RING = {0: {1: "10.9.1.1", 3: "10.9.4.2"}, 1: {0: "10.9.1.2", 2: "10.9.2.1"},
        2: {1: "10.9.2.2", 3: "10.9.3.1"}, 3: {2: "10.9.3.2", 0: "10.9.4.1"}}
NFS_10G = {r: (1e9, True) for r in range(4)}  # 10G at 80 %, one file server's port
LINKS_200G = {(r, p): 2e10 for r, peers in RING.items() for p in peers}


def peer_plan(listings=LISTINGS) -> staging.StagePlan:
    return staging.route_peers(staging.make(SRC, DST, listings), RING)


def test_stage_peer_plan_matches_golden(golden):
    plan = peer_plan()
    plan.estimates = {"nfs": staging.seconds(staging.make(SRC, DST, LISTINGS), NFS_10G, LINKS_200G),
                      "peer": staging.seconds(plan, NFS_10G, LINKS_200G)}
    golden.check(GOLDEN / "plan-peer.json", json.dumps(plan.to_json(), indent=2) + "\n")
    golden.check(GOLDEN / "dry-run-peer.txt", "\n".join(staging.lines(plan)) + "\n")


def test_peers_read_the_source_once_and_spread_over_the_ring():
    empty = {r: (f"spark{r + 1}", listing({"absent": True})) for r in range(4)}
    plan = peer_plan(empty)
    assert [(r.peer, r.peer_address, r.phase) for r in plan.ranks] == [
        (None, None, 0), (0, "10.9.1.2", 1), (1, "10.9.2.2", 2), (0, "10.9.4.1", 1)]
    assert [[r.rank for r in phase] for phase in plan.phases] == [[0], [1, 3], [2]]
    # a complete rank (2) is the source: the file server is not read at all
    plan = peer_plan(LISTINGS)
    assert [(r.rank, r.peer, r.phase) for r in plan.ranks if r.todo] == [(0, 1, 2), (1, 2, 1), (3, 2, 1)]
    # 4 × 7 MB through one 10G port vs 7 MB once, then two 200G hops (rank 0's two cables at once)
    nfs, peer = (staging.seconds(p, NFS_10G, LINKS_200G) for p in (staging.make(SRC, DST, empty), peer_plan(empty)))
    total = empty[0][1]["src"]["files"]
    size = sum(s for s, _ in total.values())
    assert nfs == pytest.approx(size / (1e9 / 4)) and peer == pytest.approx(size / 1e9 + 2 * size / 2e10)
    assert staging.seconds(peer_plan(empty), NFS_10G, {}) is None  # a link's speed unknown


def test_a_rank_no_copy_reaches_reads_the_source_with_the_first():
    empty = {r: (f"spark{r + 1}", listing({"absent": True})) for r in range(3)}
    plan = staging.route_peers(staging.make(SRC, DST, empty), {1: {0: "10.9.1.1"}, 2: {}})
    assert [(r.peer, r.phase) for r in plan.ranks] == [(None, 0), (0, 1), (None, 0)]


def test_the_plan_copies_only_what_is_missing_and_refuses_a_short_disk():
    plan = staging.make(SRC, DST, LISTINGS)
    r0, r1, r2, r3 = plan.ranks
    assert r0.to_copy == sum(size for size, _ in SOURCE["files"].values())
    assert {f.name: f.state for f in r1.todo} == {"model-00001-of-00002.safetensors": staging.PARTIAL,
                                                  "model-00002-of-00002.safetensors": staging.DIFFERS}
    assert r1.to_copy == 2_500_000 + 3_000_000 and r2.to_copy == 0 and not r2.todo
    assert plan.refusals() == [
        "rank 3 (spark4): /var/lib/models/glm needs 7.0 MB but only 5.0 MB are free at /var/lib; "
        "free space there, or set model.local_path to a disk with room"]


def test_a_rank_that_cannot_read_the_source_or_answer_is_named():
    plan = staging.make(SRC, DST, {0: ("spark1", {"src": {"error": "PermissionError: Permission denied"},
                                                  "dst": {"absent": True}, "free": GB, "free_at": "/"}),
                                   1: ("spark2", "spark2: unreachable"),
                                   2: ("spark3", listing({"absent": True}))})
    assert plan.refusals() == [
        "rank 0 (spark1): cannot read model.path /models/glm (PermissionError: Permission denied): mount "
        "the checkpoint there (`sparkstack prep`)", "rank 1 (spark2): spark2: unreachable"]


# --- the rank's side, on real directories here ---------------------------------------------------

def run_script(args: dict, **kw) -> subprocess.Popen:
    command, stdin = onrank.invocation("stage", args)
    p = subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, **kw)
    p.stdin.write(stdin)
    p.stdin.close()
    return p


def script(args: dict) -> tuple[int, str]:
    p = run_script(args)
    out = p.stdout.read().decode()
    return p.wait(), out


@pytest.fixture
def tree(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "model-00001-of-00002.safetensors").write_bytes(os.urandom(3_000_000))
    (src / "model-00002-of-00002.safetensors").write_bytes(os.urandom(1_000_000))
    (src / "config.json").write_text('{"num_hidden_layers": 3}')
    (src / ".hidden").write_text("not copied")
    return src, tmp_path / "local" / "glm"


def plan_here(src, dst, manifest=None) -> staging.StagePlan:
    rc, out = script({"mode": "list", "src": str(src), "dst": str(dst)})
    assert rc == 0
    return staging.make(str(src), str(dst), {0: ("here", json.loads(out))}, manifest)


def copy_args(plan, bwlimit=0, peer=None):
    from launcher.apply.stage import copy_args
    return copy_args(plan, plan.ranks[0], bwlimit, peer)


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_copy_then_nothing_left_and_the_copy_keeps_the_source_mtime(tree):
    src, dst = tree
    plan = plan_here(src, dst)
    assert plan.ranks[0].to_copy == 4_000_000 + len('{"num_hidden_layers": 3}')
    rc, out = script(copy_args(plan))
    assert rc == 0 and out.count("\nD ") + out.startswith("D ") == 3, out
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "config.json"):
        assert sha(dst / name) == sha(src / name)
        assert int(os.stat(dst / name).st_mtime) == int(os.stat(src / name).st_mtime)
    assert not (dst / ".hidden").exists() and not list(dst.glob(".*.partial"))
    again = plan_here(src, dst).ranks[0]
    assert again.to_copy == 0 and [f.state for f in again.files] == ["ok"] * 3


def test_a_killed_copy_resumes_from_its_partial_file(tree):
    src, dst = tree
    plan = plan_here(src, dst)
    p = run_script(copy_args(plan, bwlimit=300_000))  # the 3 MB shard takes 10 s: a wide window under load
    deadline = time.monotonic() + 10
    while not list(dst.glob(".*.partial")) or os.path.getsize(next(dst.glob(".*.partial"))) < 1_000_000:
        assert time.monotonic() < deadline, "the copy did not start"
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    resumed = plan_here(src, dst).ranks[0]
    partial = [f for f in resumed.files if f.state == staging.PARTIAL]
    assert len(partial) == 1 and 0 < partial[0].have < partial[0].size
    assert resumed.to_copy < plan.ranks[0].to_copy
    full = {n: sha(src / n) for n in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")}
    rc, out = script(copy_args(plan_here(src, dst, manifest=full)))
    assert rc == 0, out
    moved = int([line for line in out.splitlines() if line.startswith("P ")][-1][2:])
    assert moved == resumed.to_copy  # only the rest moved
    assert all(sha(dst / n) == h for n, h in full.items())


def test_a_hash_mismatch_names_the_file_and_keeps_nothing(tree):
    src, dst = tree
    bad = {"model-00002-of-00002.safetensors": "0" * 64}
    rc, out = script(copy_args(plan_here(src, dst, manifest=bad)))
    assert rc == 1
    assert ("E model-00002-of-00002.safetensors sha256 " in out and "the manifest says 000000000000" in out), out
    assert not (dst / "model-00002-of-00002.safetensors").exists()
    assert not (dst / ".model-00002-of-00002.safetensors.partial").exists()
    assert (dst / "model-00001-of-00002.safetensors").exists()  # the others are in place


def start_server(folder, names, token=TOKEN, timeouts=None, nofile=None):
    """The peer file server of `stage --from peer` here, on 127.0.0.1, as the kit starts it: its
    token on stdin after the script; (process, port)."""
    args = {"mode": "serve", "dir": str(folder), "bind": "127.0.0.1", "names": names}
    if timeouts:
        args["timeouts"] = timeouts
    command, source = onrank.invocation_keeping_stdin("stage", args)
    limit = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))) if nofile else None
    server = subprocess.Popen(shlex.split(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, preexec_fn=limit)
    server.stdin.write(source + f"{token}\n".encode())
    server.stdin.flush()
    return server, int(server.stdout.readline().decode().split()[1])


def stop_server(server) -> str:
    server.stdin.close()  # the kit done: the server ends
    assert server.wait(timeout=10) == 0
    return server.stderr.read().decode()


def fetch(port: int, request: bytes, timeout: float = 10) -> bytes:
    """What a client on the fabric gets for `request`: every byte until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(request)
        got = b""
        while block := conn.recv(1 << 16):
            got += block
        return got


def test_a_copy_from_a_peer_server_resumes_and_keeps_the_source_mtime(tree, tmp_path):
    """serve on one side (its stdin open while it serves), copy from it on the other."""
    from launcher.apply.stage import copy_invocation

    src, dst = tree
    plan = plan_here(src, dst)
    server, port = start_server(src, [f.name for f in plan.ranks[0].todo])
    try:
        name = "model-00001-of-00002.safetensors"
        dst.mkdir(parents=True)
        (dst / f".{name}.partial").write_bytes((src / name).read_bytes()[:1_000_000])
        plan = plan_here(src, dst, manifest={name: sha(src / name)})
        command, stdin = copy_invocation(copy_args(plan, peer=["127.0.0.1", port]), TOKEN)
        assert TOKEN not in command  # never on a command line `ps` shows
        copier = subprocess.run(shlex.split(command), input=stdin, capture_output=True, timeout=60)
        rc, out = copier.returncode, copier.stdout.decode()
        assert TOKEN not in out
        assert rc == 0, out
        assert int(out.splitlines()[-1][2:]) == plan.ranks[0].to_copy == 4_000_000 + 24 - 1_000_000
        for f in src.iterdir():
            if not f.name.startswith("."):
                assert sha(dst / f.name) == sha(f) and int(os.stat(dst / f.name).st_mtime) == int(os.stat(f).st_mtime)
    finally:
        server.stdin.close()  # the kit done: the server ends
        assert server.wait(timeout=10) == 0


# --- issue 33: a hostile client on the fabric, another user where the copy goes ------------------

SHARD = "model-00001-of-00002.safetensors"


def test_the_peer_server_serves_only_who_has_the_phases_token(tree):
    src, _dst = tree
    server, port = start_server(src, [SHARD], timeouts=[2, 5])
    try:
        assert fetch(port, f"{SHARD} 0\n".encode()) == b""  # the old request: no token (cut after 2 s)
        assert fetch(port, f"{SHARD} 0\nnot-the-token\n".encode()) == b""
        assert fetch(port, f"{SHARD} 0\n{TOKEN}\n".encode()) == (src / SHARD).read_bytes()
    finally:
        stop_server(server)


def rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))


def test_a_request_line_without_an_end_is_cut_off_at_its_bound(tree):
    src, _dst = tree
    server, port = start_server(src, [SHARD])
    try:
        before = rss_kib(server.pid)
        sent = 0
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            try:
                while sent < 64 << 20:  # 64 MB and no newline
                    conn.sendall(b"x" * (1 << 20))
                    sent += 1 << 20
            except OSError:
                pass  # closed on us: what it should do
        grown = rss_kib(server.pid) - before
        assert sent < 64 << 20, "the server read 64 MB of one request line"
        assert grown < 8 << 10, f"the server grew by {grown} KiB"
    finally:
        stop_server(server)


def test_idle_connections_neither_exhaust_nor_stall_the_server(tree):
    src, _dst = tree
    server, port = start_server(src, [SHARD], timeouts=[1, 5], nofile=64)  # EMFILE within reach
    idle = []
    try:
        for _ in range(150):
            try:
                idle.append(socket.create_connection(("127.0.0.1", port), timeout=0.5))
            except OSError:
                pass
        deadline, got = time.monotonic() + 30, b""
        while time.monotonic() < deadline and got != (src / SHARD).read_bytes():
            try:
                got = fetch(port, f"{SHARD} 0\n{TOKEN}\n".encode(), timeout=3)
            except OSError:
                got = b""
            time.sleep(0.2)
        assert got == (src / SHARD).read_bytes(), "a reader was not served beside 150 idle connections"
    finally:
        for conn in idle:
            conn.close()
        stop_server(server)


def test_a_link_is_not_served(tree, tmp_path):
    src, _dst = tree
    secret = tmp_path / "secret"
    secret.write_text("not part of the checkpoint\n")
    (src / "linked.safetensors").symlink_to(secret)
    server, port = start_server(src, [SHARD, "linked.safetensors"])
    try:
        assert fetch(port, f"linked.safetensors 0\n{TOKEN}\n".encode()) == b""
    finally:
        stop_server(server)


def test_a_non_ascii_digit_ends_its_request_without_a_traceback(tree):
    src, _dst = tree
    server, port = start_server(src, [SHARD])
    try:
        assert fetch(port, f"{SHARD} \u00b2\n{TOKEN}\n".encode()) == b""
        assert fetch(port, f"{SHARD} 0\n{TOKEN}\n".encode()) == (src / SHARD).read_bytes()  # still serving
    finally:
        said = stop_server(server)
    assert "Traceback" not in said, said


def test_a_planted_partial_link_is_not_written_through(tree, tmp_path):
    src, dst = tree
    victim = tmp_path / "victim"
    victim.write_text("someone else's file\n")
    dst.mkdir(parents=True)
    (dst / f".{SHARD}.partial").symlink_to(victim)
    rc, out = script(copy_args(plan_here(src, dst)))
    assert victim.read_bytes() == b"someone else's file\n"
    assert rc == 1 and f"E {SHARD} " in out and "is a symbolic link" in out, out
    assert (dst / "config.json").exists()  # the other files are copied


def test_a_planted_link_in_the_copy_is_not_taken_for_a_staged_file(tree, tmp_path):
    """A link where a staged shard goes (its target another user's file of the right size and
    mtime) is neither counted as staged nor as partial: the copy replaces the link itself."""
    src, dst = tree
    planted = tmp_path / "planted"
    planted.write_bytes(b"\0" * 1_000_000)
    shard = src / "model-00002-of-00002.safetensors"
    os.utime(planted, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns))
    dst.mkdir(parents=True)
    (dst / shard.name).symlink_to(planted)
    (dst / f".{shard.name}.partial").symlink_to(planted)
    listing = json.loads(script({"mode": "list", "src": str(src), "dst": str(dst)})[1])
    assert shard.name not in listing["dst"]["files"] and shard.name not in listing["dst"]["partial"]
    (dst / f".{shard.name}.partial").unlink()
    rc, out = script(copy_args(plan_here(src, dst)))
    assert rc == 0, out
    assert not (dst / shard.name).is_symlink() and sha(dst / shard.name) == sha(shard)
    assert planted.read_bytes() == b"\0" * 1_000_000


# --- the config and the plan -------------------------------------------------------------------

def test_plan_serves_from_the_local_path(write_config):
    data = plan_json(write_config(lambda d: d["model"].update(local_path="/var/lib/models/glm")))
    for rank in data["ranks"]:
        assert "/var/lib/models/glm:/var/lib/models/glm:ro" in rank["docker_run"]
        assert not any(a.startswith("/models/keys-GLM-5.3-EXL3") for a in rank["docker_run"])
        assert "/var/lib/models/glm" in rank["engine"]


@pytest.mark.parametrize("local, why", [("relative/glm", "absolute path"),
                                        ("/models/keys-GLM-5.3-EXL3/", "local_path is model.path")])
def test_a_bad_local_path_is_refused(write_config, local, why):
    path = write_config(lambda d: d["model"].update(local_path=local))
    with pytest.raises(ConfigError) as e:
        config_mod.load(path)
    assert "model" in e.value.message and why in e.value.message


def test_stage_without_a_local_path_says_what_to_set(write_config):
    from click.testing import CliRunner
    from launcher.cli.commands import main

    result = CliRunner().invoke(main, ["stage", "-c", str(write_config()), "--dry-run"])
    assert result.exit_code != 0 and "model.local_path is not set" in result.output
    assert "Traceback" not in result.output
