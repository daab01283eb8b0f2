"""An image's `docker save`, kept on this host with each layer named by its diff ID.

`ship` streams into each rank's `docker load` a save-format tar with only the layers the rank lacks,
then the config and the manifest (`load_tar`): Docker's loader unpacks the whole tar before it reads
the manifest, reads a layer's file only when that layer's chain is missing, and the image ID (the
config's digest) comes out the same.

A save cannot be filtered by name as it streams: Docker 20.10 writes the legacy format, whose layer
directories are v1 IDs and whose manifest.json comes near the end. So every member is hashed as it
passes: the sha256 of an uncompressed layer tar is its diff ID, that of the config the image ID. A
layer is ready for the ranks as soon as its member has passed, while the rest of the save still
streams; the ranks' sends start at once. Newer Dockers (25+) write the OCI layout: the same hashes
name the same members. Layers are kept under ~/.cache/sparkstack/spool (mode 0700) by diff ID, so
images that share a base share its files, and a re-ship of the same image saves nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import threading
import time
from pathlib import Path

from ..errors import SparkstackError
from . import manifests

SPOOL = Path("~/.cache/sparkstack/spool").expanduser()
KEEP_IMAGES = 4       # the most recently spooled images whose layers are kept
CHUNK = 1 << 20
STALE_S = 6 * 3600   # a spooling directory untouched this long was left by an interrupted ship


class SpoolError(SparkstackError):
    pass


class Spooling:
    """One image's layers, ready now (spooled earlier) or as the save streams past them."""

    def __init__(self, image_id: str, diff_ids: list[str], root: Path):
        self.image_id, self.diff_ids, self.root = image_id, diff_ids, root
        self.config: bytes | None = None
        self.error: SpoolError | None = None
        self.done = False
        self.save_bytes = 0     # the whole save's size, once it has passed
        self.feeds: list[Feed] = []  # readers of the save stream as it passes, for ranks lacking it all
        self.sizes: dict[str, int] = {}  # diff ID -> its tar's size, as this spool learned them
        self._ready: set[str] = set()
        self._changed = threading.Condition()

    @property
    def ready(self) -> set[str]:
        with self._changed:
            return set(self._ready)

    def note_layer(self, diff_id: str) -> None:
        self._note(layer=diff_id)

    def path(self, diff_id: str) -> Path:
        return self.root / "layers" / diff_id.split(":")[-1]

    def _index(self) -> Path:
        return self.root / "images" / (self.image_id.split(":")[-1] + ".json")

    def _note(self, *, layer: str | None = None, config: bytes | None = None, done: bool = False,
              error: SpoolError | None = None) -> None:
        with self._changed:
            if layer:
                self._ready.add(layer)
            if config is not None:
                self.config = config
            self.done = self.done or done or error is not None
            self.error = self.error or error
            self._changed.notify_all()

    def next_ready(self, wanted: set[str]) -> str | None:
        """One of `wanted` that is ready (waiting for the save until one is); None if none is left."""
        with self._changed:
            while True:
                ready = wanted & self._ready
                if ready:
                    return min(ready, key=self.diff_ids.index)
                if self.error:
                    raise self.error
                if self.done:
                    if wanted:
                        raise SpoolError(f"`docker save` of {self.image_id} did not hold layer(s) "
                                         f"{', '.join(sorted(wanted))}; re-run")
                    return None
                self._changed.wait()

    def tar_size(self, have: int) -> int | None:
        """The bytes of `load_tar(self, have, …)` but the config's and manifest's, once every
        layer it sends is ready (None before)."""
        with self._changed:
            wanted = set(self.diff_ids[have:])
            if not wanted <= self._ready:
                return None
        return sum(member_size(self.path(d).stat().st_size) for d in wanted) + 2 * tarfile.BLOCKSIZE

    def manifest(self) -> bytes | None:
        """The manifest this image has on a rank with containerd's image store
        (launcher/images/manifests.py), once the config is here; None while the tar size of one
        of its layers is not known on this host."""
        if self.config is None:
            return None
        sizes = known_sizes(self.root, self.diff_ids, self.sizes)
        if not set(self.diff_ids) <= set(sizes):
            return None
        return manifests.docker_manifest(self.config, [(d, sizes[d]) for d in self.diff_ids])

    def take_feed(self) -> "Feed | None":
        """A reader of the save stream, verbatim, if this spool is reading one and a reader is left."""
        with self._changed:
            return self.feeds.pop() if self.feeds else None

    def finished(self) -> bytes:
        """The config once the whole save has passed (raises why it failed)."""
        with self._changed:
            while not self.done:
                self._changed.wait()
            if self.error:
                raise self.error
            return self.config


