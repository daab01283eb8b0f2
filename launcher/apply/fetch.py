"""`sparkstack fetch` (issue 35): a Hub repository downloaded once to where the ranks read it, every
file checked against the Hub's own digests, and those digests kept as `check --deep`'s manifest.

The client is huggingface_hub's own: `HfApi.model_info(files_metadata=True)` lists the files at one
commit (each LFS file's sha256, each small file's git blob id), `get_hf_file_metadata` resolves a
file (the CDN location, its ETag), `http_get` moves its bytes (the client's headers, token,
retries and resume within a run). Each file goes to `.NAME.partial` beside its final name, opened
for appending: after Ctrl+C or a lost connection the next run asks only for the rest (a Range
request), and the partial's bytes are hashed again on the way in, so what lands is exactly the
publisher's file or is named and fetched again. huggingface_hub's own `hf_hub_download` would drop
its temporary file on an interruption (2.x: one process-unique `.incomplete` per attempt), which is
why the shards are not handed to it whole.

The token is the client's: HF_TOKEN, else the HF token file (`hf auth login`); never a flag, and
never printed. The endpoint is HF_ENDPOINT's (the sandbox's stand-in Hub in tests).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

from ..gather import hashes
from ..errors import SparkstackError
from ..facts.checkpoint_dir import parse_checkpoint
from ..onrank import probe as onrank_probe
from ..plan.fetching import PARTIAL, FetchPlan, Have, HubFile, Listing, gb

CHUNK = 1 << 20  # http_get writes a chunk once it is whole: at most this much of a file is lost to a Ctrl+C
RECORD = ".cache/sparkstack/fetched.json"  # under the destination: what was checked, at which commit
ATTEMPTS = 2  # a file whose digest differs is fetched once more before the fetch fails


class GatedError(SparkstackError):
    exit_code = 2  # bad input: a token to set, terms to accept


def endpoint() -> str:
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def has_token() -> bool:
    from huggingface_hub import get_token

    return bool(get_token())


def gated_message(repo: str, where: str, token: bool) -> str:
    page = f"{where}/{repo}"
    if token:
        return (f"{repo} is a gated repository and the Hub refuses your token (HF_TOKEN, else the HF token "
                f"file): its account has not been granted access yet.\n"
                f"open {page} logged in as that account and accept its terms (some repositories also "
                "wait for the publisher's approval), then run `sparkstack fetch` again; nothing was downloaded")
    return (f"{repo} is a gated repository: the Hub gives its files only to an account that accepted its terms, "
            "and no token is set.\n"
            f"1. open {page} logged in and accept its terms\n"
            f"2. make a read token at {where}/settings/tokens and set it: `export HF_TOKEN=hf_...` "
            "(or `hf auth login`, which keeps it in the HF token file)\n"
            "3. run `sparkstack fetch` again; nothing was downloaded")


def _hub_error(e: Exception, repo: str, revision: str, where: str) -> SparkstackError:
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    if isinstance(e, GatedRepoError):
        return GatedError(gated_message(repo, where, has_token()))
    if isinstance(e, RepositoryNotFoundError):
        return SparkstackError(f"{repo}: no such repository on {where}, or it is private (set HF_TOKEN to a "
                               "token of an account that can read it)")
    if isinstance(e, RevisionNotFoundError):
        return SparkstackError(f"{repo} has no revision {revision!r} (a branch, a tag or a commit)")
    if isinstance(e, HfHubHTTPError):
        return SparkstackError(f"{repo}: the Hub answered {str(e).splitlines()[0]}")
    return SparkstackError(f"cannot reach the Hub at {where} ({type(e).__name__}: {e}); check the network "
                           "(HF_ENDPOINT for a mirror) and run `sparkstack fetch` again: it resumes")


def network_errors() -> tuple[type[Exception], ...]:
    """The client's HTTP library's errors (huggingface_hub 2.x speaks httpx2, 1.x httpx)."""
    import importlib

    found = []
    for name in ("httpx2", "httpx"):
        try:
            found.append(importlib.import_module(name).HTTPError)
        except (ImportError, AttributeError):
            pass
    return tuple(found)


def list_repo(repo: str, revision: str) -> Listing:
    """The repository's files at `revision` as the Hub lists them (sizes, blob ids, LFS sha256)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    where = endpoint()
    try:
        info = HfApi(endpoint=where).model_info(repo, revision=revision, files_metadata=True)
    except (HfHubHTTPError, OSError, *network_errors()) as e:
        raise _hub_error(e, repo, revision, where) from None
    files = tuple(HubFile(s.rfilename, int(s.size or (s.lfs.size if s.lfs else 0)), s.blob_id or "",
                          s.lfs.sha256 if s.lfs else None) for s in info.siblings or ())
    for f in files:  # a listed name never writes outside the destination
        parts = Path(f.name).parts
        if not parts or Path(f.name).is_absolute() or ".." in parts or "\\" in f.name:
            raise SparkstackError(f"{repo}: the Hub lists a file named {f.name!r}, which would land outside "
                                  "the destination; nothing was downloaded")
    return Listing(repo, revision, info.sha, bool(info.gated), files)


