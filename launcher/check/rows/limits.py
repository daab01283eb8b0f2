"""The limits rows: the managed sysctls, and the ulimits a container can get (the config's
`docker run --ulimit` capped by dockerd).
"""

from __future__ import annotations

from ...facts.limits import UNLIMITED
from ...facts.record import Facts
from ...inputs import node_settings
from ...status import Status
from . import row
from .case import Case, RankReport


SEED_NOFILE = node_settings.NOFILE


@row("sysctls", order=130, reads=("sysctls",))
def _check_sysctls(inp: Case, r: int, f: Facts, rr: RankReport) -> None:
    want = node_settings.sysctls(inp.loaded.cluster)
    wrong = [f"{k}={f.sysctls.get(k) or 'absent'} (want {v})" for k, v in want.items()
             if f.sysctls.get(k) != str(v)]
    if wrong:
        rr.add("sysctls", Status.WARN, ", ".join(wrong), "sparkstack prep (and the Ansible role for after reboots)")
    else:
        rr.add("sysctls", Status.PASS, ", ".join(f"{k}={v}" for k, v in want.items()))


def _limit(n: int, item: str) -> str:
    if n == UNLIMITED:
        return "unlimited"
    if item == "memlock" and n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20} MiB"
    return str(n)


def _above(a: int, b: int) -> bool:
    """a > b, -1 being unlimited."""
    return a != b and (a == UNLIMITED or (b != UNLIMITED and a > b))


@row("ulimits", order=140, reads=("docker_ulimits", "sysctls", "extras"))
def _check_ulimits(inp: Case, r: int, f: Facts, rr: RankReport) -> None:
    """What a container can get is what the config asks of `docker run --ulimit`, capped by
    dockerd: with CAP_SYS_RESOURCE (a root dockerd on a real Spark) up to the kernel's ceilings,
    without it (the sandbox) its own hard limits."""
    c = inp.loaded.cluster.container
    extra = inp.extras.get(r)
    can_raise = extra.dockerd_can_raise if extra else None
    daemon = f.docker_ulimits.daemon
    if can_raise is None and daemon is None:
        rr.add("ulimits", Status.WARN, "dockerd's limits not readable", "is dockerd running? (`pgrep -a dockerd`)")
        return
    parts, status, fix = [], Status.PASS, ""
    for item, asked, seed in (("nofile", c.nofile, SEED_NOFILE), ("memlock", c.memlock, UNLIMITED)):
        ceiling, how = _grantable(item, f, daemon, can_raise)
        parts.append(f"{item} asks {_limit(asked, item)}, grantable {_limit(ceiling, item)} ({how})")
        if _above(asked, ceiling):
            status, fix = Status.FAIL, (f"raise dockerd's {item} limit (LimitNOFILE=/LimitMEMLOCK=infinity in "
                                        f"docker.service) or lower container.{item} in cluster.yaml")
        elif status == Status.PASS and (_above(seed, ceiling) or _above(seed, asked)):
            status, fix = Status.WARN, (f"the seeds use nofile {SEED_NOFILE} / memlock unlimited (NCCL at 4 "
                                        "ranks, RDMA): set container.nofile/memlock to those and raise dockerd's limits (LimitNOFILE=/LimitMEMLOCK=infinity) to allow them")
    rr.add("ulimits", status, "; ".join(parts), fix)


def _grantable(item: str, f: Facts, daemon, can_raise: bool | None) -> tuple[int, str]:
    """The most `docker run --ulimit <item>=` can get on this rank, and why."""
    own = getattr(daemon, item, None) if daemon else None
    if can_raise or own is None:
        if item == "nofile":
            return _int(f.sysctls.get("fs.nr_open")) or SEED_NOFILE, "kernel fs.nr_open"
        return UNLIMITED, "kernel"
    return own.hard, "dockerd hard limit"


def _int(text) -> int | None:
    try:
        return int(text)
    except (TypeError, ValueError):
        return None
