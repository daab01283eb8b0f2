"""What every fact module is made of: the errors a parser raises, the `Part` a subject declares for
each field of Facts it fills (the probe output it reads, the parser that reads it), and the small
readers of raw values the parsers share.

A part's parser is pure: raw values in, a typed value out. record.py runs the parts in its table's
order and checks each value against the type Facts declares for the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


class FactError(ValueError):
    """Raw output that does not have the expected shape."""


class ShapeError(FactError):
    """A part of the probe's output in a shape the probe never prints (wrong types, missing or
    extra structure): the rank's facts cannot be trusted, so the rank fails, naming the part."""


@dataclass(frozen=True)
class Read:
    """One value a parser takes: the probe's output `raw[key]` ("output"), a command's result
    `raw["commands"][key]` ("commands"), or the caller's own figure ("local": `sent`, `received`,
    its time.time() around the probe's command). `default` when the key is absent."""

    where: str
    key: str
    default: object = None

    def __call__(self, raw: dict, local: dict):
        source = {"output": raw, "commands": raw.get("commands", {}), "local": local}[self.where]
        return source.get(self.key, self.default)


def key(name: str, default=None) -> Read:
    """The probe output's `name` (`default` when absent)."""
    return Read("output", name, default)


def command(name: str, default=None) -> Read:
    """The result of the probe's command `name` ({"rc", "stdout", "stderr"} or {"missing": true})."""
    return Read("commands", name, default)


def local(name: str) -> Read:
    """The caller's `sent` or `received`."""
    return Read("local", name)


@dataclass(frozen=True)
class Part:
    """One field of Facts as its subject declares it: `parse(*(read(raw, local) for read in reads))`.

    - `what`: the source as the rank's error and its `problems` line name it;
    - `problem`: True when a FactError (the rank could not read this source) becomes a line of
      Facts.problems and the field `default`; False when it fails the rank. Output of a shape the
      probe never prints (a ShapeError) always fails the rank;
    - `checked_as`: the Facts field whose declared type the parser's value must have (the field
      itself unless named); `pick` then turns the checked value (or the default) into the field's.
    """

    field: str
    what: str
    parse: Callable
    reads: tuple[Callable[[dict, dict], object], ...]
    problem: bool = False
    default: object = None
    checked_as: str | None = None
    pick: Callable | None = None


def verbatim(value):
    """A value the probe prints as the fact itself (the host name, the kernel release)."""
    return value


def int_or_none(raw) -> int | None:
    if not isinstance(raw, str):
        return None
    try:
        return int(raw.strip())
    except ValueError:
        return None


def stripped(raw) -> str | None:
    return raw.strip() if isinstance(raw, str) else None
