"""Remote execution: one SSH connection per rank (paramiko), every rank in parallel.

The one layer every remote action uses. Each command has a timeout; stdout and stderr are read
together (reading one to its end while the other fills its window is paramiko's deadlock trap);
transient connection errors (refused while a Spark boots, resets) are retried, bounded, with the
attempt shown; host keys are verified against known_hosts, and trusting a new host is an
explicit choice. Results come back per rank and are never interleaved: a failing rank never
hides another's result. A command never outlives its timeout on the rank: it runs under
coreutils `timeout` there, and a command we give up on (our timeout, Ctrl+C) is killed on the
rank at once. An interrupt while waiting for every rank cancels what is in flight instead of
waiting for it.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import logging
import math
import secrets
import select
import shlex
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

from tenacity import (RetryCallState, retry, retry_if_exception, stop_after_attempt, stop_when_event_set,
                      wait_exponential)

from ..errors import SparkstackError
from ..inputs.config import split_jump
from .outcome import RankOutcome, values
from .target import Target


def _import_paramiko():
    """paramiko, without importing invoke at once: paramiko.config imports it only for
    ssh_config's `Match exec` (which the kit never reads), and it costs every command's start
    ~40 ms (asyncio and unittest.mock with it). Seen as missing while paramiko imports, then
    imported on first use, so paramiko behaves as before."""
    if "invoke" in sys.modules:
        import paramiko
        return paramiko
    sys.modules["invoke"] = None  # paramiko.config records it missing
    try:
        import paramiko
    finally:
        del sys.modules["invoke"]
    paramiko.config.invoke, paramiko.config.invoke_import_error = _OnUse("invoke"), None
    return paramiko


class _OnUse:
    """A module imported the first time one of its attributes is read."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attribute: str):
        return getattr(importlib.import_module(self._name), attribute)


paramiko = _import_paramiko()

DEFAULT_KNOWN_HOSTS = Path("~/.ssh/known_hosts").expanduser()
KEEPALIVE_S = 15
DEAD_AFTER_S = 30  # a rank that acknowledges nothing for this long is lost (cable, power, kernel)
# The rank's own bound on a command runs this much past ours, so our message wins when we are
# there to give it; when the connection is gone, the rank still ends the command. TERM first,
# KILL this long after.
RANK_GRACE_S = 5
KILL_AFTER_S = 5
KILL_TIMEOUT_S = 10
# AES-GCM first: one AEAD pass per packet instead of AES-CTR plus a separate HMAC-SHA256, on both
# ends (paramiko here, sshd on the rank). Measured on the sandbox: raw `cat > /dev/null` of 201 MB
# took 0.75 s with paramiko's default aes128-ctr + hmac-sha2-256 and 0.56 s with aes128-gcm, and
# the CPU per 100 MB fell from 0.21 to 0.15 s here and from 0.27 to 0.17 s on the rank. A server
# without GCM (OpenSSH < 6.2) still negotiates the rest of paramiko's list.
PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")  # for the `pkill` that stops a command we gave up on
CANCEL_WAIT_S = 15  # an interrupted Group waits this long for its cancelled commands, no longer
T = TypeVar("T")
_cancel = threading.local()  # .event: the Group.gather cancel event of the thread running a command

# paramiko's transport thread logs every failed handshake with a traceback; with no handler
# configured Python would print those to the terminal. Our own messages say what failed.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


@dataclass
class Result:
    """One rank's outcome: its exit status and output, or why it could not run."""

    target: Target
    exit_status: int | None = None
    stdout: str = ""
    stderr: str = ""
    error: str | None = None  # connection-level failure, with the fix
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and self.exit_status == 0

    def why(self) -> str:
        if self.error:
            return self.error
        tail = (self.stderr.strip() or self.stdout.strip()).splitlines()[-5:]
        return f"exited {self.exit_status}" + (": " + " | ".join(tail) if tail else "")


class RemoteError(SparkstackError):
    """A rank could not be reached or refused us; the message names the rank, cause and fix."""


@dataclass
class GroupResult:
    results: list[Result]

    @property
    def failed(self) -> list[Result]:
        return [r for r in self.results if not r.ok]

    def raise_for_failures(self, action: str) -> None:
        if self.failed:
            lines = [f"{action} failed on {len(self.failed)} of {len(self.results)} ranks:"]
            lines += [f"{r.target.name}: {r.why()}" for r in self.failed]
            raise RemoteError("\n".join(lines))


