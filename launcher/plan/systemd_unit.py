"""The systemd unit `sparkstack systemd-unit` prints (templates/sparkstack-up.service.j2), with
every path quoted as systemd reads it back (systemd.syntax(7), systemd.service(5) "Command
lines"): a space, quote, `%` or `$` in the config's or the venv's path stays part of that path."""

from __future__ import annotations

import jinja2

from .. import resources
from ..errors import ConfigError

TEMPLATES = resources.TEMPLATES_DIR


def quoted(text: str) -> str:
    """One double-quoted word: `\\` and `"` escaped, `%` doubled (specifiers are expanded in
    every setting). `$` stays: neither Environment= nor ExecStart='s executable expands variables."""
    return '"' + _one_line(text).replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%") + '"'


def executable(path: str) -> str:
    """ExecStart='s executable: systemd refuses one with a quote or backslash in it, quoted or not."""
    if any(c in path for c in "\\\"'"):
        raise ConfigError([f"{path}: systemd refuses an ExecStart= executable with a quote or backslash "
                           "in its path; install sparkstack in a directory without them"])
    return quoted(path)


def path_value(text: str) -> str:
    """A path setting such as WorkingDirectory=: the rest of the line, specifiers expanded."""
    return _one_line(text).replace("%", "%%")


def _one_line(text: str) -> str:
    if any(c in text for c in "\n\r\0"):
        raise ConfigError([f"{text!r}: a path with a line break or NUL cannot go in a systemd unit; "
                           "move or rename it"])
    return str(text)


def render(**values) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True)
    env.filters.update(quoted=quoted, executable=lambda p: executable(str(p)),
                       path_value=lambda p: path_value(str(p)))
    return env.get_template("sparkstack-up.service.j2").render(**values)
