"""What the derived-conversion tests (test_convert_derived, test_gguf_to_hf_derived) and
benchmarks/zoo_derived.py share: llama.cpp's converter source named for the module, and a zoo folder
with the tiny llama fixture's BPE tokenizer copied in (the zoo carries none)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from llamacpp_src import llamacpp_source

from fixtures.build_fixtures import fixture_path, zoo_path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
# what the model's own Hub folder has and the zoo folder lacks, which llama.cpp's class reads (both converters
# read the same folder):
# special tokens a class looks up by name (llama.cpp's _set_vocab_glm: bos [gMASK], eot <|user|>, eom
# <|observation|>; GLM-4 / ChatGLM's set_vocab: <|user|>; Solar Open's: <unk>, <|startoftext|>)
_GLM = ("[gMASK]", "<|user|>", "<|observation|>")
SPECIALS = {"glm4_moe": _GLM, "glm4_moe_lite": _GLM, "glm_moe_dsa": _GLM, "glm4": _GLM, "glm": _GLM,
            "solar_open": ("<unk>", "<|startoftext|>")}
# config keys the Hub's config.json has and transformers' config class does not write (MiniMaxM2Model reads
# rotary_dim; MiniMax-M2's own config says 64 of head_dim 128; here the whole head, as transformers'
# MiniMaxM2Config rotates it; GPT-SW3's config.json keeps GPT-2's n_ctx, which GPT2Model.set_gguf_parameters reads;
# Qwen4Exp's class writes the indexer's sizes, None in transformers' config of a model with no indexed layer, as
# the tiny one is: tiny values, metadata only)
CONFIG_EXTRA = {"minimax_m2": {"rotary_dim": 16},
                "gpt-sw3": {"n_ctx": 1024},
                "qwen4_exp": {"indexer_n_heads": 2, "indexer_head_dim": 16, "indexer_budget": 64,
                              "indexer_compress_ratio": 4, "indexer_kv_heads": 1}}
# tokenizer_config.json keys (DeepSeek-V3.2's class asserts add_bos_token, which its Hub tokenizer_config sets)
TOKENIZER_CONFIG = {"deepseek_v32": {"add_bos_token": True}}
# the families that ship a SentencePiece tokenizer (tokenizer.model, and tokenizer.json = transformers' conversion of
# it: BPE with byte fallback), which llama.cpp's class reads (_set_vocab_sentencepiece: Gemma, ERNIE 4.5, Nemotron,
# MiniCPM3, Jamba; gguf.LlamaHfVocab, which wants the byte-fallback BPE tokenizer.json: Gemma 4); value: the
# transformers tokenizer class that converts it and the special ids the family's own tokenizer has
_GEMMA_SPM = ("GemmaTokenizer", dict(pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>",
                                     bos_piece="<bos>", unk_piece="<unk>", add_dummy_prefix=False))
_LLAMA_SPM = ("LlamaTokenizer", dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1))
SPM = {"gemma": _GEMMA_SPM, "gemma4": _GEMMA_SPM, "gemma4_text": _GEMMA_SPM, "ernie4_5": _LLAMA_SPM,
       "ernie4_5_moe": _LLAMA_SPM, "nemotron": _LLAMA_SPM, "minicpm3": _LLAMA_SPM, "jamba": _LLAMA_SPM}
# tensors the Hub checkpoint carries and transformers' class does not build: Qwen3-Next's and Qwen3.5's
# multi-token-prediction block (``mtp.*``: one more full-attention decoder layer, ``fc`` over the concatenated
# embedding and hidden state, three norms), which llama.cpp's class requires (``_QwenMtpMixin``) and writes as a
# NextN layer
MTP = ("qwen3_next", "qwen3_5", "qwen3_5_moe")


@pytest.fixture(scope="module", autouse=True)
def converter_src():
    """``CKPT_SURGEON_LLAMACPP_SRC`` = the sdist's llama.cpp for the module's tests (imported, it is autouse)."""
    os.environ["CKPT_SURGEON_LLAMACPP_SRC"] = str(llamacpp_source())
    yield
    os.environ.pop("CKPT_SURGEON_LLAMACPP_SRC", None)


def zoo_folder(model_type: str, root: Path) -> Path:
    """``root/model_type``: the zoo's tiny ``model_type`` with a tokenizer (the tiny llama fixture's BPE one copied
    in, or a SentencePiece one for :data:`SPM`), built once, and what its own Hub folder has that llama.cpp's class
    reads (:data:`SPECIALS`, :data:`CONFIG_EXTRA`, :data:`TOKENIZER_CONFIG`, :data:`MTP`)."""
    out = root / model_type
    if out.exists():
        return out
    tmp = root / f".{model_type}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(zoo_path(model_type), tmp)
    _fill(model_type, tmp)
    tmp.rename(out)
    return out


def _fill(model_type: str, out: Path) -> None:
    if model_type in SPM:
        _spm_tokenizer_into(out, *SPM[model_type])
    else:
        tok = fixture_path("llama")
        for f in TOKENIZER_FILES:
            shutil.copy(tok / f, out / f)
    if model_type in MTP:
        _add_mtp(out)
    for name, extra in (("config.json", CONFIG_EXTRA), ("tokenizer_config.json", TOKENIZER_CONFIG)):
        if model_type in extra:
            cfg = json.loads((out / name).read_text())
            (out / name).write_text(json.dumps({**cfg, **extra[model_type]}, indent=2))
    if model_type in SPECIALS:
        from tokenizers import AddedToken, Tokenizer
        t = Tokenizer.from_file(str(out / "tokenizer.json"))
        t.add_special_tokens([AddedToken(s, special=True) for s in SPECIALS[model_type]])
        t.save(str(out / "tokenizer.json"))


def _spm_tokenizer_into(out: Path, tokenizer_class: str, ids: dict) -> None:
    """A SentencePiece BPE model with byte fallback trained on the fixtures' corpus (below the zoo's vocabulary of
    512, which llama.cpp pads), as ``tokenizer.model``, with transformers' own conversion of it saved beside."""
    import transformers
    from convert_variants import _spm_tokenizer
    work, tok = _spm_tokenizer(out, getattr(transformers, tokenizer_class), vocab_size=500, **ids)
    shutil.copy(work / "sp.model", out / "tokenizer.model")
    tok.save_pretrained(out)
    shutil.rmtree(work)


def _add_mtp(out: Path) -> None:
    """``mtp.layers.0.*`` shaped as the model's last full-attention layer, ``mtp.fc`` (hidden x 2 hidden) and the
    three norms, seeded, in the model's dtype, added to its safetensors file."""
    import numpy as np
    from safetensors.numpy import load_file, save_file
    cfg = json.loads((out / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    full = max(i for i, t in enumerate(cfg["layer_types"]) if t == "full_attention")
    path = out / "model.safetensors"
    tensors = load_file(path)
    prefix = f"model.layers.{full}."
    hidden, dtype = tensors["model.norm.weight"].shape[0], tensors["model.norm.weight"].dtype
    shapes = {"mtp.layers.0." + k[len(prefix):]: v.shape for k, v in tensors.items() if k.startswith(prefix)}
    shapes.update({"mtp.fc.weight": (hidden, 2 * hidden), "mtp.pre_fc_norm_embedding.weight": (hidden,),
                   "mtp.pre_fc_norm_hidden.weight": (hidden,), "mtp.norm.weight": (hidden,)})
    rng = np.random.default_rng(0)
    tensors.update({k: (rng.standard_normal(shape) * 0.02).astype(dtype) for k, shape in sorted(shapes.items())})
    save_file(tensors, path, metadata={"format": "pt"})
