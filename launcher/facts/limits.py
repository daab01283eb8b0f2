"""Resource limits: the rank's rlimits as the kit's login shell has them, and what a container
gets from the Docker daemon (daemon.json's `default-ulimits`, dockerd's own /proc/<pid>/limits).
A limit is UNLIMITED (-1) or a number."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .parts import FactError, Part, key


UNLIMITED = -1


@dataclass(frozen=True)
class Limit:
    soft: int  # UNLIMITED (-1) or a number
    hard: int


@dataclass(frozen=True)
class Ulimits:
    nofile: Limit | None
    memlock: Limit | None


@dataclass(frozen=True)
class DockerUlimits:
    """What a container gets: the daemon's `default-ulimits`, else the daemon's own limits
    (which are also the ceiling for `--ulimit` when the daemon cannot raise them)."""

    defaults: dict[str, Limit]
    daemon: Ulimits | None


def parse_rlimits(raw: dict) -> Ulimits:
    def limit(name: str) -> Limit | None:
        pair = raw.get(name)
        return Limit(int(pair[0]), int(pair[1])) if pair else None
    return Ulimits(limit("nofile"), limit("memlock"))


_LIMITS_ROWS = {"Max open files": "nofile", "Max locked memory": "memlock"}


def parse_docker_ulimits(daemon_json: str | dict | None, dockerd_limits: str | dict | None) -> DockerUlimits:
    """`default-ulimits` from /etc/docker/daemon.json and dockerd's /proc/<pid>/limits."""
    defaults: dict[str, Limit] = {}
    if isinstance(daemon_json, str) and daemon_json.strip():
        try:
            conf = json.loads(daemon_json)
        except json.JSONDecodeError as e:
            raise FactError(f"/etc/docker/daemon.json: not JSON ({e})") from None
        try:  # a file people write by hand: a wrong shape is a finding, not the rank's failure
            for name, v in sorted((conf.get("default-ulimits") or {}).items()):
                defaults[name] = Limit(int(v.get("Soft", UNLIMITED)), int(v.get("Hard", UNLIMITED)))
        except (AttributeError, TypeError, ValueError, OverflowError) as e:
            raise FactError(f"/etc/docker/daemon.json: default-ulimits is not "
                            f'{{"name": {{"Soft": n, "Hard": n}}}} ({e})') from None
    daemon = None
    if isinstance(dockerd_limits, str):
        found: dict[str, Limit] = {}
        for line in dockerd_limits.splitlines():
            cols = re.split(r"\s{2,}", line.strip())
            if cols[0] in _LIMITS_ROWS and len(cols) >= 3:
                found[_LIMITS_ROWS[cols[0]]] = Limit(*(UNLIMITED if c == "unlimited" else int(c) for c in cols[1:3]))
        daemon = Ulimits(found.get("nofile"), found.get("memlock"))
    return DockerUlimits(defaults, daemon)


ULIMITS = Part("ulimits", "rlimits", parse_rlimits, (key("rlimits", {}),))
DOCKER_ULIMITS = Part("docker_ulimits", "docker ulimits", parse_docker_ulimits,
                      (key("docker_daemon_json"), key("dockerd_limits")), problem=True, default=DockerUlimits({}, None))
