"""The local Docker engine ($DOCKER_HOST or the default socket): the one way the kit reaches it.

`build`, `ship`, the local registry, `up` and the sandbox all go through `LocalDocker`, so they
share its timeouts and say the same thing when the engine is away: "the local Docker engine
does not answer at WHERE: WHY", then the fix.

Image lookups go straight to the engine's socket: they are all a no-op build does, and importing
docker-py (requests, and paramiko for ssh:// engines) costs ~0.5 s of the one second a no-op may
take. Builds, pulls and pushes use docker-py, imported on first use. An engine not on a local
socket (DOCKER_HOST tcp:// or ssh://) is asked through docker-py for everything.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import urllib.parse

from ..errors import SparkstackError

DEFAULT_SOCKET = "/var/run/docker.sock"
DEFAULT_TIMEOUT_S = 600  # a build step or a push may stream for minutes
LOOKUP_TIMEOUT_S = 10    # one image lookup on the socket


class LocalDockerError(SparkstackError):
    """The local engine did not answer, or refused a request; `problem` and `fix` apart."""

    def __init__(self, problem: str, fix: str | None = None):
        super().__init__(problem if not fix else f"{problem}\nfix: {fix}")
        self.problem, self.fix = problem, fix


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


class LocalDocker:
    """The local engine. `api`: docker-py's low-level client (a test may pass its own);
    `client`: docker-py's high-level one (the sandbox's containers and networks)."""

    def __init__(self, api=None, socket_path: str | None = None, timeout: float = DEFAULT_TIMEOUT_S):
        self._api, self._client, self.timeout = api, None, timeout
        host = os.environ.get("DOCKER_HOST", "")
        if socket_path is None and (not host or host.startswith("unix://")):
            socket_path = host.removeprefix("unix://") or DEFAULT_SOCKET
        self._conn = _UnixConnection(socket_path, min(LOOKUP_TIMEOUT_S, timeout)) if socket_path else None

    @property
    def client(self):
        """docker-py's DockerClient, created (and the engine's API version asked) on first use."""
        if self._client is None:
            import docker

            try:
                self._client = docker.DockerClient.from_env(timeout=int(self.timeout))
            except docker.errors.DockerException as e:
                raise unreachable(e) from None
        return self._client

    @property
    def api(self):
        """docker-py's low-level APIClient."""
        return self._api if self._api is not None else self.client.api

    def ping(self) -> None:
        """Raise LocalDockerError unless the engine answers."""
        try:
            self.api.ping()
        except LocalDockerError:
            raise
        except Exception as e:  # DockerException, requests' errors, OSError
            raise unreachable(e) from None

    def image_id(self, ref: str) -> str | None:
        """The ID of image `ref` in the engine, or None if it has none by that name."""
        if self._conn is None:
            return self._api_image_id(ref)
        found = self._inspect(ref)
        return found["Id"] if found else None

    def diff_ids(self, image_id: str) -> list[str]:
        """The image's layers, bottom first, by diff ID (the digest of each uncompressed layer tar)."""
        if self._conn is None:
            return self.api.inspect_image(image_id)["RootFS"]["Layers"]
        found = self._inspect(image_id)
        if found is None:
            raise LocalDockerError(f"docker: looking up image {image_id}: no such image")
        return found["RootFS"].get("Layers") or []

    def layer_sizes(self, image_id: str) -> tuple[int, list[int] | None]:
        """The image's size, and each layer's, bottom first, from `docker history` (None where its
        entries cannot be matched to the layers: see sizes_by_layer)."""
        if self._conn is None:
            found, history = self.api.inspect_image(image_id), self.api.history(image_id)
        else:
            found, history = self._inspect(image_id), self._inspect(image_id, "history")
        if found is None or history is None:
            raise LocalDockerError(f"docker: looking up image {image_id}: no such image")
        return found.get("Size", 0), sizes_by_layer(history, len(found["RootFS"].get("Layers") or []))

    def _inspect(self, ref: str, what: str = "json"):
        """`GET /images/REF/json` (or /history) over the socket: its data, None for a 404."""
        try:
            self._conn.request("GET", f"/images/{urllib.parse.quote(ref, safe='')}/{what}")
            reply = self._conn.getresponse()
            body = reply.read()
        except OSError as e:
            self._conn.close()
            raise unreachable(e) from None
        if reply.status == 404:
            return None
        if reply.status != 200:
            raise LocalDockerError(f"docker: looking up image {ref}: {body.decode(errors='replace').strip()}")
        return json.loads(body)

    def _api_image_id(self, ref: str) -> str | None:
        import docker.errors

        try:
            return self.api.inspect_image(ref)["Id"]
        except docker.errors.NotFound:
            return None
        except docker.errors.APIError as e:
            raise LocalDockerError(f"docker: looking up image {ref}: {e.explanation or e}") from None


# history entries that add no layer (Docker marks them in the image's config, not in its history)
_NO_LAYER = re.compile(r"(/bin/sh -c #\(nop\)\s+)?(ENV|LABEL|CMD|ENTRYPOINT|EXPOSE|USER|ARG|VOLUME|"
                       r"STOPSIGNAL|HEALTHCHECK|SHELL|ONBUILD|MAINTAINER)\b")


def sizes_by_layer(history: list[dict], layers: int) -> list[int] | None:
    """Each layer's size, bottom first, from the history's entries (newest first): every entry
    with a size is a layer; one of 0 bytes is one unless it is a metadata instruction."""
    entries = list(reversed(history))
    if len(entries) != layers:
        entries = [e for e in entries if e.get("Size") or not _NO_LAYER.match((e.get("CreatedBy") or "").strip())]
    return [e.get("Size") or 0 for e in entries] if len(entries) == layers else None


def connect(timeout: float = DEFAULT_TIMEOUT_S) -> LocalDocker:
    """The local Docker engine ($DOCKER_HOST or the default socket)."""
    return LocalDocker(timeout=timeout)


def unreachable(e: Exception) -> LocalDockerError:
    """The one message for an engine that does not answer: where, why in a few words, the fix."""
    where = os.environ.get("DOCKER_HOST") or f"unix://{DEFAULT_SOCKET}"
    text = f"{type(e).__name__}: {e}"
    if "FileNotFoundError" in text or "No such file" in text:
        reason = "no engine socket there"
    elif "Connection refused" in text or "ConnectionRefused" in text:
        reason = "connection refused"
    elif "Permission denied" in text or "PermissionError" in text:
        reason = "permission denied"
    elif "timed out" in text.lower() or "timeout" in type(e).__name__.lower():
        reason = "timed out"
    else:
        reason = str(e).removeprefix("Error while fetching server API version: ").strip() or type(e).__name__
    if reason == "permission denied":
        fix = "add yourself to the docker group (then log in again), or run as root"
    else:
        fix = "start the Docker engine (`sudo systemctl start docker`, or `dockerd &`) or set DOCKER_HOST"
    return LocalDockerError(f"the local Docker engine does not answer at {where}: {reason}", fix)
