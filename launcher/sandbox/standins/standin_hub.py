"""SANDBOX STAND-IN for the Hugging Face Hub (huggingface.co): the few endpoints `sparkstack
fetch`'s client (huggingface_hub, pointed here by HF_ENDPOINT) calls, with the headers the real
Hub sends, serving checkpoints from local directories. Stdlib only (Python 3.8).

- GET /api/models/{repo}[/revision/{rev}][?blobs=true]: the model info; with blobs, each
  sibling's size and git blob id, and each LFS file's sha256, size and pointer size;
- HEAD/GET /{repo}/resolve/{rev}/{path}: a small (non-LFS) file answers 200 with ETag (its git
  blob sha1), X-Repo-Commit and Content-Length; an LFS file answers 302 to its "CDN" URL with
  X-Repo-Commit, ETag (the pointer's blob id), X-Linked-Etag (its sha256) and X-Linked-Size;
- GET /cdn/{sha256}: the LFS object, with Range requests (206, Content-Range);
- a gated repository without a token: 401, X-Error-Code: GatedRepo and the Hub's message; with
  a token the repository has not granted: 403 and the Hub's "not in the authorized list" message;
  an unknown repository 401 RepoNotFound, an unknown revision 404 RevisionNotFound, an unknown
  file 404 EntryNotFound, as the Hub answers them.

For tests and benchmarks (never on the real Hub): `rate` caps the bytes per second it sends
(a link's speed), `corrupt` names files whose next download is sent with one byte flipped (a
shard corrupted in transit), `cut` drops a file's next download after so many bytes (a lost
connection), and `served` counts the object bytes each file sent.

Run: python3 standin_hub.py --dir DIR --repo ORG/NAME [--gated] [--host 127.0.0.1] [--port 0]
"""

import argparse
import hashlib
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

BANNER = "SANDBOX STAND-IN Hugging Face Hub"
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf", ".model")  # as a repo's .gitattributes
LOCAL_HOSTS = ("127.", "::1", "localhost")


def git_blob_sha1(data):
    """git's object id of a blob: sha1 over "blob <size>\\0" and the bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Repo:
    """One model repository: its files (from a directory), one commit, gated or not."""

    def __init__(self, repo_id, directory, gated=False, granted=()):
        self.id, self.dir, self.gated, self.granted = repo_id, directory, gated, set(granted)
        self.files = {}
        for root, dirs, names in os.walk(directory):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(names):
                if name.startswith("."):
                    continue
                path = os.path.join(root, name)
                rel = os.path.relpath(path, directory).replace(os.sep, "/")
                size = os.path.getsize(path)
                entry = {"rfilename": rel, "size": size, "path": path}
                if rel.endswith(LFS_SUFFIXES):
                    sha = sha256_file(path)
                    pointer = ("version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n"
                               % (sha, size)).encode()
                    entry.update(blobId=git_blob_sha1(pointer),
                                 lfs={"sha256": sha, "size": size, "pointerSize": len(pointer)})
                else:
                    with open(path, "rb") as f:
                        entry["blobId"] = git_blob_sha1(f.read())
                self.files[rel] = entry
        tree = json.dumps([[e["rfilename"], e["blobId"]] for e in self.files.values()]).encode()
        self.commit = hashlib.sha1(b"sparkstack standin commit\0" + repo_id.encode() + tree).hexdigest()
        self.by_sha = {e["lfs"]["sha256"]: e for e in self.files.values() if "lfs" in e}

    def info(self, blobs):
        siblings = []
        for e in self.files.values():
            s = {"rfilename": e["rfilename"]}
            if blobs:
                s.update({k: e[k] for k in ("blobId", "size", "lfs") if k in e})
            siblings.append(s)
        org = self.id.split("/")[0]
        return {"_id": hashlib.sha1(self.id.encode()).hexdigest()[:24], "id": self.id, "modelId": self.id,
                "author": org, "sha": self.commit, "lastModified": "2026-11-30T12:00:00.000Z",
                "createdAt": "2026-11-30T12:00:00.000Z", "private": False,
                "gated": "manual" if self.gated else False, "disabled": False, "downloads": 0, "likes": 0,
                "library_name": "transformers", "tags": ["safetensors", "sandbox-standin"],
                "siblings": siblings,
                "usedStorage": sum(e["size"] for e in self.files.values())}


class Hub(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, repos, rate=0, quiet=True):
        host = address[0]
        if not (host.startswith(LOCAL_HOSTS) or _is_private(host)):
            raise ValueError("%s: the stand-in Hub listens on loopback or the sandbox network only" % host)
        super().__init__(address, Handler)
        self.repos = {r.id: r for r in repos}
        self.rate = rate  # bytes/s, 0: as fast as it goes
        self.corrupt = set()  # file names whose next download is corrupted in transit
        self.cut = {}  # file name -> bytes after which its next download's connection is dropped
        self.served = {}  # file name -> object bytes sent
        self.requests = []  # (method, path, range) of each request
        self.lock = threading.Lock()
        self.quiet = quiet

    @property
    def url(self):
        host, port = self.server_address[:2]
        return "http://%s:%d" % (host if ":" not in host else "[%s]" % host, port)

    def handle_error(self, request, client_address):
        """A client gone mid-answer (Ctrl+C, a cut connection) is no error of the Hub's."""
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)

    def reset_counts(self):
        with self.lock:
            self.served.clear()
            del self.requests[:]

    def start(self):
        t = threading.Thread(target=self.serve_forever, name="standin-hub", daemon=True)
        t.start()
        return self


