"""Reading only a change through this host's registry (launcher/images/pushed.py) and choosing
that way by its cost (launcher/images/source.py): the real Docker and docker-registry here."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile

import pytest

from launcher.images import pushed, registry, source, spool
from launcher.images.local_docker import connect
from test_ship import build_scratch

needs_registry = pytest.mark.skipif(shutil.which(registry.REGISTRY_BINARY) is None,
                                    reason="docker-registry is not installed")
MB = 1 << 20


def _layers(**kw) -> source.Layers:
    args = dict(diff_ids=["a", "b", "c"], sizes=[3000 * MB, 50 * MB, 1 * MB], spooled=frozenset(),
                registered=frozenset(), config_spooled=False, registry=True)
    args.update(kw)
    return source.Layers(**args)


def test_a_rank_lacking_every_layer_gets_the_save_streamed():
    assert source.choose("img", _layers(), 0).how == "save"


def test_a_change_over_a_pushed_base_is_pushed_and_costs_only_the_change():
    got = source.choose("img", _layers(registered=frozenset({"a", "b"})), 2)
    assert got.how == "push" and got.read_bytes == 2 * MB  # pushed and read back: the 1 MiB change
    assert got.seconds < 1.0 < _layers().sizes[0] / source.SAVE_BPS


def test_a_base_not_yet_pushed_is_pushed_once_when_the_changes_after_it_pay_for_it():
    got = source.choose("img", _layers(), 2)
    assert got.how == "push" and "not yet in this host's registry" in got.why
    # a change as big as the image: pushing it costs more than saving it, now and every time
    assert source.choose("img", _layers(sizes=[1 * MB, 1 * MB, 3000 * MB]), 2).how == "save"


def test_without_docker_registry_or_with_everything_spooled_no_push():
    assert source.choose("img", _layers(registry=False), 2).how == "save"
    whole = source.choose("img", _layers(spooled=frozenset("abc"), config_spooled=True), 0)
    assert (whole.how, whole.read_bytes) == ("spooled", 0)


def _image(client, parent: str | None, name: str, mib: int) -> str:
    return client.images.get(build_scratch(client, name, mib * MB, parent or "scratch")).id


@pytest.mark.sandbox  # builds images on the local Docker engine and pushes them
@needs_registry
def test_a_change_is_read_back_alone_and_checked_the_base_pushed_once(tmp_path):
    engine = connect()
    client = engine.client
    base = _image(client, None, "base", 8)
    made = [base]
    try:
        v1, v2 = (_image(client, base, name, 1) for name in ("v1", "v2"))
        made += [v1, v2]
        storage = tmp_path / "registry"
        for image_id in (v1, v2):
            ids = engine.diff_ids(image_id)
            before = registry_bytes(storage)
            spooling = pushed.fill(registry.LocalRegistry(storage, engine), image_id, ids, 1, root=tmp_path / "spool")
            assert spooling.done and spooling.ready == {ids[1]}  # only the change came back
            assert hashlib.sha256(spooling.path(ids[1]).read_bytes()).hexdigest() == ids[1][7:]
            assert "sha256:" + hashlib.sha256(spooling.finished()).hexdigest() == image_id
            grown = registry_bytes(storage) - before
            assert pushed.registered(ids, storage) == set(ids)
        assert grown < 3 * MB  # v2's push left the 8 MiB base where v1's put it
        members = [m for m in tar_members(b"".join(spool.load_tar(spooling, 1)))]
        assert members[0] == f"{ids[1][7:]}/layer.tar" and members[-1] == "manifest.json"
    finally:
        for image_id in reversed(made):
            client.images.remove(image_id, force=True)


@pytest.mark.sandbox  # builds images on the local Docker engine and pushes them
@needs_registry
def test_a_registry_whose_blob_is_not_the_layer_is_refused(tmp_path):
    engine = connect()
    client = engine.client
    base = _image(client, None, "base", 1)
    try:
        top = _image(client, base, "top", 1)
        ids, storage = engine.diff_ids(top), tmp_path / "registry"
        pushed.fill(registry.LocalRegistry(storage, engine), top, ids, 1, root=tmp_path / "spool")
        known = json.loads((storage / pushed.LAYERS).read_text())
        blob = pushed._blob_path(storage, known[ids[1]])
        blob.chmod(0o644)
        blob.write_bytes(b"not the layer")  # the registry serves what is on its disk
        shutil.rmtree(tmp_path / "spool")
        with pytest.raises(pushed.PushError, match="is not sha256:"):
            pushed.fill(registry.LocalRegistry(storage, engine), top, ids, 1, root=tmp_path / "spool")
        assert not spool.Spooling(top, ids, tmp_path / "spool").path(ids[1]).exists()
    finally:
        client.images.remove(top, force=True)
        client.images.remove(base, force=True)


def registry_bytes(storage) -> int:
    return sum(p.stat().st_size for p in storage.rglob("*") if p.is_file()) if storage.exists() else 0


def tar_members(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return tar.getnames()


def test_an_index_pushed_by_a_newer_engine_leads_to_the_image_own_manifest():
    """Docker with containerd's store pushes an index (the image, an attestation): the manifest
    read is the one whose config is the image."""
    image = {"config": {"digest": "sha256:img"}, "layers": [{"digest": "sha256:l1"}]}
    manifests = {"tag": {"manifests": [{"digest": "sha256:att"}, {"digest": "sha256:m"}]},
                 "sha256:att": {"config": {"digest": "sha256:other"}, "layers": []}, "sha256:m": image}

    class Registry:
        def manifest(self, repo, reference):
            assert repo == pushed.REPO
            return manifests[reference]

    assert pushed._image_manifest(Registry(), "tag", "sha256:img") == image


def test_a_containerd_rank_whose_layer_sizes_are_unknown_here_has_the_image_saved_here():
    """Its manifest names every layer's tar size: only a save passes them all (not the spool's
    copy of the change, not the registry's gzipped blobs)."""
    got = source.choose("img", _layers(spooled=frozenset("c"), config_spooled=True,
                                       registered=frozenset({"a", "b"})), 2, learn_sizes=True)
    assert got.how == "save" and got.read_bytes == sum(_layers().sizes)
    assert "needs every layer's tar size" in got.why and "only what they lack" in got.why
