"""GGUF files holding ik_llama.cpp's own types (IQ2_K ... IQ6_K, the IQ*_KS family, the ``_R4`` / ``_R8``
row-interleaved repacks; ids llama.cpp's ggml never used) are refused in one line naming the type and
saying the file is for ik_llama.cpp (issue 49), never listed as "unknown type 143"."""
from __future__ import annotations

import struct

import gguf
import numpy as np
import pytest
from click.testing import CliRunner

from ckpt_surgeon.cli import cli
from ckpt_surgeon.formats.quant.ggml_types import GGML_TYPES, ik_llama_type

NAME = "blk.0.ffn_down.weight"


def _gguf_with_type(path, type_id: int):
    """A llama GGUF written by gguf-py with one F32 tensor, its ggml type id then set to ``type_id`` in the
    tensor-info record (name, n_dims, ne[], type, offset)."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor(NAME, np.zeros((2, 256), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    raw = bytearray(path.read_bytes())
    key = struct.pack("<Q", len(NAME)) + NAME.encode()
    at = raw.index(key) + len(key) + 4 + 2 * 8            # past n_dims and ne[2]
    assert struct.unpack_from("<I", raw, at)[0] == 0      # F32
    struct.pack_into("<I", raw, at, type_id)
    path.write_bytes(bytes(raw))
    return path


@pytest.mark.parametrize("type_id, name", [(137, "IQ2_K"), (141, "IQ6_K"), (144, "IQ4_KS"), (202, "Q4_0_R8"),
                                           (339, "IQ4_K_R4"), (155, "type id 155")])
def test_ik_llama_type_refused_in_one_line(type_id, name, tmp_path):
    g = _gguf_with_type(tmp_path / "ik.gguf", type_id)
    for cmd in ("inspect", "lint"):
        res = CliRunner().invoke(cli, [cmd, str(g)])
        assert res.exit_code == 2, res.output
        lines = [x for x in res.output.strip().splitlines() if x.strip()]
        assert len(lines) == 1, res.output
        assert f"is stored as {name} (ggml type id {type_id})" in lines[0] and "for ik_llama.cpp" in lines[0], lines
        assert NAME in lines[0] and "unknown" not in lines[0]


def test_mainline_ids_are_not_ik_llama():
    """Every id llama.cpp's ggml (this project's type table, checked against gguf-py) defines stays its own,
    and an id outside ik_llama.cpp's ranges is still an unknown type, not called ik_llama.cpp's."""
    assert all(ik_llama_type(t) is None for t in GGML_TYPES)
    assert ik_llama_type(50) is None and ik_llama_type(1000) is None
    assert {int(t) for t in gguf.GGMLQuantizationType}.isdisjoint({137, 144, 202, 339})
