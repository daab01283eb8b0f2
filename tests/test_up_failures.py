"""`up` and `down` when something goes wrong, through the real CLI on the sandbox: an image too
old for native multi-node or without Ray, a failed ship, a rank the kernel's OOM killer ends, an
API that never answers, a rank whose container cannot be stopped -- and `up --restart`.
Each test says what it changed and puts it back; every one ends with no serving container left
(the `cfg` fixture runs `down` after each)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from serving import cli, states

SPARKSTACK = Path(sys.executable).parent / "sparkstack"  # the console script, as a user runs it
ODD = "sparkstack-test/odd-vllm:issue21"  # the stand-in with vLLM 0.10.2, no `ray`, 8 MB ballast


@pytest.fixture
def cfg(sandbox):
    """The sandbox's config; after the test, no serving container on any rank, whatever it did."""
    path = str(sandbox.config)
    yield path
    assert cli("down", "-c", path).exit_code == 0


def started_at(cfg) -> list[str]:
    return [r["started_at"] for r in json.loads(cli("status", "-c", cfg, "--json").stdout)["ranks"]]


def nothing_runs(cfg) -> None:
    assert set(states(cfg).values()) == {"absent"}, "a half-started cluster"


@pytest.fixture
def slow(sandbox, tmp_path):
    """The sandbox's config with an engine whose weights take ten minutes to load."""
    data = yaml.safe_load(open(sandbox.config))
    data["overrides"] = {"env": {"SANDBOX_VLLM_STARTUP_S": "600"}}
    path = tmp_path / "slow.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.fixture(scope="module")
