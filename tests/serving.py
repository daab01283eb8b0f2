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