def free_bytes(dest: str) -> int | None:
    """Free bytes of the filesystem `dest` is (or will be) on."""
    p = Path(dest)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def _record(dest: str) -> dict:
    try:
        return json.loads((Path(dest) / RECORD).read_text())
    except (OSError, ValueError):
        return {}


def have(dest: str, listing: Listing, verify_all: bool = False) -> dict[str, Have]:
    """What `dest` holds of each listed file; `verified` when the record says this commit's file
    was checked at this size and mtime (never with verify_all)."""
    seen = _record(dest).get("files", {})
    out = {}
    for f in listing.files:
        path, partial = Path(dest) / f.name, Path(dest) / Path(f.name).parent / PARTIAL.format(Path(f.name).name)
        size = path.stat().st_size if path.is_file() else None
        r = seen.get(f.name, {})
        ok = (not verify_all and size is not None and r.get("size") == size == f.size
              and r.get("mtime_ns") == path.stat().st_mtime_ns and r.get("blob_id") == f.blob_id)
        out[f.name] = Have(size, partial.stat().st_size if partial.is_file() else 0, ok)
    return out


def git_blob_sha1(path: Path) -> str:
    h = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sha256_of(path: Path, limit: int | None = None) -> "hashlib._Hash":
    h = hashlib.sha256()
    left = limit
    with open(path, "rb") as fh:
        while left is None or left > 0:
            block = fh.read(1 << 20 if left is None else min(1 << 20, left))
            if not block:
                break
            h.update(block)
            left = None if left is None else left - len(block)
    return h


class _Hashing:
    """The file http_get writes to, hashing what it writes (after the partial's first bytes)."""

    def __init__(self, fh, h):
        self.fh, self.h = fh, h

    def write(self, b):
        self.h.update(b)
        return self.fh.write(b)

    def tell(self):
        return self.fh.tell()

    def seek(self, *a):  # the server ignored the Range: http_get starts the file over
        self.h = hashlib.sha256()
        return self.fh.seek(*a)

    def truncate(self, *a):
        return self.fh.truncate(*a)


@dataclass
class FetchResult:
    commit: str
    moved: int = 0  # bytes this run downloaded
    seconds: float = 0.0
    fetched: list[str] = field(default_factory=list)
    refetched: list[str] = field(default_factory=list)  # their digest differed: fetched again
    hashed: list[str] = field(default_factory=list)  # present before, checked against the Hub's digest
    manifest: str = ""
    error: str = ""
    exit_code: int = 0  # the error's (2: a gated repository's terms or token)

    def to_json(self) -> dict:
        return {"commit": self.commit, "moved": self.moved, "seconds": round(self.seconds, 3),
                "rate": round(self.moved / self.seconds) if self.seconds else None, "fetched": self.fetched,
                "refetched": self.refetched, "hashed": self.hashed, "manifest": self.manifest, "error": self.error}


