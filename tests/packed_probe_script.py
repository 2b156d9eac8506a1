"""Run by tests/test_gguf_to_hf_derived.py in a child process (llama.cpp's ``conversion`` package imports its own
gguf-py): :class:`~ckpt_surgeon.conversion.derived.packed.NibbleLearner` driven by llama.cpp's own
``ModelBase.repack_mxfp4_blocks`` over a stack of experts, as DeepSeek-V4's class calls it, or by that repack with
the exponent computed (``computed``: + 1) or with each expert's rows reversed (``rows-reversed``).  Prints JSON:
the refusal, and whether the release's bytes gathered back from the repacked stack are the ones given."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

from ckpt_surgeon.conversion.derived import packed as P
from ckpt_surgeon.conversion.derived.child import _import_llamacpp

ROWS, COLS, EXPERTS = 4, 64, 3


def stack(repack, kind: str, digit: int = 0) -> np.ndarray:
    """The class's output for one pass: expert e's codes are HF id 2e + 1, its exponents 2e + 2."""
    out = []
    for e in range(EXPERTS):
        codes = P.probe_bytes(kind, 2 * e + 1, ROWS * COLS // 2, 32, digit).reshape(ROWS, COLS // 2)
        scale = P.probe_bytes(kind, 2 * e + 2, ROWS * COLS // 32, 2, digit).reshape(ROWS, COLS // 32)
        out.append(repack(torch.from_numpy(codes).view(torch.int8), torch.from_numpy(scale)))
    return np.stack(out)


def main(root: str, variant: str) -> None:
    gguf, _conversion = _import_llamacpp(Path(root))
    from conversion.base import ModelBase
    repack = ModelBase.repack_mxfp4_blocks
    if variant == "computed":
        repack = lambda p, s: ModelBase.repack_mxfp4_blocks(p, s + 1)     # noqa: E731
    elif variant == "rows-reversed":      # only moves bits, but not block by block in order: beyond the learner
        repack = lambda p, s: ModelBase.repack_mxfp4_blocks(p.flip(0), s.flip(0))     # noqa: E731
    type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.MXFP4][1]
    packed = {k: 32 if k % 2 else 2 for k in range(1, 2 * EXPERTS + 1)}
    numel = {k: ROWS * COLS // (2 if k % 2 else 32) for k in packed}
    learn = P.NibbleLearner(packed, numel, [f"t{k}" for k in packed])
    for handler, kind, n in ((learn.on_id, "nid", P.digits_for(max(packed))),
                             (learn.on_place, "npos", P.digits_for(31))):
        for d in range(n):
            learn.digit = d
            handler("blk.0.ffn_gate_exps.weight", stack(repack, kind, d), type_size)
    learn.merge()
    out = stack(repack, "nrand")
    learn.on_rand("blk.0.ffn_gate_exps.weight", out, type_size)
    learn.check_coverage()
    rows = learn.maps["blk.0.ffn_gate_exps.weight"]
    if learn.refusal:
        print(json.dumps({"refusal": learn.refusal}))
        return
    back = {k: np.zeros(2 * numel[k], np.uint8) for k in packed}
    P.scatter(rows, P.nibbles(out).reshape(-1, 2 * type_size), back, packed)
    same = all(np.array_equal(P.pack(back[k]), P.probe_bytes("nrand", k, numel[k], packed[k])) for k in packed)
    print(json.dumps({"refusal": learn.refusal, "gathered_back": same, "map_rows": len(rows)}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "")
