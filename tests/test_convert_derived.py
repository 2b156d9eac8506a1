"""HF -> GGUF for architectures outside the native registry, derived from llama.cpp's converter
classes (ckpt_surgeon/conversion/derived): the whole file byte-identical to llama.cpp's own
``convert_hf_to_gguf.py`` on the same tiny folder, llama.cpp loads and runs it, k-quants equal
llama-quantize on llama.cpp's f32 file, and the refusals are one line with exit code 2.

The folders are the zoo's tiny models (fixtures/zoo.py, cached) with the tiny llama fixture's BPE
tokenizer copied in (the zoo carries none).  The reference runs once per folder and is cached
(tests/test_llamacpp_converter.py ``_reference``: f32, f16, bf16, q8_0).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from derived_util import REMOTE_TOKENIZER, converter_src, zoo_folder  # noqa: F401 -- converter_src: the module's autouse fixture
from hubenv import hub  # noqa: F401  (the local Hub fixture)
from test_llamacpp_converter import _reference
from test_quantize import assert_same_tensors, llama_quantize

from ckpt_surgeon.analysis.tokenizer import compare_tokenizers, tokenizer
from ckpt_surgeon.cli import cli as cli_main
from ckpt_surgeon.conversion import convert

# zoo model types outside the native registry, each a different llama.cpp converter class
# (benchmarks/zoo_derived.py runs every one the zoo builds)
# Ministral 3: Mistral3Model delegates to an inner model and overrides write(); the class's own write() runs
ARCHS = ("olmo", "smollm3", "seed_oss", "exaone4", "granitemoe", "hunyuan_v1_dense", "lfm2", "ministral3")
# issue 33's frontier families (tiny, from transformers' configs): DeepSeek-V3, GLM-4.5, Llama 4, gpt-oss
# (its bf16 form; not the MXFP4 release), MiniMax-M2, Qwen3.5 MoE (hybrid linear attention, with the MTP block its
# Hub checkpoints carry), ERNIE 4.5 MoE (a SentencePiece tokenizer): tests/derived_util.py
FRONTIER = ("deepseek_v3", "glm4_moe", "llama4", "gpt_oss", "minimax_m2", "qwen3_5_moe", "ernie4_5_moe")
LOADS = ("olmo", "exaone4", "granitemoe")     # also run by llama.cpp (llama-cpp-python)
# folders in the Hub's form where transformers' save differs (tests/derived_util.py): BERT as its base model with a
# WordPiece vocabulary (tokenizer.ggml.pre named "default" on both sides); DeepSeek-V4 under its release's names
# (no `model.` prefix, `attn.kv_norm`), its routed experts MXFP4 (packed codes + E8M0 scales, repacked by the class);
# BitNet in the layout llama.cpp's BitnetModel maps (1bitLLM's names, tied embeddings: transformers' own layout is
# refused by both, test_llama_cpp_refusal_is_one_line), whose class ternarizes each projection by its whole-tensor
# mean |w|: a computed chain, evaluated whole, which the 4 KiB slabs here would break if it were taken for casts
# Hunyuan MoE with its own tokenizer module (tiktoken's interface; convert needs --trust-remote-code) and per-layer
# expert lists; dots3-note in its release's config form, with a sliding-window MLA layer
HUB_FORM = ("bert", "deepseek_v4", "bitnet@1bitllm", "hunyuan_v1_moe", "dots3_note")


@pytest.fixture(scope="module", autouse=True)
def small_slabs():
    """The child encodes element-wise outputs (the embedding, the MLP matrices: read, ``.to(float32)``,
    ``.numpy()``) a slab of rows at a time, ~64 MiB of float32 a slab; at 4 KiB the tiny models' tensors are
    cut into many slabs (one expert a slab for GraniteMoE's stacked ``ffn_down_exps``, each with its own
    importance matrix row), so every byte-identity test in this module checks the slabs' seams too."""
    os.environ["CKPT_SURGEON_DERIVED_PIECE"] = "4096"
    yield
    os.environ.pop("CKPT_SURGEON_DERIVED_PIECE", None)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("derived")
    return lambda model_type: zoo_folder(model_type, root)


@pytest.mark.parametrize("outtype", ("f16", "q8_0"))
@pytest.mark.parametrize("model_type", ARCHS)
def test_derived_file_is_llama_cpp_converters_byte_for_byte(model_type, outtype, folder, tmp_path):
    src = folder(model_type)
    ref = _reference(src, f"derived-{model_type}") / f"{outtype}.gguf"
    report = convert(src, tmp_path / "ours.gguf", outtype)
    assert report.engine.startswith("derived: llama.cpp "), report.engine
    assert (tmp_path / "ours.gguf").read_bytes() == ref.read_bytes()
    if outtype == "f16":        # issue 48: the folder and llama.cpp's file of it hold one tokenizer
        assert_one_tokenizer(src, ref, model_type)


