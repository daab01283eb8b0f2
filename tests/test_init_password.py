"""`init` and the one password it asks (issue 33, item 9): it went to every host whose key did
not log in, including hosts whose key init had trusted a moment before (--trust-new-hosts, or a
"y" to the fingerprint), i.e. to whoever answered at that address. Now the password goes without
a question only to a host whose key was known before this run, or to the host it was typed for;
a host trusted in this run is asked about (interactive) or needs --password-to-new-hosts
(--yes / --password-stdin). ensure_login runs here against fake logins that go through init's
real host-key policy."""

from __future__ import annotations

import paramiko
import pytest
from click.testing import CliRunner

from launcher.init import hosts as hosts_mod
from launcher.transport.remote import Target

PASSWORD = "s3cret"


class FakeHosts:
    """Every host refuses the key until it is installed, takes the password; `new` hosts present a
    host key not in known_hosts, which init's policy sees (and records) as it would a real one."""

    def __init__(self, monkeypatch, tmp_path, new: set[str]):
        self.new, self.sent, self.installed = set(new), [], set()
        self.host_keys = {}
        self.key = tmp_path / "id"
        paramiko.ECDSAKey.generate().write_private_key_file(str(self.key))
        (tmp_path / "id.pub").write_text("ecdsa-sha2-nistp256 AAAA test\n")
        monkeypatch.setattr(hosts_mod, "_connect", self.connect)
        monkeypatch.setattr(hosts_mod, "_install_key", lambda c, public, label: self.installed.add(c.address))

    def connect(self, t, known_hosts, trust_new, ask, **auth):
        client = hosts_mod._client(t, known_hosts, trust_new, ask)
        if t.address in self.new:  # first contact: the host key is unknown here
            key = self.host_keys.setdefault(t.address, paramiko.ECDSAKey.generate())
            client._policy.missing_host_key(client, t.address, key)  # raises when refused
            self.new.discard(t.address)
        if "password" in auth:
            self.sent.append(t.address)
        elif t.address not in self.installed:
            raise paramiko.AuthenticationException("key refused")
        client.address = t.address
        return client


def targets(key, *addresses):
    return [Target(i, f"rank {i}", a, 22, "spark", key) for i, a in enumerate(addresses)]


def prompts(answers=(), interactive=True, allow=False, asked=None):
    """Prompts answering `answers` in order (recorded in `asked`), the password always PASSWORD."""
    answers, asked = list(answers), asked if asked is not None else []

    def confirm(q):
        asked.append(q)
        return answers.pop(0)
    kw = {"interactive": interactive, "password_to_new_hosts": allow}
    return hosts_mod.Prompts(say=lambda line: None, confirm=confirm, password=lambda q: PASSWORD, **kw)


def login_all(fake, tmp_path, ask, trust_new, *addresses):
    cache = {}
    done = {}
    for t in targets(fake.key, *addresses):
        done[t.address] = hosts_mod.ensure_login(t, tmp_path / "known_hosts", trust_new, ask, cache)
    return done


def test_scripted_the_password_goes_only_to_hosts_known_before(monkeypatch, tmp_path):
    """--trust-new-hosts --password-stdin: 10.0.0.12's key is trusted in this run: it does not get
    the password, and init stops there, naming the flag and ssh-copy-id."""
    fake = FakeHosts(monkeypatch, tmp_path, new={"10.0.0.12"})
    with pytest.raises(hosts_mod.InitError, match=r"rank 1: .*10\.0\.0\.12.* its host key \S+ SHA256:\S+ was trusted in this run.*"
                                                  r"--password-to-new-hosts.*ssh-copy-id"):
        login_all(fake, tmp_path, prompts(interactive=False), True, "10.0.0.11", "10.0.0.12")
    assert fake.sent == ["10.0.0.11"]


def test_scripted_with_the_flag_it_goes_to_new_hosts_too(monkeypatch, tmp_path):
    fake = FakeHosts(monkeypatch, tmp_path, new={"10.0.0.11", "10.0.0.12"})
    done = login_all(fake, tmp_path, prompts(interactive=False, allow=True), True, "10.0.0.11", "10.0.0.12")
    assert done == {"10.0.0.11": "installed", "10.0.0.12": "installed"}
    assert fake.sent == ["10.0.0.11", "10.0.0.12"]


def test_interactive_it_asks_before_sending_it_to_a_host_just_trusted(monkeypatch, tmp_path):
    """At a terminal: rank 0's key trusted (y), its password typed for it; rank 1's key trusted
    (y), then the question before the password goes there: "n" stops with nothing sent."""
    fake = FakeHosts(monkeypatch, tmp_path, new={"10.0.0.11", "10.0.0.12"})
    asked = []
    with pytest.raises(hosts_mod.InitError, match="rank 1: .*password not sent"):
        login_all(fake, tmp_path, prompts([True, True, False], asked=asked), False, "10.0.0.11", "10.0.0.12")
    assert fake.sent == ["10.0.0.11"]
    assert [q.split(":")[0] for q in asked] == ["rank 0 (10.0.0.11)", "rank 1 (10.0.0.12)", "rank 1 (10.0.0.12)"]
    assert "trusted just now" in asked[2] and "send it the password given for spark@10.0.0.11" in asked[2]


def test_interactive_yes_sends_it_and_a_known_host_is_not_asked_about(monkeypatch, tmp_path):
    fake = FakeHosts(monkeypatch, tmp_path, new={"10.0.0.12"})
    asked = []
    done = login_all(fake, tmp_path, prompts([True, True], asked=asked), False, "10.0.0.11", "10.0.0.12", "10.0.0.13")
    assert set(done.values()) == {"installed"} and fake.sent == ["10.0.0.11", "10.0.0.12", "10.0.0.13"]
    assert len(asked) == 2 and "Trust it?" in asked[0] and "send it the password" in asked[1]


def test_the_flag_is_on_the_command_line():
    result = CliRunner().invoke(__import__("launcher.cli.commands", fromlist=["main"]).main, ["init", "--help"])
    assert "--password-to-new-hosts" in result.output


def test_a_key_file_that_is_no_key_is_one_message(tmp_path):
    """Found on the way (issue 33, item 10's "no traceback"): --key naming a file that is not a
    private key raised cryptography's ValueError out of init (rc 1, a traceback)."""
    from launcher.cli.commands import main

    key = tmp_path / "id_ed25519"
    key.write_text("not a key\n")
    res = CliRunner().invoke(main, ["init", "127.0.0.1:1", "--key", str(key), "--yes", "--profile", "sandbox",
                                    "--model-path", "/m", "-o", str(tmp_path / "c.yaml")])
    assert res.exit_code == 2, (res.output, res.exception)
    assert f"{key}: not a private key init can read" in res.output
