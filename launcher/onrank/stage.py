"""A rank's side of `sparkstack stage` (and of `check`'s staged row). Sent on stdin like the probe:

    python3 - '{"mode": "list", "src": "<model.path>", "dst": "<model.local_path>"}'
    python3 -c LOADER '{"mode": "copy", "src": ..., "dst": ..., "files": [[name, size, sha256 or null, mtime]],
                        "bwlimit": <bytes/s, 0: none>, "peer": null or [address, port],
                        "nocache": <true: keep the copy out of the page cache>}'
    python3 -c LOADER '{"mode": "serve", "dir": "<model.local_path>", "bind": "<fabric address>",
                        "names": [...]}'
    (both run with onrank.invocation_keeping_stdin: after the script, stdin carries the phase's
    token, one line -- never on a command line `ps` shows, never printed)

list: one JSON object: the top-level files of both directories (size, mtime in whole seconds),
the temp files a stopped copy left in dst (`.NAME.partial`, their sizes), the free bytes where
dst is (or would be), and the source's checkpoint fingerprint parts (as the probe reads them).
copy: each file into dst/.NAME.partial -- a partial one left by an interrupted copy is resumed
from its end; the temp file is opened without following a link and used only when it is a
regular file of this user with one link (another user's planted link or file is named, never
written through) -- then size-checked, hashed against the given sha256 (the whole file, the resumed
part included), given the source's mtime and renamed to NAME. It prints `P <bytes>` (copied so
far by this run) at most every PROGRESS_S, `D <name>` when a file is in place, `E <name> <why>`
when one is not (its temp file kept unless its hash was wrong). Exit 0 when every file is in place.
serve: a peer source. Listens on `bind` (the rank's fabric address a reader reaches), a port the
kernel picks, printed as `PORT <n>`; each connection asks `<name> <offset>\n<token>\n` (at most
MAX_REQUEST bytes, within REQUEST_TIMEOUT_S) for one of `names` in `dir` and, when the token is
the phase's, gets its bytes from that offset; a link or anything but a regular file is not
served. At most POOL connections at once (one more is closed at once: the reader retries), a
send that stalls SEND_TIMEOUT_S ends its connection, and a bad request ends only its own. It
ends when its stdin closes (the kit is done). A copy with `peer` reads from there instead of
`src` (reconnecting where it stopped when the server closed early), and gives each file the
mtime it was given. Standard library only.
"""

import hashlib
import hmac
import json
import os
import re
import socket
import stat
import sys
import threading
import time

PROGRESS_S = 0.5
CHUNK = 1 << 20
MAX_REQUEST = 4096  # bytes of a peer's two request lines
REQUEST_TIMEOUT_S = 10  # for those lines to arrive
SEND_TIMEOUT_S = 60  # for one block to leave
POOL = 16  # connections served at once
RETRY_S, RETRIES = 1.0, 30  # a reader's reconnects when the server closed without progress
OFFSET = re.compile(rb"[0-9]{1,19}")  # ASCII digits only (str.isdigit takes "\u00b2", int() does not)


def partial_name(name):
    return "." + name + ".partial"


def top_files(path, follow=True):
    """{name: [size, mtime]} of the directory's regular, not hidden, top-level files (a link to
    one counts only with `follow`: in the source, not in a copy, where another user may plant it)."""
    out = {}
    for entry in os.scandir(path):
        if not entry.name.startswith(".") and entry.is_file(follow_symlinks=follow):
            st = entry.stat(follow_symlinks=follow)
            out[entry.name] = [st.st_size, int(st.st_mtime)]
    return out


def sha256_file(path):
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(CHUNK), b""):
                h.update(block)
    except OSError:
        return None
    return h.hexdigest()


def free_bytes(path):
    """Free bytes (for an unprivileged user) on the filesystem that holds, or would hold, path."""
    while path and not os.path.exists(path):
        path = os.path.dirname(path.rstrip("/")) or "/"
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize, path


def why(e):
    return "%s: %s" % (type(e).__name__, e.strerror or e) if isinstance(e, OSError) else str(e)


def listing(src, dst):
    out = {}
    try:
        files = top_files(src)
        shards = sorted(n for n in files if n.endswith(".safetensors"))
        out["src"] = {"files": files, "checkpoint": {
            "dir": src, "shards": [[n, files[n][0]] for n in shards],
            "config_sha256": sha256_file(os.path.join(src, "config.json")),
            "index_sha256": sha256_file(os.path.join(src, "model.safetensors.index.json"))}}
    except OSError as e:
        out["src"] = {"error": why(e)}
    try:
        found = {e.name: e.stat(follow_symlinks=False).st_size for e in os.scandir(dst)
                 if e.is_file(follow_symlinks=False)}
        out["dst"] = {"files": top_files(dst, follow=False),
                      "partial": {n[1:-len(".partial")]: s for n, s in found.items()
                                  if n.startswith(".") and n.endswith(".partial")}}
    except FileNotFoundError:
        out["dst"] = {"absent": True}
    except OSError as e:
        out["dst"] = {"error": why(e)}
    try:
        out["free"], out["free_at"] = free_bytes(dst)
    except OSError as e:
        out["free_error"] = why(e)
    return out


