"""One operator at a time: `up`, `down`, `ship`, `prep` and `stage` hold the cluster lock on rank 0 while
they run (launcher/onrank/lock_holder.py holds it there). A second one waits (--wait-lock) or
refuses naming who holds it; a lock whose holder stopped answering (its host died, the network
went) lapses after STALE_S and the next one takes it over with a note. Read-only commands
(`plan`, `check`, `status`, `logs`) never take it.

A command whose own lock lapsed while it ran (its heartbeats unanswered for STALE_S: rank 0
unreachable, this host asleep) may find another operator holding the lock: `ensure_held()`,
called by the long commands between their steps, raises LockLost then, so the command stops
before its next step instead of carrying on beside the new holder.
"""

from __future__ import annotations

import getpass
import json
import os
import select
import shlex
import socket
import sys
import threading
import time
from collections import deque
from datetime import datetime, timezone


from .. import onrank
from ..errors import SparkstackError
from ..inputs.config import Loaded
from ..transport.remote import Connection, Group, paramiko  # without invoke: remote._import_paramiko

LOCK_PATH = "/tmp/sparkstack-lock/cluster.lock"  # on rank 0; gone with a reboot, as a lock should be
STALE_S = 30  # silence from the holder after which its lock lapses
ANSWER_TIMEOUT_S = 20
RETRY_S = 2


class ClusterBusy(SparkstackError):
    pass


class LockLost(SparkstackError):
    """This command's lock lapsed while it ran: it stops before its next step."""


_HELD: list["ClusterLock"] = []  # the locks this process holds now


def ensure_held() -> None:
    """Between the steps of a long command: raise LockLost when a lock this process took has
    lapsed since (nothing to check when the command holds none, as in a test without one)."""
    for lock in list(_HELD):
        lock.check()


def holder(loaded: Loaded, argv: list[str] | None = None) -> dict:
    """Who asks: shown to anyone who finds the lock taken."""
    return {"user": _user(), "host": socket.gethostname(),
            "command": shlex.join(["sparkstack", *(sys.argv[1:] if argv is None else argv)]),
            "since": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "profile": loaded.profile.name, "config": str(loaded.path) if loaded.path else None}


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name and no passwd entry (a bare container)
        return f"uid {os.getuid()}"


def describe(who: dict | None) -> str:
    if not who:
        return "an unknown holder"
    if "unreadable" in who:  # the holder says what it is, never its bytes
        return f"a holder whose note is unreadable ({who['unreadable']})"
    return (f"{who.get('user')}@{who.get('host')} running `{who.get('command')}` since {who.get('since')} "
            f"(profile {who.get('profile')})")


