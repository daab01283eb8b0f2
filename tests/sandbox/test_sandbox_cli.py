"""`sparkstack sandbox up | down | status` as a user runs them: their output, `down --purge`, and
the free-space checks before the first build.

The shared sandbox (tests/sandbox_fixture.py) must stay up, and `down` removes whatever carries
the sandbox's label on the engine it is given. So `down`, `status` before any `up` and the
free-space refusals run against a private Docker engine: a second dockerd started here, with its
own socket, state on a 64 MiB tmpfs (too small to build in) and its own network namespace (its
bridges never reach the host). `down` also deletes the host's `sparkstack-switch` network
namespace; it runs with a private /run/netns so a switch-cabled shared sandbox keeps its cables.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

from launcher.sandbox import cluster

ROOT = Path(__file__).resolve().parents[2]
# `ip netns` in a mount namespace of its own, over an empty /run/netns: nothing of the host's
NO_HOST_NETNS = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                 'if [ -d /run/netns ]; then mount -t tmpfs tmpfs /run/netns; fi; exec "$@"', "sh"]


def sparkstack(*args, env: dict, prefix=(), timeout: float = 120):
    """The real console script; on a timeout its whole process group (an mmdebstrap too) is killed."""
    cmd = [*prefix, str(Path(sys.executable).with_name("sparkstack")), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, **env}, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"`sparkstack {' '.join(args)}` did not end within {timeout} s:\n{out}\n{err}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@contextmanager
def tmpfs(path: Path, size: str):
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        for _ in range(20):  # a daemon that just exited may hold it a moment longer
            if subprocess.run(["umount", str(path)], capture_output=True).returncode == 0:
                break
            time.sleep(0.5)


@pytest.fixture(scope="module")
def engine():
    """A second, empty Docker engine: {host: its DOCKER_HOST, client, root: its data root}."""
    if os.environ.get("SPARKSTACK_NO_SANDBOX") == "1":
        pytest.skip("SPARKSTACK_NO_SANDBOX=1: no Docker engine on this machine")
    if os.geteuid() != 0 or shutil.which("dockerd") is None:
        pytest.skip("a private Docker engine needs root and dockerd (as the sandbox does)")
    import docker

    base = Path(tempfile.mkdtemp(prefix="ss-eng-", dir="/tmp"))  # short: containerd's socket path
    sock = base / "docker.sock"
    config = {"data-root": str(base / "data"), "exec-root": str(base / "exec"), "pidfile": str(base / "pid"),
              "hosts": [f"unix://{sock}"], "storage-driver": "vfs", "bridge": "none",
              "iptables": False, "ip6tables": False}
    (base / "daemon.json").write_text(json.dumps(config))
    try:
        with tmpfs(base / "data", "64m"), open(base / "dockerd.log", "wb") as log:
            daemon = subprocess.Popen(["unshare", "--net", "dockerd", "--config-file", str(base / "daemon.json")],
                                      stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                deadline = time.monotonic() + 60
                while True:
                    if daemon.poll() is not None or time.monotonic() > deadline:
                        pytest.fail("the private dockerd did not start:\n"
                                    + (base / "dockerd.log").read_text()[-2000:], pytrace=False)
                    try:
                        client = docker.DockerClient(base_url=f"unix://{sock}", timeout=60)
                        break
                    except docker.errors.DockerException:
                        time.sleep(0.2)
                yield SimpleNamespace(host=f"unix://{sock}", client=client, root=base / "data")
                client.close()
            finally:
                daemon.terminate()
                try:
                    daemon.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(daemon.pid, signal.SIGKILL)
                    daemon.wait()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def labelled(client) -> dict[str, list[str]]:
    """What `down` would remove from this engine."""
    only = {"label": f"{cluster.LABEL}=1"}
    return {"containers": sorted(c.name for c in client.containers.list(all=True, filters=only)),
            "networks": sorted(n.name for n in client.networks.list(filters=only)),
            "volumes": sorted(v.name for v in client.volumes.list(filters=only))}


def make_sandbox_leftovers(client) -> None:
    """Two ranks' containers and stores and the sandbox network, as `up` labels them (created,
    never started: `down` removes them by label either way)."""
    for name in ("spark1", "spark2"):
        client.containers.create("probe:1", "/x", name=cluster.container_name(name),
                                 labels={cluster.LABEL: "1", cluster.RANK_LABEL: name})
        client.volumes.create(cluster.volume_name(name), labels={cluster.LABEL: "1"})
    client.networks.create(cluster.NETWORK, driver="bridge", labels={cluster.LABEL: "1"})


@pytest.mark.sandbox  # a private dockerd (the `engine` fixture)
def test_down_removes_the_labelled_only_and_purge_deletes_the_state_dir(engine, tmp_path):
    """`sandbox down` removes the sandbox's containers, network and volumes and says how many, keeps
    what it did not make and the state dir; `down --purge` deletes the state dir too; a `down`
    with nothing left says so and succeeds."""
    client = engine.client
    client.api.import_image_from_data(b"\0" * 10240, repository="probe", tag="1")  # an empty tar
    foreign = client.containers.create("probe:1", "/x", name="someone-elses")
    foreign_volume = client.volumes.create("someone-elses")
    state = tmp_path / "state"
    (state / "ranks" / "spark1").mkdir(parents=True)
    (state / "id_ed25519").write_text("a key\n")
    env = {"DOCKER_HOST": engine.host}
    expected = {"containers": ["sparkstack-spark1", "sparkstack-spark2"], "networks": [cluster.NETWORK],
                "volumes": ["sparkstack-spark1-docker", "sparkstack-spark2-docker"]}
    try:
        make_sandbox_leftovers(client)
        assert labelled(client) == expected
        res = sparkstack("sandbox", "down", "--dir", str(state), env=env, prefix=NO_HOST_NETNS)
        assert (res.returncode, res.stdout) == (0, "removed 2 containers, 1 networks, 2 volumes\n"), res.stderr
        assert labelled(client) == {"containers": [], "networks": [], "volumes": []}
        assert (state / "id_ed25519").read_text() == "a key\n"  # no --purge: the state stays

        make_sandbox_leftovers(client)
        res = sparkstack("sandbox", "down", "--dir", str(state), "--purge", env=env, prefix=NO_HOST_NETNS)
        assert (res.returncode, res.stdout) == (0, "removed 2 containers, 1 networks, 2 volumes\n"), res.stderr
        assert labelled(client) == {"containers": [], "networks": [], "volumes": []}
        assert not state.exists()

        res = sparkstack("sandbox", "down", "--dir", str(state), "--purge", env=env, prefix=NO_HOST_NETNS)
        assert (res.returncode, res.stdout) == (0, "nothing to remove\n"), res.stderr
        client.containers.get(foreign.id)  # what the sandbox did not make is still there
        client.volumes.get(foreign_volume.name)
    finally:
        for c in client.containers.list(all=True):
            c.remove(force=True)
        client.volumes.prune()
        client.networks.prune()


@pytest.mark.sandbox  # a private dockerd (the `engine` fixture)
def test_status_before_up_shows_every_rank_down_and_says_to_run_up(engine, tmp_path):
    """`sandbox status` where no sandbox was made: each rank with its login and `docker down`, and
    a config that does not exist yet with the command that writes it."""
    state = tmp_path / "state"
    res = sparkstack("sandbox", "status", "--dir", str(state), env={"DOCKER_HOST": engine.host})
    assert res.returncode == 0, res.stderr
    ranks = [f"spark{i + 1}  spark@{cluster.rank_address(i)}:22  docker down"
             for i in range(cluster.n_ranks())]
    assert res.stdout.splitlines() == ranks + [
        f"config: {state}/cluster.yaml (not written yet: `sparkstack sandbox up`)"]


def _refused_for_space(engine, tmp_path, tmpdir: Path):
    state = tmp_path / "state"
    images = sorted(i.id for i in engine.client.images.list())
    res = sparkstack("sandbox", "up", "--dir", str(state), env={"DOCKER_HOST": engine.host, "TMPDIR": str(tmpdir)})
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stdout + res.stderr
    # it stopped before anything: no state dir, no network or rank, no image, no build started
    assert not state.exists()
    assert labelled(engine.client) == {"containers": [], "networks": [], "volumes": []}
    assert sorted(i.id for i in engine.client.images.list()) == images
    assert not list(tmpdir.glob("sparkstack-rootfs-*"))
    return res.stderr


@pytest.mark.sandbox  # a private dockerd (the `engine` fixture)
def test_up_refuses_when_tmpdir_is_too_small_to_build_in(engine, tmp_path):
    """The first `sandbox up` builds its images in TMPDIR: with 20 MiB there it refuses at once,
    naming the directory and saying to point TMPDIR elsewhere (no mmdebstrap run to fill it)."""
    with tmpfs(tmp_path / "small", "20m") as small:
        stderr = _refused_for_space(engine, tmp_path, small)
    assert (f"error: not enough disk space to build the sandbox base image: 0.0 GiB free in {small}, "
            "3.0 GiB needed\n") in stderr
    assert "error: fix: free some space (e.g. `docker system prune`), or point TMPDIR at a larger disk" in stderr


@pytest.mark.sandbox  # a private dockerd (the `engine` fixture)
def test_up_refuses_when_the_docker_engine_is_too_small_to_import_into(engine, tmp_path):
    """Room in TMPDIR but not where the engine keeps its images: refused, naming the engine's data
    root, and the fix is about that disk (moving TMPDIR would not help)."""
    stderr = _refused_for_space(engine, tmp_path, tmp_path)
    assert f"GiB free in {engine.root}, 3.0 GiB needed\n" in stderr
    assert ("error: fix: free some space on the Docker engine's disk (e.g. `docker system prune`), or move "
            f"its data-root ({engine.root}) to a larger one") in stderr
    assert "TMPDIR" not in stderr


def test_up_with_a_bad_rank_count_is_refused_before_docker(tmp_path):
    """`sandbox up --ranks 1`: the count is refused with its fix before any engine is asked (this
    one is unreachable, and its error is not what the user sees)."""
    res = sparkstack("sandbox", "up", "--ranks", "1", "--dir", str(tmp_path / "state"),
                     env={"DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"})
    assert res.returncode == 1
    assert res.stderr.splitlines() == ["error: a sandbox of 1 ranks is not possible",
                                       "error: fix: use 2 to 32 ranks (`sandbox up --ranks 4`)"]
    assert not (tmp_path / "state").exists()


def test_up_and_status_print_each_rank_of_the_running_sandbox(sandbox):
    """On the shared sandbox: `sandbox up` adopts every rank (nothing recreated) and prints each
    rank's login, the time, the cabling and the config; `sandbox status` prints the same ranks
    with `docker running` and the config."""
    import docker

    def ids():
        return {c.name: c.id for c in docker.from_env().containers.list(
            all=True, filters={"label": f"{cluster.LABEL}=1"})}

    before = ids()
    ranks = [f"{r['name']}  {r['user']}@{r['address']}:{r['port']}  docker running" for r in sandbox.ranks]
    res = sparkstack("sandbox", "up", env={}, timeout=300)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[:-2] == ranks
    assert lines[-2].startswith("ready in ") and lines[-2].endswith(
        f" s, cabled as a {cluster.current_topology(sandbox.state_dir)}; the cluster config is:")
    assert lines[-1] == str(sandbox.config)
    assert "sandbox: ranks: " + ", ".join(f"{n} adopted" for n in sandbox.names) in res.stderr
    assert ids() == before

    res = sparkstack("sandbox", "status", env={})
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ranks + [f"config: {sandbox.config}"]
