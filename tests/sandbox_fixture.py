"""The session-scoped `sandbox` fixture: four ranks on the local Docker engine, up once per session.

Import it into tests/conftest.py (`from tests.sandbox_fixture import sandbox  # noqa: F401`, or
`from sandbox_fixture import sandbox` when tests/ is on sys.path).

- It uses the sandbox state dir the CLI uses ($SPARKSTACK_SANDBOX_DIR, else
  ~/.local/state/sparkstack/sandbox), so a sandbox a developer already has up is adopted in
  ~2 s (whatever it still serves stopped first with `sparkstack down`) and left up afterwards;
  one the session had to create is taken down at the end unless SPARKSTACK_SANDBOX_KEEP=1.
- SPARKSTACK_NO_SANDBOX=1 skips the tests that need it (a machine without Docker); otherwise a
  sandbox that cannot come up FAILS those tests with the sandbox's own message and fix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest


@dataclass
class SandboxHandle:
    state_dir: Path
    config: Path
    known_hosts: Path
    key: Path
    ranks: list[dict]  # status()["ranks"]
    truth: dict  # rank name -> fabric_truth()
    images: dict  # {"rank": tag, "vllm": tag}
    up_result: dict
    _clients: dict = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [r["name"] for r in self.ranks]

    def rank(self, name: str) -> dict:
        return next(r for r in self.ranks if r["name"] == name)

    def ssh(self, name: str, user: str | None = None):
        """A paramiko client to the rank, host key verified against the sandbox's known_hosts."""
        import paramiko

        r = self.rank(name)
        user = user or r["user"]
        cache_key = (name, user)
        cli = self._clients.get(cache_key)
        if cli is not None and cli.get_transport() is not None and cli.get_transport().is_active():
            return cli
        cli = paramiko.SSHClient()
        cli.load_host_keys(str(self.known_hosts))
        cli.set_missing_host_key_policy(paramiko.RejectPolicy())
        cli.connect(r["address"], port=r["port"], username=user, key_filename=str(self.key),
                    look_for_keys=False, allow_agent=False, timeout=10)
        self._clients[cache_key] = cli
        return cli

    def run(self, name: str, command: str, timeout: float = 60, user: str | None = None):
        """(exit code, stdout, stderr) of a shell command on the rank. A cached connection a
        fault test broke (cut network, killed sshd) is replaced once."""
        import paramiko

        try:
            _stdin, stdout, stderr = self.ssh(name, user).exec_command(command, timeout=timeout)
        except (paramiko.SSHException, OSError, EOFError):
            self._clients.pop((name, user or self.rank(name)["user"]), None)
            _stdin, stdout, stderr = self.ssh(name, user).exec_command(command, timeout=timeout)
        out = stdout.read().decode()
        err = stderr.read().decode()
        return stdout.channel.recv_exit_status(), out, err

    def close(self) -> None:
        for cli in self._clients.values():
            cli.close()
        self._clients.clear()


@pytest.fixture(scope="session")
def sandbox():
    if os.environ.get("SPARKSTACK_NO_SANDBOX") == "1":
        pytest.skip("SPARKSTACK_NO_SANDBOX=1: sandbox tests skipped")
    from launcher.errors import SparkstackError
    from launcher.sandbox import cluster

    state_dir = cluster.state_dir_default()
    try:
        before = cluster.status(state_dir)
        was_up = all(r["docker"] == "running" for r in before["ranks"])
        result = cluster.up(state_dir, progress=lambda msg: None)
    except SparkstackError as e:
        pytest.fail(f"the sandbox did not come up:\n{e.message}", pytrace=False)
    p = cluster.paths(Path(state_dir).expanduser().resolve())
    handle = SandboxHandle(state_dir=p["config"].parent, config=p["config"],
                           known_hosts=p["known_hosts"], key=p["key"], ranks=result["ranks"],
                           truth=json.loads(p["truth"].read_text()), images=result["images"],
                           up_result=result)
    if was_up:
        _stop_serving(p["config"])
    yield handle
    handle.close()
    if not was_up and os.environ.get("SPARKSTACK_SANDBOX_KEEP") != "1":
        cluster.down(state_dir)


def _stop_serving(config: Path) -> None:
    """An adopted sandbox may still serve what a developer (or the demo) left up; the tests
    expect no serving container, so `sparkstack down` first, as a user would."""
    down = subprocess.run([sys.executable, "-c", "from launcher.cli.commands import main; main()",
                           "down", "-c", str(config)], capture_output=True, text=True, timeout=300)
    if down.returncode != 0:
        pytest.fail(f"`sparkstack down` on the adopted sandbox failed:\n{down.stdout}{down.stderr}",
                    pytrace=False)
