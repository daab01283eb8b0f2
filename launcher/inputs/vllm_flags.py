"""vLLM `serve` argv: split into flags, validate against vLLM 0.33's own option table, merge.

The table (`data/vllm-serve-flags-0.33.json`) was read from vLLM's argument parser by
`scripts/extract_vllm_flags.py`: option string -> {dest, nargs, choices, type, value}. It is
vendored so the kit works without the project's shared/ folder; a test keeps its first four keys
identical to shared/vllm/serve-flags-0.33.json, which lacks "value".

"value" says how vLLM's parser converts and checks the option's values (the format, and the
parsers themselves, are in `vllm_options`: stdlib only, shared with the sandbox's stand-in `vllm`,
so `parse` below refuses what vLLM and the stand-in refuse, with vLLM's message).
"""

from __future__ import annotations

import argparse
import difflib
import json
import shlex
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from . import vllm_options  # vLLM's value parsers, stdlib-only, shared with the sandbox's stand-in

FLAGS_FILE = Path(__file__).parent / "data" / "vllm-serve-flags-0.33.json"

# Value kinds vLLM parses as JSON: only these take dotted sub-keys here, e.g.
# `--compilation-config.pass_config.fuse_allreduce_rms=true` (FlexibleArgumentParser would
# also turn `--port.x 1` into `--port '{"x": 1}'`, which no option but these can use).
_JSON_KINDS = {"json", "dataclass", "dict_or_str"}


@cache
def table() -> dict[str, dict]:
    return vllm_options.read_table(FLAGS_FILE)


# Where a flag was set (Flag.source): the profile's `args`, cluster.yaml's overrides.engine_args,
# or the plan (the flags it manages).
PROFILE, CONFIG, PLAN = "profile", "config", "plan"


@dataclass(frozen=True)
class Flag:
    """One option as written: `name` (e.g. `--max-model-len`), `key` (what it sets, used to
    merge: `-tp` and `--tensor-parallel-size` share one), its value tokens, whether it was
    written `--name=value` (kept so the argv renders exactly as the profile wrote it), and where
    it was set (`source`, kept through `merge`; not part of what the flag is)."""

    name: str
    values: tuple[str, ...] = ()
    inline: bool = False
    plugin: bool = False
    source: str = field(default="", compare=False)  # PROFILE | CONFIG | PLAN

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
    """A flag vLLM would refuse (unknown, wrong arity, a value its parser refuses)."""


class UnknownFlagError(FlagError):
    """An option vLLM 0.33 does not have (a plugin may add it)."""


def suggest(name: str) -> str:
    match = difflib.get_close_matches(name, table().keys(), n=1, cutoff=0.6)
    return f" (did you mean {match[0]}?)" if match else ""


def _spec_for(name: str) -> dict | None:
    base, dot, _ = name.partition(".")
    spec = table().get(base)
    if spec and dot and spec["value"]["kind"] not in _JSON_KINDS:
        return None  # dotted sub-keys only exist for dict-typed options
    return spec


def parse(tokens: list[str], plugin_flags: frozenset[str] = frozenset(), source: str = "") -> list[Flag]:
    """Group argv tokens into flags, refusing what vLLM 0.33 would refuse; each flag's `source`
    says where the tokens were written.

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
            flags.append(Flag(name, values, bool(eq), plugin=True, source=source))
            continue
        spec = _spec_for(name)
        if spec is None:
            raise UnknownFlagError(f"unrecognized vLLM 0.33 argument {name}{suggest(name)}")
        nargs = spec["nargs"] if "." not in name else "None"
        values, i = _take(tokens, i, nargs, inline_value if eq else None)
        if nargs == "0" and eq:
            raise FlagError(f"{name} is a switch and takes no value (got {inline_value!r})")
        if nargs in ("None", "+") and not values:
            raise FlagError(f"{name} expects a value")
        if nargs != "0":
            _check_values(name, spec, values)
        flags.append(Flag(name, values, bool(eq), source=source))
    return flags


def _check_values(name: str, spec: dict, values: tuple[str, ...]) -> None:
    """Convert each value with the option's own vLLM parser; refuse what it would refuse. A
    dotted sub-key is checked as the JSON object vLLM makes of it (`--x.a.b=1` -> {"a":{"b":1}})."""
    base, dot, sub = name.partition(".")
    if dot:
        nested = vllm_options.dotted_value(values[0])
        for key in reversed(sub.split(".")):
            nested = {key: nested}
        values = (json.dumps(nested),)
    convert = vllm_options.converter(spec)
    choices = spec["value"].get("choices")
    for raw in values:
        try:
            out = convert(raw)
        except argparse.ArgumentTypeError as e:
            raise FlagError(f"{base}: {e}") from None
        except (TypeError, ValueError):  # argparse's wording for a plain type
            raise FlagError(f"{base}: invalid {convert.__name__} value {raw!r}") from None
        if choices is not None and out not in choices:
            raise FlagError(f"{base}: {raw!r} is not one of {', '.join(map(str, choices))}")


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


def find(flags: list[Flag], key: str) -> Flag | None:
    """The flag set for `key` (a dest), or None when absent."""
    return next((f for f in flags if f.key == key), None)


def value(flags: list[Flag], key: str) -> str | None:
    """The single value set for `key` (a dest), or None when absent."""
    for flag in flags:
        if flag.key == key:
            return flag.values[0] if flag.values else "true"
    return None


def converted(flags: list[Flag], key: str):
    """What vLLM's own parser makes of the value set for `key` (e.g. `auto` -> -1 for
    --max-model-len, `None` -> None for --kv-cache-memory-bytes), or None when absent."""
    flag = next((f for f in flags if f.key == key), None)
    if flag is None or not flag.values:
        return None
    try:
        return vllm_options.converter(table()[flag.name])(flag.values[0])
    except (argparse.ArgumentTypeError, TypeError, ValueError):  # a plugin flag taken as written
        raise FlagError(f"{flag.name}: invalid value {flag.values[0]!r}") from None


def render(flags: list[Flag]) -> list[str]:
    return [token for flag in flags for token in flag.argv()]
