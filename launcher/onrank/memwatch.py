"""The memory guard on one rank. Two ways to run it:

- while loading: from just before `up` starts the engine until the API answers
  (launcher/apply/memguard.py starts it over SSH, reads its stdout and ends it);
- while serving (args "log" and "container_id"): detached on the rank for as long as that
  engine container runs (launcher/apply/servguard.py starts it once the API answers), writing its
  events to the "log" file instead of stdout, so it needs no connection to the control host. A GB10 shares one memory between
CPU and GPU; while 75+ GiB of weights stream in, the page cache refills and the box can freeze
(NVRM NV_ERR_NO_MEMORY) instead of failing cleanly. About once a second it reads /proc/meminfo:

- MemFree below the soft floor: run the relief command (drop page caches, compact memory,
  through the narrow sudoers rule prep uses) -- the seeds' field fix for cold-load freezes;
  at most once per `cooldown` seconds, since `sync` and a drop take time themselves.
- MemAvailable below the hard floor: stop the engine's container at once (`docker kill`) and
  exit; `up` then stops every rank.

Run as `python3 - '<args JSON>'` with this file on stdin (launcher/onrank/__init__.py);
args: soft_free, hard_available (bytes), interval, cooldown (s), relief (a shell command),
container (name), meminfo (path, /proc/meminfo), max_s (give up watching after this; 0: never).
Prints one JSON object per line, flushed: {"t", "avail", "free"} per sample, plus "event":
"start" | "relief" (with "rc", "why") | "hard" | "killed" (with "rc", "why") | "end".
It ends by itself when nobody reads it: the SSH channel closed (the launcher finished or died)
makes the next write fail. Standard library only.

Serving mode adds: log (a JSON-lines file: the events only, each with "at", the unix time, and
"container_id"; no samples), container_id (the engine container it guards: the hard floor kills
that ID, never a newer container of the same name; every `check_s` seconds it asks Docker and
ends with "end" once that container no longer runs), pidfile (it writes its pid there; when a
newer guard has written its own, this one ends: one guard per rank).
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


LOG = {}  # serving mode: {"path", "container_id"}


def emit(record):
    """One line to the launcher; False once nobody reads (the channel is gone). Serving mode:
    events (not samples) appended to the log file, stamped; always True."""
    if LOG:
        if "event" in record:
            stamped = dict(record, at=round(time.time(), 3), container_id=LOG["container_id"])
            with open(LOG["path"], "a") as f:
                f.write(json.dumps(stamped, sort_keys=True) + "\n")
        return True
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


def container_gone(args):
    """Serving mode: why the guarded container no longer runs, or None while it does (or when
    Docker cannot say: an unanswering daemon is no reason to stop guarding)."""
    rc, out = run_shell("docker inspect -f '{{.State.Running}}' %s 2>&1" % args["container_id"], timeout=30)
    if rc == 0:
        return None if out.strip() == "true" else "the engine container stopped"
    return "the engine container is gone" if "no such" in out.lower() else None


def replaced(args):
    """Serving mode: a newer guard wrote its pid over ours."""
    try:
        with open(args["pidfile"]) as f:
            return f.read().strip() != str(os.getpid())
    except OSError:
        return False


def still_wanted(args, t, last_check):
    """(why to end or None, when Docker was last asked): the serving mode's reasons to end."""
    if "container_id" not in args or t - last_check < args.get("check_s", 5):
        return None, last_check
    if args.get("pidfile") and replaced(args):
        return "a newer guard took over", t
    return container_gone(args), t


def watch(args, now=time.monotonic, sleep=time.sleep):
    """The loop; returns the exit code (0: ended, 3: the hard floor stopped the engine)."""
    started = now()
    last_relief = None
    last_check = 0.0
    target = args.get("container_id") or args["container"]
    if not emit({"event": "start", "t": 0.0, "soft_free": args["soft_free"],
                 "hard_available": args["hard_available"]}):
        return 0
    while not args.get("max_s", 3600) or now() - started < args.get("max_s", 3600):
        t = round(now() - started, 2)
        why_end, last_check = still_wanted(args, t, last_check)
        if why_end:
            emit({"event": "end", "t": t, "why": why_end})
            return 0
        avail, free = read_meminfo(args.get("meminfo", "/proc/meminfo"))
        if avail < args["hard_available"]:
            emit({"event": "hard", "t": t, "avail": avail, "free": free,
                  "hard_available": args["hard_available"]})
            rc, why = run_shell("docker kill %s" % target, timeout=30)
            emit({"event": "killed", "t": round(now() - started, 2), "rc": rc, "why": why})
            return 3
        if not emit({"t": t, "avail": avail, "free": free}):
            return 0
        if free < args["soft_free"] and (last_relief is None or now() - last_relief >= args.get("cooldown", 5)):
            last_relief = now()
            rc, why = run_shell(args["relief"])
            after_avail, after_free = read_meminfo(args.get("meminfo", "/proc/meminfo"))
            if not emit({"event": "relief", "t": t, "rc": rc, "why": why, "avail": after_avail,
                         "free": after_free, "avail_before": avail, "free_before": free,
                         "soft_free": args["soft_free"]}):
                return 0
        sleep(args.get("interval", 1.0))
    emit({"event": "end", "t": round(now() - started, 2)})
    return 0


def main(args):
    if args.get("log"):
        LOG.update(path=args["log"], container_id=args["container_id"])
        if args.get("pidfile"):
            with open(args["pidfile"], "w") as f:
                f.write(str(os.getpid()))
    return watch(args)


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