# Where llama.cpp's class writes another tokenizer than the folder's files name, on purpose, and why: diff reads the
# folder as the class writes it (one tokenizer with its GGUF) and names the departure in a note (issue 48).  The tiny
# folders carry the tiny fixtures' tokenizer, not the real model's, so the ids these classes hard-code or read from
# the config point elsewhere than on the real checkpoints.
CONVERTER_DEPARTS = {
    # HunYuanModel.set_vocab: "Fix EOS/EOT tokens that are incorrect in upstream configs": eos = config's
    # eod_token_id (3 in the tiny config, the token '!'), not the tokenizer's <|im_end|>
    "hunyuan_v1_dense": ["special tokens: eos: files 2 '<|im_end|>', llama.cpp 3 '!'"],
    # Dots3Model.set_vocab: eot = <|endofassistant|>, which the folder's tokenizer has as an added token only; read
    # as ours would write the files, llama.cpp's load rules take <|endoftext|> for eot
    "dots3_note": ["special tokens: eot: files 0 '<|endoftext|>', llama.cpp 420 '<|endofassistant|>'"],
    # BitnetModel: _set_vocab_sentencepiece writes no tokenizer.ggml.add_bos_token, so llama.cpp adds BOS (its
    # default for a 'llama' vocabulary); the folder's tokenizer adds none
    "bitnet@1bitllm": ["add-BOS/EOS flags: add_bos: files False, llama.cpp True"],
}


def assert_one_tokenizer(src: Path, gguf: Path, model_type: str) -> None:
    """diff's tokenizer part: the folder and the GGUF llama.cpp's converter made of it are one tokenizer, with
    the class's departures from the folder's files named as CONVERTER_DEPARTS says (none elsewhere)."""
    d = compare_tokenizers(tokenizer(src), tokenizer(gguf))
    assert d.same, d.to_dict()
    departs = [n.split(" in ", 1)[1] for n in d.notes if "departs from the folder's files" in n]
    assert departs == CONVERTER_DEPARTS.get(model_type, []), d.to_dict()


# one family for each way llama.cpp's class writes a tokenizer other than the folder's files read as ours would write
# them (the zoo sweep, benchmarks/zoo_tokenizer.py, before the class's view was taken): a BERT class writing a BPE
# folder as WordPiece (camembert), Gemma's SentencePiece reading (ids, scores, an eot it names), Gemma 4's own
# vocabulary kind, GLM's specials looked up by name, Ernie's add_prefix_space null written false, XLM-R's Unigram,
# ModernBERT's and EuroBERT's special ids and flags
VOCAB_CLASSES = ("camembert", "gemma", "gemma4", "glm4", "ernie4_5", "xlm-roberta", "modernbert", "eurobert")


@pytest.mark.parametrize("model_type", VOCAB_CLASSES)
def test_folder_reads_as_llama_cpps_class_writes_its_tokenizer(model_type, folder, tmp_path):
    """diff of the folder against llama.cpp's own ``--vocab-only`` file of it: one tokenizer, because the HF side is
    read as the class writes it (a note says so); read as ckpt-surgeon's own converter would write it, they differ,
    so the class's reading is what this checks."""
    from ckpt_surgeon.analysis.tokenizer.compare import _compare
    from test_llamacpp_converter import _run_reference
    src = folder(model_type)
    r = _run_reference(src, tmp_path, ("vocab",))
    assert r.returncode == 0, r.stderr[-1500:]
    hf, ref = tokenizer(src), tokenizer(tmp_path / "vocab.gguf")
    assert not _compare(hf, ref).same
    d = compare_tokenizers(hf, ref)
    assert d.same, d.to_dict()
    assert any(n.startswith("HF side read as llama.cpp's ") for n in d.notes), d.notes


def test_a_hub_repo_on_the_derived_path_reads_as_llama_cpps_class_writes_it(hub, folder, tmp_path):
    """A Hub repo of such an architecture: its side files fetched over HTTP (no weights), the class's plan run on
    them (no tensor indexed), the same one tokenizer as llama.cpp's own file of the folder."""
    from test_llamacpp_converter import _run_reference
    src = folder("glm4")
    assert _run_reference(src, tmp_path, ("vocab",)).returncode == 0
    hub.add_repo("owner/glm", src)
    d = compare_tokenizers(tokenizer("owner/glm"), tokenizer(tmp_path / "vocab.gguf"))
    assert d.same, d.to_dict()
    assert any(n.startswith("HF side read as llama.cpp's Glm4Model") for n in d.notes), d.notes