def start(engine, image_id: str, diff_ids: list[str], root: Path | None = None, say=lambda line: None,
          feeds: int = 0, keep: bool = True) -> Spooling:
    """The image's spool: complete already, or being filled by a `docker save` in a thread, which
    also hands the stream as it comes to `feeds` readers (`take_feed`): a rank that lacks every
    layer loads the save itself, from its first byte, instead of waiting for layers to pass.
    `keep` False (every rank lacks every layer): only the feeds, nothing hashed or written here."""
    root = root or SPOOL
    spooling = Spooling(image_id, diff_ids, root)
    for diff_id in diff_ids:
        if spooling.path(diff_id).exists():
            spooling._note(layer=diff_id)
    config = _read_config(spooling._index())
    if config is not None and set(diff_ids) <= spooling._ready:
        os.utime(spooling._index())  # recently used: kept by _trim
        spooling._note(config=config, done=True)
        return spooling
    if keep:
        say(f"reading image {image_id[7:19]} on this host (docker save, once per image, into {root}); "
            "the ranks' sends start as its layers pass")
        _prepare(root)
        _trim(root, keep=set(diff_ids))
    else:
        _prepare_root(root)
    tee = Tee(root, feeds) if feeds else None
    spooling.feeds = [Feed(tee) for _ in range(feeds)]
    threading.Thread(target=_spool_guarded, args=(engine, spooling, keep, tee), daemon=True,
                     name=f"spool {image_id[7:19]}").start()
    return spooling


def prepared(image_id: str, diff_ids: list[str], root: Path | None = None) -> Spooling:
    """The image's spool with the layers it holds already, to be filled by another reader than a
    save (launcher/images/pushed.py), then `complete`d."""
    spooling = Spooling(image_id, diff_ids, root or SPOOL)
    _prepare(spooling.root)
    _trim(spooling.root, keep=set(diff_ids))
    for diff_id in diff_ids:
        if spooling.path(diff_id).exists():
            spooling._note(layer=diff_id)
    return spooling


def complete(spooling: Spooling, config: bytes) -> None:
    """The config is known and no more layers come; the image is indexed when every layer is
    here (a later ship of it reads nothing)."""
    if set(spooling.diff_ids) <= spooling.ready:
        _write_index(spooling, config)
    spooling._note(config=config, done=True)


def _write_index(spooling: Spooling, config: bytes) -> None:
    index = spooling._index()
    tmp_index = index.with_name(f".{index.name}.{os.getpid()}")
    tmp_index.write_text(json.dumps({"config": config.decode(), "diff_ids": spooling.diff_ids}))
    os.replace(tmp_index, index)


def spooled(image_id: str, diff_ids: list[str], root: Path | None = None) -> tuple[frozenset, bool]:
    """Which of the image's layers this host's spool holds, and whether its config too."""
    spooling = Spooling(image_id, diff_ids, root or SPOOL)
    have = frozenset(d for d in diff_ids if spooling.path(d).exists())
    return have, _read_config(spooling._index()) is not None


def known_sizes(root: Path, diff_ids: list[str], learned: dict[str, int] | None = None) -> dict[str, int]:
    """The tar size of each of these layers that this host knows: learned by this ship, a layer
    file in the spool, or recorded when an earlier save passed (launcher/images/manifests.py)."""
    recorded = None
    out = {}
    for diff_id in diff_ids:
        if learned and diff_id in learned:
            out[diff_id] = learned[diff_id]
            continue
        try:
            out[diff_id] = (root / "layers" / diff_id.split(":")[-1]).stat().st_size
            continue
        except OSError:
            pass
        recorded = manifests.sizes(root) if recorded is None else recorded
        if diff_id in recorded:
            out[diff_id] = recorded[diff_id]
    return out


def _read_config(index: Path) -> bytes | None:
    try:
        return json.loads(index.read_text())["config"].encode()
    except (OSError, ValueError, KeyError):
        return None


def _prepare_root(root: Path) -> None:
    try:
        manifests.prepare_root(root)
    except SparkstackError as e:
        raise SpoolError(e.message) from None


