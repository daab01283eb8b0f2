"""An image's `docker save`, kept on this host with each layer named by its diff ID.

`ship` streams into each rank's `docker load` a save-format tar holding the manifest, the config and
only the layers the rank lacks (`load_tar`): Docker's loader reads a layer's file only when the
layer's chain is missing, and the image ID (the config's digest) comes out the same. A save cannot be filtered as it streams: Docker 20.10 writes the legacy format, whose
layer directories are v1 IDs and whose manifest.json comes near the end. So the save is spooled once
per image ID under ~/.cache/sparkstack/spool (mode 0700), each layer hashed on the way: the sha256 of
an uncompressed layer tar is its diff ID, checked against the image's config. Layers are stored by
diff ID, so images that share a base share its files. Newer Dockers (25+) write the OCI layout, whose
manifest.json names blobs the same way: both are read through manifest.json.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import posixpath
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import SparkstackError

SPOOL = Path("~/.cache/sparkstack/spool").expanduser()
KEEP_IMAGES = 4       # the most recently spooled images whose layers are kept
IN_MEMORY = 1 << 20   # members up to this size (manifest, configs) are read into memory
CHUNK = 1 << 20


class SpoolError(SparkstackError):
    pass


@dataclass(frozen=True)
class Layer:
    diff_id: str  # "sha256:…"
    path: Path
    size: int


@dataclass(frozen=True)
class Saved:
    image_id: str
    config: bytes        # the image's config; its sha256 is the image ID
    layers: list[Layer]  # bottom first, one per diff ID in the config

    @property
    def diff_ids(self) -> list[str]:
        return [layer.diff_id for layer in self.layers]


def saved(engine, image_id: str, root: Path | None = None, say=lambda line: None) -> Saved:
    """The spooled save of `image_id` (spooled now if it is not yet)."""
    root = root or SPOOL
    index = root / "images" / (image_id.split(":")[-1] + ".json")
    found = _read_index(index, root)
    if found:
        return found
    say(f"saving image {image_id[7:19]} on this host once (docker save into {root})")
    _prepare(root)
    _trim(root)
    try:
        spooled = _spool(engine.api.get_image(image_id, chunk_size=CHUNK), image_id, root)
    except SpoolError:
        raise
    except Exception as e:  # this host's disk; docker-py's errors, the engine gone mid-save
        if isinstance(e, OSError) and e.errno is not None:
            raise SpoolError(f"saving image {image_id} into {root} failed: {e}; free space there "
                             "(`sparkstack registry-prune` empties it) and re-run") from None
        raise SpoolError(f"`docker save` of image {image_id} on this host failed: {e}; re-run") from None
    tmp = index.with_suffix(".tmp")
    tmp.write_text(json.dumps({"config": spooled.config.decode(),
                               "layers": [[la.diff_id, la.size] for la in spooled.layers]}))
    os.replace(tmp, index)
    return spooled


def _layer_path(root: Path, diff_id: str) -> Path:
    return root / "layers" / diff_id.split(":")[-1]


def _read_index(index: Path, root: Path) -> Saved | None:
    try:
        data = json.loads(index.read_text())
    except (OSError, ValueError):
        return None
    layers = [Layer(d, _layer_path(root, d), size) for d, size in data["layers"]]
    if not all(la.path.exists() for la in layers):
        return None  # trimmed by another ship since: spool again
    os.utime(index)  # recently used: kept by _trim
    return Saved(_image_id(data["config"].encode()), data["config"].encode(), layers)


def _prepare(root: Path) -> None:
    if root.is_symlink():
        raise SpoolError(f"{root} is a symbolic link: remove it or its target yourself")
    for sub in ("images", "layers"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)  # it holds every image shipped


def _trim(root: Path) -> None:
    """Keep the layers of the KEEP_IMAGES most recently used images; drop the rest."""
    indexes = sorted((root / "images").glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    keep = set()
    for index in indexes[:KEEP_IMAGES - 1]:  # the image being spooled is the last one kept
        try:
            keep.update(d.split(":")[-1] for d, _ in json.loads(index.read_text())["layers"])
        except (OSError, ValueError, KeyError):
            pass
    for index in indexes[KEEP_IMAGES - 1:]:
        index.unlink(missing_ok=True)
    for layer in (root / "layers").iterdir():
        if layer.name not in keep:
            layer.unlink(missing_ok=True)


def _image_id(config: bytes) -> str:
    return "sha256:" + hashlib.sha256(config).hexdigest()


class _Chunks(io.RawIOBase):
    """A generator of byte chunks as a readable file, for tarfile's stream mode."""

    def __init__(self, chunks):
        self._chunks, self._left = iter(chunks), memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._left:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._left = memoryview(chunk)
        n = min(len(buffer), len(self._left))
        buffer[:n], self._left = self._left[:n], self._left[n:]
        return n


