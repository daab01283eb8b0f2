import configparser

from click.testing import CliRunner

from conftest import EXAMPLE_CONFIG
from launcher.cli import main


def test_unit_runs_up_with_the_config_after_boot():
    result = CliRunner().invoke(main, ["systemd-unit", "-c", str(EXAMPLE_CONFIG), "--user", "spark",
                                       "--timeout", "600"])
    assert result.exit_code == 0, result.output
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read_string(result.output)
    service = unit["Service"]
    assert service["User"] == "spark" and service["Type"] == "oneshot"
    assert service["Environment"] == f"SPARKSTACK_CONFIG={EXAMPLE_CONFIG.resolve()}"
    assert service["ExecStart"].endswith("sparkstack up --timeout 600")
    assert service["ExecStart"].startswith("/")  # systemd wants an absolute path
    assert "network-online.target" in unit["Unit"]["After"]
    assert unit["Install"]["WantedBy"] == "multi-user.target"
