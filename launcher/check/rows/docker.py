"""The docker row: the CLI on the rank, its daemon answering, and the image store it keeps images in.

Both stores serve: the classic one (a graph driver, overlay2) and containerd's (Docker 29+'s
default on a fresh install, some Spark OEM images), so a mixed fleet passes. `ship` sends a rank
on containerd's store an OCI layout (launcher/images/spool.py `oci_tar`), measured to load on
Docker 26.1; the store came as experimental in Docker 24.0 (moby's v24.0.0 release notes) and
Docker 25.0 made the OCI layout `docker save`'s format: older than 25, the row warns.
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
        store = _store(d)
        if d.containerd_store and _major(d.server_version) < CONTAINERD_LOAD_FROM:
            rr.add("docker", Status.WARN, f"server {d.server_version}, {store}: experimental in this "
                   f"Docker (before 25.0), and `ship` sends such a rank an OCI layout of the layers it "
                   f"lacks, measured to load from 26.1 on", "upgrade Docker to 25.0 or later "
                   "(DGX OS: apt install docker-ce), or turn the store off in /etc/docker/daemon.json")
        elif d.storage_driver == "vfs":
            rr.add("docker", Status.WARN, f"server {d.server_version}, {store}: vfs copies every layer in "
                   "full (a 20 GB image takes its size once per layer on disk)",
                   "use overlay2 or containerd's overlayfs snapshotter (/etc/docker/daemon.json)")
        else:
            rr.add("docker", Status.PASS, f"server {d.server_version}, {store}, {len(d.images)} images")


CONTAINERD_LOAD_FROM = 25


def _store(d) -> str:
    if d.store is None:
        return "image store not known"
    if d.containerd_store:
        return f"containerd image store ({d.storage_driver} snapshotter)"
    return f"classic image store ({d.storage_driver})"


def _major(version: str) -> int:
    try:
        return int(version.split(".")[0])
    except ValueError:
        return 0
