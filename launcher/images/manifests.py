"""An image's identity on either of Docker's image stores, and what this host knows of it.

The classic store (a graph driver: overlay2) names an image by its config's digest. The containerd
image store (Docker 29+ installs, some Spark OEM images) names it by the digest of its manifest.
What is the same on both is the config digest and the layers' diff IDs, so that is what the kit
compares: a rank's image is "the build host's" when its ID is the config digest (classic) or the
digest of a manifest that names that config (containerd).

Loaded from a save or from a tar this kit writes, an image gets on the containerd store the manifest
containerd's importer writes for a Docker save: Docker's schema 2 media types, uncompressed layers
named by their diff IDs, compact JSON (measured on Docker 26.1, tests/test_manifests.py). So its ID
is a function of the config and the layers' tar sizes alone (`docker_manifest`), whichever way it
came: the whole save or only the layers a rank lacked (launcher/images/spool.py `oci_tar`).

This host keeps every manifest it made or read (`remember`), under the spool, named by its digest,
so `known()` maps a containerd rank's image ID back to its config digest without asking the rank;
and the tar size of every layer it saw pass (`note_sizes`), which a manifest needs for the layers a
rank already has. Both are a few bytes an image; `sparkstack registry-prune` empties them with the
spool. Pure functions first, then the record.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_TYPE = "application/vnd.docker.container.image.v1+json"
LAYER_TYPE = "application/vnd.docker.image.rootfs.diff.tar"


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def docker_manifest(config: bytes, layers: list[tuple[str, int]]) -> bytes:
    """The manifest containerd's importer writes for a Docker save of this image (config bytes,
    (diff ID, tar size) per layer, bottom first): Go's compact JSON, fields in its order."""
    doc = {"schemaVersion": 2, "mediaType": MANIFEST_TYPE,
           "config": {"mediaType": CONFIG_TYPE, "digest": digest_of(config), "size": len(config)},
           "layers": [{"mediaType": LAYER_TYPE, "digest": d, "size": s} for d, s in layers]}
    return json.dumps(doc, separators=(",", ":")).encode()


def config_of(manifest: bytes) -> str | None:
    """The config digest a manifest names (None: not an image manifest)."""
    try:
        doc = json.loads(manifest)
        digest = doc["config"]["digest"]
    except (ValueError, KeyError, TypeError):
        return None
    return digest if isinstance(digest, str) and digest.startswith("sha256:") else None


def content_id(store_id: str, known: dict[str, str]) -> str:
    """The config digest a rank's image ID stands for: itself on the classic store, the config of
    a manifest this host knows on the containerd store; an unknown manifest digest stays as it is
    (it then matches nothing, and `ship` sends the image's manifest and config again)."""
    return known.get(store_id, store_id)


# --- what this host knows ----------------------------------------------------------------------

_LOCK = threading.Lock()
SIZES_FILE = "layer-sizes.json"
KEEP_MANIFESTS = 256  # the newest kept; an older one's rank image reads as unknown, and ship resends its manifest (KB)


def prepare_root(root: Path) -> None:
    """The spool's folder, made mode 0700: it names (and holds) every image shipped."""
    from ..errors import SparkstackError

    if root.is_symlink():
        raise SparkstackError(f"{root} is a symbolic link: remove it or its target yourself")
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)


def remember(manifest: bytes, root: Path) -> str:
    """Keep a manifest (its digest names it) in the spool's folder `root`; returns the digest."""
    digest = digest_of(manifest)
    prepare_root(root)
    folder = root / "manifests"
    path = folder / (digest.split(":")[-1] + ".json")
    if path.exists():
        return digest
    folder.mkdir(exist_ok=True)
    _write(path, manifest)
    kept = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in kept[KEEP_MANIFESTS:]:
        old.unlink(missing_ok=True)
    return digest


def known(root: Path) -> dict[str, str]:
    """manifest digest -> config digest, for every manifest kept here whose bytes still hash to
    its name (a damaged file is passed over)."""
    out = {}
    folder = root / "manifests"
    for path in folder.glob("*.json") if folder.is_dir() else ():
        try:
            data = path.read_bytes()
        except OSError:
            continue
        config = config_of(data)
        if config and digest_of(data) == "sha256:" + path.stem:
            out["sha256:" + path.stem] = config
    return out


def note_sizes(sizes: dict[str, int], root: Path) -> None:
    """Remember the tar size of these layers (diff ID -> bytes)."""
    if not sizes:
        return
    prepare_root(root)
    path = root / SIZES_FILE
    with _LOCK:
        have = _read_sizes(path)
        if all(have.get(d) == s for d, s in sizes.items()):
            return
        have.update(sizes)
        _write(path, json.dumps(have, sort_keys=True).encode())


def sizes(root: Path) -> dict[str, int]:
    return _read_sizes(root / SIZES_FILE)


def _read_sizes(path: Path) -> dict[str, int]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {d: s for d, s in doc.items() if isinstance(s, int)} if isinstance(doc, dict) else {}


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
