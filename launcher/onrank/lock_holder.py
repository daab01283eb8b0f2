"""The cluster lock, held on rank 0 for as long as one `up`, `down`, `ship`, `prep` or `stage` runs
(launcher/apply/cluster_lock.py). One operator at a time: a person and a cron job, or two people,
must not start and stop the same engines at once.

Run as `python3 - '<args JSON>'` (launcher/onrank/__init__.py); args: path (the lock file),
holder (who asks: user, host, command, since), stale_s. It takes an flock on the file -- the
kernel drops it when this process ends, however it ends -- writes the holder there, prints
{"held": true, "previous": <what the file held>} and then holds the lock while the launcher
sends a line at least every stale_s seconds on its stdin, answering each line with one `+` (so
the launcher knows its lock is still held). A closed channel (the launcher done) clears the file
and ends it; silence for stale_s (the launcher's host gone) ends it leaving the holder in the
file, so the next one says whose lock it took over. Held by another: prints {"held": false,
"holder": ...} and exits 1.

The file is this login user's alone (issue 33): its folder must be one only its owner can write
(made 0700 when missing; one this user owns but others may write, as older versions made it, is
narrowed to 0700) or a sticky one root made; the file is opened without following a link, made
0600 when this run creates it and never chmodded otherwise, and refused unless it is a regular
file of this user with one link. A refusal prints {"held": false, "refused": "<why>"} and exits 3,
having written nothing and printed none of the file's bytes. Standard library only.
"""

import fcntl
import json
import os
import pwd
import select
import stat
import sys


class Refused(Exception):
    pass


def read_holder(f):
    f.seek(0)
    text = f.read(1 << 16).strip()
    if not text:
        return None
    try:
        note = json.loads(text)
    except ValueError:
        note = None
    if not isinstance(note, dict):  # never shown as it is: say only what it is not
        return {"unreadable": "%d bytes that are not a holder's note" % len(text)}
    return note


def write_holder(f, holder):
    f.seek(0)
    f.truncate()
    if holder is not None:
        f.write(json.dumps(holder, sort_keys=True))
    f.flush()
    os.fsync(f.fileno())


def owner(uid):
    try:
        return "%s (uid %d)" % (pwd.getpwuid(uid).pw_name, uid)
    except KeyError:
        return "uid %d" % uid


def open_folder(folder, me):
    """The lock's folder as a file descriptor, once it is safe: only its owner (this user, or
    root) can change its entries, or root made it sticky."""
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise Refused("%s is not a folder (%s): remove it, as its owner or root" % (folder, e.strerror))
    st = os.fstat(fd)
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid == me and mode & 0o022:
        os.fchmod(fd, 0o700)  # ours, left open to others by an older version: narrowed
    elif not (st.st_uid in (me, 0) and not mode & 0o022 or st.st_uid == 0 and mode & stat.S_ISVTX):
        os.close(fd)
        raise Refused("%s belongs to %s with mode %04o: others may change what is in it, so it cannot "
                      "hold this user's lock; have its owner or root remove it" % (folder, owner(st.st_uid), mode))
    return fd


def open_lock(path):
    """The lock file, this user's own (module docstring)."""
    me = os.geteuid()
    folder, name = os.path.split(path)
    dfd = open_folder(folder, me)
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        try:
            fd = os.open(name, flags | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=dfd)
        except FileExistsError:
            fd = os.open(name, flags, dir_fd=dfd)
    except OSError as e:
        kind = "a symbolic link" if os.path.islink(path) else "not this user's to open (%s)" % e.strerror
        raise Refused("%s is %s; sparkstack neither follows nor changes it: have its owner or root "
                      "remove it" % (path, kind))
    finally:
        os.close(dfd)
    st = os.fstat(fd)
    problem = ("not a regular file" if not stat.S_ISREG(st.st_mode) else
               "owned by %s, not by %s" % (owner(st.st_uid), owner(me)) if st.st_uid != me else
               "a file with %d hard links" % st.st_nlink if st.st_nlink != 1 else None)
    if problem:
        os.close(fd)
        raise Refused("%s is %s; sparkstack leaves it as it is: have its owner or root remove it" % (path, problem))
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return os.fdopen(fd, "r+")


def say(record):
    sys.stdout.write(json.dumps(record, sort_keys=True) + "\n")
    sys.stdout.flush()


def hold(args, stdin=sys.stdin.buffer):
    try:
        f = open_lock(args["path"])
    except Refused as e:
        say({"held": False, "refused": str(e)})
        return 3
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
        beats = os.read(fd, 4096)
        if not beats:
            write_holder(f, None)  # released
            return 0
        try:
            sys.stdout.write("+" * beats.count(b"\n"))  # each heartbeat answered: still held
            sys.stdout.flush()
        except OSError:
            return 2


if __name__ == "__main__":
    sys.exit(hold(json.loads(sys.argv[1])))
