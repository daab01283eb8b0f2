"""Scripts sent to a rank and run there by its own python3: the probe, the fabric pinger, the
relay's loopback puller and gate, the NCCL all-reduce. Each is self-contained -- the standard
library alone (torch too for the all-reduce, which runs in the serving image) and no import from
`launcher` -- since nothing else is promised on a rank (tests/test_layers.py keeps it so).

The kit imports this package only for `path`, `source` and `invocation`: the ONE way a script is
run over SSH, `python3 - '<args as one JSON object>'` with the script's source on stdin.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

HERE = Path(__file__).resolve().parent


def path(name: str) -> Path:
    """The script's file here: `path("probe")` is onrank/probe.py."""
    return HERE / f"{name}.py"


def source(name: str) -> bytes:
    """The script's bytes, as they are sent to a rank."""
    return path(name).read_bytes()


def invocation(name: str, args: dict) -> tuple[str, bytes]:
    """The one remote command line that runs script `name` with `args`, and the bytes to send on
    its stdin (the script itself)."""
    return f"python3 - {shlex.quote(json.dumps(args, sort_keys=True))}", source(name)


def invocation_keeping_stdin(name: str, args: dict) -> tuple[str, bytes]:
    """Like `invocation`, for a script that reads its own stdin after it starts (the lock
    holder's heartbeats): python3 reads exactly the script's bytes first, the rest is the script's."""
    script = source(name)
    loader = ("import os,sys\nb=b''\n"
              f"while len(b)<{len(script)}:\n"
              f" c=os.read(0,{len(script)}-len(b))\n"
              " if not c:sys.exit('the script was cut short')\n"
              " b+=c\n"
              f"exec(compile(b,{name!r},'exec'))")
    return (f"python3 -c {shlex.quote(loader)} {shlex.quote(json.dumps(args, sort_keys=True))}", script)
