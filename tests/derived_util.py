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


@pytest.fixture(scope="module", autouse=True)
def converter_src():
    """``CKPT_SURGEON_LLAMACPP_SRC`` = the sdist's llama.cpp for the module's tests (imported, it is autouse)."""
    os.environ["CKPT_SURGEON_LLAMACPP_SRC"] = str(llamacpp_source())
    yield
    os.environ.pop("CKPT_SURGEON_LLAMACPP_SRC", None)


def zoo_folder(model_type: str, root: Path, *, config_extra: dict | None = None, specials=()) -> Path:
    """``root/model_type``: the zoo's tiny ``model_type`` with the tokenizer copied in (built once);
    ``config_extra`` merged into its config.json, ``specials`` added to the tokenizer as special tokens."""
    out = root / model_type
    if out.exists():
        return out
    shutil.copytree(zoo_path(model_type), out)
    tok = fixture_path("llama")
    for f in TOKENIZER_FILES:
        shutil.copy(tok / f, out / f)
    if config_extra:
        cfg = json.loads((out / "config.json").read_text())
        (out / "config.json").write_text(json.dumps({**cfg, **config_extra}, indent=2))
    if specials:
        from tokenizers import AddedToken, Tokenizer
        t = Tokenizer.from_file(str(out / "tokenizer.json"))
        t.add_special_tokens([AddedToken(s, special=True) for s in specials])
        t.save(str(out / "tokenizer.json"))
    return out
