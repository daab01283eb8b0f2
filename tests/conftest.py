"""Shared test fixtures: the project's paths and a way to write cluster configs."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_CONFIG = ROOT / "env" / "cluster.example.yaml"


def example_config() -> dict:
    return yaml.safe_load(EXAMPLE_CONFIG.read_text())


@pytest.fixture(autouse=True, scope="session")
def state_home(tmp_path_factory):
    """The API keys `up` and `sparkstack api-key` generate go to a state dir of the session's own
    (launcher/inputs/apikey.py), never the developer's ~/.local/state."""
    path = tmp_path_factory.mktemp("state")
    before = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(path)
    yield path
    if before is None:
        os.environ.pop("XDG_STATE_HOME")
    else:
        os.environ["XDG_STATE_HOME"] = before


@pytest.fixture
def write_config(tmp_path):
    """Write a cluster.yaml built from the example; `edit` changes the parsed dict in place."""

    def write(edit=None, text: str | None = None, name: str = "cluster.yaml") -> Path:
        path = tmp_path / name
        if text is None:
            data = copy.deepcopy(example_config())
            if edit:
                edit(data)
            text = yaml.safe_dump(data, sort_keys=False)
        path.write_text(text)
        return path

    return write


from sandbox_fixture import sandbox  # noqa: E402,F401  (session-scoped: four ranks, up once)
from golden import golden  # noqa: E402,F401  (compares with tests/golden/; --update-golden rewrites, then fails)


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite the golden files under tests/golden/ whose content differs; "
                          "those tests then fail: review the diff and re-run without it")


NEEDS_SANDBOX = {"sandbox", "group"}  # the fixtures that bring the sandbox (Docker) up


def pytest_collection_modifyitems(config, items):
    """Every test whose fixtures include the sandbox is marked `sandbox` (pyproject.toml's
    markers): `./scripts/test --quick` runs `-m "not sandbox"` without Docker. A test that needs
    Docker some other way (a real build, save or registry here) is marked by hand."""
    for item in items:
        if NEEDS_SANDBOX & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.sandbox)


@pytest.fixture(scope="module")
def group(sandbox):
    """SSH connections to the sandbox's four ranks (launcher.transport.remote), one set per test module."""
    from launcher.inputs import config
    from launcher.transport import remote

    cluster = config.load(sandbox.config).cluster
    with remote.Group.from_targets(remote.targets_from_config(cluster), sandbox.known_hosts) as g:
        yield g


def _test_networks():
    from ipaddress import ip_network

    from launcher.sandbox.cluster import BARE_SUBNET, subnet

    bare = os.environ.get("SPARKSTACK_SANDBOX_BARE_SUBNET", BARE_SUBNET)  # `sandbox up --bare`'s ranks
    return [ip_network("127.0.0.0/8"), ip_network("::1/128"), subnet(), ip_network(bare)]


@pytest.fixture(autouse=True, scope="session")
def network_guard():
    """Tests talk only to loopback and the sandbox's own ranks. Anything else (the example
    config's addresses, say) is refused here, before a packet leaves this machine."""
    import socket
    from ipaddress import ip_address

    allowed = _test_networks()
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def check(address):
        if isinstance(address, tuple):
            try:
                ip = ip_address(address[0])
            except ValueError:
                raise ConnectionRefusedError(f"test network guard: {address[0]} is a name, not a test host") from None
            if not any(ip in net for net in allowed):
                raise ConnectionRefusedError(f"test network guard: {ip} is not a test host")

    def connect(self, address):
        check(address)
        return real_connect(self, address)

    def connect_ex(self, address):
        check(address)
        return real_connect_ex(self, address)

    socket.socket.connect, socket.socket.connect_ex = connect, connect_ex
    yield
    socket.socket.connect, socket.socket.connect_ex = real_connect, real_connect_ex


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """On CI (SPARKSTACK_NO_SKIPS=1) a skip is a failure: a missing tool must not pass silently."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("SPARKSTACK_NO_SKIPS") == "1" and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
