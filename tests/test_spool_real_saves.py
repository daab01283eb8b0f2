"""ship's spool on real `docker save` files (tests/fixtures/docker_save): Docker 20.10's legacy
layout (CI's host engine) and Docker 26.1's OCI layout (Debian trixie's docker.io, what the
sandbox ranks move to, issue 32). The synthetic saves of test_spool.py model both; these are the
engines' own bytes.

Measured with these engines (not run here): the load tar `spool.load_tar` makes from either save
loads into Docker 26.1 (overlay2) through ship's load (`LOAD_COMMAND`, then `_tag_verified`), whole or over a rank that
holds the lower layers, and gives this host's image ID."""

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from launcher.images import spool

SAVES = Path(__file__).parent / "fixtures" / "docker_save"
IMAGE_ID = "sha256:6eefe754a1ec45a5219a8f4cce3d48405236193e0edd5ed335666681c1c95c92"
DIFF_IDS = ["sha256:8302a9ccaaa2b296b9282139c7163cc03e59c34758ab0ad0a3e01d094e598530",
            "sha256:f912dc7cf8daa3234d420fcf3098b299b1814d01107c3aaff3c003c2f256840a"]
LEGACY, OCI = "save-20.10-legacy.tar", "save-26.1-oci.tar"


class Engine:
    """docker-py's `api.get_image` over a save file, in chunks that split its members."""

    def __init__(self, path: Path, chunk: int = 1000):
        self.api, self.data, self.chunk = self, path.read_bytes(), chunk

    def get_image(self, image_id, chunk_size=None):
        assert image_id == IMAGE_ID
        return (self.data[i:i + self.chunk] for i in range(0, len(self.data), self.chunk))


def members(chunks) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar}


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_the_fixtures_are_the_two_layouts():
    with tarfile.open(SAVES / LEGACY) as tar:
        names = tar.getnames()
        assert f"{IMAGE_ID[7:]}.json" in names and any(n.endswith("/layer.tar") for n in names)
        assert not any(n.startswith("blobs/") for n in names)
    with tarfile.open(SAVES / OCI) as tar:
        names = tar.getnames()
        assert {"index.json", "oci-layout", "manifest.json", f"blobs/sha256/{IMAGE_ID[7:]}"} <= set(names)
        assert not any(n.endswith("layer.tar") for n in names)
        manifest = json.loads(tar.extractfile("manifest.json").read())
        assert manifest[0]["Layers"] == [f"blobs/sha256/{d[7:]}" for d in DIFF_IDS]  # uncompressed


@pytest.mark.parametrize("save", [LEGACY, OCI])
def test_a_real_save_spools_by_diff_id_whichever_engine_wrote_it(tmp_path, save):
    spooling = spool.start(Engine(SAVES / save), IMAGE_ID, DIFF_IDS, root=tmp_path)
    config = spooling.finished()
    assert sha(config) == IMAGE_ID
    assert json.loads(config)["rootfs"]["diff_ids"] == DIFF_IDS
    for diff_id in DIFF_IDS:
        assert sha((tmp_path / "layers" / diff_id[7:]).read_bytes()) == diff_id
    got = members(spool.load_tar(spooling, 1))  # the rank has the base: only the change goes
    assert set(got) == {f"{DIFF_IDS[1][7:]}/layer.tar", "config.json", "manifest.json"}
    assert b"fixture-top" in got[f"{DIFF_IDS[1][7:]}/layer.tar"]


def test_both_layouts_give_the_ranks_the_same_bytes(tmp_path):
    """What a rank loads does not depend on which engine the control host runs."""
    tars = {}
    for save in (LEGACY, OCI):
        spooling = spool.start(Engine(SAVES / save), IMAGE_ID, DIFF_IDS, root=tmp_path / save)
        spooling.finished()
        tars[save] = [b"".join(spool.load_tar(spooling, have)) for have in (0, 1, 2)]
    assert tars[LEGACY] == tars[OCI]
