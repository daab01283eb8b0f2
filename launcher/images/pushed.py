"""An image's layers read through this host's registry: only the change, not the whole image.

`docker push` into the local registry (launcher/images/registry.py) compresses and sends only the
layers the registry lacks: Docker remembers which digest each layer got there and skips it after
a HEAD. Every image goes to one repository (REPO, tagged by image ID), so a base pushed once is
found again whatever the registry's port or the image's name. Then the layers the ranks lack are
read back (a GET per blob), gunzipped and hashed: each must hash to its diff ID, the config to the
image ID, before it goes into the spool (launcher/images/spool.py) from where ship sends it as
from a save. The registry's storage keeps LAYERS: which diff ID it holds under which blob, so a
plan can say what a push will cost without starting anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from pathlib import Path

from ..errors import SparkstackError
from . import spool

REPO = "sparkstack/ship"
LAYERS = "sparkstack-layers.json"   # in the registry's storage: diff ID -> blob digest


class PushError(SparkstackError):
    pass


def registered(diff_ids: list[str], storage: Path) -> frozenset:
    """Which of `diff_ids` the registry in `storage` holds (as recorded by earlier pushes, its
    blob still on disk)."""
    try:
        known = json.loads((storage / LAYERS).read_text())
    except (OSError, ValueError):
        return frozenset()
    return frozenset(d for d in diff_ids if isinstance(known.get(d), str) and _blob_path(storage, known[d]).exists())


def _blob_path(storage: Path, digest: str) -> Path:
    """Where distribution's filesystem driver keeps a blob (its layout: docker/registry/v2)."""
    hexa = digest.split(":")[-1]
    return storage / "docker/registry/v2/blobs/sha256" / hexa[:2] / hexa / "data"


def fill(registry, image_id: str, diff_ids: list[str], start_at: int, root: Path | None = None,
         say=lambda line: None) -> spool.Spooling:
    """A complete Spooling for the layers above the `start_at` lowest, and the config: pushed
    into `registry` (a LocalRegistry, not yet started), read back, checked. Raises a
    SparkstackError saying why."""
    spooling = spool.prepared(image_id, diff_ids, root)
    wanted = [d for d in diff_ids[start_at:] if d not in spooling.ready]
    with registry as reg:
        tag = image_id.split(":")[-1]
        say(f"pushing image {image_id[7:19]} into this host's registry (only layers it lacks), "
            f"then reading back {len(wanted)} layer(s)")
        reg.push(image_id, f"{REPO}:{tag}")
        manifest = _image_manifest(reg, tag, image_id)
        blobs = [layer["digest"] for layer in manifest.get("layers", [])]
        if manifest.get("config", {}).get("digest") != image_id or len(blobs) != len(diff_ids):
            raise PushError(f"the local registry's manifest for {image_id} does not match the image "
                                f"({len(blobs)} layers, config {manifest.get('config', {}).get('digest')}); "
                                "empty it (`sparkstack registry-prune`) and re-run")
        _record(reg.storage, dict(zip(diff_ids, blobs)))
        for diff_id in wanted:
            digest = blobs[diff_ids.index(diff_id)]
            _read_layer(reg, digest, diff_id, spooling)
        config = b"".join(reg.blob(REPO, image_id))
    if "sha256:" + hashlib.sha256(config).hexdigest() != image_id:
        raise PushError(f"the local registry's config for {image_id} does not hash to it; "
                            "empty it (`sparkstack registry-prune`) and re-run")
    spool.complete(spooling, config)
    return spooling


def _image_manifest(reg, tag: str, image_id: str) -> dict:
    """The pushed image's manifest: Docker 20.10 pushes one; an engine with containerd's store
    may push an index of several (platforms, attestations): the one whose config is the image."""
    manifest = reg.manifest(REPO, tag)
    for entry in manifest.get("manifests", []):
        one = reg.manifest(REPO, entry["digest"])
        if one.get("config", {}).get("digest") == image_id:
            return one
    return manifest


def _read_layer(reg, digest: str, diff_id: str, spooling: spool.Spooling) -> None:
    """One blob, uncompressed as it arrives (gzip, or a tar as it is), into the spool under its
    diff ID once its hash says it is that layer."""
    target = spooling.path(diff_id)
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    digest_of = hashlib.sha256()
    inflate = None
    try:
        with open(partial, "wb") as out:
            for chunk in reg.blob(REPO, digest):
                if inflate is None:
                    inflate = _Inflate(chunk[:2] == b"\x1f\x8b")
                data = inflate.feed(chunk)
                digest_of.update(data)
                out.write(data)
        if "sha256:" + digest_of.hexdigest() != diff_id:
            raise PushError(f"layer {digest} read back from the local registry is not {diff_id}; "
                                "empty it (`sparkstack registry-prune`) and re-run")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    spooling.note_layer(diff_id)


class _Inflate:
    """gzip members one after another (a layer blob), or the bytes as they are."""

    def __init__(self, gzipped: bool):
        self.gzipped = gzipped
        self._z = zlib.decompressobj(31) if gzipped else None

    def feed(self, chunk: bytes) -> bytes:
        if not self.gzipped:
            return chunk
        out = [self._z.decompress(chunk)]
        while self._z.eof and self._z.unused_data:
            rest, self._z = self._z.unused_data, zlib.decompressobj(31)
            out.append(self._z.decompress(rest))
        return b"".join(out)


def _record(storage: Path, blobs: dict[str, str]) -> None:
    path = storage / LAYERS
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    known.update(blobs)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(known))
    os.replace(tmp, path)
