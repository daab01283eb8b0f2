"""The host NCCL library `nccl.host_lib` names: present or not, its real file, size and version."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from .parts import Part, key


@dataclass(frozen=True)
class NcclLib:
    """The host NCCL build `nccl.host_lib` names, as found on the rank."""

    path: str
    present: bool
    realpath: str | None = None  # the file the path (usually a soname link) resolves to
    size: int | None = None
    version: str | None = None  # "2.30.7+cuda13.0": the string NCCL prints at init, else the file name's
    problem: str | None = None  # why it could not be read


_NCCL_VERSION = re.compile(r"^NCCL version (\d+\.\d+\.\d+\S*)")
_SONAME_VERSION = re.compile(r"libnccl\.so\.(\d+\.\d+\.\d+)$")


def parse_nccl_lib(raw: dict | None) -> NcclLib | None:
    """The probe's look at the host NCCL library: present or not, and its version, read from
    the "NCCL version X.Y.Z..." string in the file, else from its real name (libnccl.so.X.Y.Z)."""
    if not raw:
        return None
    if raw.get("missing"):
        return NcclLib(raw["path"], False, problem=f"{raw['path']}: no such file")
    if "error" in raw and "size" not in raw:
        return NcclLib(raw["path"], False, problem=f"{raw['path']}: {raw['error']}")
    real = raw.get("realpath")
    m = _NCCL_VERSION.match(raw.get("version_text") or "")
    name = _SONAME_VERSION.search(PurePosixPath(real).name) if real else None
    version = m[1] if m else name[1] if name else None
    problem = f"{raw['path']}: {raw['error']}" if "error" in raw else None
    return NcclLib(raw["path"], True, real, raw.get("size"), version, problem)


NCCL_LIB = Part("nccl_lib", "nccl_lib", parse_nccl_lib, (key("nccl_lib"),))