class ClusterLock:
    """A context manager: entered, the lock is held on rank 0 (or ClusterBusy is raised)."""

    def __init__(self, conn: Connection, who: dict, wait_s: float = 0, say=print,
                 stale_s: float = STALE_S, path: str = LOCK_PATH):
        self.conn, self.who, self.wait_s, self.say = conn, who, wait_s, say
        self.stale_s, self.path = stale_s, path
        self._channel: paramiko.Channel | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._sent: deque[float] = deque()  # heartbeats not answered yet, by when they left
        self._acked = 0.0  # when the last answered heartbeat left (the holder's clock ran from then)
        self._gone: str | None = None  # why the holder is known to be gone
        self._wake: tuple[int, int] | None = None  # written at the end: the heartbeat's select returns at once
        self.waited = False  # set on entering: it waited, or took a lapsed lock over

    def __enter__(self) -> "ClusterLock":
        deadline = time.monotonic() + self.wait_s
        told = False
        while True:
            self._acked = time.monotonic()  # before the holder starts its clock
            answer = self._try()
            if answer.get("held"):
                break
            if time.monotonic() >= deadline:
                raise ClusterBusy(
                    f"{self.conn.target.name}: the cluster is busy: {describe(answer.get('holder'))} "
                    f"holds its lock ({self.path} on rank 0). Wait for it to end, or re-run with "
                    "--wait-lock SECONDS; a holder that stopped answering loses the lock after "
                    f"{self.stale_s:.0f} s")
            if not told:
                self.say(f"waiting for the cluster lock: {describe(answer.get('holder'))} holds it")
                told = True
            time.sleep(RETRY_S)
        self.waited = told or bool(answer.get("previous"))  # someone else may have changed the cluster
        if answer.get("previous"):
            self.say(f"note: took over the cluster lock left by {describe(answer['previous'])}: "
                     "its holder stopped answering")
        self._wake = os.pipe()
        self._beat = threading.Thread(target=self._heartbeat, daemon=True)
        self._beat.start()
        _HELD.append(self)
        return self

    def _try(self) -> dict:
        command, script = onrank.invocation_keeping_stdin(
            "lock_holder", {"path": self.path, "holder": self.who, "stale_s": self.stale_s})
        try:
            channel = self.conn.spawn(command, script, None, keep_stdin=True)
            channel.settimeout(ANSWER_TIMEOUT_S)
            line = channel.makefile("r").readline()
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise SparkstackError(f"{self.conn.target.name}: cannot take the cluster lock ({e}); "
                                  "nothing was changed") from None
        try:
            answer = json.loads(line)
        except ValueError:
            err = channel.makefile_stderr("r").read().decode(errors="replace").strip()
            channel.close()
            raise SparkstackError(f"{self.conn.target.name}: cannot take the cluster lock: "
                                  f"{(err or line or 'no answer').splitlines()[-1]}; is python3 installed "
                                  "on rank 0?") from None
        if answer.get("refused"):
            channel.close()
            raise SparkstackError(f"{self.conn.target.name}: cannot take the cluster lock: {answer['refused']}; "
                                  "nothing was changed")
        if answer.get("held"):
            self._channel = channel
        else:
            channel.close()
        return answer

    def _heartbeat(self) -> None:
        """A line every stale_s / 3; the holder answers each with `+`: the time the last answered
        one left is when the holder's stale_s began at the latest."""
        channel, wake, interval = self._channel, self._wake[0], self.stale_s / 3
        next_beat = time.monotonic() + interval
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= next_beat:
                    self._sent.append(now)
                    channel.sendall(b".\n")
                    next_beat = now + interval
                select.select([channel, wake], [], [], min(max(next_beat - now, 0.0), 0.5))
                while channel.recv_ready():
                    for _ in range(channel.recv(1024).count(b"+")):
                        if self._sent:
                            self._acked = self._sent.popleft()
                if channel.exit_status_ready():
                    self._gone = "its holder there ended"
                    return
        except (OSError, EOFError, paramiko.SSHException) as e:
            self._gone = f"the connection to rank 0 broke ({e})"  # the holder lapses on the rank by itself

    def check(self) -> None:
        """Raise LockLost when the lock may have lapsed: its holder ended, or no heartbeat was
        answered for stale_s (the holder gives up after stale_s of silence)."""
        if self._channel is None:
            return
        silent = time.monotonic() - self._acked
        gone = self._gone or (self._channel.exit_status_ready() and "its holder there ended")
        if gone or silent > self.stale_s:
            why = gone or f"no heartbeat answered for {silent:.0f} s, more than {self.stale_s:.0f} s"
            raise LockLost(f"{self.conn.target.name}: this command lost the cluster lock ({why}): another "
                           "operator may hold it now, so it stopped before its next step; see "
                           "`sparkstack status`, then re-run it")

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self in _HELD:
            _HELD.remove(self)
        if self._channel is None:
            return
        if self._wake:
            os.write(self._wake[1], b"x")  # the beat ends now, not after its select's 0.5 s
        if self._beat is not None and self._beat is not threading.current_thread():
            self._beat.join(timeout=1)
        try:
            self._channel.shutdown_write()  # the holder clears the file and ends
            deadline = time.monotonic() + 5
            while not self._channel.exit_status_ready() and time.monotonic() < deadline:
                time.sleep(0.05)
        except (OSError, EOFError, paramiko.SSHException):
            pass
        finally:
            self._channel.close()
            for fd in self._wake or ():
                os.close(fd)
            self._wake = None


def held(loaded: Loaded, group: Group, wait_s: float = 0, say=print) -> ClusterLock:
    """The lock on rank 0 of `group` for this command."""
    head = next((c for c in group.connections if c.target.rank == 0), None)
    if head is None:
        raise SparkstackError("the cluster lock lives on rank 0, which this command does not reach")
    return ClusterLock(head, holder(loaded), wait_s, say)
