"""Judging claims with transformers' own float64 forward passes (test_derive, test_zoo)."""
from __future__ import annotations

import json
from pathlib import Path

# An exact fold only moves additions around (b_v through W_o, a per-row shift inside softmax):
# float64 rounding through a few tiny layers stays ~1e-14 relative; a real change from a bias of
# std 0.5 is ~1e-2.  1e-10 separates the two by orders of magnitude on both sides.
EXACT_RTOL = 1e-10


def logits64(folder) -> "torch.Tensor":
    """Logits (or the first output) of the checkpoint in ``folder``, float64, fixed inputs, flattened;
    then the outputs of any vision tower on fixed pixels (see ``_towers``)."""
    import torch
    import transformers

    from ckpt_surgeon.arch.derive.derived import config_object
    from ckpt_surgeon.arch.derive.feeds import model_inputs, tower_outputs
    from ckpt_surgeon.arch.derive.float64 import float64_softmax
    from ckpt_surgeon.arch.derive.instance import first_output
    from ckpt_surgeon.runtime import quiet_transformers
    cfg = json.loads((Path(folder) / "config.json").read_text())
    conf = config_object(cfg)
    klass = getattr(transformers, cfg["architectures"][0])
    with quiet_transformers():
        model = klass.from_pretrained(folder, config=conf, dtype=torch.float64).eval()
    with torch.no_grad(), float64_softmax():
        out = [first_output(model(**model_inputs(conf, model=model))).detach().reshape(-1)]
        out += [tower_outputs(mod(**inputs)).detach() for mod, inputs in _towers(model)]
    return torch.cat(out)


def _towers(model) -> list:
    """Vision / audio towers a token-id forward never runs (arch.derive.feeds.tower_input), so that claims about
    their blocks are judged too: their outputs on fixed pixels / features join the logits."""
    from ckpt_surgeon.arch.derive.derived import TOWER_PATH, read_blocks
    from ckpt_surgeon.arch.derive.feeds import tower_input
    blocks, _ = read_blocks(model, model.config)
    found = {}
    for b in blocks:
        if b.kind != "none" and TOWER_PATH.search(b.group):
            hit = tower_input(model, b.group)
            if hit is not None:
                found.setdefault(id(hit[0]), hit)
    return list(found.values())


def rel_change(a, b) -> float:
    return float((a - b).abs().max()) / (float(a.abs().max()) or 1.0)


def zeroed_k_all(src, out_dir) -> Path:
    """A copy of ``src`` whose every attention key bias (per the layout) is zeroed: the 'is the key
    bias really doing something' control for classes that claim it is not removable."""
    import numpy as np
    import shutil
    from safetensors.numpy import load_file, save_file

    from ckpt_surgeon import open_checkpoint
    from ckpt_surgeon.surgery.fold import bias_rows
    out = Path(out_dir)
    shutil.copytree(src, out)
    with open_checkpoint(str(src)) as ck:
        lay = ck.layout()
        rows = {}
        for lt in lay.layers:
            r = bias_rows(lay, lt, "k")
            if r:
                rows.setdefault(r[0], []).extend(np.asarray(r[1]).tolist())
    for f in out.glob("*.safetensors"):
        t = load_file(f)
        hit = False
        for name, rr in rows.items():
            if name in t:
                t[name] = t[name].copy()
                t[name][rr] = 0
                hit = True
        if hit:
            save_file(t, f, metadata={"format": "pt"})
    return out
