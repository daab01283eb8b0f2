"""The clock: the rank's wall clock while the probe ran, against this host's around the command."""

from __future__ import annotations

from dataclasses import dataclass

from .parts import Part, key, local


@dataclass(frozen=True)
class Clock:
    """The rank's wall clock against ours: the probe ran between `sent` and `received`."""

    remote_started: float
    remote_finished: float
    sent: float | None = None
    received: float | None = None

    @property
    def offset(self) -> float | None:
        """Rank clock minus local clock, in seconds (None without local timestamps)."""
        if self.sent is None or self.received is None:
            return None
        return (self.remote_started + self.remote_finished) / 2 - (self.sent + self.received) / 2

    @property
    def uncertainty(self) -> float | None:
        if self.sent is None or self.received is None:
            return None
        return max(0.0, (self.received - self.sent) - (self.remote_finished - self.remote_started)) / 2


def parse_clock(raw: dict, sent: float | None = None, received: float | None = None) -> Clock:
    return Clock(raw["started"], raw.get("finished", raw["started"]), sent, received)


CLOCK = Part("clock", "clock", parse_clock, (key("clock", {"started": 0.0}), local("sent"), local("received")))
