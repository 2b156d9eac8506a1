"""gpt-oss as OpenAI ships it: its experts MXFP4 (``*_blocks`` / ``*_scales``), the rest bf16.

:func:`mxfp4_gpt_oss` rewrites the zoo's tiny ``gpt_oss`` folder (fixtures/zoo.py; transformers'
bf16-expert layout ``gate_up_proj`` [E, H, 2I], ``down_proj`` [E, I, H]) into the release's layout:
``mlp.experts.gate_up_proj_blocks`` [E, 2I, H/32, 16] and ``_scales`` [E, 2I, H/32] (uint8: two
E2M1 codes per byte, one E8M0 exponent per 32 values), ``down_proj_blocks`` [E, H, I/32, 16] and
``_scales``, biases bf16, ``quantization_config: {quant_method: mxfp4}``.  The codes are random
(a seeded generator) with exponents near 2^0, so the file is a well-formed MXFP4 checkpoint.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path


def mxfp4_gpt_oss(zoo: Path, out: Path, tokenizer_from: Path, seed: int = 0) -> Path:
    import torch
    from safetensors.torch import load_file, save_file
    gen = torch.Generator().manual_seed(seed)
    out.mkdir(parents=True)
    new = {}
    for name, t in load_file(str(zoo / "model.safetensors")).items():
        if name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
            e, rows = t.shape[0], t.shape[2]               # stored [E, in, out]: the release keeps [E, out, in / 32]
            blocks = t.shape[1] // 32
            new[name + "_blocks"] = torch.randint(0, 256, (e, rows, blocks, 16), generator=gen, dtype=torch.uint8)
            new[name + "_scales"] = torch.randint(120, 131, (e, rows, blocks), generator=gen, dtype=torch.uint8)
        else:
            new[name] = t.to(torch.bfloat16)
    save_file(new, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((zoo / "config.json").read_text())
    cfg.update(dtype="bfloat16", quantization_config={
        "quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                             "model.embed_tokens", "lm_head"]})
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_from / f, out / f)
    return out