DROP_EVERY = 64 << 20  # nocache: written bytes flushed and dropped from the page cache this often


def drop_cache(f, sync=False):
    """Tell the kernel this file's cached pages are not needed (POSIX_FADV_DONTNEED); written
    pages must reach the disk first (fdatasync), or they stay dirty and cached. A socket (a
    peer's copy) or a system without fadvise: nothing to do."""
    try:
        fd = f.fileno()
        if sync:
            os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except (AttributeError, OSError, ValueError):
        pass


class Copier:
    """nocache: keep this copy out of the page cache (on a GB10 the cache is the GPU's memory:
    an upgrade's copy next to a serving engine must not fill it, issue 29)."""

    def __init__(self, bwlimit, nocache=False):
        self.bwlimit = bwlimit
        self.nocache = nocache
        self.copied = 0
        self.started = self.last = time.monotonic()

    def tick(self, n):
        self.copied += n
        now = time.monotonic()
        if self.bwlimit:  # sleep until this run's average is back under the limit
            ahead = self.copied / self.bwlimit - (now - self.started)
            if ahead > 0:
                time.sleep(ahead)
                now = time.monotonic()
        if now - self.last >= PROGRESS_S:
            self.last = now
            say("P %d" % self.copied)

    def one(self, src, dst, name, size, sha, mtime=None, peer=None, token=None):
        tmp = os.path.join(dst, partial_name(name))
        fout = open_partial(tmp)
        if isinstance(fout, str):
            return fout
        with fout:
            have = os.fstat(fout.fileno()).st_size
            if have > size:  # not this file's prefix: start over
                have = 0
            h = hashlib.sha256() if sha else None
            if h and have:
                left = have
                while left:
                    block = fout.read(min(CHUNK, left))
                    if not block:
                        break
                    h.update(block)
                    left -= len(block)
            with open_source(src, name, have, peer, token, size) as fin:
                fout.truncate(have)
                fout.seek(have)
                unsynced = 0
                while True:
                    block = fin.read(CHUNK)
                    if not block:
                        break
                    fout.write(block)
                    if h:
                        h.update(block)
                    self.tick(len(block))
                    unsynced += len(block)
                    if self.nocache and unsynced >= DROP_EVERY:
                        fout.flush()
                        drop_cache(fout, sync=True)
                        drop_cache(fin)
                        unsynced = 0
                fout.flush()
                os.fsync(fout.fileno())
                if self.nocache:
                    drop_cache(fout)
                    drop_cache(fin)
                got = fout.tell()
            if got != size:
                return "%d bytes copied, %d expected: the source changed while copying? re-run" % (got, size)
            if h and h.hexdigest() != sha:
                os.unlink(tmp)
                return "sha256 %s, the manifest says %s: the source's copy is corrupt or changed" % (
                    h.hexdigest()[:12], sha[:12])
            if peer:
                os.utime(fout.fileno(), (mtime, mtime))
            else:
                st = os.stat(os.path.join(src, name))
                os.utime(fout.fileno(), ns=(st.st_atime_ns, st.st_mtime_ns))
        os.replace(tmp, os.path.join(dst, name))  # renames the entry itself, never a link's target
        return None


