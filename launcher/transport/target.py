"""Where one rank's sshd is (Target): the value every remote action and every rank's outcome
names its rank by. Its own module so that remote (which connects to it) and outcome (which
reports for it) both import it, and neither imports the other's side."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Target:
    """Where one rank's sshd is, as the config says."""

    rank: int
    label: str
    address: str
    port: int = 22
    user: str = "root"
    key: Path | None = None
    jump: str | None = None  # "user@host:port"

    @property
    def name(self) -> str:
        return f"rank {self.rank} ({self.label})"

    @property
    def known_hosts_name(self) -> str:
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"
