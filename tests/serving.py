"""Shared by the serve tests: the CLI as a user runs it, and what a rank's engine recorded."""

from __future__ import annotations

import json

from click.testing import CliRunner

from launcher.cli.commands import main

VLLM_RECORD = "/var/log/sandbox-vllm/record.json"
TENSORFOLD_RECORD = "/var/log/sandbox-vllm/tensorfold.json"


def cli(*args):
    """`sparkstack ARGS`; whatever it exits with, never a traceback."""
    result = CliRunner().invoke(main, list(args))
    assert "Traceback" not in result.output
    return result


def engine_record(sandbox, name: str, path: str = VLLM_RECORD) -> dict:
    """The argv, options and environment the stand-in engine on rank `name` started with."""
    rc, out, err = sandbox.run(name, f"docker exec sparkstack-engine cat {path}")
    assert rc == 0, err
    return json.loads(out)


def mgmt_if(sandbox, name: str) -> str:
    """The rank's interface holding its configured address: a ring's sockets go there."""
    rc, out, err = sandbox.run(name, f"ip -o -4 addr show to {sandbox.rank(name)['address']}/32")
    assert rc == 0 and out.split(), err
    return out.split()[1]


def states(cfg: str) -> dict[int, str]:
    """Each rank's serving container state, as `status --json` reports it."""
    return {r["rank"]: r["state"] for r in json.loads(cli("status", "-c", cfg, "--json").stdout)["ranks"]}


def rank_user(sandbox, rank: str, user: str, sudoers_line: str | None = None, groups: str = ""):
    """A user on `rank` who logs in with the sandbox's key (and, given one, a sudoers rule of its
    own): a context manager that removes both after."""
    from contextlib import contextmanager

    rule = f"/etc/sudoers.d/{user}"

    @contextmanager
    def made():
        def drop():
            sandbox.run(rank, f"sudo pkill -KILL -u {user}; sudo userdel -r {user} 2>/dev/null; sudo rm -f {rule}; true")

        drop()  # a leftover of an interrupted run
        make = (f"sudo useradd -m -s /bin/sh -p '*' {'-G ' + groups if groups else ''} {user} && "
                f"sudo install -d -m 0700 -o {user} -g {user} /home/{user}/.ssh && "
                f"sudo install -m 0600 -o {user} -g {user} /home/spark/.ssh/authorized_keys /home/{user}/.ssh/")
        if sudoers_line:
            make += f" && echo '{sudoers_line}' | sudo tee {rule} >/dev/null && sudo chmod 0440 {rule}"
        try:
            rc, out, err = sandbox.run(rank, make)
            assert rc == 0, err or out
            yield user
        finally:
            drop()

    return made()
