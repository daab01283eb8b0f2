"""`up` interrupted while the ranks start -- Ctrl+C, or SIGTERM as systemd stops the unit: it
exits 130 and leaves no serving container running on any rank (all or nothing)."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from serving import cli

SPARKSTACK = Path(sys.executable).parent / "sparkstack"  # the console script, as a user runs it


@pytest.fixture(scope="module")
def slow_cfg(sandbox, tmp_path_factory):
    """The sandbox's config with an engine whose weights take ten minutes to load: `up` is
    still starting or waiting for the API when the signal comes."""
    data = yaml.safe_load(open(sandbox.config))
    data["overrides"] = {"env": {"SANDBOX_VLLM_STARTUP_S": "600"}}
    path = tmp_path_factory.mktemp("slow") / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    yield str(path)
    cli("down", "-c", str(path))


def engine_running(sandbox, name: str) -> bool:
    rc, out, err = sandbox.run(name, "docker ps -q --filter name=^sparkstack-engine$")
    assert rc == 0, err
    return bool(out.strip())


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupted_up_stops_what_it_started(sandbox, slow_cfg, signum):
    up = subprocess.Popen([str(SPARKSTACK), "up", "-c", slow_cfg], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 600  # a first run may build and ship the image
        while not engine_running(sandbox, sandbox.names[1]):  # workers start first
            assert up.poll() is None, up.stdout.read()
            assert time.monotonic() < deadline, "no worker container after 600 s"
            time.sleep(0.2)
        up.send_signal(signum)
        output, _ = up.communicate(timeout=120)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 130, output
    assert "interrupted; every rank's container was stopped" in output, output
    assert "Traceback" not in output
    assert [name for name in sandbox.names if engine_running(sandbox, name)] == []


def test_stopped_is_said_only_when_every_rank_confirms_it(sandbox, group):
    """A rank whose Docker does not answer (its CLI gone here) is not counted as stopped."""
    from launcher.apply import serve

    hide = "sudo mv /usr/bin/docker /usr/bin/docker.hidden"
    assert sandbox.run("spark3", hide, user="spark")[0] == 0
    try:
        failed = serve.stop(group)
        assert [r.target.rank for r in failed] == [2], [r.why() for r in failed]
        said = serve.stop_and_say(group)
    finally:
        sandbox.run("spark3", "sudo mv /usr/bin/docker.hidden /usr/bin/docker", user="spark")
    assert "docker: not found" in failed[0].why()
    assert said.startswith("the container could not be stopped on rank 2 (spark3) (exited 127: ")
    assert said.endswith("run `sparkstack down` once it answers")
    assert serve.stop_and_say(group) == "every rank's container was stopped"


def test_a_container_created_after_the_first_removal_is_removed_too(sandbox, group):
    """Ctrl+C while a rank's `docker run` is in flight: its daemon may create the container a
    moment after `stop` first removed it. Stopping after a cut-short start waits that out."""
    from launcher.apply import serve

    late = (f"(sleep 1.5; docker run -d --name {serve.CONTAINER_NAME} --entrypoint sleep "
            f"{sandbox.images['vllm']} 600; touch /tmp/late-start.done) >/dev/null 2>&1 &")
    assert sandbox.run("spark2", "rm -f /tmp/late-start.done && " + late)[0] == 0
    try:
        assert serve.stop_and_say(group) == "every rank's container was stopped"
        deadline = time.monotonic() + 60
        while sandbox.run("spark2", "test -e /tmp/late-start.done")[0] != 0:
            assert time.monotonic() < deadline, "the late `docker run` never finished"
            time.sleep(0.2)
        assert not engine_running(sandbox, "spark2")
        rc, out, _ = sandbox.run("spark2", f"docker ps -aq --filter name=^{serve.CONTAINER_NAME}$")
        assert rc == 0 and out.strip() == "", out
    finally:
        sandbox.run("spark2", f"docker rm -f {serve.CONTAINER_NAME} >/dev/null 2>&1; rm -f /tmp/late-start.done")