def _prepare(root: Path) -> None:
    _prepare_root(root)
    for sub in ("images", "layers"):
        (root / sub).mkdir(exist_ok=True)
    for left in root.glob(".spooling-*"):  # a ship interrupted mid-save (Ctrl+C) left it
        if time.time() - left.stat().st_mtime > STALE_S:
            shutil.rmtree(left, ignore_errors=True)


def _trim(root: Path, keep: set[str]) -> None:
    """Keep the layers of the KEEP_IMAGES most recently used images (and `keep`); drop the rest."""
    indexes = sorted((root / "images").glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    keep = {d.split(":")[-1] for d in keep}
    for index in indexes[:KEEP_IMAGES - 1]:  # the image being spooled is the last one kept
        try:
            keep.update(d.split(":")[-1] for d in json.loads(index.read_text())["diff_ids"])
        except (OSError, ValueError, KeyError):
            pass
    for index in indexes[KEEP_IMAGES - 1:]:
        index.unlink(missing_ok=True)
    for layer in (root / "layers").iterdir():
        if layer.name not in keep and not layer.name.startswith("."):
            layer.unlink(missing_ok=True)


def _spool_guarded(engine, spooling: Spooling, keep: bool, tee: "Tee | None") -> None:
    image_id, root = spooling.image_id, spooling.root
    try:
        chunks = _copied(engine.api.get_image(image_id, chunk_size=CHUNK), tee, spooling)
        if keep:
            _spool(chunks, spooling)
        else:
            _passed(chunks, spooling)
    except SpoolError as e:
        spooling._note(error=e)
    except Exception as e:  # this host's disk; docker-py's errors, the engine gone mid-save
        if isinstance(e, OSError) and e.errno is not None:
            why = (f"saving image {image_id} into {root} failed: {e}; free space there "
                   "(`sparkstack registry-prune` empties it) and re-run")
        else:
            why = f"`docker save` of image {image_id} on this host failed: {type(e).__name__}: {e}; re-run"
        spooling._note(error=SpoolError(why))
    finally:
        if tee is not None:
            tee.end(spooling.error)


def _copied(chunks, tee: "Tee | None", spooling: Spooling):
    """The save's chunks, each also written to the tee its feeds read."""
    for chunk in chunks:
        spooling.save_bytes += len(chunk)
        if tee is not None:
            tee.write(chunk)
        yield chunk


class Tee:
    """The save stream as it passes, in an unnamed file in the spool's directory, which every feed
    reads at its own pace: a rank whose load is slow never holds up the save or the other ranks.
    (A bounded queue per feed in memory did: measured on the sandbox, four ranks lacking a 210 MB
    image, 7.9-8.5 s with 32 MiB of lag allowed, 6.6-7.0 s with 256 MiB.) Memory stays at a chunk
    per reader; the file's space is freed when the save and the last reader have ended."""

    def __init__(self, root: Path, readers: int):
        self._file = tempfile.TemporaryFile(dir=root, prefix=".save-", buffering=0)
        self._readers, self._size, self._done, self._error = readers, 0, False, None
        self._changed = threading.Condition()

    def write(self, chunk) -> None:
        if not self._readers:
            return  # every reader has stopped (their ranks failed): nobody needs the rest
        view = memoryview(chunk)
        while view:
            view = view[self._file.write(view):]
        with self._changed:
            self._size += len(chunk)
            self._changed.notify_all()

    def end(self, error: Exception | None) -> None:
        with self._changed:
            self._done, self._error = True, error
            self._changed.notify_all()
            self._close_if_unused()

    def read(self, offset: int) -> bytes:
        """The bytes from `offset` on (up to CHUNK), waiting for the save; b"" at its end."""
        with self._changed:
            while offset >= self._size and not self._done:
                self._changed.wait()
            if offset >= self._size:
                if self._error:
                    raise self._error
                return b""
            n = min(CHUNK, self._size - offset)
        return os.pread(self._file.fileno(), n, offset)

    def release(self) -> None:
        with self._changed:
            self._readers -= 1
            self._close_if_unused()

    def _close_if_unused(self) -> None:
        if self._done and not self._readers:
            self._file.close()

    @property
    def closed(self) -> bool:
        return self._file.closed


class Feed:
    """One reader of the save stream, from its first byte. `drop()` when its rank stops or never
    starts: a tee nobody reads is not written and its file is freed."""

    def __init__(self, tee: Tee):
        self.tee, self._dropped = tee, False

    def drop(self) -> None:
        if not self._dropped:
            self._dropped = True
            self.tee.release()

    def __iter__(self):
        offset = 0
        try:
            while chunk := self.tee.read(offset):
                offset += len(chunk)
                yield chunk
        finally:
            self.drop()


class _Stream:
    """The save as it arrives (a generator of byte chunks), read without copying where it can."""

    def __init__(self, chunks):
        self._chunks, self._left = iter(chunks), memoryview(b"")

    def pieces(self, n: int):
        """The next `n` bytes, as the pieces they arrive in."""
        while n > 0:
            if not self._left:
                chunk = next(self._chunks, None)
                if chunk is None:
                    raise SpoolError("the `docker save` stream ended mid-file")
                self._left = memoryview(chunk)
            piece, self._left = self._left[:n], self._left[n:]
            n -= len(piece)
            yield piece

    def read(self, n: int) -> bytes:
        return b"".join(self.pieces(n))


def _members(stream: _Stream):
    """(name, size, pieces) of every regular file in a tar stream, its data read as it is
    iterated (the caller must read it all). A pax header may carry the next file's size (past
    8 GiB) or its long name; so may GNU's long-name header."""
    size_override = name_override = None
    while True:
        header = stream.read(tarfile.BLOCKSIZE)
        if header == bytes(tarfile.BLOCKSIZE):
            return  # the end-of-archive blocks
        info = tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")
        size = info.size
        if info.type in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK):
            data = stream.read(size)
            stream.read(-size % tarfile.BLOCKSIZE)
            if info.type == tarfile.XHDTYPE:
                size_override, name_override = _pax_size(data), _pax_field(data, b"path")
            elif info.type == tarfile.GNUTYPE_LONGNAME:
                name_override = data.rstrip(b"\0").decode("utf-8", "surrogateescape")
            continue
        if size_override is not None:
            size, size_override = size_override, None
        name, name_override = name_override or info.name, None
        if info.type in tarfile.REGULAR_TYPES:
            yield name, size, stream.pieces(size)
        else:
            for _ in stream.pieces(size):
                pass
        stream.read(-size % tarfile.BLOCKSIZE)