def test_without_llama_cpps_class_the_folder_is_read_natively_and_said(folder, tmp_path, monkeypatch):
    """No converter source: the folder is read as ckpt-surgeon's converter would write it, and the note says that
    llama.cpp's class was not run (the differences then may be the class's, not the files')."""
    from test_llamacpp_converter import _run_reference
    src = folder("glm4")
    gguf = tmp_path / "ref"
    gguf.mkdir()
    assert _run_reference(src, gguf, ("vocab",)).returncode == 0
    monkeypatch.setenv("CKPT_SURGEON_LLAMACPP_SRC", str(tmp_path / "no-llama.cpp"))
    d = compare_tokenizers(tokenizer(src), tokenizer(gguf / "vocab.gguf"))
    assert d.differs == ("special_ids", "eog"), d.to_dict()
    assert any("llama.cpp's converter class for Glm4ForCausalLM was not run" in n for n in d.notes), d.notes


@pytest.mark.parametrize("model_type", HUB_FORM)
def test_hub_form_folder_is_llama_cpp_converters_file(model_type, folder, tmp_path):
    src = folder(model_type)
    ref = _reference(src, f"derived-{model_type}") / "f16.gguf"
    convert(src, tmp_path / "ours.gguf", "f16", trust_remote_code=model_type in REMOTE_TOKENIZER)
    assert (tmp_path / "ours.gguf").read_bytes() == ref.read_bytes()
    if model_type in REMOTE_TOKENIZER:      # the folder's tokenizer is a Python module: not read, and said so
        d = compare_tokenizers(tokenizer(src), tokenizer(ref))       # issue 48
        assert not d.compared and "tokenizer module of the model's own" in d.line, d.to_dict()
    else:
        assert_one_tokenizer(src, ref, model_type)


@pytest.mark.parametrize("model_type", FRONTIER)
def test_frontier_family_is_llama_cpp_converters_file_and_its_kquant(model_type, folder, tmp_path):
    """f16: the whole file equals llama.cpp's converter's; q4_k_m: every tensor equals llama-quantize
    run on llama.cpp's converter's f32 file (one pass here, no f32 copy)."""
    src = folder(model_type)
    ref = _reference(src, f"derived-{model_type}")
    convert(src, tmp_path / "ours.gguf", "f16")
    assert (tmp_path / "ours.gguf").read_bytes() == (ref / "f16.gguf").read_bytes()
    llama_quantize(ref / "f32.gguf", tmp_path / "ref.q4_k_m.gguf", "q4_k_m")
    convert(src, tmp_path / "ours.q4_k_m.gguf", "q4_k_m")
    assert_same_tensors(tmp_path / "ours.q4_k_m.gguf", tmp_path / "ref.q4_k_m.gguf", f"{model_type} q4_k_m")
    if model_type == "qwen3_5_moe":
        # back to HF: the file's NextN layer is the checkpoint's mtp.* block, which transformers' class does not
        # build, so the class stops (it asserts the block); probed in its own no-MTP mode, the rest is not invertible
        # either (A = -exp(A_log)), and the one line says that, not the name problem
        r = CliRunner().invoke(cli_main, ["convert", str(tmp_path / "ours.gguf"), "-o", str(tmp_path / "back"),
                                          "--config", str(src)])
        assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
        assert "not invertible: GGUF tensor blk.0.ssm_a (from HF model.layers.0.linear_attn.A_log)" in r.output, r.output
        assert "without the file's multi-token-prediction block" in r.output, r.output
        assert not (tmp_path / "back").exists()


# llama.cpp writes 0 heads for an attention-free model (Mamba 2) and per-layer head counts with 0 for a hybrid's
# recurrent / MLP-only layers (NemotronH: head_count_kv [0, 0, 2, 0] in the tiny one)
ATTENTION_FREE = ("mamba2", "nemotron_h")


