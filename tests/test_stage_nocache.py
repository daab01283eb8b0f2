"""The rank-side copy with `nocache` (an upgrade stages next to a serving engine): what it read and
wrote leaves the page cache as it goes, measured on this host's real kernel with `fincore` (the
sandbox's meminfo model counts only what its stand-ins report reading, so it cannot show a copy's
cache: the kernel's own figures per file can). Without `nocache` the same copy leaves both files
cached: the test sees the difference, not a hard-coded figure."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from launcher import onrank
from launcher.apply.stage import copy_args
from launcher.plan import staging

MIB = 1 << 20
SIZE = 160 * MIB  # past DROP_EVERY twice: the drop runs during the copy, not only at its end

pytestmark = pytest.mark.skipif(shutil.which("fincore") is None, reason="util-linux's fincore is not here")


def resident(path) -> int:
    """Bytes of the file in the page cache, as the kernel says (mincore, through fincore)."""
    done = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "-o", "RES", str(path)],
                          capture_output=True, text=True, check=True)
    return int(done.stdout.split()[0])


def uncache(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def copy(src, dst, nocache: bool) -> None:
    import json

    command, stdin = onrank.invocation("stage", {"mode": "list", "src": str(src), "dst": str(dst)})
    listed = subprocess.run(["sh", "-c", command], input=stdin, capture_output=True, check=True)
    plan = staging.make(str(src), str(dst), {0: ("here", json.loads(listed.stdout))}, None)
    command, stdin = onrank.invocation("stage", copy_args(plan, plan.ranks[0], 0, None, nocache))
    done = subprocess.run(["sh", "-c", command], input=stdin, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()


@pytest.fixture
def shard(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "model-00001-of-00001.safetensors", "wb") as f:
        for _ in range(SIZE // MIB):
            f.write(os.urandom(MIB))
    (src / "config.json").write_text("{}")
    uncache(src / "model-00001-of-00001.safetensors")
    return src


@pytest.mark.parametrize("nocache", [False, True])
def test_a_nocache_copy_leaves_neither_file_in_the_page_cache(shard, tmp_path, nocache):
    name = "model-00001-of-00001.safetensors"
    dst = tmp_path / f"dst-{nocache}"
    assert resident(shard / name) < 8 * MIB  # starts uncached
    copy(shard, dst, nocache)
    cached = resident(shard / name) + resident(dst / name)
    print(f"nocache={nocache}: {cached / MIB:.0f} MiB of the source and the copy in the page cache "
          f"after copying {SIZE / MIB:.0f} MiB")
    if nocache:
        assert cached < 8 * MIB
    else:  # what an upgrade's copy did before: the whole shard cached twice over, next to the engine
        assert cached > SIZE