def open_partial(tmp):
    """The temp file, read-write, created 0644 or resumed: never through a link, and only a regular
    file of this user with one link (another user may write where dst is). Else why not, a str."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        try:
            fd = os.open(tmp, flags | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            fd = os.open(tmp, flags)
    except OSError as e:
        if os.path.islink(tmp):
            return "%s is a symbolic link, not a copy of ours: not followed; remove it and re-run" % tmp
        return "cannot open %s: %s" % (tmp, why(e))
    st = os.fstat(fd)
    problem = ("not a regular file" if not stat.S_ISREG(st.st_mode) else
               "owned by uid %d, not by this user (uid %d)" % (st.st_uid, os.geteuid())
               if st.st_uid != os.geteuid() else
               "a file with %d hard links" % st.st_nlink if st.st_nlink != 1 else None)
    if problem:
        os.close(fd)
        return "%s is %s: not written; remove it and re-run" % (tmp, problem)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "r+b")


def open_source(src, name, offset, peer, token=None, size=None):
    """The file's bytes from `offset`: the source file, or a peer's copy over a socket."""
    if not peer:
        f = open(os.path.join(src, name), "rb")
        f.seek(offset)
        return f
    return PeerFile(tuple(peer), name, offset, token or "", size)


class PeerFile:
    """A peer's copy from `offset`, read as a file; a connection the server closed before `size`
    (its pool full, a dropped link) is opened again where it stopped, RETRIES times without
    progress at most."""

    def __init__(self, peer, name, offset, token, size):
        self.peer, self.name, self.offset, self.token, self.size = peer, name, offset, token, size
        self.conn = None
        self.tries = 0

    def _open(self):
        self.conn = socket.create_connection(self.peer, timeout=60)
        self.conn.sendall(("%s %d\n%s\n" % (self.name, self.offset, self.token)).encode())

    def read(self, n):
        while True:
            if self.conn is None:
                self._open()
            block = self.conn.recv(n)
            if block:
                self.offset += len(block)
                self.tries = 0
                return block
            self.close()
            if self.size is None or self.offset >= self.size or self.tries >= RETRIES:
                return b""
            self.tries += 1
            time.sleep(RETRY_S)

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_request(conn):
    """A peer's two lines (what, and the token), or None: too long, too slow, cut short."""
    buffer = b""
    while buffer.count(b"\n") < 2:
        if len(buffer) >= MAX_REQUEST:
            return None
        chunk = conn.recv(MAX_REQUEST - len(buffer))
        if not chunk:
            return None
        buffer += chunk
    request, token = buffer.split(b"\n")[:2]
    return request, token


def open_served(folder, name):
    """The file to serve, read-only: a regular file reached without following a link, else None."""
    try:
        fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def serve(args, token):
    """Hand out the named files of `dir` to the ranks that ask with the token, until stdin closes."""
    names = set(args["names"])
    secret = token.encode()
    timeouts = args.get("timeouts") or [REQUEST_TIMEOUT_S, SEND_TIMEOUT_S]  # tests shorten them
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((args["bind"], 0))
    listener.listen(16)
    say("PORT %d" % listener.getsockname()[1])
    slots = threading.BoundedSemaphore(POOL)

    def answer(conn):
        conn.settimeout(timeouts[0])
        asked = read_request(conn)
        if asked is None or not secret or not hmac.compare_digest(asked[1], secret):
            return
        name, _, offset = asked[0].rpartition(b" ")
        try:
            name = name.decode("utf-8")
        except UnicodeDecodeError:
            return
        if name not in names or not OFFSET.fullmatch(offset):
            return
        f = open_served(args["dir"], name)
        if f is None:
            return
        with f:
            f.seek(int(offset))
            conn.settimeout(timeouts[1])
            for block in iter(lambda: f.read(CHUNK), b""):
                conn.sendall(block)

    def handle(conn):
        try:
            with conn:
                answer(conn)
        except Exception:  # a reader's problem ends its connection, never the server
            pass
        finally:
            slots.release()

    def accept():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # EMFILE and the like: the pool bounds it, and it passes
                time.sleep(0.1)
                continue
            if not slots.acquire(blocking=False):
                conn.close()  # full: the reader retries
                continue
            try:
                threading.Thread(target=handle, args=(conn,), daemon=True).start()
            except RuntimeError:
                slots.release()
                conn.close()

    threading.Thread(target=accept, daemon=True).start()
    while sys.stdin.buffer.read(1 << 16):
        pass
    return 0


def stdin_token():
    """The phase's token: the line after the script on stdin."""
    return sys.stdin.buffer.readline().strip().decode("ascii", "replace")


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()  # a closed connection ends the copy here (EPIPE) within PROGRESS_S


def copy(args):
    src, dst = args["src"], args["dst"]
    try:
        os.makedirs(dst, exist_ok=True)
    except OSError as e:
        say("E %s cannot create the directory: %s" % (dst, why(e)))
        return 1
    copier = Copier(args.get("bwlimit") or 0, bool(args.get("nocache")))
    failed = 0
    peer = args.get("peer")
    token = stdin_token() if peer else None
    for name, size, sha, mtime in args["files"]:
        try:
            problem = copier.one(src, dst, name, size, sha, mtime, peer, token)
        except OSError as e:
            problem = why(e)
        if problem:
            failed += 1
            say("E %s %s" % (name, problem))
        else:
            say("D %s" % name)
    say("P %d" % copier.copied)
    fd = os.open(dst, os.O_RDONLY)
    try:
        os.fsync(fd)  # the renames too
    finally:
        os.close(fd)
    return 1 if failed else 0


def main():
    args = json.loads(sys.argv[1])
    if args["mode"] == "list":
        print(json.dumps(listing(args["src"], args["dst"]), sort_keys=True))
        return 0
    return serve(args, stdin_token()) if args["mode"] == "serve" else copy(args)


if __name__ == "__main__":
    sys.exit(main())
