"""The safetensors header: an 8-byte little-endian length, then that many bytes of JSON.

Only the header is read (never the tensors: a GLM-5.3 shard is several GB and sits on NFS).
The writer exists for the sandbox's small checkpoint; tests check both against the
`safetensors` library itself.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

# Largest header we accept: the format caps it at 100 MB; anything larger is not safetensors.
MAX_HEADER_BYTES = 100_000_000

DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}


class HeaderError(ValueError):
    pass


def read_header(path: Path) -> dict[str, dict]:
    """Tensor name -> {dtype, shape, data_offsets}; `__metadata__` is dropped."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise HeaderError(f"{path}: too short to be a safetensors file")
        (length,) = struct.unpack("<Q", raw)
        if length > MAX_HEADER_BYTES:
            raise HeaderError(f"{path}: header length {length} is not plausible")
        blob = f.read(length)
    try:
        header = json.loads(blob)
    except (ValueError, RecursionError) as e:  # not UTF-8, not JSON, nested beyond reading
        raise HeaderError(f"{path}: header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise HeaderError(f"{path}: header is not a JSON object")
    header.pop("__metadata__", None)
    for name, entry in header.items():
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
                and 0 <= offsets[0] <= offsets[1]):
            raise HeaderError(f"{path}: tensor {name!r} has no valid data_offsets [start, end]")
    return header


def tensor_bytes(entry: dict) -> int:
    start, end = entry["data_offsets"]
    return end - start


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], bytes]],
                      metadata: dict[str, str] | None = None) -> None:
    """Write tensors given as name -> (dtype, shape, raw bytes) in the safetensors format."""
    header: dict[str, object] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, (dtype, shape, data) in tensors.items():
        expected = DTYPE_BYTES[dtype] * _product(shape)
        if len(data) != expected:
            raise ValueError(f"{name}: {len(data)} bytes for {dtype}{shape}, expected {expected}")
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the format pads the header so tensors start aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for _, _, data in tensors.values():
            f.write(data)


def _product(shape: list[int]) -> int:
    n = 1
    for dim in shape:
        n *= dim
    return n
