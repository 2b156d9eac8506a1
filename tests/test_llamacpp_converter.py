"""Differential test: our HF -> GGUF against llama.cpp's own ``convert_hf_to_gguf.py``.

For each family's tiny model and each of llama.cpp's ``--outtype`` f32 / f16 / bf16 / q8_0, both
converters write a GGUF of the same folder, and:

* the tensor sets are equal, and every tensor has the same name, ggml type, shape and bytes;
* our metadata is a superset of the reference's: every key it writes, we write with the same
  value, except the provenance labels in :data:`EXEMPT`.

The reference converter comes from the installed llama-cpp-python's sdist (tests/llamacpp_src.py)
and runs in a subprocess with its own gguf-py (tests/llamacpp_ref_convert.py).  Its outputs are
cached in the fixture cache, keyed by the model folder's bytes, the llama-cpp-python version and
the runner script, so a warm run only converts with ours.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import forkserver
import pytest

from convert_variants import build_variant, gguf_metadata
from llamacpp_src import llamacpp_source

from ckpt_surgeon import tiny_cache
from ckpt_surgeon.analysis.tokenizer import compare_tokenizers, tokenizer
from ckpt_surgeon.checkpoint import open_checkpoint
from ckpt_surgeon.conversion import hf_to_gguf
from fixtures.build_fixtures import fixture_base

OUTTYPES = ("f32", "f16", "bf16", "q8_0")
# Every family convert supports, as the llama.cpp-runnable variants tests/test_llamacpp.py uses
# (gpt2 with the Hub's config spelling: llama.cpp's GPT2Model needs n_ctx; phi3 as Phi-4 declares
# its BPE tokenizer: the reference reads a Phi-3 vocabulary only from a SentencePiece tokenizer.model;
# gemma2 with a SentencePiece tokenizer.model, the only vocabulary Gemma2Model.set_vocab reads).

# Families the reference converter cannot convert here, and the error it stops with (asserted, so
# a llama.cpp that fixes it makes the test fail and the family move to FAMILIES).  GPT-NeoX:
# GPTNeoXModel reads hparams["rotary_pct"], but its load_hparams takes AutoConfig(...).to_dict(),
# which under transformers 5 holds the value in rope_parameters only (also for Pythia's own
# config.json, which spells rotary_pct).  Ours converts it (tests/test_llamacpp.py runs the file).
# Falcon-7B's multi_query layout: FalconModel takes num_kv_heads, which FalconConfig sets to the
# head count when the config has none (Falcon-7B's has none), and reshapes query_key_value into that
# many groups; its one kv head does not fit (ours applies modeling_falcon's rule: one kv head).
REFERENCE_FAILS = {"gpt_neox": "KeyError: 'rotary_pct'", "falcon_mq_nobias": "RuntimeError: shape '[4, 3, 16, 64]'"}
FAMILIES = ("qwen2", "qwen2_long", "qwen2_yarn", "llama", "llama_bias", "llama3_rope", "llama_linear", "qwen3_yarn", "mistral", "qwen3", "phi3_bpe", "gpt2_hub", "gemma3",
            "qwen2_moe", "qwen3_moe", "olmoe", "mixtral", "starcoder2", "olmo2", "granite", "phi", "cohere",
            "stablelm", "bloom", "gemma2_spm", "falcon_nobias", "falcon_11b", "falcon_mha", "phimoe_hub", "deepseek_v2",
            "phi3_longrope", "phimoe_longrope", "deepseek_v2_yarn", "gemma3_linear",
            "phi4mini_longrope", "qwen2_named_templates")

# Metadata the reference writes that we do not match, and why (nothing else may differ):
EXEMPT = {
    # derived by its converter from the folder name (`Qwen2 A898F6Bb9Ad9`); ours is the --name
    # option / the folder name: a label, read by llama.cpp only for the Phi-3 tokenizer check,
    # which both satisfy for real Phi-3 folders
    "general.name",
    "general.basename",     # the folder name split into base / finetune / size by regexes
    "general.finetune",
    "general.size_label",   # a parameter count rounded for display ("132K")
    "general.type",         # "model" (vs "adapter"); llama.cpp's loader does not read it
}

# Keys we write with a different value than the reference, and why.
EXEMPT_VALUE = {
    # GPT2Model / Phi2Model.set_gguf_parameters write 4 * n_embd whatever n_inner /
    # intermediate_size say (128 in the fixtures); llama.cpp checks ffn_up's shape against this
    # key, so its file does not load (asserted below) and ours, with the real width, does
    "gpt2.feed_forward_length",
    "phi2.feed_forward_length",
    # FalconModel.set_gguf_parameters writes 2048 ("not in config.json") whatever
    # max_position_embeddings says (256 in the fixture, 8192 for Falcon2-11B); ours writes the
    # config's, the default n_ctx llama.cpp offers (the graph does not otherwise read it)
    "falcon.context_length",
}

# Tensors whose bytes we write differently, and why.  Gemma3Model.modify_tensors drops the
# embedding rows past len(vocab) + len(added_tokens) of tokenizer.json but keeps a token per
# config vocab_size row, so on a padded vocabulary (448 rows, 423 tokens here) its own file does
# not load: llama.cpp refuses "token_embd.weight has wrong shape" (asserted below).  Ours keeps
# every row; the rows it has in common with the reference are byte-identical.
TENSOR_PREFIX_ONLY = {("gemma3", "token_embd.weight"), ("gemma3_linear", "token_embd.weight")}

_RUNNER = Path(__file__).with_name("llamacpp_ref_convert.py")


def _pre_tokenizer(folder: Path) -> str:
    """The pre-tokenizer transformers runs for this folder, which llama.cpp's converter would recognise by its
    hash on the real checkpoints, named by the rule our converters use for a tokenizer llama.cpp does not know
    (``pre_name_for`` on the split of the tokenizer transformers loads: the tokenizer class it picks for the model
    type may replace tokenizer.json's, Qwen2Tokenizer's for qwen2, Qwen3_5Tokenizer's for qwen3_5_moe); gpt-2
    where it names none (a SentencePiece folder: llama.cpp's class does not ask)."""
    import json

    from transformers import AutoTokenizer

    from ckpt_surgeon.conversion.tokenizer import pre_name_for_json
    if not (folder / "tokenizer.json").is_file():
        return "gpt-2"
    import transformers
    tcfg = folder / "tokenizer_config.json"
    tcfg = json.loads(tcfg.read_text()) if tcfg.is_file() else {}
    # a tokenizer module of the folder's own (the tests' fixtures: tests/derived_util.py REMOTE_TOKENIZER) where no
    # transformers class stands for it; else transformers' own class, without importing the module
    remote = "AutoTokenizer" in (tcfg.get("auto_map") or {}) and not hasattr(transformers, tcfg.get("tokenizer_class") or "")
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True, **({"trust_remote_code": True} if remote else {}))
    return pre_name_for_json(json.loads(tok.backend_tokenizer.to_str())) or "gpt-2"


def _folder_key(folder: Path) -> str:
    h = hashlib.sha256()
    h.update(importlib.metadata.version("llama-cpp-python").encode())
    h.update(_RUNNER.read_bytes() + _pre_tokenizer(folder).encode())
    for p in sorted(folder.iterdir()):
        if p.is_file():
            h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


def _reference(folder: Path, family: str) -> Path:
    """llama.cpp's outputs for ``folder``: a cached folder of ``<outtype>.gguf`` files."""
    def build(tmp: Path) -> None:
        r = _run_reference(folder, tmp, OUTTYPES)
        if r.returncode != 0:
            pytest.fail(f"llama.cpp's convert_hf_to_gguf.py failed on {family}: {r.stderr.strip()[-1500:]}")

    return tiny_cache.cached_build(fixture_base() / "llamacpp-ref" / f"{family}-{_folder_key(folder)}", build)


def _run_reference(folder: Path, out: Path, outtypes) -> subprocess.CompletedProcess:
    root = llamacpp_source()
    env = dict(os.environ, PYTHONPATH=str(root / "gguf-py"), NO_LOCAL_GGUF="1")
    # forked from a server with torch and transformers imported (tests/forkserver.py): ~8 s of CPU less a run
    return forkserver.run([_RUNNER, root, folder, out, _pre_tokenizer(folder), *outtypes], env=env)


@pytest.mark.parametrize("family", sorted(REFERENCE_FAILS))
def test_reference_converter_fails_where_documented(family, family_src, tmp_path):
    r = _run_reference(family_src(family), tmp_path, ("f32",))
    assert r.returncode != 0 and REFERENCE_FAILS[family] in r.stderr, r.stderr[-1500:]


@pytest.fixture(scope="module")
def family_src(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("ref-families")
    return lambda name: build_variant(tiny, name, root / name)


def _tensors(path: Path) -> dict:
    with open_checkpoint(path) as ck:
        return {n: (i.dtype, tuple(i.shape), ck.read_raw(n)) for n, i in ck.tensors.items()}


@pytest.mark.parametrize("family", FAMILIES)
def test_hf_to_gguf_is_identical_to_llama_cpp_converter(family, family_src, tmp_path):
    src = family_src(family)
    ref_dir = _reference(src, family)
    for outtype in OUTTYPES:
        ref = ref_dir / f"{outtype}.gguf"
        ours = hf_to_gguf(src, tmp_path / f"{outtype}.gguf", dtype=outtype, name="tiny")
        assert_matches_reference(ours, ref, family, outtype)
        if outtype == "f32":
            # the tokenizer record (issue 48): the folder, llama.cpp's file of it and ours read as one tokenizer
            d = compare_tokenizers(tokenizer(src), tokenizer(ours))
            assert d.same, (family, d.to_dict())
            for side in (src, ours):
                d = compare_tokenizers(tokenizer(side), tokenizer(ref))
                assert set(d.differs) == TOKENIZER_DIFFERS.get(family, set()), (family, d.to_dict())


# Where the folder's tokenizer (as transformers runs it) and llama.cpp's file of it really differ, and why.
TOKENIZER_DIFFERS = {
    # the fixture's GemmaTokenizer adds no BOS (add_bos_token false, no BOS in tokenizer.json's template), and
    # Gemma2Model.set_vocab writes no tokenizer.ggml.add_bos_token for its SentencePiece vocabulary, so llama.cpp
    # adds one to its file (its default for 'llama' vocabularies); ours writes add_bos_token = false, as
    # transformers runs the folder.  The diff names it (real Gemma 2 folders add BOS, so there they agree).
    "gemma2_spm": {"add_flags"},
}


def assert_matches_reference(ours: Path, ref: Path, family: str, outtype: str) -> None:
    """Every tensor of the reference's file in ours with the same name, ggml type, shape and bytes
    (bar TENSOR_PREFIX_ONLY), and every metadata key it writes written by us with its value (bar
    EXEMPT / EXEMPT_VALUE)."""
    a, b = _tensors(ours), _tensors(ref)
    assert sorted(a) == sorted(b), (outtype, sorted(set(a) ^ set(b)))
    for name in b:
        if (family, name) in TENSOR_PREFIX_ONLY:
            assert a[name][0] == b[name][0] and a[name][1][1:] == b[name][1][1:], (outtype, name)
            assert a[name][1][0] > b[name][1][0] and a[name][2][: len(b[name][2])] == b[name][2], (outtype, name)
            if outtype == "f32":
                _assert_llama_cpp_refuses(ref, "token_embd.weight")
            continue
        assert a[name][:2] == b[name][:2], (outtype, name, a[name][:2], b[name][:2])
        assert a[name][2] == b[name][2], (outtype, name, "bytes differ")
    meta_a, _ = gguf_metadata(ours)
    meta_b, _ = gguf_metadata(ref)
    for key, value in meta_b.items():
        if key in EXEMPT:
            continue
        assert key in meta_a, (outtype, f"we do not write {key} = {value!r:.80}")
        if key not in EXEMPT_VALUE:
            assert meta_a[key] == value, (outtype, key, str(meta_a[key])[:200], str(value)[:200])


def _assert_llama_cpp_refuses(path: Path, tensor: str) -> None:
    """llama.cpp cannot load ``path`` and says ``tensor`` has the wrong shape (in a child: the
    message is on the native stderr)."""
    code = ("import sys, llama_cpp\n"
            "try:\n    llama_cpp.Llama(model_path=sys.argv[1], n_ctx=32, verbose=True)\n"
            "except ValueError:\n    sys.exit(3)\n")
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True)
    assert r.returncode == 3 and f"tensor '{tensor}' has wrong shape" in r.stderr, r.stderr[-600:]
