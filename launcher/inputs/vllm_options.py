"""vLLM 0.33's option table and the value parsers its options use: stdlib only.

This module imports nothing of the kit, so it is copied as is beside the sandbox's stand-ins (the
stand-in image's dist-packages, launcher/sandbox/debian_image.py): the kit (`vllm_flags`) and the
stand-in `vllm` (launcher/sandbox/standins/standin_vllm.py) refuse a value with one code, and the
same message as vLLM's parser.

The table (launcher/inputs/data/vllm-serve-flags-0.33.json, read from vLLM's argument parser by
`scripts/extract_vllm_flags.py`) maps option string -> {dest, nargs, choices, type, value}.
"value" says how vLLM's parser converts and checks the option's values, so that the kit
(`vllm_flags.parse`) and the sandbox's stand-in refuse what vLLM refuses, with its message:
  argument  how argparse names the option in errors: all the option strings of its action,
            e.g. "--speculative-config/-sc", "--enable-prefix-caching/--disable-prefix-caching"
  kind      "switch" (no value; "sets": the boolean this option string stores), "help", or the
            value parser: "int", "float", "str", "human_readable_int" (1k = 1000, 1K = 1024),
            "human_readable_int_or_auto" (also auto/-1 -> -1), "json" (json.loads, any JSON),
            "dataclass" (a config dataclass validated by pydantic: "class", and "fields" when it
            refuses unknown keys: field -> the nested dataclass's schema or null), "dict_or_str"
            (a JSON object if it looks like one, else the string), "lower_snake" (lower-cased,
            `-` -> `_`, then the choices), "device_ids" ("0,1,uuid"), "reasoning_parser"
            ("none" in any case -> "")
  wrap      (optional) "optional_type": "" and "None" give None, a failing value reads "Value X
            cannot be converted to <int/function>."; "parse_type": that message without the None
  choices   (optional) the allowed converted values; null is None (allowed in Optional options)
  const     (optional, nargs "?") the value of the option given bare
  append    (optional) true: every use adds a value (argparse "append")
  action    (optional) "lora_modules": vLLM's own action (`name=path` or a JSON object)

The functions below are vLLM's, named as vLLM names them, because argparse puts a converter's name
(or, in vLLM's wrappers, its repr) in its messages.
"""

from __future__ import annotations

import argparse
import json
import re

PYDANTIC_DOCS = "https://errors.pydantic.dev/2.14/v/"  # vLLM 0.33's pydantic, in its messages


def read_table(path) -> dict[str, dict]:
    """The option table at `path` (option string -> its spec); OSError/ValueError when unreadable."""
    with open(path) as f:
        return json.load(f)


def human_readable_int(value: str) -> int:
    """vLLM's `1k` = 1000, `1K` = 1024 (binary suffixes take no decimals), else a plain int."""
    value = value.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if not m:
        return int(value)
    number, suffix = m.groups()
    if suffix.islower():
        return int(float(number) * 1000 ** ("kmgt".index(suffix) + 1))
    if "." in number:
        raise argparse.ArgumentTypeError(
            f"Decimals are not allowed with binary suffixes like {suffix}. Did you mean to use "
            f"{number}{suffix.lower()} instead?")
    return int(number) * 1024 ** ("KMGT".index(suffix) + 1)


def human_readable_int_or_auto(value: str) -> int:
    value = value.strip()
    return -1 if value == "-1" or value.lower() == "auto" else human_readable_int(value)


def parse_type(return_type):
    """vLLM's wrapper: a ValueError becomes "Value X cannot be converted to <repr>."."""
    def _parse_type(val: str):
        try:
            return return_type(val)
        except ValueError as e:
            raise argparse.ArgumentTypeError(
                f"Value {val} cannot be converted to {return_type}.") from e
    return _parse_type


def optional_type(return_type):
    """vLLM's Optional wrapper: "" and "None" (that spelling only) are None."""
    def _optional_type(val: str):
        return None if val in ("", "None") else parse_type(return_type)(val)
    return _optional_type