def odd_image(sandbox):
    """On this host: the sandbox's stand-in image with `vllm --version` saying 0.10.2, `ray`
    removed, and an 8 MB layer of random bytes (so a pull needs room). Removed everywhere after."""
    def docker(*args):
        done = subprocess.run(["docker", *args], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout

    work = "sparkstack-test-odd-vllm"
    subprocess.run(["docker", "rm", "-f", work], capture_output=True)
    docker("run", "--name", work, sandbox.images["vllm"], "sh", "-c",
           "rm /usr/local/bin/ray && head -c 8000000 /dev/urandom > /var/tmp/ballast")
    docker("commit", "--change", "ENV SANDBOX_VLLM_VERSION=0.10.2", work, ODD)
    docker("rm", work)
    image_id = docker("image", "inspect", "--format", "{{.Id}}", ODD).strip()
    yield ODD  # every test using it ends with `down` (cfg): no container left that uses it
    for name in sandbox.names:  # by ID: a shipped image also keeps the registry's digest as a name;
        # by name too: on containerd's image store (spark4) the ID is its manifest's digest
        sandbox.run(name, f"docker rmi -f {image_id} >/dev/null 2>&1; docker rmi -f {ODD} >/dev/null 2>&1; true")
    subprocess.run(["docker", "rmi", ODD], capture_output=True)


def prebuilt_config(sandbox, tmp_path, image: str, **changes) -> str:
    """The sandbox's config serving `image` as a prebuilt profile (up ships it if a rank lacks it)."""
    profiles = tmp_path / "profiles"
    profiles.mkdir(exist_ok=True)
    prof = yaml.safe_load(open("env/profiles/sandbox.yaml"))
    prof["image"] = {"prebuilt": image}
    (profiles / "odd.yaml").write_text(yaml.safe_dump(prof))
    data = yaml.safe_load(open(sandbox.config))
    data.update(profile="odd", profiles_dir=str(profiles), **changes)
    data.setdefault("images", {}).pop("base", None)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


# --- refused before anything starts -------------------------------------------------------------

def test_a_failed_ship_inside_up_starts_nothing(sandbox, cfg, odd_image, tmp_path):
    """`up` ships the image a rank lacks; a rank whose disk fills mid-pull fails the ship, and
    `up` starts nothing on any rank and names that rank and why."""
    custom = prebuilt_config(sandbox, tmp_path, odd_image)
    assert cli("down", "-c", cfg).exit_code == 0
    sandbox.run("spark3", f"docker rmi {odd_image} >/dev/null 2>&1; true")  # spark3 must need it
    # spark3: on the classic store, whose `docker load` unpacks into <root>/tmp
    full = ["docker", "exec", "sparkstack-spark3"]
    assert subprocess.run([*full, "mount", "-t", "tmpfs", "-o", "size=4m", "sandbox-full",
                           "/var/lib/docker/tmp"]).returncode == 0
    try:
        result = cli("up", "-c", custom)
    finally:
        subprocess.run([*full, "umount", "/var/lib/docker/tmp"], check=True)
    assert result.exit_code == 1, result.output
    assert "error: cannot put the image on every rank, nothing was started:" in result.output
    assert "error: rank 2 (spark3): disk full (" in result.output
    assert "starting" not in result.output
    nothing_runs(cfg)
    assert sandbox.run("spark3", f"docker image inspect {odd_image}")[0] != 0  # no half-shipped tag


def test_an_image_with_too_old_vllm_is_refused(sandbox, cfg, odd_image, tmp_path):
    """Native multi-node (--nnodes/--node-rank/--master-addr) needs vLLM 0.11.1: an image whose
    `vllm --version` says 0.10.2 is refused after the ship, before any rank starts."""
    custom = prebuilt_config(sandbox, tmp_path, odd_image)
    assert cli("down", "-c", cfg).exit_code == 0
    result = cli("up", "-c", custom)
    assert result.exit_code == 1, result.output
    assert (f"error: {odd_image} has vLLM 0.10.2: native multi-node (--nnodes/--node-rank/--master-addr) "
            "needs 0.11.1 or newer; use a newer image") in result.output
    assert "starting" not in result.output
    nothing_runs(cfg)


def test_an_image_without_ray_is_refused_for_multinode_ray(sandbox, cfg, odd_image, tmp_path):
    """`multinode: ray` with an image that has no `ray`: refused before the Ray head starts,
    saying what to do."""
    custom = prebuilt_config(sandbox, tmp_path, odd_image, multinode="ray")
    assert cli("down", "-c", cfg).exit_code == 0
    result = cli("up", "-c", custom)
    assert result.exit_code == 1, result.output
    assert f"error: rank 0 (spark1): {odd_image} has no Ray (`ray --version` in the image: exited 127" \
        in result.output
    assert "multinode: ray needs an image with Ray installed, or use multinode: native" in result.output
    assert "starting" not in result.output
    nothing_runs(cfg)


# --- started, then it goes wrong ------------------------------------------------------------------

def test_up_restart_starts_every_rank_again(sandbox, cfg):
    """`up` on a cluster running as planned changes nothing; `up --restart` starts every rank's
    container anew and waits for the API again."""
    assert cli("up", "-c", cfg).exit_code == 0
    before = started_at(cfg)
    result = cli("up", "-c", cfg, "--restart")
    assert result.exit_code == 0, result.output
    assert "already running as planned" not in result.output
    assert "starting workers: rank 1 (spark2), rank 2 (spark3), rank 3 (spark4)" in result.output
    assert "(started, " in result.output and "a completion: ok" in result.output
    after = started_at(cfg)
    assert all(a != b for a, b in zip(after, before)), (before, after)
    assert set(states(cfg).values()) == {"running"}


def test_an_api_that_never_answers_stops_every_rank(sandbox, cfg, slow):
    """The engine still "loading weights" when `up --timeout` runs out: `up` fails saying where
    the API was stuck, stops every rank's container, says so, and shows how each rank was when
    it gave up (running, then: not a claim that contradicts the stop) with its log tail."""
    result = cli("up", "-c", slow, "--timeout", "5")
    assert result.exit_code == 1, result.output
    head = sandbox.rank("spark1")["address"]
    assert f"error: http://{head}:8888 not serving after 5 s: stuck at /health (ConnectError: " \
        in result.output
    assert "; every rank's container was stopped\nerror: each rank as the wait gave up:\n" in result.output
    before_the_stop = result.output.split("each rank as the wait gave up:")[1]
    for r, name in enumerate(sandbox.names):
        assert f"error: rank {r} ({name}): running\n" in before_the_stop
    assert "vLLM API server version 0.33.0 (SANDBOX STAND-IN" in result.output  # the log tails
    nothing_runs(cfg)


def engine_running(sandbox, name: str) -> bool:
    rc, out, err = sandbox.run(name, "docker ps -q --filter name=^sparkstack-engine$")
    assert rc == 0, err
    return bool(out.strip())


def test_a_rank_killed_for_memory_is_said_so(sandbox, cfg, slow):
    """The kernel's OOM killer ends rank 2's engine while the model loads (its container held
    to 128 MiB, small processes in it growing past that; the engine is the killer's pick): `up`
    says the rank ran out of memory and stops every rank."""
    up = subprocess.Popen([str(SPARKSTACK), "up", "-c", slow], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 600  # a first run may build and ship the image
        while not engine_running(sandbox, "spark3"):
            assert up.poll() is None, up.stdout.read()
            assert time.monotonic() < deadline, "no container on spark3 after 600 s"
            time.sleep(0.2)
        oom = sandbox.run("spark3", (
            "docker update --memory 128m --memory-swap 128m sparkstack-engine >/dev/null && "
            # sixteen small eaters (tail keeps its last 12 MiB until its input ends, 30 s on):
            # together past the limit at once, each smaller than the engine, which is the
            # killer's pick (a docker exec gets the container's --oom-score-adj 1000 too, so
            # one big eater would be picked instead)
            "docker exec sparkstack-engine sh -c 'for i in $(seq 16); do "
            "(head -c 12m /dev/zero; sleep 30) | tail -c 12m >/dev/null & done; wait'"))
        try:
            output, _ = up.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"`up` went on after the OOM kill: {oom}") from None
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 1, output
    assert "error: the cluster did not start; every rank's container was stopped." in output
    assert ("error: rank 2 (spark3): killed by the kernel's OOM killer (exit 137): the rank ran out "
            "of memory") in output
    assert "Traceback" not in output
    nothing_runs(cfg)


def test_down_names_the_rank_it_could_not_stop(sandbox, cfg):
    """A rank whose Docker does not answer (its CLI hidden here) while serving: `down` stops the
    others, names that rank with why, exits 1; its container is still there, as said."""
    assert cli("up", "-c", cfg).exit_code == 0
    hide = "sudo mv /usr/bin/docker /usr/bin/docker.hidden"
    assert sandbox.run("spark3", hide)[0] == 0
    try:
        result = cli("down", "-c", cfg)
    finally:
        assert sandbox.run("spark3", "sudo mv /usr/bin/docker.hidden /usr/bin/docker")[0] == 0
    assert result.exit_code == 1, result.output
    assert "rank 2 (spark3): exited 127: " in result.output and "docker: not found" in result.output
    assert "error: could not stop the container on rank 2 (spark3)" in result.output
    assert "stopped on every rank" not in result.output
    assert states(cfg) == {0: "absent", 1: "absent", 2: "running", 3: "absent"}
    assert cli("down", "-c", cfg).exit_code == 0
    nothing_runs(cfg)


def test_another_clusters_engine_is_named_not_replaced(sandbox, cfg, tmp_path):
    """spark2 runs an engine container labelled as another cluster's (a second config on the
    same boxes): `up` refuses, naming the rank and that cluster, and starts nothing; `down`
    names it as it empties the ranks."""
    assert cli("down", "-c", cfg).exit_code == 0
    image = sandbox.images["vllm"]
    rc, _, err = sandbox.run("spark2", "docker run -d --name sparkstack-engine --label org.sparkstack.cluster=lab-b "
                                       f"--label org.sparkstack.profile=other --entrypoint sleep {image} 600")
    assert rc == 0, err
    result = cli("up", "-c", cfg)
    text = " ".join(result.output.split())
    assert result.exit_code == 1, result.output
    assert "rank 1 (" in text and "its sparkstack-engine belongs to cluster 'lab-b' (profile other)" in text
    assert "nothing was started" in text and "starting" not in result.output
    assert {r: s for r, s in states(cfg).items() if s != "absent"} == {1: "running"}  # only lab-b's
    down = cli("down", "-c", cfg)
    assert down.exit_code == 0 and "stopping cluster 'lab-b''s engine (profile other)" in down.output
    nothing_runs(cfg)
