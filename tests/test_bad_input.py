"""Bad input found by fuzzing (issue #19): each ends in one message and exit 2 (or 3 when the plan
does not fit), never a traceback. Driven through the real CLI in-process (click's CliRunner)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from launcher.cli import main


def invoke(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def plan(path, *extra: str):
    return invoke("plan", "--offline", "--json", "-c", str(path), *extra)


# --- the config file itself ---------------------------------------------------------------------

def test_config_that_is_not_utf8(write_config):
    path = write_config(text="profile: keys-1m-dcp4\n")
    path.write_bytes(b"topology: ring\nprofile: caf\xe9\n")  # Latin-1
    result = plan(path)
    assert result.exit_code == 2
    assert f"{path}:2: not UTF-8 text (byte 0xe9)" in result.output


def test_yaml_nested_a_thousand_deep(write_config):
    result = plan(write_config(text="profile: " + "[" * 1000 + "]" * 1000 + "\n"))
    assert result.exit_code == 2 and "nested too deeply" in result.output