def union_dict_and_str(val: str):
    """A JSON object when it looks like one, else the string itself."""
    if not re.match(r"(?s)^\s*{.*}\s*$", val):
        return val
    return optional_type(json.loads)(val)


def parse_reasoning_parser(val: str) -> str:
    return "" if val.lower() == "none" else val


def pydantic_error(cls: str, errors: list[tuple[tuple, str, str, object]]) -> str:
    """pydantic's ValidationError text, as vLLM's parse_dataclass reports it:
    errors are (location, message, error type, input value)."""
    lines = [f"{len(errors)} validation error{'s' if len(errors) > 1 else ''} for {cls}"]
    for loc, msg, kind, value in errors:
        if loc:
            lines.append(".".join(loc))
        lines += [f"  {msg} [type={kind}, input_value={value!r}, "
                  f"input_type={type(value).__name__}]",
                  f"    For further information visit {PYDANTIC_DOCS}{kind}"]
    return "\n".join(lines)


# Python's json messages that read differently in pydantic's parser (jiter).
JITER_WORDS = {"Expecting property name enclosed in double quotes": "key must be a string",
               "Expecting value": "expected value", "Extra data": "trailing characters"}


def unknown_keys(schema: dict, obj: dict, loc: tuple = ()) -> list:
    """The keys a closed config dataclass refuses: nested fields first, then its own."""
    fields = schema.get("fields")
    if fields is None:
        return []  # pydantic takes any key here
    errors = []
    for name, sub in fields.items():
        if sub and isinstance(obj.get(name), dict):
            errors += unknown_keys(sub, obj[name], (*loc, name))
    return errors + [((*loc, k), "Unexpected keyword argument", "unexpected_keyword_argument", v)
                     for k, v in obj.items() if k not in fields]


def expand_human_numbers(val: str) -> str:
    """vLLM's `{"size": 80m}` -> `{"size": 80000000}`, outside JSON strings only."""
    parts = re.split(r'("(?:[^"\\]|\\.)*")', val)
    for i in range(0, len(parts), 2):
        parts[i] = re.sub(r"\b\d+(?:\.\d+)?[kKmMgGtT]\b",
                          lambda m: str(human_readable_int(m.group())), parts[i])
    return "".join(parts)


def dataclass_parser(schema: dict):
    """vLLM validates a config dataclass's JSON with pydantic: the JSON, that it is an object,
    and (for closed dataclasses) its keys. Field values are not checked here."""
    def parse_dataclass(val: str):
        val = expand_human_numbers(val)
        try:
            out = json.loads(val)
        except json.JSONDecodeError as e:
            words = JITER_WORDS.get(e.msg, e.msg)
            error = ((), f"Invalid JSON: {words} at line {e.lineno} column {e.colno}",
                     "json_invalid", val)
            raise argparse.ArgumentTypeError(pydantic_error(schema["class"], [error])) from None
        errors = (unknown_keys(schema, out) if isinstance(out, dict) else
                  [((), "Input should be an object", "dataclass_type", out)])
        if errors:
            raise argparse.ArgumentTypeError(pydantic_error(schema["class"], errors))
        return out
    return parse_dataclass


KINDS = {"int": int, "float": float, "str": str, "json": json.loads,
         "human_readable_int": human_readable_int,
         "human_readable_int_or_auto": human_readable_int_or_auto,
         "dict_or_str": union_dict_and_str, "reasoning_parser": parse_reasoning_parser,
         "lower_snake": lambda s: s.lower().replace("-", "_"),
         "device_ids": lambda s: [int(d) if d.isdigit() else d for d in
                                  (part.strip() for part in s.split(","))]}


def converter(spec: dict):
    """The `type=` function vLLM gives this option (table entry's "value")."""
    value = spec["value"]
    kind = value["kind"]
    func = dataclass_parser(value) if kind == "dataclass" else KINDS[kind]
    wrap = {"optional_type": optional_type, "parse_type": parse_type}.get(value.get("wrap"))
    return wrap(func) if wrap else func


def dotted_value(text: str):
    """JSON if it parses, else a human-readable int (`80g`), else the string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        try:
            return human_readable_int(text)
        except (ValueError, argparse.ArgumentTypeError):
            return text
