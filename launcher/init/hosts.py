"""The first login to each host: its host key trusted (shown first), the user's public key
installed where only a password works (asked once, kept in memory for this run only), and the
kit's passwordless sudo checked.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


from ..errors import SparkstackError
from ..inputs import node_settings
from ..transport.remote import Target, fingerprint, paramiko  # without invoke: remote._import_paramiko


class InitError(SparkstackError):
    pass


class InitInputError(SparkstackError):
    """A missing or wrong answer (a flag): bad input, exit 2."""
    exit_code = 2


@dataclass
class Prompts:
    """How init asks: the CLI passes click's; tests and --yes pass answers."""
    say: Callable[[str], None]
    confirm: Callable[[str], bool]  # a yes/no question
    password: Callable[[str], str | None]  # None: there is none to give (--yes without --password-stdin)
    # a person answers at a terminal (not --yes, not --password-stdin)
    interactive: bool = True
    # scripted: the password may go to a host whose key was trusted in this run (--password-to-new-hosts)
    password_to_new_hosts: bool = False
    # (address, port): fingerprint of each host key trusted in this run (_AskFirst records them)
    trusted_now: dict = field(default_factory=dict)


class _AskFirst(paramiko.MissingHostKeyPolicy):
    """An unknown host key: its fingerprint shown, then trusted when the user says so (or
    --trust-new-hosts), appended to known_hosts; refused otherwise."""

    def __init__(self, known_hosts: Path, trust_new: bool, ask: Prompts, label: str, where: tuple):
        self.known_hosts, self.trust_new, self.ask, self.label = known_hosts, trust_new, ask, label
        self.where = where

    def missing_host_key(self, client, hostname, key):
        fp = fingerprint(key)
        if self.trust_new:
            self.ask.say(f"{self.label}: trusting new host key {fp}, recorded in {self.known_hosts}")
        elif not self.ask.confirm(f"{self.label}: unknown host key {fp}. Trust it?"):
            raise InitError(f"{self.label}: host key {fp} not trusted; check it on the host "
                            "(ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub) and run init again")
        self.ask.trusted_now[self.where] = fp
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
        with open(self.known_hosts, "a") as f:
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


def _client(t: Target, known_hosts: Path, trust_new: bool, ask: Prompts) -> paramiko.SSHClient:
    c = paramiko.SSHClient()
    if known_hosts.exists():
        c.load_host_keys(str(known_hosts))
    c.set_missing_host_key_policy(_AskFirst(known_hosts, trust_new, ask, f"{t.label} ({t.address})",
                                            (t.address, t.port)))
    return c


def _connect(t: Target, known_hosts: Path, trust_new: bool, ask: Prompts, **auth) -> paramiko.SSHClient:
    c = _client(t, known_hosts, trust_new, ask)
    try:
        c.connect(t.address, port=t.port, username=t.user, timeout=10, banner_timeout=10,
                  auth_timeout=10, allow_agent=False, look_for_keys=False, **auth)
    except paramiko.AuthenticationException:
        c.close()
        raise
    except (OSError, paramiko.SSHException) as e:
        c.close()
        if isinstance(e, InitError):
            raise
        raise InitError(f"{t.label}: cannot reach {t.user}@{t.address}:{t.port} ({e}); is the host up "
                        "and its sshd running?") from None
    return c