class _Run:
    def __init__(self, plan: FetchPlan, say: Callable[[str], None]):
        self.plan, self.say, self.where = plan, say, endpoint()
        self.lock = threading.Lock()
        self.record = _record(plan.dest)
        if self.record.get("commit") != plan.listing.commit:
            self.record = {"files": {k: v for k, v in self.record.get("files", {}).items()}}
        self.record.update(repo=plan.listing.repo, revision=plan.listing.revision, commit=plan.listing.commit,
                           endpoint=self.where)
        self.result = FetchResult(plan.listing.commit)
        self.done: dict[str, int] = {}  # bytes of each file this run moved and landed
        self.errors: list[SparkstackError] = []

    def paths(self, f: HubFile) -> tuple[Path, Path]:
        path = Path(self.plan.dest) / f.name
        return path, path.parent / PARTIAL.format(path.name)

    def matches(self, f: HubFile, path: Path, sha: str | None = None) -> tuple[bool, str]:
        """Whether the file is the publisher's: its sha256 against the listing's (LFS), else its
        git blob id. Returns (ok, the digest found)."""
        if f.sha256:
            got = sha or sha256_of(path).hexdigest()
            return got == f.sha256, got
        got = git_blob_sha1(path)
        return got == f.blob_id, got

    def keep(self, f: HubFile, path: Path) -> None:
        st = path.stat()
        sha = f.sha256 or sha256_of(path).hexdigest()
        with self.lock:
            self.record.setdefault("files", {})[f.name] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                                                           "blob_id": f.blob_id, "sha256": sha}
            rec = Path(self.plan.dest) / RECORD
            rec.parent.mkdir(parents=True, exist_ok=True)
            tmp = rec.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.record, indent=1, sort_keys=True) + "\n")
            tmp.replace(rec)

    def download(self, f: HubFile, partial: Path) -> str:
        """The file's bytes into `partial`, resumed from its size; returns the sha256 of it all."""
        from huggingface_hub import get_hf_file_metadata, hf_hub_url
        from huggingface_hub.file_download import http_get
        from huggingface_hub.utils import build_hf_headers

        url = hf_hub_url(self.plan.listing.repo, f.name, revision=self.plan.listing.commit, endpoint=self.where)
        meta = get_hf_file_metadata(url, endpoint=self.where)
        if meta.size is not None and meta.size != f.size:
            raise SparkstackError(f"{f.name}: the Hub resolves it to {meta.size} bytes, its listing says {f.size}")
        headers = build_hf_headers()
        location = meta.location or url
        if urlsplit(location)[:2] != urlsplit(url)[:2]:
            headers.pop("authorization", None)  # a signed CDN URL: the token stays with the Hub
        partial.parent.mkdir(parents=True, exist_ok=True)
        have = partial.stat().st_size if partial.is_file() else 0
        if have > f.size:
            partial.unlink()
            have = 0
        h = sha256_of(partial, have) if have else hashlib.sha256()
        with open(partial, "ab") as fh:
            sink = _Hashing(fh, h)
            http_get(location, sink, resume_size=have, headers=headers, expected_size=f.size,
                     displayed_filename=f.name)
            h = sink.h
        return h.hexdigest()

    def one(self, f: HubFile, state: str) -> None:
        path, partial = self.paths(f)
        if state == "present":
            ok, got = self.matches(f, path)
            with self.lock:
                self.result.hashed.append(f.name)
            if ok:
                return self.keep(f, path)
            self.say(f"{f.name}: present, but its digest {got[:12]} is not the Hub's {(f.sha256 or f.blob_id)[:12]}: "
                     "fetching it again")
            path.unlink()
        for attempt in range(1, ATTEMPTS + 1):
            sha = self.download(f, partial)
            ok, got = self.matches(f, partial, sha if f.sha256 else None)
            if ok:
                os.replace(partial, path)
                with self.lock:
                    self.done[f.name] = f.size
                    self.result.fetched.append(f.name)
                return self.keep(f, path)
            partial.unlink()
            what = "sha256" if f.sha256 else "git blob id"
            expected = f.sha256 or f.blob_id
            if attempt < ATTEMPTS:
                self.say(f"{f.name}: corrupted in transit ({what} {got[:12]}, the Hub lists {expected[:12]}): "
                         "fetching it again")
                with self.lock:
                    self.result.refetched.append(f.name)
            else:
                raise SparkstackError(f"{f.name}: its {what} is {got[:12]}, the Hub lists {expected[:12]}, "
                                      f"{ATTEMPTS} times: the file was not kept; run `sparkstack fetch` again "
                                      "(a proxy or mirror in between may be serving a bad copy)")

    def moved(self) -> int:
        """Bytes this run moved so far: landed files and the partials' growth."""
        n = 0
        for s in self.plan.steps:
            if s.state in ("partial", "missing"):
                f = next(x for x in self.plan.listing.files if x.name == s.name)
                path, partial = self.paths(f)
                if s.name in self.done:
                    n += s.size - s.have
                elif partial.is_file():
                    n += max(0, partial.stat().st_size - s.have)
        return n


