import configparser
import re
import shlex
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from conftest import EXAMPLE_CONFIG
from launcher.cli.commands import main


def unit_of(result) -> configparser.ConfigParser:
    assert result.exit_code == 0, result.output
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read_string(result.output)
    return unit


def systemd_words(line: str) -> list[str]:
    """A command line or Environment= value split as systemd does for what the unit writes:
    double-quoted words with C escapes (`\\"`, `\\\\`; shlex's POSIX rules agree on these), then
    specifiers: an approximation of systemd's parser for these characters only
    (test_systemd_itself_accepts_the_unit has systemd's own)."""
    return [specifiers(w) for w in shlex.split(line)]


def specifiers(text: str) -> str:
    """systemd's specifier pass: `%%` is `%`; any other `%x` would be expanded, shown here as
    `{%x}` so that a `%` the unit left single never reads back as the path it came from."""
    return re.sub(r"%(.|$)", lambda m: "%" if m[1] == "%" else "{%" + m[1] + "}", text)


def test_unit_runs_up_with_the_config_after_boot():
    result = CliRunner().invoke(main, ["systemd-unit", "-c", str(EXAMPLE_CONFIG), "--user", "spark",
                                       "--timeout", "600"])
    unit = unit_of(result)
    service = unit["Service"]
    assert service["User"] == "spark" and service["Type"] == "oneshot"
    assert systemd_words(service["Environment"]) == [f"SPARKSTACK_CONFIG={EXAMPLE_CONFIG.resolve()}"]
    command = systemd_words(service["ExecStart"])
    assert command[0].endswith("/sparkstack") and command[1:] == ["up", "--timeout", "600"]
    assert command[0].startswith("/")  # systemd wants an absolute path
    assert "network-online.target" in unit["Unit"]["After"]
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_keep_unit_runs_the_supervisor():
    unit = unit_of(CliRunner().invoke(main, ["systemd-unit", "-c", str(EXAMPLE_CONFIG), "--keep"]))
    service = unit["Service"]
    assert service["Type"] == "simple" and service["Restart"] == "on-abnormal"
    assert systemd_words(service["ExecStart"])[1:] == ["up", "--keep", "--timeout", "1800"]
    assert "RemainAfterExit" not in service and service["KillMode"] == "mixed"


WEIRD = 'my configs %h $HOME "q" \\x'  # a space, a specifier, a variable, quotes, a backslash
VENV = "venv 100% %h $HOME"  # systemd refuses quotes and backslashes in an executable's path


@pytest.fixture
def weird_paths(tmp_path, monkeypatch):
    """The config and the venv (where `sparkstack` sits beside python) in directories whose names
    systemd would otherwise split, expand or unquote."""
    conf_dir, venv_bin = tmp_path / WEIRD, tmp_path / VENV / "bin"
    conf_dir.mkdir()
    venv_bin.mkdir(parents=True)
    config = conf_dir / "cluster 100%.yaml"
    config.write_text(EXAMPLE_CONFIG.read_text())
    script = venv_bin / "sparkstack"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(venv_bin / "python"))
    return config, script


def test_unit_quotes_paths_as_systemd_reads_them(weird_paths):
    config, script = weird_paths
    service = unit_of(CliRunner().invoke(main, ["systemd-unit", "-c", str(config)]))["Service"]
    assert systemd_words(service["Environment"]) == [f"SPARKSTACK_CONFIG={config}"]
    assert systemd_words(service["ExecStart"]) == [str(script), "up", "--timeout", "1800"]
    assert specifiers(service["WorkingDirectory"]) == str(config.parent)


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="needs systemd-analyze (systemd's own unit parser)")
@pytest.mark.parametrize("keep", [[], ["--keep"]], ids=["up", "keep"])
def test_systemd_itself_accepts_the_unit(weird_paths, tmp_path, keep):
    """systemd-analyze verify parses the unit as systemd would: an Environment= split at the
    space, or an ExecStart= path that is not the executable, fails it."""
    config, _ = weird_paths
    result = CliRunner().invoke(main, ["systemd-unit", "-c", str(config), *keep])
    assert result.exit_code == 0, result.output
    unit = tmp_path / "sparkstack-up.service"
    unit.write_text(result.output)
    done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr


@pytest.mark.parametrize("args", [["--timeout", "-5"], ["--timeout", "0"]])
def test_timeout_must_be_positive(args):
    result = CliRunner().invoke(main, ["systemd-unit", "-c", str(EXAMPLE_CONFIG), *args])
    assert result.exit_code == 2 and "Invalid value for '--timeout'" in result.output


def test_an_executable_path_systemd_refuses(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", str(tmp_path / 'venv "q"' / "bin" / "python"))
    result = CliRunner().invoke(main, ["systemd-unit", "-c", str(EXAMPLE_CONFIG)])
    assert result.exit_code == 2
    assert "systemd refuses an ExecStart= executable with a quote or backslash" in result.output


def test_a_config_path_with_a_line_break(tmp_path):
    config = tmp_path / "a\nb.yaml"
    config.write_text(EXAMPLE_CONFIG.read_text())
    result = CliRunner().invoke(main, ["systemd-unit", "-c", str(config)])
    assert result.exit_code == 2 and "a path with a line break or NUL cannot go in a systemd unit" in result.output
