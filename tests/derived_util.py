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
# MiniMaxM2Config rotates it)
CONFIG_EXTRA = {"minimax_m2": {"rotary_dim": 16}}
# tokenizer_config.json keys (DeepSeek-V3.2's class asserts add_bos_token, which its Hub tokenizer_config sets)
TOKENIZER_CONFIG = {"deepseek_v32": {"add_bos_token": True}}


@pytest.fixture(scope="module", autouse=True)
def converter_src():
    """``CKPT_SURGEON_LLAMACPP_SRC`` = the sdist's llama.cpp for the module's tests (imported, it is autouse)."""
    os.environ["CKPT_SURGEON_LLAMACPP_SRC"] = str(llamacpp_source())
    yield
    os.environ.pop("CKPT_SURGEON_LLAMACPP_SRC", None)


def zoo_folder(model_type: str, root: Path) -> Path:
    """``root/model_type``: the zoo's tiny ``model_type`` with the tokenizer copied in (built once), and what
    its own Hub folder has that llama.cpp's class reads (:data:`SPECIALS`, :data:`CONFIG_EXTRA`,
    :data:`TOKENIZER_CONFIG`)."""
    out = root / model_type
    if out.exists():
        return out
    shutil.copytree(zoo_path(model_type), out)
    tok = fixture_path("llama")
    for f in TOKENIZER_FILES:
        shutil.copy(tok / f, out / f)
    for name, extra in (("config.json", CONFIG_EXTRA), ("tokenizer_config.json", TOKENIZER_CONFIG)):
        if model_type in extra:
            cfg = json.loads((out / name).read_text())
            (out / name).write_text(json.dumps({**cfg, **extra[model_type]}, indent=2))
    if model_type in SPECIALS:
        from tokenizers import AddedToken, Tokenizer
        t = Tokenizer.from_file(str(out / "tokenizer.json"))
        t.add_special_tokens([AddedToken(s, special=True) for s in SPECIALS[model_type]])
        t.save(str(out / "tokenizer.json"))
    return out
