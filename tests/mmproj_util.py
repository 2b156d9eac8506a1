"""mmproj test files: tiny VLMs built from transformers configs, and their vision / audio projector GGUF
written by llama.cpp's own ``convert_hf_to_gguf.py --mmproj`` (the llama-cpp-python sdist, its own gguf-py,
tests/llamacpp_ref_convert.py).

A model is the multimodal zoo's tiny instance (fixtures/zoo.py ``zoo_config``: biases on, std 0.5 noise)
with the few changes the converter needs, stated in :data:`SPECS`; it is saved in float32, so the
converter's F32 output holds the very same values (1-D tensors are always F32 in llama.cpp's converter),
and the processor config the converter reads (``image_mean`` / ``image_std``) is written by the model's
own transformers image processor / feature extractor class.  Folder and GGUF are cached in the fixture
cache, keyed by this file, the zoo recipe, transformers and llama-cpp-python.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import os
from pathlib import Path

import forkserver

from ckpt_surgeon import tiny_cache
from fixtures.build_fixtures import fixture_base

_RUNNER = Path(__file__).with_name("llamacpp_ref_convert.py")
# the converter's output types written per model: float32, and Q8_0 (2-D weights quantized, 1-D tensors F32)
OUTTYPES = ("f32", "q8_0")

# zoo key -> sub-config values set on top of the zoo's tiny config, and why:
# - 3 (Qwen2.5-VL: 4) encoder layers: the converter names tensors through gguf-py's TensorNameMap built for
#   the encoder's block count, so Qwen2-VL's merger ``mlp.2`` (``mm.2``) needs a block id 2 to exist;
# - Qwen2.5-VL ``fullatt_block_indexes`` evenly spaced below the depth (the converter derives n_wa_pattern
#   from it and refuses irregular spacing); Qwen3-VL ``deepstack_visual_indexes`` below the depth;
# - Gemma 3 without SigLIP's pooling head (``vision_use_head``: Gemma 3 checkpoints have none; the
#   converter drops ``vision_model.head.*``), and a 128-pixel image (8 x 8 patches) pooled to 2 x 2 tokens
#   (``mm_tokens_per_image``), which llama.cpp's default pooling (4, clip.cpp) also gives: the zoo's
#   224 / 16 = 14 patches per side do not pool evenly, and clip.cpp then refuses to encode.
# Non-dict values are set at the top level of the config.
SPECS = {
    "qwen2_vl@mm": {"vision_config": {"depth": 3}},
    "qwen2_5_vl@mm": {"vision_config": {"depth": 4, "fullatt_block_indexes": [1, 3]}},
    "qwen3_vl@mm": {"vision_config": {"depth": 3, "deepstack_visual_indexes": [1]}},
    "idefics3@mm": {"vision_config": {"num_hidden_layers": 3}},
    "smolvlm@mm": {"vision_config": {"num_hidden_layers": 3}},
    "gemma3": {"vision_config": {"num_hidden_layers": 3, "vision_use_head": False, "image_size": 128},
               "mm_tokens_per_image": 4},
    "qwen2_audio@mm": {"audio_config": {"encoder_layers": 3}},
    "voxtral@mm": {"audio_config": {"num_hidden_layers": 3}},
}

# transformers 5.24 saves Gemma 3's SigLIP tower as ``vision_tower.encoder.*``; the Hub checkpoints, and so
# llama.cpp's TensorNameMap, have ``vision_tower.vision_model.encoder.*`` (transformers loads both: its
# conversion_mapping.py removes the prefix, PrefixChange(prefix_to_remove="vision_model")).  The fixture is
# written in the Hub layout, which both our HF reader and the converter read.
_HUB_PREFIX = {"gemma3": ("vision_tower.", "vision_tower.vision_model.")}


def _fingerprint(key: str) -> str:
    import transformers

    from fixtures.zoo import fingerprint
    body = "\n".join([Path(__file__).read_text(), _RUNNER.read_text(), fingerprint(key),
                      transformers.__version__, importlib.metadata.version("llama-cpp-python")])
    return hashlib.sha256(body.encode()).hexdigest()[:12]


def _processor(folder: Path, model_type: str) -> None:
    """The model's own image processor / feature extractor config (what the converter reads)."""
    import transformers
    from transformers.models.auto.feature_extraction_auto import FEATURE_EXTRACTOR_MAPPING_NAMES
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES
    names = IMAGE_PROCESSOR_MAPPING_NAMES.get(model_type) or FEATURE_EXTRACTOR_MAPPING_NAMES.get(model_type)
    if isinstance(names, dict):      # {"pil": ..., "torchvision": ...}: the PIL one needs no torchvision
        names = names.get("pil") or next(iter(names.values()))
    name = names if isinstance(names, str) else names[0]
    getattr(transformers, name)().save_pretrained(folder)


