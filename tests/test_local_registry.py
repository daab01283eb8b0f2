"""The local registry `ship` starts (the real `docker-registry` binary, or a broken one): nothing is
left behind when its start fails or is interrupted, and each failure says its cause and fix."""

import os
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from launcher.images import registry

ROOT = Path(__file__).resolve().parents[1]
needs_registry = pytest.mark.skipif(shutil.which(registry.REGISTRY_BINARY) is None,
                                    reason="docker-registry not installed (scripts/provision.sh installs it)")


def _interrupt_the_wait(monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(registry.httpx, "get", interrupted)  # the readiness poll: Ctrl+C lands there


def _time_out_the_wait(monkeypatch):
    monkeypatch.setattr(registry, "READY_TIMEOUT_S", 0)


@needs_registry
@pytest.mark.parametrize("fault, raised", [(_interrupt_the_wait, KeyboardInterrupt),
                                           (_time_out_the_wait, registry.RegistryError)])
def test_a_start_that_fails_stops_the_registry_and_removes_its_dir(tmp_path, monkeypatch, fault, raised):
    fault(monkeypatch)
    reg = registry.LocalRegistry(tmp_path / "storage", engine=SimpleNamespace())  # no push here
    try:
        with pytest.raises(raised):
            with reg:
                pytest.fail("the registry should not have come up")
        assert reg._process is not None, "the registry was never started"
        assert reg._process.poll() is not None, "docker-registry still runs"
        assert not Path(reg._workdir.name).exists()
    finally:
        if reg._process is not None and reg._process.poll() is None:
            reg._process.kill()  # a failing run must not leave it behind either


# A registry that hangs: it takes its port, accepts connections and never answers them, and
# ignores SIGTERM (a wedged process), so only SIGKILL ends it.
HUNG_REGISTRY = f"""#!{sys.executable}
import re, signal, socket, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
port = int(re.search(r"addr: 127\\.0\\.0\\.1:(\\d+)", open(sys.argv[2]).read()).group(1))
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen()
print("hung registry: listening, answering nothing", flush=True)
held = []
while True:
    held.append(s.accept()[0])
"""


def test_a_registry_that_never_answers_times_out_with_cause_and_fix_and_is_killed(tmp_path, monkeypatch):
    """`ship` on a host whose docker-registry hangs: after the start-up timeout the error names
    the binary, the port, what it printed and the fix; the hung process (deaf to SIGTERM) is
    killed, its port freed, its work dir removed and the storage lock released."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = bin_dir / registry.REGISTRY_BINARY
    stand_in.write_text(HUNG_REGISTRY)
    stand_in.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(registry, "READY_TIMEOUT_S", 3)
    storage = tmp_path / "storage"
    reg = registry.LocalRegistry(storage, engine=SimpleNamespace())
    try:
        with pytest.raises(registry.RegistryError) as raised:
            with reg:
                pytest.fail("a registry that never answers should not count as started")
        message = raised.value.message
        assert f"the local registry ({stand_in}) did not answer on 127.0.0.1:{reg.port} within 3 s" in message
        assert "hung registry: listening, answering nothing" in message  # what it printed
        assert "fix: " in message and "apt-get install --reinstall docker-registry" in message
        assert reg._process.poll() is not None, "the hung registry still runs"
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", reg.port)) != 0, "its port still accepts connections"
        assert not Path(reg._workdir.name).exists()
        assert registry.prune(storage) == 0  # the exclusive lock is free: no ship holds the storage
    finally:
        if reg._process is not None and reg._process.poll() is None:
            reg._process.kill()


def _path_without(name: str, where: Path) -> str:
    """A PATH with every program of this one except `name` (a host where it is not installed)."""
    where.mkdir()
    for directory in os.environ["PATH"].split(os.pathsep):
        for program in Path(directory).glob("*") if Path(directory).is_dir() else []:
            link = where / program.name
            if program.name != name and not link.exists() and os.access(program, os.X_OK):
                link.symlink_to(program)
    assert shutil.which(name, path=str(where)) is None
    return str(where)


def test_ship_without_docker_registry_says_how_to_install_it(sandbox, tmp_path):
    """`sparkstack ship --relay` on a build host without docker-registry, with an image a rank
    lacks: one message naming the missing program and the apt command, exit 1, nothing shipped.
    A plain ship needs no registry: it goes through."""
    tag = f"sparkstack-test/no-registry:{uuid.uuid4().hex[:8]}"
    empty = subprocess.run(["tar", "-cf", "-", "-T", "/dev/null"], capture_output=True, check=True).stdout
    subprocess.run(["docker", "import", "-", tag], input=empty, capture_output=True, check=True)
    env = dict(os.environ, PATH=_path_without(registry.REGISTRY_BINARY, tmp_path / "bin"))

    def ship(*flags):
        return subprocess.run([str(Path(sys.executable).with_name("sparkstack")), "ship", "-c", str(sandbox.config),
                               "--image", tag, *flags], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)

    try:
        res = ship("--relay")
        assert res.returncode == 1, res.stdout + res.stderr
        assert ("error: `docker-registry` is not installed on this host; install it (Debian/Ubuntu: "
                "apt-get install docker-registry)") in res.stderr
        assert "Traceback" not in res.stdout + res.stderr
        assert sandbox.run("spark1", f"docker image inspect {tag}")[0] != 0  # nothing reached a rank
        res = ship()
        assert res.returncode == 0, res.stdout + res.stderr
        assert sandbox.run("spark1", f"docker image inspect {tag}")[0] == 0
    finally:
        subprocess.run(["docker", "rmi", tag], capture_output=True)
        for name in sandbox.names:
            sandbox.run(name, f"docker rmi {tag} >/dev/null 2>&1; true")
