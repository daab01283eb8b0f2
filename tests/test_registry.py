"""This host's registry (launcher/images/registry.py) with the real docker-registry, fed through its own
HTTP API (no Docker needed): its storage is private, and `registry-prune` empties it, but never
under a running ship."""

import hashlib
import shutil
import stat

import httpx
import pytest
from click.testing import CliRunner

from launcher.images import registry, spool
from launcher.cli.commands import main

pytestmark = pytest.mark.skipif(shutil.which(registry.REGISTRY_BINARY) is None,
                                reason="docker-registry is not installed")


def upload_blob(reg: registry.LocalRegistry, data: bytes) -> str:
    """A blob pushed as Docker pushes a layer (a monolithic upload)."""
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    base = f"http://127.0.0.1:{reg.port}"
    started = httpx.post(f"{base}/v2/sparkstack/test/blobs/uploads/", timeout=10)
    assert started.status_code == 202, started.text
    location = str(httpx.URL(base).join(started.headers["Location"]))  # it holds the upload's state
    done = httpx.put(f"{location}&digest={digest}", content=data, timeout=10)
    assert done.status_code == 201, done.text
    return digest


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_storage_is_private_even_when_it_was_not(tmp_path):
    storage = tmp_path / "registry"
    with registry.LocalRegistry(storage, engine=object()):
        assert mode(storage) == 0o700
    storage.chmod(0o755)  # as an earlier version left it
    with registry.LocalRegistry(storage, engine=object()):
        assert mode(storage) == 0o700


def test_prune_empties_the_storage_but_not_under_a_running_ship(tmp_path, monkeypatch):
    storage = tmp_path / "registry"
    monkeypatch.setattr(registry, "STORAGE", storage)
    monkeypatch.setattr(spool, "SPOOL", tmp_path / "spool")
    (tmp_path / "spool" / "layers").mkdir(parents=True)
    (tmp_path / "spool" / "layers" / "ab").write_bytes(b"z" * 20_000_000)
    with registry.LocalRegistry(storage, engine=object()) as reg:
        upload_blob(reg, b"x" * 300_000)
        result = CliRunner().invoke(main, ["registry-prune"])
        assert result.exit_code == 1
        assert f"a ship is using {storage}: prune once it has ended" in result.output
        assert any(storage.rglob("data"))
    result = CliRunner().invoke(main, ["registry-prune"])
    assert result.exit_code == 0, result.output
    assert "registry storage emptied: 0.00 GB freed" in result.output  # 300 kB
    assert "spool emptied: 0.02 GB freed" in result.output
    assert not storage.exists() and not (tmp_path / "spool").exists()
    assert registry.prune(storage) == 0  # nothing left: nothing to do
    with registry.LocalRegistry(storage, engine=object()) as reg:  # and it starts afresh
        digest = upload_blob(reg, b"y" * 1000)
        assert httpx.head(f"http://127.0.0.1:{reg.port}/v2/sparkstack/test/blobs/{digest}").status_code == 200
    assert registry.prune(storage) >= 1000
