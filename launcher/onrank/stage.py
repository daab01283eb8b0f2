"""A rank's side of `sparkstack stage` (and of `check`'s staged row). Sent on stdin like the probe:

    python3 - '{"mode": "list", "src": "<model.path>", "dst": "<model.local_path>"}'
    python3 - '{"mode": "copy", "src": ..., "dst": ..., "files": [[name, size, sha256 or null, mtime]],
                "bwlimit": <bytes/s, 0: none>, "peer": null or [address, port]}'
    (serve: run with onrank.invocation_keeping_stdin)
    python3 -c LOADER '{"mode": "serve", "dir": "<model.local_path>", "bind": "<fabric address>",
                        "names": [...]}'

list: one JSON object: the top-level files of both directories (size, mtime in whole seconds),
the temp files a stopped copy left in dst (`.NAME.partial`, their sizes), the free bytes where
dst is (or would be), and the source's checkpoint fingerprint parts (as the probe reads them).
copy: each file into dst/.NAME.partial -- a partial one left by an interrupted copy is resumed
from its end -- then size-checked, hashed against the given sha256 (the whole file, the resumed
part included), given the source's mtime and renamed to NAME. It prints `P <bytes>` (copied so
far by this run) at most every PROGRESS_S, `D <name>` when a file is in place, `E <name> <why>`
when one is not (its temp file kept unless its hash was wrong). Exit 0 when every file is in place.
serve: a peer source. Listens on `bind` (the rank's fabric address a reader reaches), a port the
kernel picks, printed as `PORT <n>`; each connection asks `<name> <offset>\n` for one of `names`
in `dir` and gets its bytes from that offset. It ends when its stdin closes (the kit is done).
A copy with `peer` reads from there instead of `src`, and gives each file the mtime it was given.
Standard library only.
"""

import hashlib
import json
import os
import socket
import sys
import threading
import time

PROGRESS_S = 0.5
CHUNK = 1 << 20


def partial_name(name):
    return "." + name + ".partial"


def top_files(path):
    """{name: [size, mtime]} of the directory's regular, not hidden, top-level files."""
    out = {}
    for entry in os.scandir(path):
        if not entry.name.startswith(".") and entry.is_file(follow_symlinks=True):
            st = entry.stat(follow_symlinks=True)
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
        found = {e.name: e.stat().st_size for e in os.scandir(dst) if e.is_file()}
        out["dst"] = {"files": top_files(dst),
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


class Copier:
    def __init__(self, bwlimit):
        self.bwlimit = bwlimit
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

    def one(self, src, dst, name, size, sha, mtime=None, peer=None):
        tmp = os.path.join(dst, partial_name(name))
        have = os.path.getsize(tmp) if os.path.exists(tmp) else 0
        if have > size:  # not this file's prefix: start over
            have = 0
        h = hashlib.sha256() if sha else None
        if h and have:
            with open(tmp, "rb") as f:
                left = have
                while left:
                    block = f.read(min(CHUNK, left))
                    if not block:
                        break
                    h.update(block)
                    left -= len(block)
        with open_source(src, name, have, peer) as fin, open(tmp, "r+b" if have else "wb") as fout:
            fout.truncate(have)
            fout.seek(have)
            while True:
                block = fin.read(CHUNK)
                if not block:
                    break
                fout.write(block)
                if h:
                    h.update(block)
                self.tick(len(block))
            fout.flush()
            os.fsync(fout.fileno())
            got = fout.tell()
        if got != size:
            return "%d bytes copied, %d expected: the source changed while copying? re-run" % (got, size)
        if h and h.hexdigest() != sha:
            os.unlink(tmp)
            return "sha256 %s, the manifest says %s: the source's copy is corrupt or changed" % (
                h.hexdigest()[:12], sha[:12])
        if peer:
            os.utime(tmp, (mtime, mtime))
        else:
            st = os.stat(os.path.join(src, name))
            os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
        os.replace(tmp, os.path.join(dst, name))
        return None


def open_source(src, name, offset, peer):
    """The file's bytes from `offset`: the source file, or a peer's copy over a socket."""
    if not peer:
        f = open(os.path.join(src, name), "rb")
        f.seek(offset)
        return f
    conn = socket.create_connection(tuple(peer), timeout=60)
    conn.sendall(("%s %d\n" % (name, offset)).encode())
    return conn.makefile("rb")


def serve(args):
    """Hand out the named files of `dir` to the ranks that ask, until stdin closes."""
    names = set(args["names"])
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((args["bind"], 0))
    listener.listen(16)
    say("PORT %d" % listener.getsockname()[1])

    def handle(conn):
        with conn:
            request = conn.makefile("rb").readline().decode(errors="replace").split()
            if len(request) != 2 or request[0] not in names or not request[1].isdigit():
                return
            with open(os.path.join(args["dir"], request[0]), "rb") as f:
                f.seek(int(request[1]))
                for block in iter(lambda: f.read(CHUNK), b""):
                    conn.sendall(block)

    def accept():
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    while sys.stdin.buffer.read(1 << 16):
        pass
    return 0


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
    copier = Copier(args.get("bwlimit") or 0)
    failed = 0
    peer = args.get("peer")
    for name, size, sha, mtime in args["files"]:
        try:
            problem = copier.one(src, dst, name, size, sha, mtime, peer)
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
    return serve(args) if args["mode"] == "serve" else copy(args)


if __name__ == "__main__":
    sys.exit(main())
