"""The SSH layer against the sandbox's real sshd: parallel runs, no deadlock, host keys, retries."""

import http.server
import secrets
import signal
import threading
import time
from pathlib import Path

import paramiko
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from launcher.inputs import config
from launcher.transport import remote


@pytest.fixture(scope="module")
def targets(sandbox):
    return remote.targets_from_config(config.load(sandbox.config).cluster)


def test_every_rank_answers_in_parallel_in_order(group, sandbox):
    results = group.run("hostname").results
    assert [r.stdout.strip() for r in results] == sandbox.names
    assert all(r.ok for r in results)


def test_large_stdout_and_stderr_together_do_not_deadlock(group):
    # 4 MiB on each stream at once: more than paramiko's window, read together
    cmd = "head -c 4194304 /dev/zero & head -c 4194304 /dev/zero >&2; wait"
    for r in group.run(cmd, timeout=60).results:
        assert r.ok, r.why()
        assert len(r.stdout) == len(r.stderr) == 4194304


def test_stdin_is_fed_without_blocking_output(group):
    data = b"x" * (3 << 20)
    r = group.connections[0].run("cat; cat /etc/hostname >&2", stdin=data, timeout=60)
    assert r.ok and len(r.stdout) == len(data)


def test_one_failing_rank_does_not_hide_the_others(group):
    out = group.run('[ "$(hostname)" = spark3 ] && { echo broken >&2; exit 4; } || hostname')
    assert [r.ok for r in out.results] == [True, True, False, True]
    assert out.failed[0].exit_status == 4 and "broken" in out.failed[0].why()
    with pytest.raises(remote.RemoteError, match=r"failed on 1 of 4 ranks:\nrank 2 \(spark3\): exited 4: broken"):
        out.raise_for_failures("probe")


def test_gather_keeps_every_ranks_answer_when_one_raises(group, sandbox):
    """A rank whose action raises keeps its exception; the others' answers are all there."""
    def action(conn):
        name = conn.run("hostname").stdout.strip()
        if name == "spark2":
            raise remote.RemoteError(f"{conn.target.name}: refused")
        return name

    outcomes = group.gather(action)
    assert [o.value for o in outcomes] == [n if n != "spark2" else None for n in sandbox.names]
    assert [o.why() for o in outcomes if not o.ok] == ["rank 1 (spark2): refused"]
    with pytest.raises(remote.RemoteError, match="refused"):
        group.map(action)


def test_timeout_names_the_command(group):
    r = group.connections[1].run("sleep 5", timeout=1)
    assert not r.ok and "did not finish within 1 s" in r.error
    assert group.connections[1].run("echo still usable").stdout == "still usable\n"


def _running(sandbox, name: str, pattern: str) -> bool:
    """Whether a process on the rank has `pattern` in its command line (pgrep's own shell,
    which holds the pattern too, is not matched: the regex form spells it differently)."""
    rc, out, err = sandbox.run(name, f"pgrep -f -- '[{pattern[0]}]{pattern[1:]}'")
    assert rc in (0, 1), err
    return rc == 0


def _until(sandbox, name: str, pattern: str, running: bool, within: float = 30) -> bool:
    """Poll until the pattern's process is running (or gone) on the rank; False at `within`."""
    deadline = time.monotonic() + within
    while _running(sandbox, name, pattern) != running:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _unique_sleep() -> str:
    """A `sleep` whose command line no other process on a rank has."""
    return f"sleep {300000 + secrets.randbelow(600000)}"


@pytest.mark.parametrize("sudo", [False, True])
def test_a_timed_out_command_is_killed_on_the_rank(group, sandbox, sudo):
    sleep = _unique_sleep()
    r = group.connections[2].run(f"{sleep}; echo never", timeout=2, sudo=sudo)
    assert "did not finish within 2 s; stopped on the rank" in r.error
    assert _until(sandbox, "spark3", sleep, running=False), f"`{sleep}` still runs on spark3"


