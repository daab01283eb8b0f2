"""Our header reader and writer against the safetensors library itself."""

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from launcher.facts.safetensors_header import HeaderError, read_header, tensor_bytes, write_safetensors


def test_reads_headers_written_by_safetensors(tmp_path):
    path = tmp_path / "a.safetensors"
    save_file({"w": np.zeros((3, 5), dtype=np.float16), "b": np.ones(7, dtype=np.int32)}, str(path),
              metadata={"format": "pt"})
    header = read_header(path)
    assert set(header) == {"w", "b"}
    assert header["w"]["dtype"] == "F16" and header["w"]["shape"] == [3, 5]
    assert tensor_bytes(header["w"]) == 30 and tensor_bytes(header["b"]) == 28


def test_safetensors_loads_what_we_write(tmp_path):
    path = tmp_path / "b.safetensors"
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    write_safetensors(path, {"x": ("F32", [3, 4], data.tobytes()), "y": ("U8", [2], b"\x01\x02")},
                      metadata={"format": "pt"})
    with safe_open(str(path), framework="numpy") as f:
        assert f.metadata() == {"format": "pt"}
        np.testing.assert_array_equal(f.get_tensor("x"), data)
        assert f.get_tensor("y").tolist() == [1, 2]


def test_never_reads_the_tensors(tmp_path):
    """A header followed by a truncated body still parses: only the header is read."""
    path = tmp_path / "c.safetensors"
    write_safetensors(path, {"big": ("BF16", [1024, 1024], bytes(2 * 1024 * 1024))})
    blob = path.read_bytes()
    path.write_bytes(blob[:200])
    assert read_header(path)["big"]["shape"] == [1024, 1024]


@pytest.mark.parametrize("blob", [b"", b"\xff" * 8 + b"{}", b"\x05\x00\x00\x00\x00\x00\x00\x00notjs"])
def test_not_safetensors_is_a_clear_error(tmp_path, blob):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(blob)
    with pytest.raises(HeaderError, match="bad.safetensors"):
        read_header(path)


def test_writer_checks_sizes(tmp_path):
    with pytest.raises(ValueError, match="expected 8"):
        write_safetensors(tmp_path / "d.safetensors", {"x": ("F32", [2], b"\x00" * 4)})