def _pax_size(data: bytes) -> int | None:
    value = _pax_field(data, b"size")
    return int(value) if value is not None else None


def _pax_field(data: bytes, key: bytes) -> str | None:
    for record in data.split(b"\n"):
        _, _, field = record.partition(b" ")
        if field.startswith(key + b"="):
            return field[len(key) + 1:].decode("utf-8", "surrogateescape")
    return None


def _spool(chunks, spooling: Spooling) -> None:
    """Read the save stream once, hashing every file: a layer (its hash a diff ID of the image)
    is kept by diff ID and ready at once; the config is the file whose hash is the image ID."""
    wanted = {d.split(":")[-1] for d in spooling.diff_ids}
    image = spooling.image_id.split(":")[-1]
    config = None
    with tempfile.TemporaryDirectory(dir=spooling.root, prefix=".spooling-") as tmp:
        path = Path(tmp) / "member"
        stream = _Stream(chunks)
        for _, size, pieces in _members(stream):
            digest = _copy_hashed(pieces, path)
            if digest in wanted:
                target = spooling.path("sha256:" + digest)
                if not target.exists():  # else an earlier save brought the same layer
                    os.replace(path, target)
                spooling.sizes["sha256:" + digest] = size
                spooling._note(layer="sha256:" + digest)
            elif digest == image:
                config = path.read_bytes()
        for _ in stream._chunks:
            pass  # the padding after the end blocks: the feeds hand on the save whole
    if config is None:
        raise SpoolError(f"`docker save` of {spooling.image_id} held no config with that digest; re-run")
    _write_index(spooling, config)
    manifests.note_sizes(spooling.sizes, spooling.root)
    spooling._note(config=config, done=True)


SMALL = 1 << 20  # a save's metadata files (manifest.json, the config) are kept in memory to read