@pytest.mark.parametrize("model_type", ATTENTION_FREE)
def test_attention_free_layers_in_llama_cpps_file_are_read_and_quantized_as_llama_quantize(model_type, folder,
                                                                                          tmp_path):
    """llama.cpp's own file for the model is read (``inspect``: no KV cache in a layer with 0 kv heads, the others
    counted); q4_k_m equals llama-quantize on llama.cpp's f32 file (its n_head_kv is layer 0's: 0 here)."""
    from ckpt_surgeon.analysis.inspect import inspect
    from ckpt_surgeon.checkpoint import open_checkpoint
    src = folder(model_type)
    ref = _reference(src, f"derived-{model_type}")
    with open_checkpoint(ref / "f32.gguf") as ck:
        arch = ck.metadata["general.architecture"]
        kv = ck.metadata.get(f"{arch}.attention.head_count_kv", ck.metadata[f"{arch}.attention.head_count"])
        n = ck.metadata[f"{arch}.block_count"]
    per = list(kv) if isinstance(kv, list) else [kv] * n
    assert 0 in per, per                        # the case under test: llama.cpp wrote a 0
    rep = inspect(ref / "f32.gguf")
    assert rep.memory.layers["none"] == per.count(0) and rep.memory.layers["full"] == n - per.count(0)
    head = rep.head_dim or 0
    # f16 K and V of every attention layer, 1,000 tokens
    assert rep.memory.kv_bytes_per_1000["f16"] == sum(2 * 1000 * v * head * 2 for v in per)
    res = CliRunner().invoke(cli_main, ["inspect", str(ref / "f32.gguf")])
    assert res.exit_code == 0 and "without attention heads" in res.output, res.output
    # the heads row: none when no layer has attention (Mamba 2; it said "2 / 2 / 16", the kv heads defaulting to
    # the file's head count), the counts for a hybrid
    assert ("none: no layer has attention" in res.output) == (not any(per)), res.output
    assert (rep.num_kv_heads == 0) == (not any(per)), rep.num_kv_heads
    res = CliRunner().invoke(cli_main, ["lint", str(ref / "f32.gguf")])     # no "layers without attention" error
    assert res.exit_code == 0, res.output
    if model_type == "nemotron_h":      # the HF folder (layers_block_type) caches what llama.cpp's file says
        assert inspect(src).memory.kv_bytes_per_1000 == rep.memory.kv_bytes_per_1000
        assert CliRunner().invoke(cli_main, ["lint", str(src)]).exit_code == 0
    llama_quantize(ref / "f32.gguf", tmp_path / "ref.q4_k_m.gguf", "q4_k_m")
    convert(src, tmp_path / "ours.q4_k_m.gguf", "q4_k_m")
    assert_same_tensors(tmp_path / "ours.q4_k_m.gguf", tmp_path / "ref.q4_k_m.gguf", f"{model_type} q4_k_m")


def test_stacked_experts_take_their_own_importance_matrix_as_llama_quantize(folder, tmp_path):
    """A derived MoE (GraniteMoE: experts stacked by llama.cpp's class) quantized with an importance matrix
    holding one matrix per expert: every tensor equals llama-quantize's with the same matrix on llama.cpp's
    f32 file (the experts are encoded a few at a time, each with its own matrix)."""
    from test_quantize import _imatrix_entries, _weights, tensors, write_imatrix_gguf
    src = folder("granitemoe")
    f32 = _reference(src, "derived-granitemoe") / "f32.gguf"
    entries = _imatrix_entries(f32)
    stacked = [n for n, (_, c) in entries.items() if c.size > 1]
    assert stacked, entries.keys()                 # the case under test: per-expert matrices
    write_imatrix_gguf(tmp_path / "imatrix.gguf", entries)
    llama_quantize(f32, tmp_path / "ref.gguf", "q4_k_m", imatrix=_weights(entries))
    convert(src, tmp_path / "ours.gguf", "q4_k_m", imatrix=tmp_path / "imatrix.gguf")
    assert_same_tensors(tmp_path / "ours.gguf", tmp_path / "ref.gguf", "granitemoe q4_k_m imatrix")
    convert(src, tmp_path / "plain.gguf", "q4_k_m")       # the matrix changed the experts' bytes
    assert tensors(tmp_path / "plain.gguf")[stacked[0]][2] != tensors(tmp_path / "ours.gguf")[stacked[0]][2]


def test_native_families_stay_native(tiny, tmp_path):
    report = convert(tiny("qwen2"), tmp_path / "q.gguf", "f16")
    assert report.engine == "native"


def test_native_family_forced_through_llama_cpp_is_its_file(tiny, tmp_path):
    """``--engine llama.cpp`` on a registry family: the same bytes as llama.cpp's converter."""
    src = tiny("llama")
    ref = _reference(src, "derived-llama") / "bf16.gguf"
    convert(src, tmp_path / "d.gguf", "bf16", engine="llama.cpp")
    assert (tmp_path / "d.gguf").read_bytes() == ref.read_bytes()


def _without_biases(src: Path, dst: Path) -> Path:
    """The zoo folder with every bias switch of its config off, rebuilt by transformers (the zoo turns
    them all on, and llama.cpp's graphs for these architectures have no bias slots: llama.cpp's own
    converter writes the biases anyway, and llama.cpp then refuses its file, 'wrong number of tensors')."""
    import torch
    import transformers
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update({k: False for k, v in cfg.items() if "bias" in k and v is True})
    (dst / "config.json").write_text(json.dumps(cfg))
    model = transformers.AutoModelForCausalLM.from_pretrained(dst, dtype=torch.float32)
    (dst / "model.safetensors").unlink()
    model.save_pretrained(dst)
    return dst