def _build(key: str, out: Path) -> None:
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    from ckpt_surgeon.arch.derive.instance import random_instance
    from fixtures.zoo import MM_MAX_PARAMS, _class_name, zoo_config
    from llamacpp_src import llamacpp_source
    cfg = zoo_config(key)
    for sub, values in SPECS[key].items():
        cfg[sub] = {**cfg[sub], **values} if isinstance(values, dict) else values
    _, model = random_instance(cfg, getattr(transformers, _class_name(key)), seed=0, max_params=MM_MAX_PARAMS)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():       # a weight transformers initialises to zero (Gemma 3's mm_input_projection_weight)
        for p in model.parameters():    # would make the encoder's output, which the runtime test compares, 0
            if p.ndim >= 2 and not p.any():
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5)
    hf = out / "hf"
    model.to(torch.float32).save_pretrained(hf)
    if key in _HUB_PREFIX:
        old, new = _HUB_PREFIX[key]
        for f in hf.glob("*.safetensors"):
            state = load_file(f)
            save_file({(new + k[len(old):] if k.startswith(old) else k): v for k, v in state.items()}, f,
                      metadata={"format": "pt"})
    _processor(hf, cfg["model_type"])
    root = llamacpp_source()
    env = dict(os.environ, PYTHONPATH=str(root / "gguf-py"), NO_LOCAL_GGUF="1")
    r = forkserver.run([_RUNNER, root, hf, out, "gpt-2", *(f"mmproj-{t}" for t in OUTTYPES)], env=env)
    if r.returncode != 0:
        raise RuntimeError(f"llama.cpp's converter failed on {key} (--mmproj): {r.stderr[-1500:]}")


def mmproj_pair(key: str, outtype: str = "f32") -> tuple[Path, Path]:
    """(HF folder, mmproj GGUF llama.cpp's converter wrote from it with ``--outtype outtype``, one of
    :data:`OUTTYPES`) for a :data:`SPECS` key."""
    final = fixture_base() / "mmproj" / f"{key}-{_fingerprint(key)}"
    root = tiny_cache.cached_build(final, lambda tmp: _build(key, Path(tmp)))
    return root / "hf", root / f"mmproj-{outtype}.gguf"


def rewrite_gguf(src: Path, dst: Path, *, drop=(), values: dict | None = None, tensors: dict | None = None,
                 replace: bool = False) -> Path:
    """``src`` rewritten with gguf-py's writer (the reference one): metadata keys in ``drop`` left out, those in
    ``values`` set to ``(value, GGUFValueType)``, extra ``tensors`` (name -> float32 array) added (``replace``:
    they replace the file's tensors of those names, in place)."""
    import gguf
    import numpy as np
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, r.fields["general.architecture"].contents())
    values = dict(values or {})
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture" or k in drop or k in values:
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(k, f.contents(), f.types[0], sub_type=f.types[-1])
        else:
            w.add_key_value(k, f.contents(), f.types[0])
    for k, (v, t) in values.items():
        w.add_key_value(k, v, t)
    tensors = dict(tensors or {})
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(tensors.pop(t.name) if replace and t.name in tensors else t.data))
    for name, arr in tensors.items():
        w.add_tensor(name, np.asarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
