"""Docker's two image stores, as data: the ID containerd's store gives an image (recorded on a real
Docker 26.1, tests/fixtures/containerd_store/), this host's record of manifests and layer sizes,
the OCI layout `ship` sends a containerd rank, and the rows that name a rank's store. The sandbox
side (a mixed fleet shipped, checked and served) is tests/test_ship_stores.py."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from launcher.check import report as check
from launcher.check import since_start
from launcher.facts.docker import parse_docker_api, parse_store
from launcher.facts.start_facts import RankStart
from launcher.images import manifests, ship, spool
from test_check import fabric_facts, inputs, row, sandbox_cluster, sandbox_config  # noqa: F401
from test_spool import CONFIG, DIFF_IDS, IMAGE_ID, LAYERS, Engine, legacy_save

RECORDED = json.loads((Path(__file__).parent / "fixtures" / "containerd_store" / "loaded_ids.json").read_text())
CASES = Path(__file__).parent / "facts_cases"


@pytest.mark.parametrize("image", RECORDED["images"], ids=["stand-in", "a-layer-over-it"])
def test_the_manifest_gives_the_id_real_containerd_gave(image):
    """Docker 26.1 on containerd's store named each image by the digest of the manifest its
    importer wrote for a Docker save; the kit writes the same bytes from the config and sizes."""
    config = image["config"].encode()
    assert manifests.digest_of(config) == image["config_digest"]
    manifest = manifests.docker_manifest(config, [tuple(x) for x in image["layers"]])
    assert manifests.digest_of(manifest) == image["containerd_id"]
    assert manifests.config_of(manifest) == image["config_digest"]


def test_a_rank_s_manifest_digest_reads_as_the_config_it_names(tmp_path):
    image = RECORDED["images"][1]
    manifest = manifests.docker_manifest(image["config"].encode(), [tuple(x) for x in image["layers"]])
    assert manifests.known(tmp_path) == {}
    assert manifests.content_id(image["containerd_id"], {}) == image["containerd_id"]  # unknown: as it is
    assert manifests.remember(manifest, tmp_path) == image["containerd_id"]
    known = manifests.known(tmp_path)
    assert known == {image["containerd_id"]: image["config_digest"]}
    assert manifests.content_id(image["containerd_id"], known) == image["config_digest"]
    assert manifests.content_id(image["config_digest"], known) == image["config_digest"]  # classic store
    assert (tmp_path.stat().st_mode & 0o777) == 0o700
    # a file whose bytes no longer hash to its name is passed over, not believed
    forged = tmp_path / "manifests" / ("0" * 64 + ".json")
    forged.write_bytes(manifest)
    (tmp_path / "manifests" / "junk.json").write_text("not json")
    assert manifests.known(tmp_path) == known


def test_only_the_newest_manifests_are_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(manifests, "KEEP_MANIFESTS", 3)
    digests = [manifests.remember(manifests.docker_manifest(b"{%d}" % i, []), tmp_path) for i in range(5)]
    for i, digest in enumerate(digests):  # mtimes apart, as ships are
        path = tmp_path / "manifests" / (digest[7:] + ".json")
        if path.exists():
            os.utime(path, (1000 + i, 1000 + i))
    manifests.remember(manifests.docker_manifest(b"{9}", []), tmp_path)
    assert len(manifests.known(tmp_path)) == 3


def test_layer_sizes_are_kept_and_merged(tmp_path):
    manifests.note_sizes({"sha256:a": 1, "sha256:b": 2}, tmp_path)
    manifests.note_sizes({"sha256:b": 2, "sha256:c": 3}, tmp_path)
    assert manifests.sizes(tmp_path) == {"sha256:a": 1, "sha256:b": 2, "sha256:c": 3}
    (tmp_path / manifests.SIZES_FILE).write_text("[1, 2]")
    assert manifests.sizes(tmp_path) == {}


def oci_members(chunks) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar}


def test_the_oci_layout_holds_the_missing_layers_and_the_manifest_the_whole_save_would_get(tmp_path):
    spooling = spool.start(Engine(legacy_save()), IMAGE_ID, DIFF_IDS, root=tmp_path)
    assert spooling.finished() == CONFIG
    got = oci_members(spool.oci_tar(spooling, 1))
    manifest = manifests.docker_manifest(CONFIG, [(d, len(x)) for d, x in zip(DIFF_IDS, LAYERS + [b""])])
    digest = manifests.digest_of(manifest)
    # the rank has the lowest layer: the second and the (repeated) empty one are sent, once
    assert got == {
        f"blobs/sha256/{DIFF_IDS[1][7:]}": LAYERS[1], f"blobs/sha256/{DIFF_IDS[2][7:]}": b"",
        f"blobs/sha256/{IMAGE_ID[7:]}": CONFIG, f"blobs/sha256/{digest[7:]}": manifest,
        "index.json": json.dumps({"schemaVersion": 2, "mediaType": spool.OCI_INDEX_TYPE, "manifests": [
            {"mediaType": manifests.MANIFEST_TYPE, "digest": digest, "size": len(manifest)}]},
            separators=(",", ":")).encode(),
        "oci-layout": b'{"imageLayoutVersion":"1.0.0"}'}
    assert spooling.manifest() == manifest


def test_a_save_that_only_passes_still_tells_each_layer_s_size(tmp_path):
    """Every rank lacks the image: nothing is kept here, but its tar sizes are (a containerd
    rank's manifest names them when only a later change is sent)."""
    spooling = spool.start(Engine(legacy_save()), IMAGE_ID, DIFF_IDS, root=tmp_path, feeds=1, keep=False)
    b"".join(spooling.take_feed())
    assert spooling.finished() == CONFIG
    assert not (tmp_path / "layers").exists()
    assert manifests.sizes(tmp_path) == {d: len(x) for d, x in zip(DIFF_IDS, LAYERS + [b""])}
    assert spool.known_sizes(tmp_path, DIFF_IDS) == manifests.sizes(tmp_path)
    assert spooling.manifest() == manifests.docker_manifest(
        CONFIG, [(d, len(x)) for d, x in zip(DIFF_IDS, LAYERS + [b""])])


def test_a_containerd_rank_gets_only_what_it_lacks_once_the_sizes_are_known(tmp_path, monkeypatch):
    monkeypatch.setattr(spool, "SPOOL", tmp_path)
    plan = ship.ShipPlan({"x:1": IMAGE_ID}, diff_ids={"x:1": DIFF_IDS}, stores={3: ship.CONTAINERD, 0: "classic"})
    assert ship._sendable(plan, 0, "x:1", 2)[0] == 2
    # sizes not known here: the rank still gets only what it lacks; this host reads the save first
    have, how = ship._sendable(plan, 3, "x:1", 2)
    assert have == 2 and "not seen pass: `docker save` reads them here first" in how
    assert plan.sizes_wanted == {"x:1"}
    plan.sizes_wanted.clear()
    manifests.note_sizes({DIFF_IDS[0]: 3000, DIFF_IDS[1]: 70_000}, tmp_path)
    have, how = ship._sendable(plan, 3, "x:1", 2)
    assert have == 2 and how.startswith("x:1: the 2 of 4 layers it lacks") and "OCI layout" in how
    assert how.endswith("lacks a layer)") and plan.sizes_wanted == set()


def test_rank_layers_reads_the_store_line_then_the_chains():
    store, chains = ship.rank_layers(
        'store {"Driver":"overlayfs","DriverStatus":[["driver-type","io.containerd.snapshotter.v1"]]}\n'
        "sha256:a sha256:b \nsha256:a \n")
    assert store == "containerd" and chains == [["sha256:a", "sha256:b"], ["sha256:a"]]
    assert ship.rank_layers('store {"Driver":"overlay2","DriverStatus":[["Backing Filesystem","extfs"]]}\n')[0] == "classic"


def test_the_store_is_read_from_info():
    assert parse_store({"Driver": "overlayfs", "DriverStatus": [["driver-type", "io.containerd.snapshotter.v1"]]}) \
        == ("overlayfs", True)
    assert parse_store({"Driver": "overlay2", "DriverStatus": [["Backing Filesystem", "extfs"]]}) == ("overlay2", False)
    assert parse_store({}) == (None, None)


def docker_of(name: str, version: str | None = None):
    raw = json.loads((CASES / f"{name}.json").read_text())["raw"]
    docker = parse_docker_api(**raw)
    return dataclasses.replace(docker, server_version=version) if version else docker


def test_a_mixed_fleet_passes_and_the_row_names_each_store(sandbox_config, fabric_facts):
    overrides = {r: {"docker": docker_of("docker_api_classic_overlay2")} for r in range(3)}
    overrides[3] = {"docker": docker_of("docker_api_containerd_store")}
    report = check.evaluate(inputs(sandbox_config, fabric_facts, overrides))
    assert row(report, 0, "docker").status == "pass"
    assert "classic image store (overlay2)" in row(report, 0, "docker").value
    assert row(report, 3, "docker").status == "pass"
    assert row(report, 3, "docker").value.startswith(
        "server 26.1.5+dfsg1, containerd image store (overlayfs snapshotter)")


@pytest.mark.parametrize("name, version, status, says", [
    ("docker_api_containerd_store", "24.0.7", "warn", "experimental in this Docker (before 25.0)"),
    ("docker_api_containerd_store", "29.2.1", "pass", "containerd image store"),
    ("docker_api_classic_overlay2", "20.10.24", "pass", "classic image store"),
])
def test_a_containerd_store_ship_cannot_feed_is_explained(sandbox_config, fabric_facts, name, version, status, says):
    report = check.evaluate(inputs(sandbox_config, fabric_facts, {1: {"docker": docker_of(name, version)}}))
    assert row(report, 1, "docker").status == status
    assert says in row(report, 1, "docker").value
    if status == "warn":
        assert "25.0" in row(report, 1, "docker").fix


def test_a_store_switched_since_the_last_good_start_is_said():
    then = RankStart(3, "spark4", docker="26.1.5", store="classic", image="x:1", image_id="sha256:" + "a" * 64)
    now = dataclasses.replace(then, docker="29.2.1", store="containerd", image_id="")
    lines = [c.line for c in since_start.compare(then, now)]
    assert lines[0] == ("rank 3 (spark4): Docker 29.2.1 with the containerd image store (which hides the "
                        "images loaded before: `sparkstack ship` sends them again), was Docker 26.1.5 with "
                        "the classic store at the last good start")
    assert lines[1].startswith("rank 3 (spark4): image x:1 is not on the rank")
    upgraded = [c.line for c in since_start.compare(then, dataclasses.replace(then, docker="28.5.0"))]
    assert upgraded == ["rank 3 (spark4): Docker 28.5.0, was 26.1.5 at the last good start"]
    assert since_start.compare(RankStart(3, "spark4"), now) == []  # kept before stores were: no change
    upgraded = [c.line for c in since_start.compare(then, dataclasses.replace(then, docker="28.5.0"))]
    assert upgraded == ["rank 3 (spark4): Docker 28.5.0, was 26.1.5 at the last good start"]
    assert since_start.compare(RankStart(3, "spark4"), now) == []  # kept before stores were: no change


def test_the_sandbox_is_mixed_by_default_and_a_rank_keeps_its_store_as_ranks_come_and_go(monkeypatch):
    from launcher.sandbox import cluster
    from launcher.sandbox.errors import SandboxError

    monkeypatch.delenv("SPARKSTACK_SANDBOX_STORES", raising=False)
    assert cluster.stores(None, 4) == ["classic", "classic", "classic", "containerd"]
    assert cluster.stores(None, 5) == ["classic", "classic", "classic", "containerd", "classic"]
    assert cluster.stores(None, 8)[3::4] == ["containerd", "containerd"]
    assert cluster.stores(None, 2) == ["classic", "containerd"]
    assert cluster.stores("classic", 3) == ["classic"] * 3
    assert cluster.stores("containerd,classic", 2) == ["containerd", "classic"]
    monkeypatch.setenv("SPARKSTACK_SANDBOX_STORES", "containerd")
    assert cluster.stores(None, 2) == ["containerd"] * 2
    with pytest.raises(SandboxError, match="no sandbox Docker stores 'zfs'"):
        cluster.stores("zfs", 4)
    with pytest.raises(SandboxError, match="for 4 ranks"):
        cluster.stores("classic,containerd", 4)