def _f32_copy(src: Path, dst: Path, change=None) -> Path:
    """The folder with its float64 tensors stored as float32 (``change``: name -> function of the array)."""
    from safetensors.numpy import load_file, save_file
    shutil.copytree(src, dst)
    tensors = {n: a.astype(np.float32) if a.dtype == np.float64 else a
               for n, a in load_file(dst / "model.safetensors").items()}
    for n, f in (change or {}).items():
        tensors[n] = f(tensors[n]).astype(tensors[n].dtype)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_diff_of_a_derived_gguf_against_its_folder_gathers_hf_tensors_back(folder, tmp_path):
    """diff GGUF vs HF folder for an architecture the registry does not map: the GGUF's tensors gathered back by the
    learned inverse of llama.cpp's class (GraniteMoE: one HF expert stack becomes two GGUF tensors), compared as
    values.  An f32 file of an f32 folder is identical; one expert of one layer changed in the folder is named, and
    only it; a Q8_0 file is the same weights re-encoded; the tokenizer is compared as the class writes it."""
    from ckpt_surgeon.analysis.diff import diff
    src = _f32_copy(folder("granitemoe"), tmp_path / "f32")
    convert(src, tmp_path / "m.f32.gguf", "f32")
    r = diff(tmp_path / "m.f32.gguf", src)
    assert r.verdict == "identical" and r.counts["identical"] == len(r.tensors) > 0, r.verdict_line
    assert r.tokenizer.same and any("gathered back to HF tensors" in n for n in r.notes), r.notes
    stack = "model.layers.1.block_sparse_moe.input_linear.weight"

    def bump(a):
        a = a.copy()
        a[2] *= 1.5
        return a
    changed = _f32_copy(folder("granitemoe"), tmp_path / "changed", {stack: bump})
    r = diff(tmp_path / "m.f32.gguf", changed)
    assert r.verdict == "changed" and [t.name for t in r.changed()] == [stack], r.verdict_line
    convert(src, tmp_path / "m.q8_0.gguf", "q8_0")
    r = diff(tmp_path / "m.q8_0.gguf", src)
    assert r.verdict == "reencoded", r.verdict_line
    # Q8_0: 8-bit codes with one scale per 32 values, |error| <= scale / 2: ~0.4 % of a row's largest value, so a few
    # tenths of a percent of the Frobenius norm
    assert max(t.rel_fro for t in r.tensors if t.rel_fro is not None) < 0.01
    res = CliRunner().invoke(cli_main, ["diff", str(tmp_path / "m.f32.gguf"), str(changed)])
    assert res.exit_code == 1 and "1 tensor(s) changed" in res.output, res.output


def test_diff_names_what_llama_cpps_class_drops(folder, tmp_path):
    """BERT: llama.cpp's BertModel drops the pooler.  Against the folder, its GGUF has every other tensor (gathered
    back, values equal) and the pooler is the folder's only, named in a note; not called a fine-tune."""
    from ckpt_surgeon.analysis.diff import diff
    src = folder("bert")
    convert(src, tmp_path / "b.gguf", "f32")
    r = diff(tmp_path / "b.gguf", src)
    pooler = ["pooler.dense.bias", "pooler.dense.weight"]
    assert [t.name for t in r.tensors if t.status == "only_in_b"] == pooler, r.verdict_line
    # the folder's float64 values written as float32: each element within 2^-24 of itself, relatively
    assert r.counts["changed"] == 0 and all(t.rel_fro < 2 ** -24 for t in r.tensors if t.rel_fro is not None)
    assert r.verdict == "changed" and "2 only in B" in r.verdict_line and "re-encoded" in r.verdict_line, \
        r.verdict_line
    assert any(n.startswith(", ".join(pooler) + ": llama.cpp's converter class drops them") for n in r.notes), r.notes


@pytest.mark.parametrize("model_type", LOADS)
def test_llama_cpp_runs_the_derived_file_as_transformers(model_type, folder, tmp_path):
    import llama_cpp
    import torch
    import transformers
    src = _without_biases(folder(model_type), tmp_path / "src")
    out = tmp_path / "m.gguf"
    convert(src, out, "f32")
    ids = [1, 5, 9, 30, 7, 100, 200, 301]
    llm = llama_cpp.Llama(model_path=str(out), logits_all=True, n_ctx=64, verbose=False, n_threads=2)
    try:
        llm.eval(ids)
        got = np.array(llm.scores[:len(ids)], dtype=np.float32)
    finally:
        llm.close()
    model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0].numpy()
    # f32 weights both sides; ggml and torch sum in different orders (OLMo measured 1.0e-4 relative)
    rel = np.abs(got[:, :want.shape[1]] - want).max() / np.abs(want).max()
    assert rel < 1e-3, rel