def _spool(chunks, image_id: str, root: Path) -> Saved:
    """Read the save stream once: small members into memory, large ones into temporary files
    (hashed as they are written); then keep the layers its manifest names, by diff ID."""
    small: dict[str, bytes] = {}
    large: dict[str, tuple[str, Path]] = {}   # member -> (sha256 hex, temporary file)
    links: dict[str, str] = {}                # member -> the member it stands for
    with tempfile.TemporaryDirectory(dir=root, prefix=".spooling-") as tmp:
        with tarfile.open(fileobj=io.BufferedReader(_Chunks(chunks), CHUNK), mode="r|") as save:
            for member in save:
                name = posixpath.normpath(member.name)
                if member.issym():
                    links[name] = posixpath.normpath(posixpath.join(posixpath.dirname(name), member.linkname))
                elif member.islnk():
                    links[name] = posixpath.normpath(member.linkname)
                elif member.isfile():
                    source = save.extractfile(member)
                    if member.size <= IN_MEMORY:
                        small[name] = source.read()
                    else:
                        large[name] = _copy_hashed(source, Path(tmp) / str(len(large)))
        return _keep(small, large, links, image_id, root)


def _copy_hashed(source, path: Path) -> tuple[str, Path]:
    digest = hashlib.sha256()
    with open(path, "wb") as out:
        while chunk := source.read(CHUNK):
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest(), path


def _keep(small, large, links, image_id: str, root: Path) -> Saved:
    def resolve(name: str) -> str:
        for _ in range(8):
            name = links.get(posixpath.normpath(name), posixpath.normpath(name))
        return name

    try:
        manifest = json.loads(small["manifest.json"])[0]
        config = small[resolve(manifest["Config"])]
    except (KeyError, ValueError, IndexError) as e:
        raise SpoolError(f"`docker save` of {image_id} gave no usable manifest.json ({e!r})") from None
    if _image_id(config) != image_id:
        raise SpoolError(f"`docker save` of {image_id} gave the config of {_image_id(config)}; re-run")
    diff_ids = json.loads(config)["rootfs"]["diff_ids"]
    if len(diff_ids) != len(manifest["Layers"]):
        raise SpoolError(f"`docker save` of {image_id}: {len(manifest['Layers'])} layers for "
                         f"{len(diff_ids)} diff IDs")
    layers = []
    for diff_id, member in zip(diff_ids, manifest["Layers"]):
        member = resolve(member)
        target = _layer_path(root, diff_id)
        if member in large:
            digest, tmp = large[member]
        else:
            data = small.get(member)
            digest = hashlib.sha256(data).hexdigest() if data is not None else None
        if digest != diff_id.split(":")[-1]:
            raise SpoolError(f"`docker save` of {image_id}: layer {member} hashes to sha256:{digest}, "
                             f"not its diff ID {diff_id}; re-run (is this host's disk failing?)")
        if not target.exists():  # else another image brought the same layer
            if member in large:
                os.replace(tmp, target)
            else:
                _write_atomic(target, data)
        layers.append(Layer(diff_id, target, target.stat().st_size))
    return Saved(image_id, config, layers)


def load_tar(saved: Saved, have: int, tag: str) -> tuple[int, object]:
    """(size, chunks) of a tar for `docker load`: the manifest (loaded under `tag`), the config and
    the layers above the `have` lowest, which the rank already has. Memory stays at one chunk."""
    layers = [f"{la.diff_id.split(':')[-1]}/layer.tar" for la in saved.layers]
    manifest = json.dumps([{"Config": "config.json", "RepoTags": [tag], "Layers": layers}]).encode()
    members = [("manifest.json", len(manifest), manifest), ("config.json", len(saved.config), saved.config)]
    members += [(name, la.size, la.path) for name, la in zip(layers[have:], saved.layers[have:])]
    size = sum(tarfile.BLOCKSIZE + _padded(n) for _, n, _ in members) + 2 * tarfile.BLOCKSIZE
    return size, _tar_chunks(members)


def _padded(n: int) -> int:
    return -(-n // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


def _tar_chunks(members):
    for name, size, source in members:
        info = tarfile.TarInfo(name)
        info.size, info.mode = size, 0o644
        yield info.tobuf(tarfile.GNU_FORMAT)  # GNU: sizes past 8 GiB
        if isinstance(source, bytes):
            yield source
        else:
            sent = 0
            with open(source, "rb") as f:
                while chunk := f.read(CHUNK):
                    sent += len(chunk)
                    yield chunk
            if sent != size:
                raise SpoolError(f"{source} changed while it was being sent ({sent} of {size} B)")
        yield bytes(_padded(size) - size)
    yield bytes(2 * tarfile.BLOCKSIZE)


def _write_atomic(target: Path, data: bytes) -> None:
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, target)


def prune(root: Path | None = None) -> int:
    """Empty the spool; returns the bytes freed."""
    root = root or SPOOL
    if root.is_symlink():
        raise SpoolError(f"{root} is a symbolic link: remove it or its target yourself")
    if not root.exists():
        return 0
    freed = sum(p.lstat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())
    shutil.rmtree(root)
    return freed
