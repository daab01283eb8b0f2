"""The probe run here, as a rank runs it (the script on stdin of `python3 -`), with this
interpreter: real output of the real script, for the tests that need facts without a rank."""

from __future__ import annotations

import ipaddress
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from launcher.facts import record as facts
from launcher.facts.memory import parse_meminfo


def local_command(command: str, script: Path) -> str:
    """A rank's `python3 - ARGS` (the script on stdin) as this interpreter running the same script
    from its file: the same code and argv, and the coverage report can name the lines it ran."""
    assert command.startswith("python3 - "), command
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))} {command[len('python3 - '):]}"


def coverage_env() -> dict:
    """What a subprocess with a bare environment needs to be measured by the coverage run."""
    return {k: v for k, v in os.environ.items() if k.startswith("COVERAGE_")}


def run_probe(args: dict, env: dict | None = None) -> dict:
    """The probe's raw JSON; `env` is laid over this process's environment."""
    command, _ = facts.invocation(args)
    done = subprocess.run(local_command(command, facts.PROBE_SOURCE), shell=True,
                          capture_output=True, env={**os.environ, **(env or {})}, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)


def sandbox_rank_raw(root: Path, r: int, tree: dict[str, str] | None = None) -> dict:
    """The probe's raw output for sandbox rank r's fixture sysfs and `ip addr`, written under root.
    `tree`: another fixture tree (fabric_fixture.sysfs_tree with a fault). The `ip addr` also holds what a sandbox rank's real one shows beside the fixture's: its
    management address on eth0 (the sandbox's Docker network, the config's `address`)."""
    from launcher.sandbox import cluster, fabric_fixture as sfabric

    sfabric.write_tree(root / "sysfs", sfabric.sysfs_tree(r) if tree is None else tree)
    net = ipaddress.ip_network(cluster.DEFAULT_SUBNET)
    eth0 = {"ifindex": 2, "ifname": "eth0", "mtu": 1500, "operstate": "UP",
            "addr_info": [{"family": "inet", "local": cluster.rank_address(r, net),
                           "prefixlen": net.prefixlen, "scope": "global"}]}
    (root / "ip-addr.json").write_text(json.dumps([eth0] + sfabric.ip_addr_json(r)))
    return run_probe(facts.probe_args(str(root / "sysfs")))


def sandbox_rank_facts(root: Path, r: int, tree: dict[str, str] | None = None) -> facts.Facts:
    """Sandbox rank r's facts (sandbox_rank_raw, parsed); its memory is the sandbox rank's GB10
    meminfo, what the rank's /proc/meminfo shows, not this host's."""
    import dataclasses

    from launcher.sandbox import meminfo

    found = facts.parse_facts(sandbox_rank_raw(root, r, tree))
    return dataclasses.replace(found, memory=parse_meminfo(meminfo.meminfo(r)))
