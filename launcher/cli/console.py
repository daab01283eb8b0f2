"""Where the CLI writes (results on stdout, progress and errors on stderr) and how it fails:
errors never show a secret value the run has seen (launcher/redact.py)."""

from __future__ import annotations

import contextlib
import functools
import signal
import sys
import threading

from rich.console import Console

from .. import redact
from ..errors import SparkstackError

err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)


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