def test_a_command_whose_connection_dropped_ends_on_the_rank(sandbox):
    """Nobody is left to kill it: the rank's own `timeout` (ours + RANK_GRACE_S) ends it."""
    sleep = _unique_sleep()
    with remote.Group.for_cluster(config.load(sandbox.config).cluster, attempts=1, say=lambda m: None) as g:
        conn = g.connections[1]
        running = threading.Thread(target=lambda: conn.run(f"{sleep}; echo never", timeout=3), daemon=True)
        running.start()
        assert _until(sandbox, "spark2", sleep, running=True)
        conn.close()
        running.join(30)
    assert _until(sandbox, "spark2", sleep, running=False), f"`{sleep}` still runs on spark2"


def test_ctrl_c_while_every_rank_runs_kills_the_commands_there(group, sandbox):
    """The main thread is interrupted while every rank runs a long command: the interrupt
    comes through at once, and each rank's command is killed there, not waited for."""
    sleep = _unique_sleep()

    def interrupt_once_running():
        if all(_until(sandbox, name, sleep, running=True) for name in sandbox.names):
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    threading.Thread(target=interrupt_once_running, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        group.run(f"{sleep}; echo never", timeout=120)
    for name in sandbox.names:
        assert _until(sandbox, name, sleep, running=False), f"`{sleep}` still runs on {name}"
    assert group.run("echo still usable").results[3].stdout == "still usable\n"


def test_sudo_is_root(group):
    for r in group.run("id -u", sudo=True).results:
        assert r.ok and r.stdout.strip() == "0"


def test_unknown_host_key_is_refused_with_its_fingerprint(targets, tmp_path, sandbox):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(remote.RemoteError) as e:
        remote.Connection(targets[0], empty).open()
    real = paramiko.HostKeys(str(sandbox.known_hosts)).lookup(targets[0].address)
    key = next(iter(real.values()))
    assert "host key not in" in e.value.message and remote.fingerprint(key) in e.value.message
    assert "--trust-new-hosts" in e.value.message
    # trusting is explicit: then the key is appended, its fingerprint said, and the next
    # connection verifies it
    said = []
    remote.Connection(targets[0], empty, trust_new=True, say=said.append).open().close()
    assert targets[0].address in empty.read_text()
    t = targets[0]
    assert said == [f"trusting new host key for {t.label} ({t.address}:{t.port}): "
                    f"{remote.fingerprint(key)}, recorded in {empty}"]
    remote.Connection(targets[0], empty).open().close()


def test_changed_host_key_is_refused(targets, tmp_path):
    """known_hosts holds another ed25519 key for the rank: refused, with how to clear it."""
    wrong = tmp_path / "known_hosts"
    hk = paramiko.HostKeys()
    hk.add(targets[0].address, "ssh-ed25519", paramiko.Ed25519Key(data=_fake_ed25519_blob()))
    hk.save(str(wrong))
    with pytest.raises(remote.RemoteError, match="host key CHANGED.*ssh-keygen -R"):
        remote.Connection(targets[0], wrong).open()


def _fake_ed25519_blob() -> bytes:
    msg = paramiko.Message()
    msg.add_string("ssh-ed25519")
    msg.add_string(bytes(range(32)))
    return msg.asbytes()


def test_wrong_key_is_an_authentication_error(targets, sandbox, tmp_path):
    key = tmp_path / "id_other"
    key.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption()))
    t = targets[1]
    bad = remote.Target(t.rank, t.label, t.address, t.port, t.user, key)
    with pytest.raises(remote.RemoteError, match=r"rank 1 \(spark2\).*authentication failed.*ssh-copy-id"):
        remote.Connection(bad, sandbox.known_hosts).open()


def test_unreachable_rank_is_retried_then_named(targets, sandbox):
    t = targets[2]
    closed = remote.Target(t.rank, t.label, t.address, 2, t.user, t.key)
    said = []
    with pytest.raises(remote.RemoteError, match=r"rank 2 \(spark3\).*unreachable \(connection refused\) after 2 attempts"):
        remote.Connection(closed, sandbox.known_hosts, attempts=2, say=said.append).open()
    assert len(said) == 1 and "retrying (1/1)" in said[0]


def test_jump_host(targets, sandbox):
    first, second = targets[0], targets[1]
    via = remote.Target(second.rank, second.label, second.address, second.port, second.user,
                        second.key, jump=f"{first.user}@{first.address}:{first.port}")
    conn = remote.Connection(via, sandbox.known_hosts)
    try:
        assert conn.run("hostname").stdout.strip() == "spark2"
    finally:
        conn.close()


