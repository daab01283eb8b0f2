"""The image chain's stand-ins for the tests of `build` and for scripts/bench_build.py: a tiny
base image (a static busybox, a shell python3 and a fake vLLM site-packages, imported into the
local Docker, nothing pulled) and the patch files a serving checkout would hold.

Test infrastructure that ships in the package, so the benchmark script imports it from here
rather than from tests/. The standard library only: `client` is launcher.images.build's engine.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import time
from pathlib import Path

BUSYBOX = Path("/bin/busybox")
TEST_LABEL = "org.sparkstack.test"
TEST_REPO = "sparkstack-test"
APPLETS = ["sh", "cp", "chmod", "rm", "mkdir", "dd", "echo", "cat", "test", "[", "true", "head",
           "ls", "grep", "sed"]
SITE = "usr/lib/python3/dist-packages"
PYTHON3 = r"""#!/bin/sh
# python3 STAND-IN of sparkstack's image tests (busybox sh, not Python). It answers only what the
# stages ask: `python3 -c <find_spec one-liner> NAME` prints the file NAME loads from, and
# `python3 SCRIPT FILE` (keys3's hook patch) appends a marker to FILE.
SP=/usr/lib/python3/dist-packages
if [ "$1" = -c ]; then
    if [ -f "$SP/$3/__init__.py" ]; then echo "$SP/$3/__init__.py"; exit 0; fi
    for so in "$SP/$3".*so; do [ -f "$so" ] && { echo "$so"; exit 0; }; done
    echo "python3 cannot find $3 in the base image" >&2; exit 1
fi
case "$1" in
    *.py) [ -f "$1" ] || { echo "python3: can't open file '$1'" >&2; exit 2; }
          echo "# patched by ${1##*/}" >> "$2"; exit 0;;
esac
echo "python3 stand-in: unsupported call: $*" >&2; exit 2
"""
# The files of Mia's image the stages add to or overlay (vLLM's layout), and exllamav3 0.0.43's
# extension that v145 replaces.
BASE_FILES = {
    f"{SITE}/vllm/__init__.py": b"__version__ = '0.0.0+sparkstack-test'\n",
    f"{SITE}/vllm/v1/attention/backends/mla/flashmla_sparse.py": b"# stock\n",
    f"{SITE}/vllm/model_executor/layers/quantization/exl3.py": b"# Mia's mcg-only overlay\n",
    f"{SITE}/vllm/model_executor/layers/sparse_attn_indexer.py": b"# stock indexer\n",
    f"{SITE}/vllm/model_executor/models/deepseek_v2.py": b"# stock DeepseekV2Model\n",
    f"{SITE}/exllamav3_ext.cpython-312-aarch64-linux-gnu.so": b"\x7fELF exllamav3 0.0.43\n",
}
def base_tarball(session: str) -> bytes:
    """The stand-in base's root filesystem; `session` goes into /etc/sparkstack-test."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add(path, data=None, mode=0o644, kind=tarfile.REGTYPE, link=""):
            info = tarfile.TarInfo(path)
            info.type, info.mode, info.linkname = kind, mode, link
            info.size = len(data) if data is not None else 0
            tar.addfile(info, io.BytesIO(data) if data is not None else None)

        dirs = {"bin", "tmp", "usr/bin"} | {str(p) for f in BASE_FILES for p in Path(f).parents}
        for d in sorted(dirs - {"."}):
            add(d, kind=tarfile.DIRTYPE, mode=0o1777 if d == "tmp" else 0o755)
        add("bin/busybox", BUSYBOX.read_bytes(), 0o755)
        for applet in APPLETS:
            add(f"bin/{applet}", kind=tarfile.SYMTYPE, link="busybox", mode=0o777)
        add("usr/bin/python3", PYTHON3.encode(), 0o755)
        add("etc", kind=tarfile.DIRTYPE, mode=0o755)
        add("etc/sparkstack-test", f"{session}\n".encode())
        for path, data in sorted(BASE_FILES.items()):
            add(path, data)
    return buf.getvalue()


def make_test_base(client, session: str) -> str:
    """Import the stand-in base for this session and return its tag."""
    data = base_tarball(session)
    tag = f"{TEST_REPO}/base:{hashlib.sha256(data).hexdigest()[:12]}"
    if client.image_id(tag) is None:
        repo, _, version = tag.rpartition(":")
        client.api.import_image_from_data(data, repository=repo, tag=version,
                                      changes=[f"LABEL {TEST_LABEL}={session}", "ENV PATH=/usr/bin:/bin",
                                               'CMD ["/bin/sh"]'])
    return tag


def remove_test_images(client, session: str) -> None:
    """Every image of this session (intermediate ones included), children before parents."""
    for _ in range(10):
        found = client.api.images(all=True, filters={"label": f"{TEST_LABEL}={session}"})
        if not found:
            return
        for image in sorted(found, key=lambda i: i["Created"], reverse=True):
            try:
                client.api.remove_image(image["Id"], force=True)
            except Exception:  # a parent of one not yet removed: the next round takes it
                pass


def session_id() -> str:
    return f"{os.getpid()}-{time.time_ns()}"


# Stand-ins for the serving checkout's files (the real ones are the user's, not shipped here).
PATCH_FILES = {
    "sm120_dcp.py": "# test stand-in: SM120 sparse-MLA backend, decode-context-parallel\n",
    "mla_attn_dcp.py": "# test stand-in: MLA attention with DCP KV sharding\n",
    "exl3.py": "# test stand-in: EXL3 overlay with mul1 markers\n",
    "sparse_attn_indexer.py": "# test stand-in: indexer with prefill top-k fallback\n",
    "ablit_runtime.py": "# test stand-in: ablit o_proj transplant runtime\n",
    "patch_ablit_dsv2.py": "# test stand-in: patches deepseek_v2.py to call ablit_runtime\n",
}
EXT_SO = b"\x7fELF exllamav3 1.4.5 (test stand-in)\n"


def write_patches(path: Path) -> Path:
    """The stand-in patch files in `path` (cluster.yaml images.patches_dir)."""
    path.mkdir(parents=True, exist_ok=True)
    for name, text in PATCH_FILES.items():
        (path / name).write_text(text)
    (path / "exllamav3_ext.so").write_bytes(EXT_SO)
    return path
