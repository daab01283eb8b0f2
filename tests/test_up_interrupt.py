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