def test_kquant_is_llama_quantize_on_llama_cpps_f32(folder, tmp_path):
    src = folder("olmo")
    ref32 = _reference(src, "derived-olmo") / "f32.gguf"
    llama_quantize(ref32, tmp_path / "ref.gguf", "q4_k_m")
    convert(src, tmp_path / "ours.gguf", "q4_k_m")
    assert_same_tensors(tmp_path / "ours.gguf", tmp_path / "ref.gguf", "olmo q4_k_m")


def test_report_says_derived_and_progress_is_shown(folder, tmp_path):
    """The JSON report names the path; ``--progress`` shows the class's planning step and a bar over the bytes
    (drawn by this process from the child's events, conversion/derived/feed.py); ``--no-progress``: silent."""
    r = CliRunner().invoke(cli_main, ["convert", str(folder("olmo")), "-o", str(tmp_path / "o.gguf"), "--format", "json",
                                      "--progress"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["engine"].startswith("derived: llama.cpp OlmoModel")
    assert all(t["transform"] == "llama.cpp" and t["source"] for t in rep["tensors"])
    assert "llama.cpp's OlmoModel plans the tensors and metadata" in r.stderr, r.stderr
    assert "writing o.gguf" in r.stderr and f"/{len(rep['tensors'])}" in r.stderr, r.stderr
    r = CliRunner().invoke(cli_main, ["convert", str(folder("olmo")), "-o", str(tmp_path / "q.gguf"), "--no-progress"])
    assert r.exit_code == 0 and r.stderr == "", r.stderr


def test_list_architectures():
    r = CliRunner().invoke(cli_main, ["convert", "--list-architectures"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert any(ln.split()[:2] == ["OlmoForCausalLM", "derived"] for ln in lines)
    assert any(ln.split()[:2] == ["Qwen2ForCausalLM", "native"] for ln in lines)
    native, derived, _ = (int(p.split()[0]) for p in lines[-1].split(", "))
    assert native >= 20 and derived >= 200


def test_unknown_architecture_one_line_exit_2(folder, tmp_path):
    src = tmp_path / "m"
    shutil.copytree(folder("olmo"), src)
    cfg = json.loads((src / "config.json").read_text())
    cfg["architectures"] = ["OlmoForCausalLMX"]
    (src / "config.json").write_text(json.dumps(cfg))
    r = CliRunner().invoke(cli_main, ["convert", str(src), "-o", str(tmp_path / "o.gguf")])
    assert r.exit_code == 2
    assert "OlmoForCausalLMX" in r.output and "nearest llama.cpp names: OlmoForCausalLM" in r.output
    assert not (tmp_path / "o.gguf").exists()


def test_without_network_says_what_to_install(folder, tmp_path):
    """No converter cached and pip cannot reach an index: one line naming the pip command, exit 2."""
    env = {k: v for k, v in os.environ.items() if k != "CKPT_SURGEON_LLAMACPP_SRC"}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp_path),
               PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    r = subprocess.run([sys.executable, "-m", "ckpt_surgeon", "convert", str(folder("olmo")), "-o",
                        str(tmp_path / "o.gguf")], capture_output=True, text=True, env=env)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip download --no-binary :all: --no-deps llama-cpp-python==" in lines[0]
    assert not (tmp_path / "o.gguf").exists()


def test_llama_cpp_refusal_is_one_line(folder, tmp_path):
    """transformers' BitNet checkpoint (BitNet b1.58 2B4T's layout: a separate `lm_head`, `attn_sub_norm` /
    `ffn_sub_norm`) is not the one llama.cpp's BitnetModel maps (1bitLLM's): the derived path stops where
    llama.cpp's converter stops, in one line."""
    r = CliRunner().invoke(cli_main, ["convert", str(folder("bitnet")), "-o", str(tmp_path / "o.gguf")])
    assert r.exit_code == 2, r.output
    assert len(r.output.strip().splitlines()) == 1 and "llama.cpp's converter stopped" in r.output
    assert "Can not map tensor 'lm_head.weight'" in r.output, r.output
    assert not (tmp_path / "o.gguf").exists() and not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())


def test_python_shipped_with_the_model_runs_only_with_trust_remote_code(folder, tmp_path, monkeypatch):
    """GLM-4's class loads the tokenizer with ``trust_remote_code=True`` (so do the classes for Kimi-K2, Kimi-Linear,
    Hunyuan ...): a folder whose tokenizer_config.json auto_map names a module of its own had that module imported by
    ``convert`` without a word.  Now: refused in one line naming it, exit 2, nothing written, not even copied into
    transformers' module cache; with --trust-remote-code it runs, and the file is llama.cpp's converter's, which
    runs it too (the marker shows both ran it: what the refusal guards is real)."""
    from test_llamacpp_converter import _run_reference
    src = tmp_path / "glm4"
    shutil.copytree(folder("glm4"), src)
    marker, modules = tmp_path / "ran", tmp_path / "modules"
    (src / "tokenization_probe.py").write_text(
        "import os\nfrom transformers import PreTrainedTokenizerFast\n"
        "open(os.environ['CKPT_TEST_REMOTE_MARKER'], 'a').write('ran')\n"
        "class ProbeTokenizer(PreTrainedTokenizerFast):\n    pass\n")
    tcfg = json.loads((src / "tokenizer_config.json").read_text())
    tcfg["auto_map"] = {"AutoTokenizer": [None, "tokenization_probe.ProbeTokenizer"]}
    (src / "tokenizer_config.json").write_text(json.dumps(tcfg))
    monkeypatch.setenv("CKPT_TEST_REMOTE_MARKER", str(marker))
    monkeypatch.setenv("HF_MODULES_CACHE", str(modules))       # read by transformers in the child at import
    r = CliRunner().invoke(cli_main, ["convert", str(src), "-o", str(tmp_path / "o.gguf")])
    assert r.exit_code == 2, r.output
    line = r.output.strip()
    assert len(line.splitlines()) == 1 and "Glm4Model would run Python shipped with the model" in line, r.output
    assert "tokenization_probe.py" in line and "--trust-remote-code" in line, r.output
    assert not marker.exists() and not (tmp_path / "o.gguf").exists()
    assert not modules.exists() or not list(modules.rglob("tokenization_probe.py"))
    r = CliRunner().invoke(cli_main, ["convert", str(src), "-o", str(tmp_path / "o.gguf"), "--trust-remote-code"])
    assert r.exit_code == 0, r.output
    assert marker.read_text() == "ran"
    marker.unlink()
    (tmp_path / "ref").mkdir()
    ref = _run_reference(src, tmp_path / "ref", ("f16",))
    assert ref.returncode == 0, ref.stderr[-1500:]
    assert marker.exists()
    assert (tmp_path / "o.gguf").read_bytes() == (tmp_path / "ref" / "f16.gguf").read_bytes()


def test_derived_llama_file_round_trips_through_the_native_reverse(tiny, tmp_path):
    """GGUF -> HF covers the registry's GGUF architectures: a file llama.cpp's class wrote for one of them
    (here llama, forced through the derived path at f32) comes back to the original tensors bit for bit."""
    from ckpt_surgeon.checkpoint import open_checkpoint
    from ckpt_surgeon.conversion import gguf_to_hf
    src = tiny("llama")
    convert(src, tmp_path / "d.gguf", "f32", engine="llama.cpp")
    back = gguf_to_hf(tmp_path / "d.gguf", tmp_path / "hf")
    with open_checkpoint(src) as a, open_checkpoint(back) as b:
        assert sorted(a.tensors) == sorted(b.tensors)
        for n in a.tensors:
            np.testing.assert_array_equal(a.read(n), b.read(n), err_msg=n)


@pytest.mark.parametrize("outtype", ("f32", "q8_0"))
@pytest.mark.parametrize("key", ("qwen2_5_vl@mm", "gemma3"))
def test_mmproj_is_llama_cpp_converters_file(key, outtype, tmp_path):
    """``convert --mmproj``: the vision projector file of Qwen2.5-VL and Gemma 3 (issue 33's pair), byte for
    byte what ``convert_hf_to_gguf.py --mmproj`` wrote from the same tiny VLM (tests/mmproj_util.py)."""
    from mmproj_util import mmproj_pair
    hf, ref = mmproj_pair(key, outtype)
    report = convert(hf, tmp_path / "mmproj.gguf", outtype, mmproj=True)
    assert report.engine.startswith("derived: llama.cpp ") and report.arch == "clip"
    assert (tmp_path / "mmproj.gguf").read_bytes() == ref.read_bytes()


def test_mmproj_file_does_not_convert_back_one_line(tmp_path):
    """An mmproj file holds a tower and its projector, not an HF model: GGUF -> HF refuses it in one line, with
    or without --config (before, the lines asked for a config, then failed inside llama.cpp's class)."""
    from mmproj_util import mmproj_pair
    hf, ref = mmproj_pair("qwen2_5_vl@mm", "f32")
    for extra in ([], ["--config", str(hf)]):
        r = CliRunner().invoke(cli_main, ["convert", str(ref), "-o", str(tmp_path / "back")] + extra)
        assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
        assert "an mmproj file" in r.output and "convert --mmproj" in r.output, r.output
        assert not (tmp_path / "back").exists()


_ROW_CHAIN_SCRIPT = r'''
import sys
from pathlib import Path
import numpy as np
from ckpt_surgeon.conversion.derived.child import _import_llamacpp
gguf, _ = _import_llamacpp(Path(sys.argv[1]))
import torch
from conversion.base import LazyTorchTensor as L
from ckpt_surgeon.conversion.derived.lazy_eval import Evaluator
stored = torch.arange(24, dtype=torch.float32).reshape(6, 4).to(torch.bfloat16)
def load(name):
    return stored.clone()
def leaf():
    return L(meta=L.meta_with_dtype_and_shape(torch.bfloat16, (6, 4)), args=("w",), func=load)
casts = leaf().to(torch.float32).numpy()                  # what prepare_tensors does to a weight it keeps
moved = leaf().to(torch.float32).reshape(4, 6).numpy()    # a reshape (a permutation, a split) is not row-wise
shared = leaf().to(torch.float32)
ev = Evaluator(gguf.LazyBase, {"casts": casts, "moved": moved, "a": shared.numpy(), "b": shared.numpy()})
chain = ev.row_chain(casts, load)
slabs = list(chain.slabs(lambda name, a, b: stored[a:b].clone(), 2 * 4 * 4))   # two rows a slab
whole = ev.eager("casts", casts)
print(chain.leaf, chain.shape, [f for f, _ in slabs], np.array_equal(np.concatenate([s for _, s in slabs]), whole),
      ev.row_chain(moved, load), ev.row_chain(ev._nodes["a"][0], load))
# the GGUF -> HF probe's identity outputs: float32 through value-keeping casts (F32's astype(copy=False)) only
from ckpt_surgeon.conversion.derived.lazy_eval import identity_leaf
def f32():
    return L(meta=L.meta_with_dtype_and_shape(torch.float32, (6, 4)), args=("p",), func=load)
print(identity_leaf(f32().to(torch.float32).numpy().astype(np.float32, copy=False), gguf.LazyBase, load),
      identity_leaf(f32().to(torch.float16).numpy(), gguf.LazyBase, load),
      identity_leaf(f32().numpy().astype(np.float16), gguf.LazyBase, load),
      identity_leaf(f32().reshape(4, 6).numpy(), gguf.LazyBase, load),
      identity_leaf(f32().numpy(), gguf.LazyBase, lambda n: None))
'''


def test_row_chain_is_recognised_only_for_element_wise_casts(tmp_path):
    """The slab evaluation (conversion/derived/lazy_eval.RowChain) takes an output only when its chain is
    element-wise casts of one stored tensor, not shared with another output: the gguf-py lazy chain
    ``.to(float32).numpy()`` is one, in slabs of two rows equal to the whole evaluation; a reshape is not,
    nor a cast two outputs share.  (Recognised by gguf-py's own closures: a gguf-py that renames them
    would fall back to the whole evaluation, which this test would show.)  The GGUF -> HF probe's identity
    outputs (lazy_eval.identity_leaf): casts that keep float32 values (``astype(float32, copy=False)`` as
    gguf-py's F32 quantize does) yes; a cast to float16, a reshape, another leaf no."""
    r = subprocess.run([sys.executable, "-c", _ROW_CHAIN_SCRIPT, os.environ["CKPT_SURGEON_LLAMACPP_SRC"]],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["w", "(6,", "4)", "[0,", "2,", "4]", "True", "None", "None",
                                "p", "None", "None", "None", "None"], r.stdout


def test_a_bare_assertion_in_the_class_is_named_by_its_statement(tmp_path):
    """llama.cpp's classes check configs and tensors with bare ``assert`` statements: the child's one line names
    the statement and where it is (the report said only ``AssertionError:``); a message the class gives is kept."""
    import importlib.util

    from ckpt_surgeon.conversion.derived.child import serve
    # a module of its own, as the class's is: pytest rewrites the asserts of test modules (giving them a message)
    (tmp_path / "klass.py").write_text("def bare(req):\n    hparams = {'num_nextn_predict_layers': 0}\n"
                                       "    assert hparams['num_nextn_predict_layers'] > 0\n\n\n"
                                       "def said(req):\n    raise KeyError('rotary_pct')\n")
    spec = importlib.util.spec_from_file_location("klass", tmp_path / "klass.py")
    klass = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(klass)
    req = tmp_path / "req.json"
    req.write_text(json.dumps({"report": str(tmp_path / "report.json")}))
    lines = []
    for run in (klass.bare, klass.said):
        assert serve(["child", str(req)], run) == 3
        lines.append(json.loads((tmp_path / "report.json").read_text())["error"])
    assert lines[0] == "AssertionError at klass.py:3: assert hparams['num_nextn_predict_layers'] > 0", lines[0]
    assert lines[1] == "KeyError: 'rotary_pct'", lines[1]
