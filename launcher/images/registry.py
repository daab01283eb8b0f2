"""A private registry on the build host, for the duration of a ship.

Debian's `docker-registry` (the CNCF distribution registry) listens on 127.0.0.1 only; ranks reach
it through an SSH reverse forward on their own 127.0.0.1, which Docker accepts without TLS. Its
storage persists under ~/.cache/sparkstack/registry (mode 0700: it holds every image shipped), so
pushing an unchanged layer again is free; `sparkstack registry-prune` empties it.
A registry is the well-kept tool for "send only what is missing": a pull moves only the blobs the
rank lacks, each verified by digest.
"""

from __future__ import annotations

import fcntl
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from ..errors import SparkstackError
from ..facts.image_ref import ImageRef
from .local_docker import LocalDocker, connect

REGISTRY_BINARY = "docker-registry"
STORAGE = Path("~/.cache/sparkstack/registry").expanduser()
# what a pull may be answered with: an image index (several platforms) or one image's manifest
MANIFEST_TYPES = ", ".join([
    "application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json"])
READY_TIMEOUT_S = 15


class RegistryError(SparkstackError):
    pass


def _lock(storage: Path, exclusive: bool):
    """A ship holds the storage's lock shared while its registry runs; prune, exclusively."""
    storage.parent.mkdir(parents=True, exist_ok=True)
    lock = open(storage.with_name(storage.name + ".lock"), "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB if exclusive else fcntl.LOCK_SH)
    except BlockingIOError:
        lock.close()
        raise RegistryError(f"a ship is using {storage}: prune once it has ended") from None
    return lock


def prune(storage: Path | None = None) -> int:
    """Empty the storage (every image pushed for earlier ships); returns the bytes freed. The
    next ship pushes its images again, on this host only: the ranks still get only what they lack."""
    storage = storage or STORAGE
    with _lock(storage, exclusive=True):
        if storage.is_symlink():
            raise RegistryError(f"{storage} is a symbolic link: remove it or its target yourself")
        if not storage.exists():
            return 0
        freed = sum(p.lstat().st_size for p in storage.rglob("*") if p.is_file() and not p.is_symlink())
        shutil.rmtree(storage)
        return freed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalRegistry:
    """`with LocalRegistry() as reg: reg.push(ref)` — started on entry, stopped on exit."""

    def __init__(self, storage: Path = STORAGE, engine: LocalDocker | None = None):
        self.storage = storage
        self.port = 0
        self.engine = engine or connect()
        self._process: subprocess.Popen | None = None
        self._workdir: tempfile.TemporaryDirectory | None = None
        self._lock = None

    def __enter__(self) -> "LocalRegistry":
        binary = shutil.which(REGISTRY_BINARY)
        if not binary:
            raise RegistryError(f"`{REGISTRY_BINARY}` is not installed on this host; install it "
                                "(Debian/Ubuntu: apt-get install docker-registry)")
        self._lock = _lock(self.storage, exclusive=False)
        self.storage.mkdir(parents=True, exist_ok=True)
        self.storage.chmod(0o700)  # also one an older version created 0755
        self.port = _free_port()
        self._workdir = tempfile.TemporaryDirectory(prefix="sparkstack-registry-")
        try:  # a failed start or Ctrl+C while waiting must not leave the registry or its dir behind
            self._start(binary, Path(self._workdir.name))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self, binary: str, workdir: Path) -> None:
        config = workdir / "config.yml"
        config.write_text(yaml.safe_dump({
            "version": 0.1,
            "log": {"level": "warn"},
            "storage": {"filesystem": {"rootdirectory": str(self.storage)}},
            "http": {"addr": f"127.0.0.1:{self.port}"},
        }))
        with open(workdir / "registry.log", "wb") as log:  # the registry keeps its own copy
            self._process = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=log)
        self._wait_ready(binary, workdir / "registry.log")

    def _wait_ready(self, binary: str, log: Path) -> None:
        timeout = READY_TIMEOUT_S
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RegistryError(f"the local registry exited at start: {log.read_text()[-500:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/v2/", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        said = log.read_text(errors="replace").strip()[-500:]
        raise RegistryError(
            f"the local registry ({binary}) did not answer on 127.0.0.1:{self.port} within {timeout:.0f} s"
            + (f"; its last output:\n{said}" if said else ", and printed nothing") + "\n"
            f"fix: `{binary}` must be the CNCF distribution registry (Debian: apt-get install --reinstall "
            "docker-registry) and nothing may block connections to 127.0.0.1; then re-run the command")

    def __exit__(self, *exc) -> None:
        if self._process and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._workdir:
            self._workdir.cleanup()
        if self._lock:
            self._lock.close()

    def name(self, ref: str, port: int | str | None = None) -> str:
        """The image's name in this registry, as seen on a host where it answers on `port`
        (a placeholder string where the port is known only on the rank: the relay's)."""
        return f"127.0.0.1:{port or self.port}/{ImageRef.parse(ref).tagged}"  # its registry dropped

    def push(self, ref: str, as_name: str | None = None) -> None:
        """Push a local image (`ref`: a name or an image ID), under its own name or `as_name`
        ("repo:tag"); the registry keeps blobs it already has (nothing moves for them)."""
        api = self.engine.api
        target = ImageRef.parse(f"127.0.0.1:{self.port}/{as_name}" if as_name else self.name(ref))
        api.tag(ref, target.repository, target.tag)
        try:
            for line in api.push(target.repository, target.tag, stream=True, decode=True):
                if "error" in line:
                    raise RegistryError(f"pushing {ref} to the local registry failed: {line['error']}")
        finally:
            api.remove_image(str(target))  # untag only; the image stays

    def manifest(self, repo: str, reference: str, accept: str = MANIFEST_TYPES) -> dict:
        answer = httpx.get(f"http://127.0.0.1:{self.port}/v2/{repo}/manifests/{reference}",
                           headers={"Accept": accept}, timeout=30)
        if answer.status_code != 200:
            raise RegistryError(f"the local registry has no manifest {repo}:{reference} "
                                f"(HTTP {answer.status_code}); re-run `sparkstack ship`")
        return answer.json()

    def blob(self, repo: str, digest: str):
        """A blob's bytes as they come (chunks of up to 1 MiB)."""
        with httpx.stream("GET", f"http://127.0.0.1:{self.port}/v2/{repo}/blobs/{digest}", timeout=300) as answer:
            if answer.status_code != 200:
                raise RegistryError(f"the local registry has no blob {digest} in {repo} "
                                    f"(HTTP {answer.status_code}); re-run `sparkstack ship`")
            yield from answer.iter_bytes(1 << 20)

    def contents(self, ref: str) -> tuple[str, list[str], list[str]]:
        """A pushed image as a pull asks for it: (repository, [its tag and every manifest
        digest], [every config and layer digest]), from this registry's own manifests."""
        parsed = ImageRef.parse(ref)
        repo, tag = parsed.path, parsed.tag or "latest"
        manifests, blobs, todo = {tag}, set(), [tag]
        while todo:
            reference = todo.pop()
            answer = httpx.get(f"http://127.0.0.1:{self.port}/v2/{repo}/manifests/{reference}",
                               headers={"Accept": MANIFEST_TYPES}, timeout=30)
            if answer.status_code == 404 and reference != tag:
                continue  # a platform of an index that was not pushed: nothing to serve
            if answer.status_code != 200:
                raise RegistryError(f"the local registry has no manifest for {ref} "
                                    f"(HTTP {answer.status_code}); re-run `sparkstack ship`")
            manifests.add(answer.headers["Docker-Content-Digest"])
            body = answer.json()
            todo += [m["digest"] for m in body.get("manifests", [])]
            blobs.update(d["digest"] for d in [body.get("config"), *body.get("layers", [])] if d)
        return repo, sorted(manifests), sorted(blobs)