def _is_private(host):
    import ipaddress
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_private  # the sandbox's bridges (172.x / 10.x / 192.168.x); never a public address


class Handler(BaseHTTPRequestHandler):
    server_version = "sparkstack-standin-hub"
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        if not self.server.quiet:
            sys.stderr.write("%s: %s\n" % (BANNER, fmt % args))

    def do_HEAD(self):
        self._route(head=True)

    def do_GET(self):
        self._route(head=False)

    # -- helpers -----------------------------------------------------------------------------
    def _send(self, status, headers=(), body=b"", head=False):
        self.send_response(status)
        self.send_header("X-Request-Id", "Root=1-standin-%d" % id(self))
        self.send_header("Access-Control-Expose-Headers",
                         "X-Repo-Commit,X-Request-Id,X-Error-Code,X-Error-Message,X-Total-Count,ETag,"
                         "Link,Accept-Ranges,Content-Range,X-Linked-Size,X-Linked-ETag,X-Xet-Hash")
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head and body:
            self.wfile.write(body)

    def _error(self, status, code, message, head=False):
        body = json.dumps({"error": message}).encode()
        self._send(status, [("Content-Type", "application/json; charset=utf-8"), ("X-Error-Code", code),
                            ("X-Error-Message", message)], body, head)

    def _token(self):
        auth = self.headers.get("Authorization", "")
        return auth[7:].strip() if auth.lower().startswith("bearer ") else None

    def _allowed(self, repo, head):
        """A gated repository's files: only to a token it granted (the Hub's 401 and 403)."""
        if not repo.gated:
            return True
        token = self._token()
        if not token:
            self._error(401, "GatedRepo", "Access to model %s is restricted. You must have access to it and be "
                        "authenticated to access it. Please log in." % repo.id, head)
            return False
        if token not in repo.granted:
            self._error(403, "GatedRepo", "Access to model %s is restricted and you are not in the authorized "
                        "list. Visit https://huggingface.co/%s to ask for access." % (repo.id, repo.id), head)
            return False
        return True

    def _route(self, head):
        parts = urlsplit(self.path)
        path = unquote(parts.path)
        with self.server.lock:
            self.server.requests.append((self.command, path, self.headers.get("Range")))
        if path.startswith("/api/models/"):
            return self._model_info(path[len("/api/models/"):], parse_qs(parts.query), head)
        if path.startswith("/cdn/"):
            return self._object(path[len("/cdn/"):], head)
        if "/resolve/" in path:
            repo_id, _, rest = path.lstrip("/").partition("/resolve/")
            rev, _, name = rest.partition("/")
            return self._resolve(repo_id, rev, name, head)
        self._error(404, "EntryNotFound", "Not Found", head)

    def _repo(self, repo_id, head):
        repo = self.server.repos.get(repo_id)
        if repo is None:
            self._error(401, "RepoNotFound", "Repository not found", head)
        return repo

    def _model_info(self, rest, query, head):
        repo_id, _, rev = rest.partition("/revision/")
        repo = self._repo(repo_id, head)
        if repo is None:
            return
        if rev and rev not in ("main", repo.commit):
            return self._error(404, "RevisionNotFound", "Invalid rev id: %s" % rev, head)
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        body = json.dumps(repo.info(blobs)).encode()
        self._send(200, [("Content-Type", "application/json; charset=utf-8")], body, head)

    def _resolve(self, repo_id, rev, name, head):
        repo = self._repo(repo_id, head)
        if repo is None:
            return
        if rev not in ("main", repo.commit):
            return self._error(404, "RevisionNotFound", "Invalid rev id: %s" % rev, head)
        if not self._allowed(repo, head):
            return
        entry = repo.files.get(name)
        if entry is None:
            return self._error(404, "EntryNotFound", "Entry not found", head)
        common = [("X-Repo-Commit", repo.commit), ("Accept-Ranges", "bytes"), ("Vary", "Origin, Accept")]
        if "lfs" in entry:
            sha = entry["lfs"]["sha256"]
            location = "%s/cdn/%s?name=%s" % (self.server.url, sha, quote(name))
            body = ("Found. Redirecting to %s" % location).encode()
            return self._send(302, common + [("Location", location), ("ETag", '"%s"' % entry["blobId"]),
                                             ("X-Linked-Etag", '"%s"' % sha),
                                             ("X-Linked-Size", str(entry["size"])),
                                             ("Content-Type", "text/plain; charset=utf-8")], body, head)
        with open(entry["path"], "rb") as f:
            data = f.read()
        self._body(entry, data, common + [("ETag", '"%s"' % entry["blobId"])], head)

    def _object(self, sha, head):
        sha = sha.split("?")[0]
        entry = None
        for repo in self.server.repos.values():
            entry = entry or repo.by_sha.get(sha)
        if entry is None:
            return self._error(404, "EntryNotFound", "Not Found", head)
        self._body(entry, None, [("ETag", '"%s"' % sha), ("Content-Type", "binary/octet-stream")], head)

    def _body(self, entry, data, headers, head):
        """The file's bytes (or the Range asked), at the hub's rate, counted; corrupted once when asked."""
        size = entry["size"]
        start, end, status = 0, size - 1, 200
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            a, _, b = rng[6:].split(",")[0].partition("-")
            start = int(a) if a else max(0, size - int(b))
            end = min(int(b), size - 1) if a and b else size - 1
            if start >= size:
                return self._send(416, [("Content-Range", "bytes */%d" % size)], b"", head)
            status = 206
            headers = headers + [("Content-Range", "bytes %d-%d/%d" % (start, end, size))]
        length = end - start + 1
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        if head:
            return
        name = entry["rfilename"]
        with self.server.lock:
            corrupt = name in self.server.corrupt
            self.server.corrupt.discard(name)
            cut = self.server.cut.pop(name, None)
        flip = start + length // 2 if corrupt else -1
        sent, began = 0, time.monotonic()
        with open(entry["path"], "rb") as f:
            f.seek(start)
            while sent < length:
                if cut is not None and sent >= cut:  # a lost connection: the body ends short
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                block = f.read(min(256 * 1024, length - sent, *([cut - sent] if cut is not None else [])))
                if not block:
                    break
                if start + sent <= flip < start + sent + len(block):
                    i = flip - start - sent
                    block = block[:i] + bytes([block[i] ^ 0xFF]) + block[i + 1:]
                try:
                    self.wfile.write(block)
                except (BrokenPipeError, ConnectionResetError):
                    return
                sent += len(block)
                with self.server.lock:
                    self.server.served[name] = self.server.served.get(name, 0) + len(block)
                if self.server.rate:
                    ahead = sent / self.server.rate - (time.monotonic() - began)
                    if ahead > 0:
                        time.sleep(ahead)


def main(argv=None):
    p = argparse.ArgumentParser(description=BANNER)
    p.add_argument("--dir", required=True)
    p.add_argument("--repo", required=True)
    p.add_argument("--gated", action="store_true")
    p.add_argument("--granted", action="append", default=[], help="a token the gated repository accepts")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--rate", type=float, default=0, help="bytes per second (0: no cap)")
    a = p.parse_args(argv)
    hub = Hub((a.host, a.port), [Repo(a.repo, a.dir, a.gated, a.granted)], rate=a.rate, quiet=False)
    sys.stderr.write("%s: %s serving %s from %s\n" % (BANNER, hub.url, a.repo, a.dir))
    sys.stderr.flush()
    print(hub.url, flush=True)
    hub.serve_forever()


if __name__ == "__main__":
    main()
