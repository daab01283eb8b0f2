#!/usr/bin/env python3
"""Write vLLM's `vllm serve` option table, with how each option's values are parsed.

Needs vLLM itself (not a dependency of the kit; the tests never run this):

    python3 -m venv /work/vllm-venv && /work/vllm-venv/bin/pip install vllm==0.33.0
    /work/vllm-venv/bin/python scripts/extract_vllm_flags.py > launcher/inputs/data/vllm-serve-flags-0.33.json

It builds the parser exactly as `vllm serve` does (vllm.entrypoints.cli.main: a
FlexibleArgumentParser whose `serve` subparser is filled by make_arg_parser) and writes, per
option string, {dest, nargs, choices, type} (what shared/vllm/serve-flags-0.33.json holds) plus
"value": how vLLM converts and checks the option's values. The format of "value" is described in
launcher/inputs/vllm_options.py. vLLM builds its parser without a GPU only once a platform is chosen; the
CPU platform is used here (the option set is the same: the output's first four keys are checked
against the shared table by tests/test_vllm_flags.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys


def serve_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """(the `vllm` parser, its `serve` subparser), as vllm.entrypoints.cli.main builds them."""
    sys.argv[1:] = []  # vLLM peeks at sys.argv while building (--help, --omni)
    from vllm import platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms.current_platform = CpuPlatform()  # no GPU here: the CUDA platform would not load
    from vllm.entrypoints.cli import serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(prog="vllm")
    subparsers = top.add_subparsers(required=False, dest="subparser")
    return top, serve.ServeSubcommand().subparser_init(subparsers)


def converter_kind(func) -> tuple[str, dict]:
    """vLLM's `type=` function -> (kind, extra keys); wrappers are unwrapped by value_info."""
    import vllm.engine.arg_utils as au
    from vllm.utils import argparse_utils as pu

    named = {int: "int", float: "float", str: "str", json.loads: "json",
             pu.human_readable_int: "human_readable_int",
             pu.human_readable_int_or_auto: "human_readable_int_or_auto",
             au.union_dict_and_str: "dict_or_str", au.parse_reasoning_parser: "reasoning_parser"}
    if func is None:
        return "str", {}
    if func in named:
        return named[func], {}
    if func.__name__ == "parse_dataclass":
        return "dataclass", dataclass_schema(func.__defaults__[0])
    if func.__name__ == "<lambda>":  # told apart by what they do
        if func("Flash-Infer") == "flash_infer":
            return "lower_snake", {}
        if func("0, gpu-1") == [0, "gpu-1"]:
            return "device_ids", {}
    sys.exit(f"extract_vllm_flags: unknown value parser {func!r}: teach converter_kind (and the "
             "stand-in) what it does")


def unwrap(func) -> tuple[str | None, object]:
    """vLLM's optional_type / parse_type closures -> (wrapper name, the function they call)."""
    wrap = None
    while getattr(func, "__name__", "") in ("_optional_type", "_parse_type"):
        wrap = wrap or func.__name__.lstrip("_")  # the outermost one decides: "optional_type"
        func = dict(zip(func.__code__.co_freevars,
                        (c.cell_contents for c in func.__closure__)))["return_type"]
    return wrap, func


def dataclass_schema(cls, root=None, path: tuple = ()) -> dict:
    """{"class": name, "fields": {field: nested schema or null}} when pydantic refuses unknown
    keys (the field names then matter); {"class": name} when it takes any. Nested dataclasses
    are probed through the option's own class, as pydantic validates them."""
    from pydantic import TypeAdapter, ValidationError  # vLLM's own dependency
    from vllm.engine.arg_utils import get_type_hints

    root = root or TypeAdapter(cls)
    probe: object = {"__probe__": 0}
    for key in reversed(path):
        probe = {key: probe}
    schema: dict = {"class": cls.__name__}
    try:
        root.validate_json(json.dumps(probe))
    except (TypeError, ValueError) as e:  # ValidationError, or a validator of vLLM's own
        if isinstance(e, ValidationError) and any(err["loc"] == (*path, "__probe__") for err in e.errors()):
            schema["fields"] = {}
            for f in dataclasses.fields(cls):
                nested = next((t for t in get_type_hints(f.type) if dataclasses.is_dataclass(t)), None)
                schema["fields"][f.name] = (dataclass_schema(nested, root, (*path, f.name))
                                            if nested else None)
    return schema


def action_name(action: argparse.Action) -> str:
    """How argparse names the option in its messages (`argument --x/--no-x: ...`)."""
    return argparse._get_action_name(action)


def value_info(action: argparse.Action, option: str) -> dict:
    info: dict = {"argument": action_name(action)}
    if action.nargs == 0:
        negatives = getattr(action, "negative_option_strings", None) or {
            o for o in action.option_strings if o.startswith("--no-")}
        if isinstance(action, argparse._HelpAction):
            return {**info, "kind": "help"}
        return {**info, "kind": "switch", "sets": option not in negatives}
    wrap, func = unwrap(action.type)
    kind, extra = converter_kind(func)
    info.update(kind=kind, **extra)
    if wrap:
        info["wrap"] = wrap
    if action.choices is not None:
        info["choices"] = list(action.choices)
    if action.nargs == "?":
        info["const"] = action.const
    if isinstance(action, argparse._AppendAction):
        info["append"] = True
    if type(action).__name__ == "LoRAParserAction":
        info["action"] = "lora_modules"
    return info


def table(parser: argparse.ArgumentParser) -> dict[str, dict]:
    """Keys sorted as in the shared table; a dataclass's fields stay in declaration order (the
    order pydantic reports them in)."""
    out = {}
    for action in parser._actions:
        for option in action.option_strings:  # the visible ones, as the shared table has them
            value = value_info(action, option)
            out[option] = {
                "choices": None if action.choices is None else [str(c) for c in action.choices],
                "dest": action.dest,
                "nargs": str(action.nargs),
                "type": getattr(action.type, "__name__", str(action.type)),
                "value": {k: value[k] for k in sorted(value)},
            }
    return {option: out[option] for option in sorted(out)}


def main() -> None:
    _, serve = serve_parser()
    json.dump(table(serve), sys.stdout, indent=0)  # the shared table's layout


if __name__ == "__main__":
    main()
