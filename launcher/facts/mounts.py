"""Mounts: the rank's mount table (`findmnt -J`) and the mount holding the checkpoint directory."""

from __future__ import annotations

import json
from dataclasses import dataclass

from .parts import FactError, Part, command


@dataclass(frozen=True)
class Mount:
    target: str
    source: str
    fstype: str
    options: str


def parse_mounts(findmnt: dict | None) -> tuple[Mount, ...]:
    """`findmnt -J` (list or tree form) into a flat list, in the order findmnt gives."""
    if not findmnt or findmnt.get("rc") != 0:
        return ()
    try:
        data = json.loads(findmnt["stdout"])
    except json.JSONDecodeError as e:
        raise FactError(f"findmnt: not JSON ({e})") from None
    out: list[Mount] = []

    def walk(entries):
        for e in entries:
            out.append(Mount(e.get("target", ""), e.get("source", ""), e.get("fstype", ""), e.get("options", "")))
            walk(e.get("children", []))
    walk(data.get("filesystems", []))
    return tuple(out)


def _model_findmnt(raw: dict, local: dict) -> dict | None:
    """`findmnt` of the checkpoint directory: the fixture mount table's answer when it gave one."""
    cmds = raw.get("commands", {})
    fixture = cmds.get("findmnt_model_fixture")
    return fixture if fixture and fixture.get("rc") == 0 else cmds.get("findmnt_model")


def _first(mounts: tuple[Mount, ...]) -> Mount | None:
    return mounts[0] if mounts else None


MODEL_MOUNT = Part("model_mount", "findmnt (model dir)", parse_mounts, (_model_findmnt,), problem=True, default=(),
                   checked_as="mounts", pick=_first)
MOUNTS = Part("mounts", "findmnt", parse_mounts, (command("findmnt"),), problem=True, default=())
