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


def load_yaml_model(path: Path, model: type[BaseModel], what: str):
    """Parse a YAML file into `model`, turning every failure into a ConfigError naming the file."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError([f"{path}: no such {what} file"]) from None
    except OSError as e:
        raise ConfigError([f"{path}: cannot read ({e.strerror})"]) from None
    try:
        text = raw.decode()
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise ConfigError([f"{path}:{line}: not UTF-8 text (byte {raw[e.start]:#04x}); save the "
                           f"{what} file as UTF-8"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError([f"{path}{where}: malformed YAML: {problem}"]) from None
    except RecursionError:  # PyYAML composes nested nodes recursively
        raise ConfigError([f"{path}: nested too deeply to read; a {what} file is a few levels "
                           "deep (see env/cluster.example.yaml)"]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: expected a mapping of settings, got {type(data).__name__}"])
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError([f"{path}: {field_path(err['loc'])}: {describe(err)}"
                           for err in e.errors()]) from None