def ensure_login(t: Target, known_hosts: Path, trust_new: bool, ask: Prompts,
                 password_cache: dict) -> str:
    """"key" when the key logs in; "installed" when it did not, a password did, and the public key
    is now in the user's authorized_keys there. The password is asked once for every host."""
    try:
        pkey = paramiko.PKey.from_path(t.key)
    except (ValueError, TypeError, OSError, paramiko.SSHException, paramiko.UnknownKeyType) as e:
        raise InitInputError(f"--key {t.key}: not a private key init can read ({e}); pass the private "
                             "key of an ssh-keygen pair (without a passphrase), or make one: ssh-keygen -t ed25519") from None
    try:
        _connect(t, known_hosts, trust_new, ask, pkey=pkey).close()
        return "key"
    except paramiko.AuthenticationException:
        pass
    if "password" not in password_cache:
        password_cache["password"] = ask.password(
            f"{t.user}@{t.address}: the key {t.key} does not log in; password (asked once, to "
            "install the key; not stored)")
        password_cache["typed_for"] = (t.address, t.port) if ask.interactive else None
        password_cache["asked_of"] = f"{t.user}@{t.address}"
    password = password_cache["password"]
    if password is None:
        raise InitError(f"{t.label}: {t.user}@{t.address} does not take the key {t.key} and no "
                        f"password was given; pass --password-stdin, or install the key: "
                        f"ssh-copy-id -i {t.key}.pub {t.user}@{t.address}")
    _may_send_password(t, ask, password_cache)
    try:
        c = _connect(t, known_hosts, trust_new, ask, password=password)
    except paramiko.AuthenticationException:
        raise InitError(f"{t.label}: {t.user}@{t.address} refuses the key {t.key} and the password; "
                        "check --user and the password, or install the key by hand: "
                        f"ssh-copy-id -i {t.key}.pub {t.user}@{t.address}") from None
    try:
        _install_key(c, Path(str(t.key) + ".pub").read_text().strip(), t.label)
    finally:
        c.close()
    _connect(t, known_hosts, trust_new, ask, pkey=pkey).close()  # the key works now
    return "installed"


def _may_send_password(t: Target, ask: Prompts, password_cache: dict) -> None:
    """The password goes without a question to a host whose key was known before this run, and to
    the host a person typed it for (its fingerprint shown first). A host whose key was trusted in
    this run is only as trustworthy as whoever answered at its address: a person is asked; a
    script (--yes, --password-stdin) needs --password-to-new-hosts."""
    where = (t.address, t.port)
    fp = ask.trusted_now.get(where)
    if fp is None or password_cache.get("typed_for") == where:
        return
    by_hand = f"install the key by hand: ssh-copy-id -i {t.key}.pub {t.user}@{t.address}"
    if ask.interactive:
        if ask.confirm(f"{t.label} ({t.address}): its host key {fp} was trusted just now; send it the "
                       f"password given for {password_cache['asked_of']}?"):
            return
        raise InitError(f"{t.label}: {t.user}@{t.address}: password not sent (its host key {fp} was "
                        f"trusted in this run); check the key on the host, then {by_hand}")
    if ask.password_to_new_hosts:
        return
    raise InitError(f"{t.label}: {t.user}@{t.address} does not take the key {t.key}, and its host key {fp} "
                    "was trusted in this run: the password is not sent to it without --password-to-new-hosts "
                    f"(or {by_hand})")


def _install_key(c: paramiko.SSHClient, public: str, label: str) -> None:
    line = shlex.quote(public)
    script = ("umask 077 && mkdir -p ~/.ssh && touch ~/.ssh/authorized_keys && "
              f"(grep -qxF {line} ~/.ssh/authorized_keys || echo {line} >> ~/.ssh/authorized_keys)")
    _in, out, err = c.exec_command(script, timeout=20)
    if out.channel.recv_exit_status() != 0:
        raise InitError(f"{label}: installing the key failed: {err.read().decode().strip()}; "
                        "install it by hand with ssh-copy-id")


def sudo_problem(conn, user: str, where: str) -> str | None:
    """None when `user` has the kit's passwordless sudo; else the line to add, and where."""
    res = conn.run(node_settings.relief_sudo_check_command(user), timeout=20)
    if res.ok:
        return None
    return (f"{where}: {user} cannot run the kit's commands with `sudo -n`; add this line "
            f"with `sudo visudo -f {node_settings.SUDOERS_FILE}`:\n  {node_settings.sudoers_rule(user).strip()}")