def fingerprint(key: paramiko.PKey) -> str:
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"{key.get_name()} SHA256:{digest}"


class _RecordUnknownKey(paramiko.MissingHostKeyPolicy):
    """Refuse unknown host keys, keeping the key so the error can show its fingerprint; with
    trust_new, record it and say so, fingerprint and all, so the user can still check it."""

    def __init__(self, trust_new: bool, known_hosts: Path, target: Target, say: Callable[[str], None]):
        self.trust_new = trust_new
        self.known_hosts = known_hosts
        self.target, self.say = target, say
        self.key: paramiko.PKey | None = None

    def missing_host_key(self, client, hostname, key):
        self.key = key
        if not self.trust_new:
            raise _UnknownHostKey(hostname, key)
        t = self.target
        self.say(f"trusting new host key for {t.label} ({t.address}:{t.port}): {fingerprint(key)}, "
                 f"recorded in {self.known_hosts}")
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
        with open(self.known_hosts, "a") as f:  # append only this host: never rewrite the file
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


class _UnknownHostKey(paramiko.SSHException):
    def __init__(self, hostname: str, key: paramiko.PKey):
        super().__init__(hostname)
        self.hostname, self.key = hostname, key


class KeyFileError(Exception):
    pass


def _load_key(path: Path) -> paramiko.PKey:
    """The rank's private key, read here so a missing or unreadable file says so plainly."""
    if not path.exists():
        raise KeyFileError(f"key file {path} does not exist; fix the rank's `key` in the config")
    try:
        return paramiko.PKey.from_path(path)
    except paramiko.PasswordRequiredException:
        raise KeyFileError(f"key file {path} is passphrase-protected; load it into ssh-agent "
                           "and leave the rank's `key` unset") from None
    except (paramiko.SSHException, ValueError, OSError) as e:
        raise KeyFileError(f"key file {path} cannot be read ({e}); convert it to OpenSSH format: "
                           f"ssh-keygen -p -o -f {path}") from None


def _transient(error: BaseException) -> bool:
    """Worth another attempt: the rank may be booting or its network flapping."""
    if isinstance(error, (ConnectionRefusedError, ConnectionResetError, socket.timeout,
                          paramiko.ssh_exception.NoValidConnectionsError, EOFError)):
        return True
    return isinstance(error, paramiko.SSHException) and "banner" in str(error).lower()


