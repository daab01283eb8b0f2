"""The spool of an image's save (launcher/images/spool.py) and what ship builds from it, on
synthetic saves in both layouts: Docker 20.10's legacy one (v1-ID directories, a repeated layer
as a symlink, manifest.json near the end) and the OCI one of Docker 25+ (blobs named by digest,
pax headers)."""

import hashlib
import io
import json
import os
import tarfile
import threading

import pytest

from launcher.images import ship, spool


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


LAYERS = [os.urandom(3000), os.urandom(70_000), b""]  # b"": an empty layer, repeated below
DIFF_IDS = [sha(LAYERS[0]), sha(LAYERS[1]), sha(LAYERS[2]), sha(LAYERS[2])]
CONFIG = json.dumps({"architecture": "arm64", "os": "linux",
                     "rootfs": {"type": "layers", "diff_ids": DIFF_IDS}}).encode()
IMAGE_ID = sha(CONFIG)


def add(tar: tarfile.TarFile, name: str, data: bytes, **pax) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.pax_headers = len(data), pax
    tar.addfile(info, io.BytesIO(data))


def legacy_save() -> bytes:
    """As Docker 20.10 writes it: members in lexical order, so manifest.json comes late."""
    buf = io.BytesIO()
    dirs = ["c" * 64, "a" * 64, "f" * 64, "b" * 64]  # v1 IDs: unrelated to the layer order
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        members = {f"{IMAGE_ID[7:]}.json": CONFIG}
        for d, data in zip(dirs[:3], LAYERS):
            members[f"{d}/VERSION"], members[f"{d}/json"], members[f"{d}/layer.tar"] = b"1.0", b"{}", data
        members["manifest.json"] = json.dumps([{"Config": f"{IMAGE_ID[7:]}.json", "RepoTags": ["x:1"],
                                                "Layers": [f"{d}/layer.tar" for d in dirs]}]).encode()
        members["repositories"] = b"{}"
        for name in sorted([*members, f"{dirs[3]}/layer.tar"]):
            if name == f"{dirs[3]}/layer.tar":  # the repeated empty layer: a link to its first copy
                info = tarfile.TarInfo(name)
                info.type, info.linkname = tarfile.SYMTYPE, f"../{dirs[2]}/layer.tar"
                tar.addfile(info)
            else:
                add(tar, name, members[name])
    return buf.getvalue()


def oci_save() -> bytes:
    """As Docker 25+ writes it: blobs named by digest, pax headers."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for data in [CONFIG, *LAYERS[:3]]:
            add(tar, f"blobs/sha256/{sha(data)[7:]}", data, comment="x" * 200)
        add(tar, "index.json", b"{}")
        add(tar, "manifest.json", json.dumps([{"Config": f"blobs/sha256/{IMAGE_ID[7:]}",
                                                "Layers": [f"blobs/sha256/{d[7:]}" for d in DIFF_IDS]}]).encode())
        add(tar, "oci-layout", b"{}")
    return buf.getvalue()


class Engine:
    """docker-py's `api.get_image` over a prepared save, in uneven chunks."""

    def __init__(self, save: bytes | Exception, chunk: int = 777):
        self.api, self.save, self.chunk, self.calls = self, save, chunk, 0

    def get_image(self, image_id, chunk_size=None):
        self.calls += 1
        if isinstance(self.save, Exception):
            raise self.save
        return (self.save[i:i + self.chunk] for i in range(0, len(self.save), self.chunk))


def members(chunks) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar}


@pytest.mark.parametrize("save", [legacy_save, oci_save])
def test_spool_keeps_layers_by_diff_id_and_the_load_tar_holds_only_the_missing(tmp_path, save):
    spooling = spool.start(Engine(save()), IMAGE_ID, DIFF_IDS, root=tmp_path)
    assert spooling.finished() == CONFIG
    for diff_id, data in zip(DIFF_IDS, LAYERS + [b""]):
        assert (tmp_path / "layers" / diff_id[7:]).read_bytes() == data
    names = [f"{d[7:]}/layer.tar" for d in DIFF_IDS]
    got = members(spool.load_tar(spooling, 1))
    # the rank has the lowest layer: the second and the (repeated) empty one are sent, once
    assert got == {names[1]: LAYERS[1], names[2]: b"", "config.json": CONFIG,
                   "manifest.json": json.dumps([{"Config": "config.json", "RepoTags": None,
                                                 "Layers": names}]).encode()}
    assert spooling.tar_size(1) == sum(spool.member_size(len(d)) for d in (LAYERS[1], b"")) + 1024
    assert set(members(spool.load_tar(spooling, 4))) == {"config.json", "manifest.json"}


def test_a_spooled_image_is_not_saved_again(tmp_path):
    spool.start(Engine(legacy_save()), IMAGE_ID, DIFF_IDS, root=tmp_path).finished()
    again = Engine(RuntimeError("must not be asked"))
    assert spool.start(again, IMAGE_ID, DIFF_IDS, root=tmp_path).finished() == CONFIG
    assert again.calls == 0


