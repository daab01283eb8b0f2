"""Where the CLI writes (results on stdout, progress and errors on stderr) and how it fails:
errors never show a secret value the run has seen (launcher/redact.py)."""

from __future__ import annotations

import contextlib
import functools
import signal
import sys
import threading

from typing import TYPE_CHECKING

from .. import redact
from ..errors import SparkstackError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text


class _OnFirstUse:
    """A rich Console made the first time it is used: rich costs every command's start ~20 ms
    of imports, and `check --json`, `--version` or a command that prints nothing never use it."""

    def __init__(self, **options):
        self._options, self._console = options, None

    def __getattr__(self, name: str):
        return getattr(self.console, name)

    @property
    def console(self) -> Console:
        """The Console itself: what rich's Live, Progress and `with` want (no dunder reaches
        __getattr__)."""
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)
        return self._console


err = _OnFirstUse(stderr=True, highlight=False, soft_wrap=True)
out = _OnFirstUse(highlight=False, soft_wrap=True)


def make_table(*headers: str) -> Table:
    """The one style of every per-rank table: no box, two spaces between columns, a bold header
    row when `headers` name the columns (else the columns come with the first row)."""
    from rich.table import Table

    made = Table(box=None, pad_edge=False, show_header=bool(headers), header_style="bold")
    for header in headers:
        made.add_column(header)
    return made


def plain(value) -> Text:
    """A cell shown as it is: a host, an error or a value is never read as rich markup."""
    from rich.text import Text

    return Text("" if value is None else str(value))


def print_table(table: Table, console: Console = out) -> None:
    """`table` at its natural width, each row one line with no trailing blanks, whatever the
    terminal's width: a log file, a pipe or a test reads one line per rank."""
    from rich.text import Text

    options = console.options.update(width=10_000, no_wrap=True)
    for line in console.render_lines(table, options, pad=False):
        text = Text.assemble(*((s.text, s.style) for s in line if not s.control))
        text.rstrip()
        console.print(text)


def friendly(interrupted: str = "interrupted"):
    """A command decorator: every failure a user can cause ends as one message per line and the
    error's exit code, Ctrl+C (SIGTERM, SIGHUP) as `interrupted` and 130; never a traceback."""

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                with signals_interrupt():
                    return fn(*args, **kwargs)
            except SparkstackError as e:
                for line in redact.scrub(e.message).splitlines():  # a log tail may echo a secret
                    err.print(f"[bold red]error:[/] {line}", markup=True, highlight=False)
                sys.exit(e.exit_code)
            except KeyboardInterrupt:
                err.print(interrupted, markup=False)
                sys.exit(130)

        return wrapper

    return decorate


@contextlib.contextmanager
def signals_interrupt():
    """SIGTERM (systemd stopping the unit) and SIGHUP (the terminal gone) take Ctrl+C's path,
    so a command cleans up after them as it does after Ctrl+C. Handlers are the main thread's."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(_signum, _frame):
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


friendly_errors = friendly()