class Connection:
    """One rank's SSH connection, opened once and reused for every command of a run."""

    def __init__(self, target: Target, known_hosts: Path = DEFAULT_KNOWN_HOSTS, *,
                 trust_new: bool = False, timeout: float = 10.0, attempts: int = 4,
                 dead_after: float = DEAD_AFTER_S, say: Callable[[str], None] | None = None):
        self.target = target
        self.dead_after = dead_after
        self.known_hosts = known_hosts
        self.trust_new = trust_new
        self.timeout = timeout
        self.attempts = attempts
        self.say = say or (lambda line: None)  # the CLI passes its own: only it prints
        self.client: paramiko.SSHClient | None = None
        self._jump: paramiko.SSHClient | None = None
        self._opening = threading.Lock()  # two threads may open it at once (`up`'s look beside its lock)

    # -- connecting --------------------------------------------------------------------------
    def open(self) -> "Connection":
        with self._opening:
            if self.client is not None and not self._alive():
                self.close()  # dropped since the last command (a reboot, a cut): connect afresh
            if self.client is None:
                try:
                    self.client = self._connect_with_retries()
                except Exception as e:  # every cause becomes one message naming rank and fix
                    raise RemoteError(self._explain(e)) from None
        return self

    def _alive(self) -> bool:
        transport = self.client.get_transport() if self.client else None
        return transport is not None and transport.is_active()

    def _connect_with_retries(self) -> paramiko.SSHClient:
        def announce(state: RetryCallState) -> None:
            error = state.outcome.exception()
            self.say(f"{self.target.name}: {type(error).__name__}: {error or 'no answer'}; "
                     f"retrying ({state.attempt_number}/{self.attempts - 1})")

        stop = stop_after_attempt(self.attempts)
        cancel = getattr(_cancel, "event", None)
        if cancel is not None:  # an interrupted Group.gather: no more attempts
            stop = stop | stop_when_event_set(cancel)
        attempt = retry(retry=retry_if_exception(_transient), stop=stop,
                        wait=wait_exponential(multiplier=0.5, max=8), before_sleep=announce,
                        reraise=True)
        return attempt(self._connect)()

    def _connect(self) -> paramiko.SSHClient:
        t = self.target
        client = paramiko.SSHClient()
        if self.known_hosts.exists():
            client.load_host_keys(str(self.known_hosts))
        client.set_missing_host_key_policy(_RecordUnknownKey(self.trust_new, self.known_hosts, t, self.say))
        pkey = _load_key(t.key) if t.key else None
        client.connect(t.address, port=t.port, username=t.user, pkey=pkey,
                       timeout=self.timeout, banner_timeout=self.timeout, auth_timeout=self.timeout,
                       sock=self._jump_channel(), allow_agent=pkey is None, look_for_keys=pkey is None,
                       transport_factory=_transport)
        self._detect_dead_peer(client.get_transport())
        return client

    def _detect_dead_peer(self, transport: paramiko.Transport) -> None:
        """A cut cable or a powered-off rank sends no FIN: without this a command waits for its
        own timeout (an hour for a pull). Keepalives make traffic; TCP_USER_TIMEOUT makes the
        kernel drop a connection whose data goes unacknowledged for `dead_after` seconds."""
        transport.set_keepalive(max(1, min(KEEPALIVE_S, int(self.dead_after // 3))))
        sock = transport.sock
        if isinstance(sock, socket.socket) and hasattr(socket, "TCP_USER_TIMEOUT"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(self.dead_after * 1000))

    def _jump_channel(self):
        """A direct-tcpip channel through the jump host, verified like any other host."""
        if not self.target.jump:
            return None
        user, host, port = split_jump(self.target.jump)
        jump = Connection(Target(self.target.rank, f"jump {host}", host, int(port or 22),
                                 user or self.target.user, self.target.key),
                          self.known_hosts, trust_new=self.trust_new, timeout=self.timeout,
                          attempts=1, say=self.say).open()
        self._jump = jump.client
        return jump.client.get_transport().open_channel(
            "direct-tcpip", (self.target.address, self.target.port), ("127.0.0.1", 0),
            timeout=self.timeout)

    def _explain(self, e: Exception) -> str:
        t = self.target
        where = f"{t.name}: {t.user}@{t.address}:{t.port}"
        if isinstance(e, _UnknownHostKey):
            return (f"{where}: host key not in {self.known_hosts}: {fingerprint(e.key)}. Check it on "
                    f"the rank (ssh-keygen -lf /etc/ssh/ssh_host_{e.key.get_name().split('-')[-1]}_key.pub), "
                    f"then re-run with --trust-new-hosts to add it")
        if isinstance(e, paramiko.BadHostKeyException):
            return (f"{where}: host key CHANGED (now {fingerprint(e.key)}; known_hosts has "
                    f"{fingerprint(e.expected_key)}). If the rank was reinstalled, remove the old key: "
                    f"ssh-keygen -R '{t.known_hosts_name}' -f {self.known_hosts}")
        if isinstance(e, paramiko.AuthenticationException):
            key = t.key or "your SSH agent/default keys"
            return (f"{where}: authentication failed with {key}. Install the public key on the "
                    f"rank (ssh-copy-id -i {t.key or '~/.ssh/id_ed25519'}.pub -p {t.port} "
                    f"{t.user}@{t.address}) or fix ranks[{t.rank}].user/key")
        if isinstance(e, KeyFileError):
            return f"{where}: {e}"
        if _transient(e) or isinstance(e, OSError):
            cause = "connection refused" if isinstance(e, (ConnectionRefusedError,
                    paramiko.ssh_exception.NoValidConnectionsError)) else (str(e) or type(e).__name__)
            return (f"{where}: unreachable ({cause}) after {self.attempts} attempts. Is the rank "
                    f"up, its sshd running, and {t.address}:{t.port} reachable from here?")
        return f"{where}: SSH failed: {type(e).__name__}: {e}"

    def stream(self, command: str, write) -> int | None:
        """Run `command`, handing its output to `write(bytes)` as it comes (`logs -f`).
        Ctrl+C (None) stops the command on the rank too, not what it watches (the container):
        closing the channel alone would leave a quiet `docker logs -f` there until its next line."""
        self.open()
        token = f"sparkstack-stream-{secrets.token_hex(8)}"
        channel = self.client.get_transport().open_session(timeout=self.timeout)
        channel.set_combine_stderr(True)
        channel.exec_command(_bounded(command, None, token))
        channel.shutdown_write()
        try:
            while not (channel.exit_status_ready() and not channel.recv_ready()):
                while channel.recv_ready():
                    write(channel.recv(1 << 16))
                select.select([channel], [], [], 0.5)
            return channel.recv_exit_status()
        except KeyboardInterrupt:
            self._kill(token, sudo=False)
            return None
        finally:
            channel.close()

    def spawn(self, command: str, stdin: bytes, lifetime: float | None,
              keep_stdin: bool = False) -> paramiko.Channel:
        """Start `command` and leave it running; the caller reads its output from the channel
        and closes it to end the command (which must end on its next write then, as a watcher
        does, or on the end of its stdin when `keep_stdin` leaves that open for the caller).
        `lifetime` bounds it on the rank should this host vanish."""
        self.open()
        token = f"sparkstack-spawn-{secrets.token_hex(8)}"
        channel = self.client.get_transport().open_session(timeout=self.timeout)
        channel.exec_command(_bounded(command, lifetime, token))
        if keep_stdin:
            channel.sendall(stdin)
        else:
            _feed(channel, stdin)
        return channel

    def reverse_forward(self, local_port: int) -> tuple[int, "ByteCounter"]:
        """Listen on the rank's 127.0.0.1 (a port sshd picks) and carry each connection to
        127.0.0.1:`local_port` here; returns the rank's port and a count of the bytes carried."""
        self.open()
        counter = ByteCounter()

        def handler(channel, _origin, _server):
            try:
                sock = socket.create_connection(("127.0.0.1", local_port), timeout=self.timeout)
            except OSError:
                channel.close()
                return
            threading.Thread(target=_pump, args=(channel, sock, counter), daemon=True).start()

        port = self.client.get_transport().request_port_forward("127.0.0.1", 0, handler)
        return port, counter

    def cancel_forward(self, port: int) -> None:
        transport = self.client.get_transport() if self.client else None
        if transport and transport.is_active():
            transport.cancel_port_forward("127.0.0.1", port)

    def close(self) -> None:
        for client in (self.client, self._jump):
            if client:
                client.close()
        self.client = self._jump = None

    # -- running -----------------------------------------------------------------------------
    def run(self, command: str, *, stdin=None, timeout: float = 60.0, sudo: bool = False) -> Result:
        """Run `command` through the rank's shell; never raises for the command's own failure.
        `stdin`: bytes, or an iterable of byte chunks sent as they come (a stream of any size).
        Timed out or cancelled (Group.gather), it is killed on the rank, not left running there."""
        started = time.monotonic()
        result = Result(self.target)
        cancel = getattr(_cancel, "event", None)  # set only in a Group.gather thread
        try:
            if cancel is not None and cancel.is_set():
                raise Cancelled("was cancelled before it started")
            self.open()
            token = f"sparkstack-run-{secrets.token_hex(8)}"
            wrapped = _bounded(command, timeout, token)
            if sudo:
                wrapped, stdin = self._sudo(wrapped, stdin)
            result.exit_status, out, err = self._exec(wrapped, stdin, timeout, cancel,
                                                      lambda: self._kill(token, sudo))
            result.stdout, result.stderr = out.decode(errors="replace"), err.decode(errors="replace")
        except RemoteError as e:
            result.error = e.message
        except (paramiko.SSHException, OSError, EOFError) as e:
            result.error = f"{self.target.name}: connection lost ({type(e).__name__}: {e}); re-run when the rank is back"
            self.close()
        except (TimedOut, Cancelled) as e:
            result.error = f"{self.target.name}: `{_short(command)}` {e}"
        result.seconds = time.monotonic() - started
        return result

    def _sudo(self, command: str, stdin: bytes | None) -> tuple[str, bytes | None]:
        """Root through sudo, never asking for a password (`sudo -n`: passwordless, or the narrow
        sudoers rule); a rank that wants one fails with sudo's own message (launcher/apply/prep.py)."""
        if self.target.user == "root":
            return command, stdin
        return f"sudo -n sh -c {shlex.quote(command)}", stdin

    def _exec(self, command: str, stdin: bytes | None, timeout: float,
              cancel: threading.Event | None = None, kill: Callable[[], None] | None = None
              ) -> tuple[int, bytes, bytes]:
        """The exit status and output of `command`. Given up on (the timeout, `cancel`, Ctrl+C
        in this thread), `kill` stops it on the rank before the error is raised."""
        channel = self.client.get_transport().open_session(timeout=self.timeout)
        try:
            channel.exec_command(command)
            if stdin is not None:  # fed from a thread: a big stdin must not block reading output
                threading.Thread(target=_feed, args=(channel, stdin), daemon=True).start()
            else:
                channel.shutdown_write()
            return self._collect(channel, timeout, cancel)
        except (paramiko.SSHException, OSError, EOFError):
            raise  # the connection is gone: the rank's own `timeout` ends the command
        except BaseException:
            if kill:
                kill()
            raise
        finally:
            channel.close()

    @staticmethod
    def _collect(channel: paramiko.Channel, timeout: float,
                 cancel: threading.Event | None) -> tuple[int, bytes, bytes]:
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + timeout
        while True:
            while channel.recv_ready():
                out += channel.recv(1 << 16)
            while channel.recv_stderr_ready():
                err += channel.recv_stderr(1 << 16)
            if channel.exit_status_ready() and channel.eof_received and not (
                    channel.recv_ready() or channel.recv_stderr_ready()):
                return channel.recv_exit_status(), bytes(out), bytes(err)
            if not channel.get_transport().is_active() or (channel.closed and channel.exit_status == -1):
                raise EOFError("the SSH connection dropped before the command finished")
            if cancel is not None and cancel.is_set():
                raise Cancelled("was cancelled and stopped on the rank")
            if time.monotonic() > deadline:
                raise TimedOut(f"did not finish within {timeout:.0f} s; stopped on the rank")
            select.select([channel], [], [], 0.2)

    def _kill(self, token: str, sudo: bool) -> None:
        """Stop a command of ours on the rank: TERM to its `timeout`, which passes it to the
        command's whole process group (and KILLs it KILL_AFTER_S later). Best effort: when
        the rank does not answer, its own `timeout` ends the command anyway."""
        # the pattern as a regex that does not match itself: the shell running pkill is spared
        command, stdin = f"pkill -TERM -f -- {shlex.quote(f'[{token[0]}]{token[1:]}')}", None
        if sudo:
            command, stdin = self._sudo(command, stdin)
        try:
            self._exec(command, stdin, KILL_TIMEOUT_S)
        except (paramiko.SSHException, OSError, EOFError, TimedOut):
            pass


def _transport(sock, **kw) -> paramiko.Transport:
    """paramiko's transport, with PREFERRED_CIPHERS ahead of its own order."""
    transport = paramiko.Transport(sock, **kw)
    options = transport.get_security_options()
    options.ciphers = PREFERRED_CIPHERS + tuple(c for c in options.ciphers if c not in PREFERRED_CIPHERS)
    return transport


class TimedOut(Exception):
    """A command ran past its timeout (not an OSError: the connection is fine)."""


class Cancelled(Exception):
    """Group.gather was interrupted while this command was in flight."""


def _bounded(command: str, timeout: float | None, token: str) -> str:
    """`command` as the rank runs it: under coreutils `timeout`, in a process group of its own,
    so it ends even if our connection is gone (`timeout` None: no limit, `logs -f`); `token` (an
    argument the command ignores) names its processes for `_kill`'s `pkill -f`."""
    if timeout is None:
        return f"timeout 0 sh -c {shlex.quote(command)} sh {token}"
    limit = math.ceil(timeout) + RANK_GRACE_S
    return f"timeout -k {KILL_AFTER_S} {limit} sh -c {shlex.quote(command)} sh {token}"


FEED_CHUNK = 1 << 16


def _feed(channel: paramiko.Channel, data) -> None:
    """`data`: bytes, or an iterable of byte chunks (a stream of any size, read as it is sent).
    In chunks: paramiko's sendall re-slices the whole remaining buffer after every packet
    (32 KB), which makes a 100 MB stdin cost gigabytes of copying (minutes of CPU)."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        view = memoryview(data)
        data = (view[start:start + FEED_CHUNK] for start in range(0, len(view), FEED_CHUNK))
    try:
        for chunk in data:
            for start in range(0, len(chunk), FEED_CHUNK):
                channel.sendall(chunk[start:start + FEED_CHUNK])
        channel.shutdown_write()
    except (OSError, EOFError, paramiko.SSHException):
        pass  # the command ended or the connection dropped: its result says which
    except Exception:  # the source failed (its owner keeps why): the command must not wait for the rest
        try:
            channel.close()
        except (OSError, EOFError, paramiko.SSHException):
            pass


class ByteCounter:
    """Bytes carried by a forward, both directions, from several pump threads."""

    def __init__(self):
        self.total = 0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.total += n


def _pump(channel: paramiko.Channel, sock: socket.socket, counter: ByteCounter) -> None:
    """Copy both ways between an SSH channel and a local socket until either side closes."""
    try:
        ends = {channel: sock, sock: channel}
        while True:
            readable, _, _ = select.select(list(ends), [], [], 30)
            for source in readable:
                data = source.recv(1 << 16)
                if not data:
                    return
                ends[source].sendall(data)
                counter.add(len(data))
    except (OSError, EOFError, paramiko.SSHException):
        pass
    finally:
        try:
            channel.close()
        except (OSError, EOFError, paramiko.SSHException):
            pass  # the connection is already gone: the command's own result says so
        sock.close()


def _short(command: str, limit: int = 60) -> str:
    return command if len(command) <= limit else command[:limit] + "…"


@dataclass
class Group:
    """Connections to every rank; runs a command (or a per-rank function) on all in parallel."""

    connections: list[Connection]

    @classmethod
    def from_targets(cls, targets: list[Target], known_hosts: Path = DEFAULT_KNOWN_HOSTS, **kw) -> "Group":
        return cls([Connection(t, known_hosts, **kw) for t in targets])

    @classmethod
    def for_cluster(cls, cluster, **kw) -> "Group":
        """The config's ranks, its known_hosts (else ~/.ssh/known_hosts) and connect timeout."""
        kw.setdefault("timeout", float(cluster.ssh.connect_timeout_s))
        kw.setdefault("dead_after", float(cluster.ssh.dead_after_s))
        return cls.from_targets(targets_from_config(cluster), cluster.ssh.known_hosts or DEFAULT_KNOWN_HOSTS, **kw)

    def gather(self, action: Callable[[Connection], T]) -> list[RankOutcome[T]]:
        """`action` on every rank at once; each rank's value or exception, in rank order (one
        rank raising never hides another's result). An interrupt (Ctrl+C, SIGTERM) while waiting
        cancels every command in flight (Connection.run kills it on its rank), waits up to
        CANCEL_WAIT_S for that and is raised: nothing is waited for to its own timeout. The
        worker threads are daemons, so a rank that does not answer even then cannot hold up
        the exit."""
        cancel = threading.Event()
        outcomes = [RankOutcome(c.target) for c in self.connections]

        def work(i: int, conn: Connection) -> None:
            _cancel.event = cancel
            try:
                outcomes[i] = RankOutcome(conn.target, action(conn))
            except BaseException as e:  # kept for the caller's thread
                outcomes[i] = RankOutcome(conn.target, error=e)

        threads = [threading.Thread(target=work, args=(i, c), daemon=True, name=c.target.name)
                   for i, c in enumerate(self.connections)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        except BaseException:
            cancel.set()
            deadline = time.monotonic() + CANCEL_WAIT_S
            for t in (t for t in threads if t.ident is not None):  # those started
                t.join(max(0.0, deadline - time.monotonic()))
            raise
        return outcomes

    def map(self, action: Callable[[Connection], T]) -> list[T]:
        """`gather`, all or nothing: the answers in rank order, or, once every rank is done,
        the first rank's exception (the other ranks' work is not cut short)."""
        return values(self.gather(action))

    def each(self, action: Callable[[Connection], Result]) -> GroupResult:
        """`action`'s Result per rank; a rank whose action raised gets a Result whose error
        says so, the others keep theirs."""
        return GroupResult([o.value if o.ok else Result(o.target, error=o.why())
                            for o in self.gather(action)])

    def run(self, command: str, **kw) -> GroupResult:
        return self.each(lambda c: c.run(command, **kw))

    def close(self) -> None:
        for c in self.connections:
            c.close()

    def __enter__(self) -> "Group":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def targets_from_config(cluster) -> list[Target]:
    """The config's ranks as SSH targets (rank 0 first)."""
    return [Target(i, r.label, r.address, r.port, r.user, r.key, r.jump) for i, r in enumerate(cluster.ranks)]