def test_a_save_without_a_layer_or_the_config_fails_the_ship_with_why(tmp_path):
    short = legacy_save().replace(LAYERS[1], os.urandom(len(LAYERS[1])))  # a layer that is not the one
    spooling = spool.start(Engine(short), IMAGE_ID, DIFF_IDS, root=tmp_path)
    with pytest.raises(spool.SpoolError, match=f"did not hold layer.*{DIFF_IDS[1]}"):
        b"".join(spool.load_tar(spooling, 0))
    broken = spool.start(Engine(ConnectionError("engine went away")), IMAGE_ID, DIFF_IDS, root=tmp_path / "b")
    with pytest.raises(spool.SpoolError, match="`docker save` of image sha256:.* on this host failed: "
                                                 "ConnectionError: engine went away; re-run"):
        broken.finished()


@pytest.mark.parametrize("chains, want", [
    ([], 0),
    ([["a", "b"]], 2),
    ([["a", "x", "c"], ["a", "b", "c", "d", "e"]], 3),  # the longest prefix, whichever image gives it
    ([["b", "c"]], 0),                                  # the same layers over another base: not ours
])
def test_have_layers_is_the_longest_prefix_of_the_ranks_chains(chains, want):
    assert ship.have_layers(["a", "b", "c"], chains) == want


def test_progress_says_moved_of_missing_rate_and_eta_at_most_every_2_s(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(ship.time, "monotonic", lambda: now[0])
    lines, total = [], [None]
    progress = ship.Progress("rank 1 (spark2)", lambda: total[0], lines.append)

    def chunks():
        for t, size in [(100.5, 10_000_000), (101.0, 10_000_000), (102.0, 10_000_000), (103.0, 10_000_000),
                        (104.5, 10_000_000)]:
            now[0] = t
            yield bytes(size)
            if t == 102.0:
                total[0] = 100_000_000

    assert sum(len(c) for c in progress.count(chunks())) == 50_000_000
    assert lines == ["rank 1 (spark2): 30.0 MB, 15.0 MB/s (this host is still reading the image)",
                     "rank 1 (spark2): 50.0 of 100.0 MB, 11.1 MB/s, ETA 4 s"]


def test_a_feed_hands_on_the_save_verbatim_and_a_dropped_one_holds_up_nothing(tmp_path):
    save = legacy_save()
    spooling = spool.start(Engine(save), IMAGE_ID, DIFF_IDS, root=tmp_path, feeds=2)
    reader, quitter = spooling.take_feed(), spooling.take_feed()
    assert spooling.take_feed() is None
    next(iter(quitter))
    quitter.drop()  # its rank failed: the save goes on for the other
    assert b"".join(reader) == save
    assert spooling.finished() == CONFIG and spooling.save_bytes == len(save)
    assert reader.tee.closed  # the save and every reader ended: the file's space is freed
    # spooled: no save runs, so no feed; a rank lacking everything gets load_tar(…, 0)
    assert spool.start(Engine(save), IMAGE_ID, DIFF_IDS, root=tmp_path, feeds=1).take_feed() is None


def test_a_slow_feed_holds_up_neither_the_save_nor_the_others(tmp_path):
    """One rank's load lags (its dockerd busy): the save and the other rank's feed run to their
    end while it has read nothing yet; it then gets the whole save, verbatim."""
    save = legacy_save()  # ~100 chunks of 777 bytes
    spooling = spool.start(Engine(save), IMAGE_ID, DIFF_IDS, root=tmp_path, feeds=2)
    fast, slow = spooling.take_feed(), spooling.take_feed()
    got = []
    reading = threading.Thread(target=lambda: got.append(b"".join(fast)), daemon=True)
    reading.start()
    reading.join(timeout=10)
    assert got == [save], "the fast feed waited for the slow one"
    assert spooling.finished() == CONFIG
    assert not slow.tee.closed and b"".join(slow) == save
    assert slow.tee.closed


def test_a_failed_save_fails_every_feed_after_what_passed(tmp_path):
    class Failing(Engine):
        def get_image(self, image_id, chunk_size=None):
            yield self.save[:1000]
            raise OSError("the engine went away")

    spooling = spool.start(Failing(legacy_save()), IMAGE_ID, DIFF_IDS, root=tmp_path, feeds=1, keep=False)
    feed, got = spooling.take_feed(), bytearray()
    with pytest.raises(spool.SpoolError, match="`docker save` of image .* failed: OSError: the engine went away"):
        for chunk in feed:
            got += chunk
    assert bytes(got) == legacy_save()[:1000]


def test_when_every_rank_lacks_every_layer_the_save_only_passes_through(tmp_path):
    save = legacy_save()
    spooling = spool.start(Engine(save), IMAGE_ID, DIFF_IDS, root=tmp_path, feeds=1, keep=False)
    assert b"".join(spooling.take_feed()) == save
    spooling.finished()
    assert not (tmp_path / "layers").exists()  # nothing hashed or kept here
