"""vLLM `serve` argv: split into flags, validate against vLLM 0.33's own option table, merge.

The table (`data/vllm-serve-flags-0.33.json`) was read from vLLM's argument parser: option ->
{dest, nargs, choices, type}. It is vendored so the kit works without the project's shared/
folder; a test keeps it identical to shared/vllm/serve-flags-0.33.json.
"""

from __future__ import annotations

import difflib
import json
import shlex
from dataclasses import dataclass
from functools import cache
from pathlib import Path

FLAGS_FILE = Path(__file__).parent / "data" / "vllm-serve-flags-0.33.json"

# Option types vLLM parses as JSON/dataclasses: these also accept dotted sub-keys,
# e.g. `--compilation-config.pass_config.fuse_allreduce_rms=true` (FlexibleArgumentParser).
_DICT_TYPES = {"parse_dataclass", "union_dict_and_str", "loads"}


@cache
def table() -> dict[str, dict]:
    return json.loads(FLAGS_FILE.read_text())


@dataclass(frozen=True)
class Flag:
    """One option as written: `name` (e.g. `--max-model-len`), `key` (what it sets, used to
    merge: `-tp` and `--tensor-parallel-size` share one), its value tokens, and whether it was
    written `--name=value` (kept so the argv renders exactly as the profile wrote it)."""

    name: str
    values: tuple[str, ...] = ()
    inline: bool = False
    plugin: bool = False

    @property
    def key(self) -> str:
        base, _, sub = self.name.partition(".")
        spec = table().get(base)
        dest = spec["dest"] if spec else base
        return f"{dest}.{sub}" if sub else dest

    def argv(self) -> list[str]:
        if self.inline:
            return [f"{self.name}={self.values[0]}"]
        return [self.name, *self.values]


class FlagError(ValueError):
    """A flag vLLM would refuse (unknown, wrong arity, bad choice)."""


def suggest(name: str) -> str:
    match = difflib.get_close_matches(name, table().keys(), n=1, cutoff=0.6)
    return f" (did you mean {match[0]}?)" if match else ""


def _spec_for(name: str) -> dict | None:
    base, dot, _ = name.partition(".")
    spec = table().get(base)
    if spec and dot and not (spec["type"] in _DICT_TYPES or spec["dest"].endswith("_config")):
        return None  # dotted sub-keys only exist for dict-typed options
    return spec


def parse(tokens: list[str], plugin_flags: frozenset[str] = frozenset()) -> list[Flag]:
    """Group argv tokens into flags, refusing what vLLM 0.33 would refuse.

    `plugin_flags` are options a plugin adds to vLLM's parser; they are taken as written
    (`--x` alone is a switch, `--x v` carries one value)."""
    flags: list[Flag] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("-"):
            raise FlagError(f"unexpected value {token!r}: every argument must follow a flag")
        name, eq, inline_value = token.partition("=")
        i += 1
        if name in plugin_flags:
            values, i = _take(tokens, i, "?", inline_value if eq else None)
            flags.append(Flag(name, values, bool(eq), plugin=True))
            continue
        spec = _spec_for(name)
        if spec is None:
            raise FlagError(f"unrecognized vLLM 0.33 argument {name}{suggest(name)}")
        nargs = spec["nargs"] if "." not in name else "None"
        values, i = _take(tokens, i, nargs, inline_value if eq else None)
        if nargs == "0" and eq:
            raise FlagError(f"{name} is a switch and takes no value (got {inline_value!r})")
        if nargs in ("None", "+") and not values:
            raise FlagError(f"{name} expects a value")
        if spec["choices"] and any(v not in spec["choices"] for v in values):
            raise FlagError(f"{name}: {values[0]!r} is not one of {', '.join(spec['choices'])}")
        flags.append(Flag(name, values, bool(eq)))
    return flags


def _take(tokens: list[str], i: int, nargs: str, inline: str | None) -> tuple[tuple[str, ...], int]:
    """The value tokens of one flag starting at tokens[i], by argparse's nargs."""
    if inline is not None:
        return (inline,), i
    if nargs == "0":
        return (), i
    if nargs in ("None", "?"):
        if i < len(tokens) and not _looks_like_flag(tokens[i]):
            return (tokens[i],), i + 1
        return (), i
    start = i  # nargs '+': everything up to the next flag
    while i < len(tokens) and not _looks_like_flag(tokens[i]):
        i += 1
    return tuple(tokens[start:i]), i


def _looks_like_flag(token: str) -> bool:
    return token.startswith("-") and not _is_number(token)


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def split_lines(lines: list[str]) -> list[str]:
    """Profile/config args are written one flag per line in shell quoting."""
    return [token for line in lines for token in shlex.split(line)]


def merge(base: list[Flag], overrides: list[Flag]) -> list[Flag]:
    """Overrides replace the flag with the same key in place; new ones are appended."""
    merged = list(base)
    for flag in overrides:
        at = next((n for n, f in enumerate(merged) if f.key == flag.key), None)
        if at is None:
            merged.append(flag)
        else:
            merged[at] = flag
    return merged


def value(flags: list[Flag], key: str) -> str | None:
    """The single value set for `key` (a dest), or None when absent."""
    for flag in flags:
        if flag.key == key:
            return flag.values[0] if flag.values else "true"
    return None


def render(flags: list[Flag]) -> list[str]:
    return [token for flag in flags for token in flag.argv()]
