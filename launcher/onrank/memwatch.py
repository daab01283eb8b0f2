"""The load-time memory guard on one rank: runs from just before `up` starts the engine until the
API answers (launcher/apply/memguard.py starts it and ends it). A GB10 shares one memory between
CPU and GPU; while 75+ GiB of weights stream in, the page cache refills and the box can freeze
(NVRM NV_ERR_NO_MEMORY) instead of failing cleanly. About once a second it reads /proc/meminfo:

- MemFree below the soft floor: run the relief command (drop page caches, compact memory,
  through the narrow sudoers rule prep uses) -- the seeds' field fix for cold-load freezes;
  at most once per `cooldown` seconds, since `sync` and a drop take time themselves.
- MemAvailable below the hard floor: stop the engine's container at once (`docker kill`) and
  exit; `up` then stops every rank.

Run as `python3 - '<args JSON>'` with this file on stdin (launcher/onrank/__init__.py);
args: soft_free, hard_available (bytes), interval, cooldown (s), relief (a shell command),
container (name), meminfo (path, /proc/meminfo), max_s (give up watching after this).
Prints one JSON object per line, flushed: {"t", "avail", "free"} per sample, plus "event":
"start" | "relief" (with "rc", "why") | "hard" | "killed" (with "rc", "why") | "end".
It ends by itself when nobody reads it: the SSH channel closed (the launcher finished or died)
makes the next write fail. Standard library only.
"""

import json
import os
import subprocess
import sys
import time

KIB = 1024


def read_meminfo(path):
    """(MemAvailable, MemFree) in bytes."""
    values = {}
    with open(path) as f:
        for line in f:
            name, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                values[name.strip()] = int(parts[0]) * KIB
    return values["MemAvailable"], values["MemFree"]


def emit(record):
    """One line to the launcher; False once nobody reads (the channel is gone)."""
    try:
        sys.stdout.write(json.dumps(record, sort_keys=True) + "\n")
        sys.stdout.flush()
        return True
    except (BrokenPipeError, OSError):
        # Python's own flush at exit would fail again (exit 120): point stdout at /dev/null
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return False


def run_shell(command, timeout=60):
    """(exit code, last line of its output) of a shell command."""
    try:
        done = subprocess.run(["sh", "-c", command], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, "timed out after %d s" % timeout
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    return done.returncode, lines[-1] if lines else ""


def watch(args, now=time.monotonic, sleep=time.sleep):
    """The loop; returns the exit code (0: ended, 3: the hard floor stopped the engine)."""
    started = now()
    last_relief = None
    if not emit({"event": "start", "t": 0.0, "soft_free": args["soft_free"],
                 "hard_available": args["hard_available"]}):
        return 0
    while now() - started < args.get("max_s", 3600):
        t = round(now() - started, 2)
        avail, free = read_meminfo(args.get("meminfo", "/proc/meminfo"))
        if avail < args["hard_available"]:
            emit({"event": "hard", "t": t, "avail": avail, "free": free})
            rc, why = run_shell("docker kill %s" % args["container"], timeout=30)
            emit({"event": "killed", "t": round(now() - started, 2), "rc": rc, "why": why})
            return 3
        if not emit({"t": t, "avail": avail, "free": free}):
            return 0
        if free < args["soft_free"] and (last_relief is None or now() - last_relief >= args.get("cooldown", 5)):
            last_relief = now()
            rc, why = run_shell(args["relief"])
            after_avail, after_free = read_meminfo(args.get("meminfo", "/proc/meminfo"))
            if not emit({"event": "relief", "t": t, "rc": rc, "why": why,
                         "avail": after_avail, "free": after_free}):
                return 0
        sleep(args.get("interval", 1.0))
    emit({"event": "end", "t": round(now() - started, 2)})
    return 0


if __name__ == "__main__":
    sys.exit(watch(json.loads(sys.argv[1])))
