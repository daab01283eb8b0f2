"""The checkpoint's sha256 manifest and `check --deep` (issue 15), with each rank a local
directory: the manifest is made once, shared out over the ranks; a corrupt or missing shard is
named with its rank."""

import dataclasses
import hashlib
import shlex
import subprocess
from types import SimpleNamespace

import pytest

from launcher.apply.preflight import verify
from launcher.gather import hashes
from launcher.facts.checkpoint_dir import Checkpoint
from launcher.status import Status
from launcher.transport.remote import Group, Result, Target

PATH = "/models/glm"
SHARDS = {f"model-0000{i}-of-00004.safetensors": bytes([i]) * (1000 + i) for i in range(1, 5)}
CONFIG = b'{"architectures": ["GlmMoeDsaForCausalLM"]}'


class LocalRank:
    """A rank whose checkpoint at PATH is a directory here; commands run in a local shell."""

    def __init__(self, r, root):
        self.target = Target(r, f"spark{r + 1}", f"10.0.0.{11 + r}")
        self.root, self.commands = root, []

    def run(self, command, timeout=60.0, **kw):
        self.commands.append(command)
        local = command.replace(shlex.quote(PATH), shlex.quote(str(self.root)))
        done = subprocess.run(["sh", "-c", local], capture_output=True, text=True, timeout=timeout)
        return Result(self.target, done.returncode, done.stdout, done.stderr)


@pytest.fixture
def ranks(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    out = []
    for r in range(4):
        root = tmp_path / f"spark{r + 1}"
        root.mkdir()
        (root / "config.json").write_bytes(CONFIG)
        for name, data in SHARDS.items():
            (root / name).write_bytes(data)
        out.append(LocalRank(r, root))
    return out


def facts_of(ranks):
    shards = tuple((n, len(d)) for n, d in SHARDS.items())
    c = Checkpoint(PATH, hashlib.sha256(CONFIG).hexdigest(), None, shards, "f" * 64, sum(s for _, s in shards))
    return {r.target.rank: SimpleNamespace(checkpoint=c) for r in ranks}


LOADED = SimpleNamespace(cluster=SimpleNamespace(model=SimpleNamespace(path=PATH, local_path=None, serving_path=PATH)))


def test_manifest_is_shared_out_then_every_rank_matches(ranks):
    path, sha = hashes.make(LOADED, Group(ranks), facts_of(ranks))
    assert sha == {n: hashlib.sha256(d).hexdigest() for n, d in {"config.json": CONFIG, **SHARDS}.items()}
    assert path.name.startswith("f" * 24) and path.is_file()
    hashed = [c.split("sha256sum -- ")[1] for r in ranks for c in r.commands]
    assert len(hashed) == 4 and sorted(" ".join(hashed).split()) == sorted(sha)  # each file once
    found = verify(LOADED, Group(ranks), facts_of(ranks))
    assert {f.status for f in found.values()} == {Status.PASS}
    assert found[0].value == "5 files match the manifest"


def test_a_corrupt_shard_is_named_with_its_rank(ranks):
    hashes.make(LOADED, Group(ranks), facts_of(ranks))
    bad = ranks[2].root / "model-00003-of-00004.safetensors"
    bad.write_bytes(b"\0" + bad.read_bytes()[1:])  # same size: the fingerprint cannot see it
    (ranks[1].root / "model-00004-of-00004.safetensors").unlink()
    found = verify(LOADED, Group(ranks), facts_of(ranks))
    assert found[0].status == found[3].status == Status.PASS
    assert found[2].status == Status.FAIL
    assert found[2].value.startswith("rank 2: model-00003-of-00004.safetensors differs from the manifest (sha256 ")
    assert "copy model-00003-of-00004.safetensors to this rank's /models/glm again" in found[2].fix
    assert found[1].status == Status.FAIL
    assert found[1].value.startswith("rank 1: model-00004-of-00004.safetensors in /models/glm could not be read")


def test_without_a_manifest_the_odd_rank_out_is_named(ranks):
    bad = ranks[3].root / "model-00001-of-00004.safetensors"
    bad.write_bytes(b"x" * len(SHARDS[bad.name]))
    found = verify(LOADED, Group(ranks), facts_of(ranks))
    assert found[3].status == Status.FAIL and "differs from the other ranks" in found[3].value
    assert found[0].status == Status.WARN and "sparkstack manifest" in found[0].fix


def test_a_rank_that_cannot_hash_its_share_stops_the_manifest(ranks):
    facts = facts_of(ranks)
    (ranks[1].root / "model-00001-of-00004.safetensors").unlink()  # rank 1's share: the first shard
    with pytest.raises(ValueError, match=r"^rank 1 \(spark2\): could not hash model-00001-of-00004.safetensors"):
        hashes.make(LOADED, Group(ranks), facts)
    assert not hashes.manifest_file("f" * 64).exists()
    other = {r: SimpleNamespace(checkpoint=dataclasses.replace(f.checkpoint, fingerprint="e" * 64))
             for r, f in facts.items()}
    assert hashes.load("e" * 64) is None and hashes.files(other[0])[0] == "config.json"