def test_missing_key_file(targets, sandbox):
    t = targets[0]
    missing = remote.Target(t.rank, t.label, t.address, t.port, t.user, Path("/nonexistent/key"))
    with pytest.raises(remote.RemoteError, match=r"rank 0 \(spark1\).*key file /nonexistent/key does not exist"):
        remote.Connection(missing, sandbox.known_hosts).open()


def test_unreadable_key_file_says_how_to_convert(targets, sandbox, tmp_path):
    key = tmp_path / "id_garbage"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nnot a key\n-----END OPENSSH PRIVATE KEY-----\n")
    t = targets[0]
    with pytest.raises(remote.RemoteError, match=r"cannot be read .*ssh-keygen -p -o -f"):
        remote.Connection(remote.Target(t.rank, t.label, t.address, t.port, t.user, key), sandbox.known_hosts).open()


def test_reverse_forward_carries_and_counts_bytes(group):
    body = b"y" * 200_000

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    conn = group.connections[3]
    try:
        port, counter = conn.reverse_forward(server.server_address[1])
        r = conn.run(f"python3 -c \"import urllib.request;print(len(urllib.request.urlopen("
                     f"'http://127.0.0.1:{port}/').read()))\"", timeout=30)
        assert r.ok and r.stdout.strip() == str(len(body)), r.why()
        assert len(body) < counter.total < len(body) + 2000
        conn.cancel_forward(port)
    finally:
        server.shutdown()


def test_a_connection_dropped_between_commands_reconnects(sandbox):
    """sshd's session for our connection dies between two commands (the rank's sshd restarted,
    a reboot): the next command connects afresh instead of failing."""
    with remote.Group.for_cluster(config.load(sandbox.config).cluster, attempts=1, say=lambda m: None) as g:
        conn = g.connections[1]
        # the session's sshd: the nearest sshd above the command (`timeout` and sh sit between)
        first = conn.run("p=$$; until grep -q '^sshd' /proc/$p/comm; do p=$(cut -d' ' -f4 /proc/$p/stat); done; echo $p")
        assert first.ok
        sandbox.run("spark2", f"sudo kill {int(first.stdout)}; true", user="spark")
        deadline = time.monotonic() + 10
        while conn.client.get_transport().is_active() and time.monotonic() < deadline:
            time.sleep(0.1)
        again = conn.run("echo back")
        assert again.ok and again.stdout.strip() == "back", again.error


def test_the_connection_negotiates_aes_gcm(group):
    """AES-GCM with the rank's sshd: one AEAD pass a packet instead of AES-CTR plus HMAC-SHA256,
    about a quarter less CPU per byte on both ends (measured, launcher/transport/remote.py)."""
    group.run("true")
    for conn in group.connections:
        transport = conn.client.get_transport()
        assert (transport.local_cipher, transport.remote_cipher) == ("aes128-gcm@openssh.com",) * 2


def test_gcm_comes_first_and_paramikos_other_ciphers_stay():
    """A server without GCM (OpenSSH < 6.2) still finds a cipher it knows."""
    import socket

    here, _there = socket.socketpair()
    transport = remote._transport(here)
    ciphers = transport.get_security_options().ciphers
    assert ciphers[:2] == remote.PREFERRED_CIPHERS
    assert set(ciphers) == set(paramiko.Transport._preferred_ciphers)
    transport.close()


def test_paramiko_comes_without_invoke_until_used():
    """Every command's start skips invoke (asyncio, unittest.mock: ~40 ms); paramiko's ssh_config
    `Match exec`, its one use, still runs it."""
    import subprocess
    import sys

    code = ("import sys, launcher.transport.remote, launcher.apply.deploy, launcher.init.hosts, paramiko\n"
            "print('invoke' in sys.modules, 'asyncio' in sys.modules)\n"
            "c = paramiko.SSHConfig.from_text('Match exec \"true\"\\n  User matched\\n')\n"
            "print(c.lookup('h').get('user'), 'invoke' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1]).stdout.split()
    assert out == ["False", "False", "matched", "True"]
