"""The named rank facts (launcher/facts/remote.py): each command's output, as Docker and the
kernel print it, read by its parser; and the commands run against this host's own Docker."""

import json
import shutil
import subprocess
import uuid

import pytest

from launcher.facts import remote
from launcher.facts.parts import FactError

ID = "sha256:01260f3072ec2df9356826bf746fe3f92882c8a61dec0e36ca7896d61cdc0072"
STATE = ('{"Status":"running","Running":true,"Paused":false,"Restarting":false,"OOMKilled":false,'
         '"Dead":false,"Pid":19753,"ExitCode":0,"Error":"","StartedAt":"2026-12-01T07:18:51.016913579Z",'
         '"FinishedAt":"0001-01-01T00:00:00Z"}')
MEMINFO = "MemTotal:       127600000 kB\nMemFree:        121350000 kB\nMemAvailable:   123199992 kB\nBuffers:           48212 kB\n"


def test_image_ids_with_and_without_the_label():
    out = (f"Welcome to DGX OS\nsparkstack/keys:3f2a {ID} 9c1b7e4d\n"
           f"sparkstack-test/base:7d3c {ID} <no value>\nmia/vllm:dcp {ID}\n")
    assert remote.parse_image_ids(out) == {
        "sparkstack/keys:3f2a": remote.RankImage(ID, "9c1b7e4d"),
        "sparkstack-test/base:7d3c": remote.RankImage(ID, "<no value>"),  # Docker's word for none
        "mia/vllm:dcp": remote.RankImage(ID, ""),
    }
    assert remote.parse_image_ids("") == {}


def test_container_states():
    running = remote.parse_container_state(f"{STATE}\t0123456789abcdef\tsparkstack/keys:3f2a\n")
    assert running == remote.ContainerState("running", 0, False, "2026-12-01T07:18:51.016913579Z",
                                            "sparkstack/keys:3f2a", "0123456789abcdef")
    killed = json.dumps({"Status": "exited", "OOMKilled": True, "ExitCode": 137, "StartedAt": None})
    assert remote.parse_container_state(f"{killed}\t\timg\n").oom_killed
    assert remote.parse_container_state(f"{killed}\t\timg\n").label is None
    assert remote.parse_container_state("absent\n") is None


@pytest.mark.parametrize("stdout", ["", "Error: No such object\n", f"{STATE}\tlabel\n",
                                    '{"Status": 5}\t\timg\n'])
def test_container_state_of_another_shape_quotes_the_line(stdout):
    with pytest.raises(FactError) as e:
        remote.parse_container_state(stdout)
    assert str(e.value).startswith("`docker inspect` printed ") and "not the container's state" in str(e.value)


def test_mem_available():
    assert remote.parse_mem_available(MEMINFO) == 123199992 * 1024
    assert remote.parse_mem_available("MemTotal: 1 kB\n") is None
    assert remote.parse_mem_available("cat: /proc/meminfo: No such file or directory\n") is None
    with open("/proc/meminfo") as f:
        assert remote.parse_mem_available(f.read()) > 0


def local_shell(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)


@pytest.fixture
def local_docker_cli():
    if not shutil.which("docker") or local_shell("docker version").returncode != 0:
        pytest.skip("no docker CLI with an engine here")


@pytest.fixture
def own_image(local_docker_cli):
    """An image of this test's own (empty, one label), imported with no registry; removed after."""
    ref = f"sparkstack-test/rank-facts:{uuid.uuid4().hex[:8]}"
    made = local_shell(f"tar cf - -T /dev/null | docker import --change 'LABEL org.sparkstack.chain=c0ffee' - {ref}")
    assert made.returncode == 0, made.stderr
    yield ref, made.stdout.strip()
    local_shell(f"docker rmi {ref}")


@pytest.mark.sandbox  # imports an image into this host's Docker engine
def test_commands_against_this_hosts_docker(own_image):
    """The commands as a rank runs them, with this host's Docker: what they print, the parsers read."""
    ref, image_id = own_image
    out = local_shell(remote.image_ids_command([ref, "sparkstack/no-such:image"], label="org.sparkstack.chain"))
    assert out.returncode == 0, out.stderr
    assert remote.parse_image_ids(out.stdout) == {ref: remote.RankImage(image_id, "c0ffee")}
    out = local_shell(remote.container_state_command("sparkstack-no-such-container", "org.sparkstack.plan"))
    assert out.returncode == 0 and remote.parse_container_state(out.stdout) is None
