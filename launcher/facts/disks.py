"""Disks: the free and total bytes of each path asked for (the checkpoint's, Docker's root, ...)."""

from __future__ import annotations

from dataclasses import dataclass

from .parts import Part, key


@dataclass(frozen=True)
class Disk:
    path: str
    avail: int
    size: int


def parse_disks(raw: dict) -> tuple[Disk, ...]:
    return tuple(Disk(p, v["avail"], v["size"]) for p, v in sorted(raw.items()) if "avail" in v)


DISKS = Part("disks", "disk", parse_disks, (key("disk", {}),))
