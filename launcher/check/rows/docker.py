"""The docker row: the CLI on the rank and its daemon answering.
"""

from __future__ import annotations

from ...facts.record import Facts
from ...status import Status
from . import row
from .case import Case, RankReport


@row("docker", order=20, reads=("docker", "problems"))
def _check_docker(inp: Case, r: int, f: Facts, rr: RankReport) -> None:
    d = f.docker
    if d is None:
        rr.add("docker", Status.FAIL, "docker CLI not installed", "install Docker (DGX OS ships it): apt install docker.io")
    elif d.server_version is None:
        why = next((p for p in f.problems if p.startswith("docker")), "the daemon does not answer")
        rr.add("docker", Status.FAIL, why, "sudo systemctl start docker; and the SSH user must be in the docker group")
    else:
        rr.add("docker", Status.PASS, f"server {d.server_version}, {len(d.images)} images")
