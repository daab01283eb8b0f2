"""Docker: the daemon's version, its image store, its images (with their labels) and its storage's
free space, read through the daemon's socket (the Engine API) when the probe reached it, else
through the CLI.

The image store: Docker Engine 29+ installs (and some Spark OEM images) keep images in containerd's
store (`"features": {"containerd-snapshotter": true}`); upgraded daemons keep the classic graph
driver (overlay2). `/info` says which: `DriverStatus` holds `driver-type io.containerd.snapshotter.v1`
on the containerd store (measured on Docker 26.1: `Driver` is then the snapshotter, `overlayfs`).
There an image's ID is its manifest's digest, not its config's (launcher/images/manifests.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from .image_ref import ImageRef
from .parts import FactError, Part, command, key


KIT_LABEL_PREFIX = "org.sparkstack."


@dataclass(frozen=True)
class Image:
    id: str
    tags: tuple[str, ...]
    labels: dict[str, str]
    size: int | None

    @property
    def kit(self) -> bool:
        return any(k.startswith(KIT_LABEL_PREFIX) for k in self.labels)


@dataclass(frozen=True)
class Docker:
    client_version: str | None
    server_version: str | None  # None: the daemon did not answer
    root_dir: str
    storage_avail: int | None
    storage_size: int | None
    images: tuple[Image, ...]
    storage_driver: str | None = None   # `overlay2`, `overlayfs` (a containerd snapshotter), `vfs`…
    containerd_store: bool | None = None  # None: the daemon did not say (no /info)

    @property
    def store(self) -> str | None:
        """`containerd` or `classic` (the graph driver's own store), None when not known."""
        return None if self.containerd_store is None else ("containerd" if self.containerd_store else "classic")

    def image(self, ref: str) -> Image | None:
        """The image a tag (`repo:tag`, `:latest` implied) or an ID names."""
        parsed = ImageRef.parse(ref)
        ref_tag = ref if parsed.tag or parsed.digest else ref + ":latest"
        for image in self.images:
            if ref_tag in image.tags or image.id in (ref, "sha256:" + ref):
                return image
        return None


def _json_lines(text: str, source: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise FactError(f"{source}: not JSON lines ({e})") from None
    return out


CONTAINERD_SNAPSHOTTER = "io.containerd.snapshotter.v1"


def parse_store(info: dict | None) -> tuple[str | None, bool | None]:
    """(storage driver, containerd image store on) from `/info` or `docker info --format '{{json .}}'`."""
    if not isinstance(info, dict) or not info.get("Driver"):
        return None, None
    status = info.get("DriverStatus") or []
    containerd = any(isinstance(pair, list) and len(pair) == 2 and pair[0] == "driver-type"
                     and pair[1] == CONTAINERD_SNAPSHOTTER for pair in status)
    return str(info["Driver"]), containerd


def _info_json(text: str | None, source: str) -> dict | None:
    if not text or not text.strip():
        return None
    try:
        doc = json.loads(text.splitlines()[0])
    except json.JSONDecodeError as e:
        raise FactError(f"{source}: not JSON ({e})") from None
    return doc if isinstance(doc, dict) else None


def parse_docker(version: dict, images: dict | None, inspect: dict | None,
                 root_dir: str = "/var/lib/docker", disk: dict | None = None,
                 info: dict | None = None) -> Docker | None:
    """`docker version`, `docker images` and `docker image inspect` (for labels) into one fact;
    None when there is no docker CLI at all."""
    if version.get("missing"):
        return None
    client_version = server_version = None
    if version.get("stdout", "").strip():
        try:
            doc = json.loads(version["stdout"].splitlines()[0])
        except json.JSONDecodeError as e:
            raise FactError(f"docker version: not JSON ({e})") from None
        client_version = (doc.get("Client") or {}).get("Version")
        server_version = (doc.get("Server") or {}).get("Version")
    found: dict[str, Image] = {}
    if inspect and inspect.get("rc") == 0:
        for e in _json_lines(inspect["stdout"], "docker image inspect"):
            found[e["Id"]] = Image(e["Id"], tuple(sorted(e.get("RepoTags") or ())),
                                   dict(sorted((e.get("Labels") or {}).items())), e.get("Size"))
    elif images and images.get("rc") == 0:  # no labels without inspect, but IDs and tags
        for e in _json_lines(images["stdout"], "docker images"):
            tag = f"{e['Repository']}:{e['Tag']}" if "<none>" not in (e["Repository"], e["Tag"]) else None
            old = found.get(e["ID"])
            tags = (old.tags if old else ()) + ((tag,) if tag else ())
            found[e["ID"]] = Image(e["ID"], tuple(sorted(tags)), {}, None)
    space = (disk or {}).get(root_dir) or {}
    driver, containerd = parse_store(_info_json((info or {}).get("stdout"), "docker info")
                                     if (info or {}).get("rc") == 0 else None)
    return Docker(client_version, server_version, root_dir, space.get("avail"), space.get("size"),
                  tuple(found[k] for k in sorted(found)), driver, containerd)


def parse_docker_api(api: dict, root_dir: str = "/var/lib/docker", disk: dict | None = None) -> Docker:
    """The Engine API's GET /version and /images/json (labels included: no inspect needed), as
    the probe read them from the daemon's socket. There is no client here: client_version None."""
    version = api.get("version") or {}
    server_version = None
    if version.get("status") == 200:
        try:
            server_version = json.loads(version["body"]).get("Version")
        except json.JSONDecodeError as e:
            raise FactError(f"GET /version: not JSON ({e})") from None
    found: dict[str, Image] = {}
    images = api.get("images") or {}
    if images.get("status") == 200:
        try:
            listed = json.loads(images["body"])
        except json.JSONDecodeError as e:
            raise FactError(f"GET /images/json: not JSON ({e})") from None
        for e in listed:
            tags = tuple(sorted(t for t in e.get("RepoTags") or () if t != "<none>:<none>"))
            found[e["Id"]] = Image(e["Id"], tags, dict(sorted((e.get("Labels") or {}).items())), e.get("Size"))
    space = (disk or {}).get(root_dir) or {}
    info = api.get("info") or {}
    driver, containerd = parse_store(_info_json(info.get("body"), "GET /info") if info.get("status") == 200 else None)
    return Docker(None, server_version, root_dir, space.get("avail"), space.get("size"),
                  tuple(found[k] for k in sorted(found)), driver, containerd)


def parse_docker_probe(api: dict | None, version: dict, images: dict | None, inspect: dict | None,
                       root_dir: str = "/var/lib/docker", disk: dict | None = None,
                       info: dict | None = None) -> Docker | None:
    """The Engine API's answers when the probe read the daemon's socket, else the CLI's."""
    if api:
        return parse_docker_api(api, root_dir, disk)
    return parse_docker(version, images, inspect, root_dir, disk, info)


def api_problem(api: dict) -> str | None:
    """One line when the daemon did not answer its socket (or answered an error)."""
    for asked in ("version", "images"):
        got = api.get(asked) or {}
        where = f"{got.get('endpoint', asked)} on {api.get('socket')}"
        if "error" in got:
            return f"docker: the daemon does not answer ({where}: {got['error']})"
        if got.get("status") != 200:
            return f"docker: GET {where}: HTTP {got.get('status')}: {(got.get('body') or '').strip()[:200]}"
    return None


DOCKER = Part("docker", "docker", parse_docker_probe,
              (key("docker_api"), command("docker_version", {"missing": True}), command("docker_images"),
               command("docker_inspect"), key("disk_docker_root", "/var/lib/docker"), key("disk", {}),
               command("docker_info")), problem=True)
