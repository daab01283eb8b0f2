"""The memory guard's reader (launcher/apply/memguard.py) against a fake watcher stream (issue 33,
item 6): one line that was not a JSON object, or lacked a field, killed the reader thread of that
rank, and `up` went on with that rank's hard floor unwatched. Now every line is survived, and a
reader that ends while the guard is open fails `up` for that rank (MemoryGuardLost, a MemoryFloor:
`up` stops every rank)."""

from __future__ import annotations

import io
import json
import threading
import time

import pytest

from launcher.apply import memguard
from launcher.inputs.config import MemoryGuardSettings
from launcher.transport.remote import Group, Target

GIB = 1024 ** 3


class FakeChannel:
    """What paramiko's channel gives the reader: its lines (fed by the test), then an exit."""

    def __init__(self, exit_status: int = 0, stderr: str = ""):
        self.lines: list[str] = []
        self.fed = threading.Condition()
        self.ended = False
        self.closed = False
        self.exit_status, self.stderr = exit_status, stderr

    def feed(self, *lines: str, end: bool = False) -> None:
        with self.fed:
            self.lines += [line + "\n" for line in lines]
            self.ended = self.ended or end
            self.fed.notify_all()

    def makefile(self, mode):
        def lines():
            while True:
                with self.fed:
                    self.fed.wait_for(lambda: self.lines or self.ended or self.closed)
                    if self.lines:
                        line = self.lines.pop(0)
                    else:
                        return
                yield line
        return lines()

    def makefile_stderr(self, mode):
        return io.BytesIO(self.stderr.encode())

    def exit_status_ready(self):
        return self.ended

    def recv_exit_status(self):
        return self.exit_status

    def close(self):
        with self.fed:
            self.closed = True
            self.fed.notify_all()


class FakeConnection:
    def __init__(self, rank: int, channel: FakeChannel):
        self.target = Target(rank, f"spark{rank + 1}", f"10.0.0.{rank + 11}", user="spark")
        self.channel = channel

    def spawn(self, command, stdin, lifetime, keep_stdin=False):
        return self.channel


def guard_on(*channels: FakeChannel) -> memguard.MemoryGuard:
    group = Group([FakeConnection(i, c) for i, c in enumerate(channels)])
    return memguard.MemoryGuard(group, MemoryGuardSettings(), lifetime=60, say=lambda line: None)


def sample(t: float, avail_gib: float, free_gib: float = 50) -> str:
    return json.dumps({"t": t, "avail": int(avail_gib * GIB), "free": int(free_gib * GIB)})


def settle(memory: memguard.RankMemory, samples: int) -> None:
    deadline = time.monotonic() + 5
    while len(memory.samples) < samples and time.monotonic() < deadline:
        time.sleep(0.01)


BAD_LINES = ["not json", "[1, 2]", '"a string"', "null", "42", '{"t": 1}', '{"event": "relief"}',
             '{"event": "relief", "t": 1, "rc": 0}', '{"event": "hard", "t": 2}',
             '{"t": "soon", "avail": 1, "free": 2}', '{"t": 1, "avail": true, "free": 2}',
             '{"t": NaN, "avail": 1, "free": 2}', '{"event": "relief", "t": 1, "rc": "0", "free": 1}', "{" * 5000, "\x00\xff"]


@pytest.mark.parametrize("bad", BAD_LINES, ids=range(len(BAD_LINES)))
def test_the_reader_survives_any_line_and_says_what_it_got(bad):
    channel = FakeChannel()
    with guard_on(channel) as guard:
        channel.feed(sample(0, 100), bad, sample(1, 90))
        memory = guard.ranks[0]
        settle(memory, 2)
        assert [s[0] for s in memory.samples] == [0, 1], memory.samples  # read on past the bad line
        assert memory.error and "the watcher printed" in memory.error
        guard.check()  # nothing tripped, the reader still reads
        channel.feed(sample(2, 2))  # below the hard floor of 3 GiB
        channel.feed(json.dumps({"event": "hard", "t": 2, "avail": 2 * GIB, "free": GIB}))
        with pytest.raises(memguard.MemoryFloor, match=r"spark1\): MemAvailable fell to 2.0 GiB"):
            guard.check(grace=5)
        assert "spark1): lowest MemAvailable" in memory.summary()
        json.dumps(memory.to_json())


def test_a_dead_reader_fails_up_for_that_rank():
    """The watcher's stream ends (it crashed, or was killed on the rank) while the guard is open:
    check() raises, naming the rank and why, instead of leaving its floor unwatched."""
    alive, dying = FakeChannel(), FakeChannel(exit_status=1, stderr="Traceback ...\nKeyError: 'MemAvailable'\n")
    with guard_on(alive, dying) as guard:
        alive.feed(sample(0, 100))
        dying.feed(sample(0, 100), end=True)
        deadline = time.monotonic() + 5
        with pytest.raises(memguard.MemoryGuardLost) as raised:
            while time.monotonic() < deadline:
                guard.check()
                time.sleep(0.01)
        assert isinstance(raised.value, memguard.MemoryFloor)  # `up` stops every rank for it
        message = raised.value.message
        assert "spark2): the memory guard stopped watching" in message and "KeyError: 'MemAvailable'" in message
        assert "spark1" not in message.splitlines()[0]


def test_closing_the_guard_is_not_a_dead_reader():
    channel = FakeChannel()
    guard = guard_on(channel)
    with guard:
        channel.feed(sample(0, 100))
        settle(guard.ranks[0], 1)
    guard.check()  # the guard ended its readers itself: no error
    assert guard.ranks[0].error is None
