"""The local registry `ship` starts (the real `docker-registry` binary): nothing is left behind
when its start fails or is interrupted."""

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from launcher import registry

pytestmark = pytest.mark.skipif(shutil.which(registry.REGISTRY_BINARY) is None,
                                reason="docker-registry not installed (scripts/provision.sh installs it)")


def _interrupt_the_wait(monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(registry.httpx, "get", interrupted)  # the readiness poll: Ctrl+C lands there


def _time_out_the_wait(monkeypatch):
    monkeypatch.setattr(registry, "READY_TIMEOUT_S", 0)


@pytest.mark.parametrize("fault, raised", [(_interrupt_the_wait, KeyboardInterrupt),
                                           (_time_out_the_wait, registry.RegistryError)])
def test_a_start_that_fails_stops_the_registry_and_removes_its_dir(tmp_path, monkeypatch, fault, raised):
    fault(monkeypatch)
    reg = registry.LocalRegistry(tmp_path / "storage", docker_client=SimpleNamespace())  # no push here
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
