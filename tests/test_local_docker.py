"""The one way to the local Docker engine (launcher/images/local_docker.py): an engine that does
not answer is one message naming where and why, with the fix, whichever call met it first."""

import socket

import pytest

from launcher.images import local_docker


def message(monkeypatch, host: str, call) -> str:
    monkeypatch.setenv("DOCKER_HOST", host)
    with pytest.raises(local_docker.LocalDockerError) as e:
        call(local_docker.connect(timeout=5))
    return str(e.value)


@pytest.mark.parametrize("call", [lambda d: d.image_id("busybox"), lambda d: d.ping(), lambda d: d.client])
def test_no_socket(monkeypatch, tmp_path, call):
    said = message(monkeypatch, f"unix://{tmp_path}/docker.sock", call)
    assert said == (f"the local Docker engine does not answer at unix://{tmp_path}/docker.sock: "
                    "no engine socket there\nfix: start the Docker engine (`sudo systemctl start docker`, "
                    "or `dockerd &`) or set DOCKER_HOST")


def test_a_socket_nobody_listens_on(monkeypatch, tmp_path):
    path = tmp_path / "docker.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))  # bound, never listening: the connection is refused
        said = message(monkeypatch, f"unix://{path}", lambda d: d.image_id("busybox"))
    assert ": connection refused\nfix: start the Docker engine" in said


def test_permission_denied_says_the_docker_group(monkeypatch):
    error = local_docker.unreachable(PermissionError(13, "Permission denied"))
    assert error.problem.endswith(": permission denied")
    assert error.fix == "add yourself to the docker group (then log in again), or run as root"
