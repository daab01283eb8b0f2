"""The cluster lock, held on rank 0 for as long as one `up`, `down`, `ship` or `prep` runs
(launcher/apply/cluster_lock.py). One operator at a time: a person and a cron job, or two people,
must not start and stop the same engines at once.

Run as `python3 - '<args JSON>'` (launcher/onrank/__init__.py); args: path (the lock file),
holder (who asks: user, host, command, since), stale_s. It takes an flock on the file -- the
kernel drops it when this process ends, however it ends -- writes the holder there, prints
{"held": true, "previous": <what the file held>} and then holds the lock while the launcher
sends a line at least every stale_s seconds on its stdin. A closed channel (the launcher done)
clears the file and ends it; silence for stale_s (the launcher's host gone) ends it leaving the
holder in the file, so the next one says whose lock it took over. Held by another:
prints {"held": false, "holder": ...} and exits 1. Standard library only.
"""

import fcntl
import json
import os
import select
import sys


def read_holder(f):
    f.seek(0)
    text = f.read().strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return {"unreadable": text[:200]}


def write_holder(f, holder):
    f.seek(0)
    f.truncate()
    if holder is not None:
        f.write(json.dumps(holder, sort_keys=True))
    f.flush()
    os.fsync(f.fileno())


def open_shared(path):
    """The lock file, readable and writable by every user of the rank (two operators may log in
    as different users); a folder without the sticky bit, where the kernel's protected_regular
    would refuse opening another user's file."""
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        os.makedirs(folder, exist_ok=True)
        try:
            os.chmod(folder, 0o777)
        except OSError:
            pass
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        os.fchmod(fd, 0o666)
    except OSError:
        pass  # another user's file: already shared
    return os.fdopen(fd, "r+")


def say(record):
    sys.stdout.write(json.dumps(record, sort_keys=True) + "\n")
    sys.stdout.flush()


def hold(args, stdin=sys.stdin.buffer):
    f = open_shared(args["path"])
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        say({"held": False, "holder": read_holder(f)})
        return 1
    previous = read_holder(f)  # a holder left there: its launcher stopped answering
    write_holder(f, args["holder"])
    say({"held": True, "previous": previous})
    fd = stdin.fileno()
    while True:
        ready, _, _ = select.select([fd], [], [], args["stale_s"])
        if not ready:
            return 2  # silence: the holder stays in the file for the next one to name
        if not os.read(fd, 4096):
            write_holder(f, None)  # released
            return 0


if __name__ == "__main__":
    sys.exit(hold(json.loads(sys.argv[1])))