def apply(plan: FetchPlan, say: Callable[[str], None], workers: int = 4, interval: float = 2.0,
          model_dir: str | None = None) -> FetchResult:
    """Move what the plan says (`workers` files at once), check each file against the Hub's digest,
    then keep the manifest of `check --deep` from those digests. Progress every `interval` s."""
    from huggingface_hub import constants
    from huggingface_hub.errors import HfHubHTTPError
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()  # one progress line of ours for all files, not a bar per file
    constants.DOWNLOAD_CHUNK_SIZE = CHUNK  # its default, 10 MiB, would lose up to that per file in flight
    run = _Run(plan, say)
    files = {f.name: f for f in plan.listing.files}
    queue = [(files[s.name], s.state) for s in plan.steps if s.state != "verified"]
    queue.sort(key=lambda item: -item[0].size)
    lock = threading.Lock()
    began = time.monotonic()

    def work():
        while True:
            with lock:
                if not queue or run.errors:
                    return
                f, state = queue.pop(0)
            try:
                run.one(f, state)
            except SparkstackError as e:
                run.errors.append(e)
            except (HfHubHTTPError, *network_errors()) as e:
                run.errors.append(_hub_error(e, plan.listing.repo, plan.listing.revision, run.where))
            except Exception as e:  # noqa: BLE001 - a file's failure is reported, the others' work kept
                run.errors.append(SparkstackError(f"{f.name}: {type(e).__name__}: {e}; run `sparkstack fetch` "
                                                  "again: it resumes"))

    threads = [threading.Thread(target=work, name=f"fetch-{i}", daemon=True) for i in range(max(1, workers))]
    for t in threads:
        t.start()
    total, last = plan.to_move, began
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(0.1)
        now = time.monotonic()
        if total and now - last >= interval:
            last = now
            say(progress_line(run.moved(), total, now - began))
    result = run.result
    result.seconds = time.monotonic() - began
    result.moved = run.moved()
    if total:
        say(progress_line(result.moved, total, result.seconds))
    if run.errors:
        result.error, result.exit_code = run.errors[0].message, run.errors[0].exit_code
        return result
    found = parse_checkpoint(onrank_probe.checkpoint(plan.dest))
    if found and found.shards:
        sha = {n: e["sha256"] for n, e in run.record.get("files", {}).items() if n in files}
        source = {"hub": run.where, "repo": plan.listing.repo, "revision": plan.listing.revision,
                  "commit": plan.listing.commit}
        result.manifest = str(hashes.write(found.fingerprint, model_dir or plan.dest, sha, source))
    return result


def progress_line(moved: int, total: int, seconds: float) -> str:
    rate = moved / seconds if seconds > 0 else 0
    eta = (total - moved) / rate if rate else None
    pct = 100 * moved / total if total else 100
    left = f"ETA {int(eta) // 60}:{int(eta) % 60:02d}" if eta is not None else "ETA --:--"
    return f"fetch: {gb(moved)} of {gb(total)} ({pct:.0f}%), {rate / 1e6:,.1f} MB/s, {left}"