def _passed(chunks, spooling: Spooling) -> None:
    """A save that is not kept: only its members' sizes and small files are read as it passes
    (no hashing, nothing written), and its manifest.json names which member is which layer and
    the config: each layer's tar size and the config, what a containerd rank's image ID needs."""
    sizes, small = {}, {}
    stream = _Stream(chunks)
    for name, size, pieces in _members(stream):
        sizes[name] = size
        if size <= SMALL:
            small[name] = b"".join(pieces)
        else:
            for _ in pieces:
                pass
    for _ in stream._chunks:
        pass
    try:
        listed = json.loads(small["manifest.json"])[0]
        layers, config = listed["Layers"], small[listed["Config"]]
    except (KeyError, IndexError, ValueError, TypeError):
        raise SpoolError(f"`docker save` of {spooling.image_id} held no readable manifest.json; re-run") from None
    if manifests.digest_of(config) != spooling.image_id or len(layers) != len(spooling.diff_ids):
        raise SpoolError(f"`docker save` of {spooling.image_id} held another image's manifest.json; re-run")
    # a layer repeated in the image is a link to its first copy in a legacy save: same diff ID
    spooling.sizes.update({d: sizes[name] for d, name in zip(spooling.diff_ids, layers) if name in sizes})
    if set(spooling.diff_ids) - set(spooling.sizes):
        raise SpoolError(f"`docker save` of {spooling.image_id} did not hold every layer; re-run")
    manifests.note_sizes(spooling.sizes, spooling.root)
    (spooling.root / "images").mkdir(exist_ok=True)
    _write_index(spooling, config)  # the config: a later ship of this image to a rank that has its layers reads nothing
    spooling._note(config=config, done=True)


def _copy_hashed(pieces, path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "wb") as out:
        for piece in pieces:
            digest.update(piece)
            out.write(piece)
    return digest.hexdigest()


def load_tar(spooling: Spooling, have: int):
    """The chunks of a tar for `docker load`: the layers above the `have` lowest (which the rank
    has), each as soon as it is ready; then the config and the manifest (which names no tag: the
    image loads untagged, by ID). Memory stays at one chunk."""
    names = [f"{d.split(':')[-1]}/layer.tar" for d in spooling.diff_ids]
    wanted = set(spooling.diff_ids[have:])
    while (diff_id := spooling.next_ready(wanted)) is not None:
        wanted.discard(diff_id)
        yield from _member(names[spooling.diff_ids.index(diff_id)], spooling.path(diff_id))
    config = spooling.finished()
    manifest = json.dumps([{"Config": "config.json", "RepoTags": None, "Layers": names}]).encode()
    yield from _member("config.json", config)
    yield from _member("manifest.json", manifest)
    yield bytes(2 * tarfile.BLOCKSIZE)


OCI_INDEX_TYPE = "application/vnd.oci.image.index.v1+json"


def oci_tar(spooling: Spooling, have: int):
    """The chunks of a tar for `docker load` on a rank with containerd's image store, which takes
    no save-format tar that lacks a layer file ("failed to resolve layers"), but does take an OCI
    layout whose manifest names blobs its content store holds: the layers above the `have` lowest,
    each as soon as it is ready, then the config, the manifest that store would have written for
    the whole save (so the image ID is the same either way) and index.json (no name: the image
    loads untagged, by ID). Measured on Docker 26.1, tests/test_ship.py."""
    wanted = set(spooling.diff_ids[have:])
    while (diff_id := spooling.next_ready(wanted)) is not None:
        wanted.discard(diff_id)
        yield from _member(_blob(diff_id), spooling.path(diff_id))
    config = spooling.finished()
    manifest = spooling.manifest()
    if manifest is None:
        raise SpoolError(f"the tar size of a layer of {spooling.image_id} is not known on this host "
                         "(`sparkstack registry-prune` emptied the spool?); re-run: the next ship sends the whole image")
    digest = manifests.digest_of(manifest)
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX_TYPE,
             "manifests": [{"mediaType": manifests.MANIFEST_TYPE, "digest": digest, "size": len(manifest)}]}
    yield from _member(_blob(manifests.digest_of(config)), config)
    yield from _member(_blob(digest), manifest)
    yield from _member("index.json", json.dumps(index, separators=(",", ":")).encode())
    yield from _member("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
    yield bytes(2 * tarfile.BLOCKSIZE)


def _blob(digest: str) -> str:
    return "blobs/sha256/" + digest.split(":")[-1]


def _member(name: str, source: bytes | Path):
    size = len(source) if isinstance(source, bytes) else source.stat().st_size
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
    yield bytes(-size % tarfile.BLOCKSIZE)


def member_size(size: int) -> int:
    """What a file of `size` bytes takes in the tar: header and padding."""
    return tarfile.BLOCKSIZE + size + (-size % tarfile.BLOCKSIZE)


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
