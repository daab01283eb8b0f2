"""Errors a user can cause, each carrying its message and the exit code the CLI ends with.

Exit codes: 1 a step failed on a rank, 2 bad input (config, profile, flags), 3 the plan refuses
(the model does not fit), 130 interrupted (Ctrl+C, SIGTERM, SIGHUP).
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ValidationError

from . import redact


class SparkstackError(Exception):
    exit_code = 1

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class ConfigError(SparkstackError):
    """One or more problems with an input file, one line each: `file: field.path: problem`."""

    exit_code = 2

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


class PlanRefused(SparkstackError):
    exit_code = 3


class Interrupted(SparkstackError):
    """Ctrl+C (or SIGTERM/SIGHUP) ended a command; the message says what was cleaned up."""

    exit_code = 130


def field_path(loc: tuple) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "(top level)"


def describe(error: dict) -> str:
    """One pydantic error as a user reads it: what was expected and what was found."""
    kind, got = error["type"], error.get("input")
    if kind == "extra_forbidden":
        return "unknown key (check the spelling; see env/cluster.example.yaml)"
    if kind == "missing":
        return "required but missing"
    secret = any(isinstance(part, str) and redact.is_secret(part) for part in error.get("loc", ()))
    shown = f" (got {got!r})" if got is not None and not isinstance(got, (dict, list)) and not secret else ""
    return f"{error['msg'].removeprefix('Value error, ')}{shown}"


# A config file (cluster.yaml, a profile, a stage.yaml, `init --merge`'s) is a few KB.
MAX_YAML_BYTES = 1 << 20


class _NoAliasLoader(yaml.SafeLoader):
    """PyYAML's safe loader without anchors and aliases, which no config file needs: nested
    aliases (the "billion laughs") make a few hundred bytes into billions of values, expanded by
    whatever walks the document (an 8 KB cluster.yaml took > 8 GB). Merge keys (`<<: *x`) are
    aliases too."""

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise yaml.composer.ComposerError(
                None, None, "aliases and anchors are not allowed (&name, *name, <<: *name): write "
                "the value out in full", event.start_mark)
        return super().compose_node(parent, index)


def load_yaml(path: Path, what: str) -> dict:
    """A YAML file of settings as a dict; every failure a ConfigError naming the file: unreadable,
    larger than MAX_YAML_BYTES, not UTF-8, malformed, with aliases or anchors, not a mapping."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_YAML_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError([f"{path}: no such {what} file"]) from None
    except OSError as e:
        raise ConfigError([f"{path}: cannot read ({e.strerror})"]) from None
    if len(raw) > MAX_YAML_BYTES:
        size = path.stat().st_size if path.is_file() else len(raw)
        raise ConfigError([f"{path}: is {size} bytes; a {what} file is a few KB (at most "
                           f"{MAX_YAML_BYTES} bytes are read)"])
    try:
        text = raw.decode()
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise ConfigError([f"{path}:{line}: not UTF-8 text (byte {raw[e.start]:#04x}); save the "
                           f"{what} file as UTF-8"]) from None
    try:
        data = yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        kind = "" if "aliases and anchors" in problem else "malformed YAML: "
        raise ConfigError([f"{path}{where}: {kind}{problem}"]) from None
    except RecursionError:  # PyYAML composes nested nodes recursively
        raise ConfigError([f"{path}: nested too deeply to read; a {what} file is a few levels "
                           "deep (see env/cluster.example.yaml)"]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: expected a mapping of settings, got {type(data).__name__}"])
    return data


def load_yaml_model(path: Path, model: type[BaseModel], what: str):
    """Parse a YAML file into `model`, turning every failure into a ConfigError naming the file."""
    data = load_yaml(path, what)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError([f"{path}: {field_path(err['loc'])}: {describe(err)}"
                           for err in e.errors()]) from None
