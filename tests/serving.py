"""Shared by the serve tests: the CLI as a user runs it, and what a rank's engine recorded."""

from __future__ import annotations

import json

from click.testing import CliRunner

from launcher.cli import main

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
