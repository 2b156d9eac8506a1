"""GGUF -> HF for architectures outside the native registry (conversion/derived/to_hf.py): llama.cpp's
converter class inverted by probing it, with the original config given and checked.

HF -> GGUF at f32 (llama.cpp's own ``convert_hf_to_gguf.py`` for OLMo, the derived path for the
others: the same bytes, tests/test_convert_derived.py) and back must give every original tensor bit for
bit (the zoo folders' values cast to float32, which is what an f32 GGUF holds), and transformers must
run the result exactly as it runs the original.  A class that computes instead of moving values
(Gemma 2's ``w + 1`` norms) and a config the file was not made from are refused in one line.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from derived_util import converter_src, zoo_folder  # noqa: F401 -- converter_src: the module's autouse fixture
from test_llamacpp_converter import _reference

from ckpt_surgeon.checkpoint import open_checkpoint
from ckpt_surgeon.cli import cli as cli_main
from ckpt_surgeon.conversion import convert

# different shapes of llama.cpp transform: plain renames (SmolLM3), stacked experts kept
# stacked (GraniteMoE), a short-conv hybrid (LFM2), MLA with kv_b split into k_b / v_b and per-expert
# tensors stacked (DeepSeek-V3), an encoder whose checkpoint is the base model the config's architectures name
# (ModernBertModel: the probe lists the HF tensors of that class, not of the model type's causal / masked LM), a
# class that delegates its planning to an inner model and has its own write() (Mistral3Model: the tensors and
# metadata are the inner Ministral3Model's writer's), a release whose names are neither transformers' save spelling
# nor its keys (HY-V4, the Hub's `model.hc_head.hc_head_fn`, `layers.N.hc_attn_layer.hc_pre.hc_fn`: the probe takes
# the spelling llama.cpp's tensor map holds that transformers reads alike, so the folder comes back as the Hub's)
ROUND_TRIP = ("smollm3", "granitemoe", "ministral3", "lfm2", "deepseek_v3", "modernbert", "hy_v4")
LOGITS = ("granitemoe", "deepseek_v3")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("g2h")
    return lambda model_type: zoo_folder(model_type, root)


FLOATS = ("F64", "F32", "F16", "BF16")


def assert_same_as_f32(original: Path, back: Path) -> None:
    """Every float tensor as float32, bit for bit; the others (integers, a release's packed form) as stored, byte for
    byte, in the same dtype."""
    with open_checkpoint(original) as a, open_checkpoint(back) as b:
        assert sorted(a.tensors) == sorted(b.tensors)
        for n in a.tensors:
            if a.tensors[n].dtype not in FLOATS:
                assert (b.tensors[n].dtype, b.tensors[n].shape) == (a.tensors[n].dtype, a.tensors[n].shape), n
                assert a.read_raw(n) == b.read_raw(n), n
                continue
            x, y = a.read(n).astype(np.float32), b.read(n)
            assert y.dtype == np.float32 and x.shape == y.shape, n
            assert np.array_equal(x.view(np.uint32), y.view(np.uint32)), n


def unbiased(src: Path, out: Path) -> Path:
    """The zoo's Gemma 2 as llama.cpp's gemma2 graph runs it (the native writer refuses it otherwise): no
    attention biases, query_pre_attn_scalar = head_dim (llama.cpp assumes it; the file does not store it)."""
    from safetensors.numpy import load_file, save_file
    shutil.copytree(src, out)
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "attention_bias": False, "query_pre_attn_scalar": cfg["head_dim"]}))
    for f in out.glob("*.safetensors"):
        save_file({k: v for k, v in load_file(f).items() if not k.endswith(".bias")}, f, metadata={"format": "pt"})
    return out


def logits(folder: Path) -> np.ndarray:
    import torch
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor([[1, 5, 9, 2, 7, 3]])).logits.numpy()


def test_llama_cpp_converters_own_file_comes_back(folder, tmp_path):
    """OLMo: the f32 file llama.cpp's convert_hf_to_gguf.py wrote, back to the original tensors."""
    src = folder("olmo")
    ref = _reference(src, "derived-olmo") / "f32.gguf"
    report = convert(ref, tmp_path / "back", config=src / "config.json")
    assert report.engine.startswith("derived: inverse of llama.cpp OlmoModel"), report.engine
    assert_same_as_f32(src, tmp_path / "back")
    assert json.loads((tmp_path / "back" / "config.json").read_text())["model_type"] == "olmo"


@pytest.mark.parametrize("model_type", ROUND_TRIP)
def test_round_trip_is_the_identity_on_tensors(model_type, folder, tmp_path):
    src = folder(model_type)
    convert(src, tmp_path / "m.gguf", "f32", engine="llama.cpp")
    convert(tmp_path / "m.gguf", tmp_path / "back", config=src)
    assert_same_as_f32(src, tmp_path / "back")
    if model_type in LOGITS:
        # same float32 weights, same config, same transformers class: the same logits, exactly
        assert np.array_equal(logits(src), logits(tmp_path / "back"))


def test_a_split_set_comes_back_from_any_part(folder, tmp_path):
    """A derived split set (three parts by count; OLMo): GGUF -> HF from its second part reads the whole set and
    gives the original tensors bit for bit."""
    src = folder("olmo")
    rep = convert(src, tmp_path / "m.gguf", "f32", split_max_tensors=8)
    assert len(rep.files) == 3
    convert(Path(rep.files[1]), tmp_path / "back", config=src)
    assert_same_as_f32(src, tmp_path / "back")


def test_cli_without_config_is_one_line(folder, tmp_path):
    src = folder("smollm3")
    convert(src, tmp_path / "m.gguf", "f32", engine="llama.cpp")
    r = CliRunner().invoke(cli_main, ["convert", str(tmp_path / "m.gguf"), "-o", str(tmp_path / "back")])
    assert r.exit_code == 2, r.output
    assert "pass the original config" in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert not (tmp_path / "back").exists()


def test_a_config_the_file_was_not_made_from_is_refused(folder, tmp_path):
    src = folder("smollm3")
    convert(src, tmp_path / "m.gguf", "f32", engine="llama.cpp")
    cfg = json.loads((src / "config.json").read_text())
    cfg["rms_norm_eps"] = 1e-3
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    r = CliRunner().invoke(cli_main, ["convert", str(tmp_path / "m.gguf"), "-o", str(tmp_path / "back"),
                                      "--config", str(tmp_path / "config.json")])
    assert r.exit_code == 2, r.output
    assert "layer_norm_rms_epsilon" in r.output and "not the config the file was made from" in r.output, r.output
    assert not (tmp_path / "back").exists()


def test_a_name_the_class_cannot_map_is_taken_in_the_spelling_transformers_reads_alike(folder, tmp_path):
    """Kimi-Linear: transformers' save spells the dense first layer's MLP `block_sparse_moe.*` (its reversal of the
    load rename of the MoE blocks), the Hub and llama.cpp's class `mlp.*`; transformers reads both into the same
    parameter.  The probe takes the spelling the class maps, and so reaches the values: refused then for what the
    class computes (Mamba-style A = -exp(A_log)), not for a name (before: `Can not map tensor`)."""
    from fixtures.zoo import zoo_config

    from ckpt_surgeon.conversion.model_check import expected_tensors_and_spellings
    _, spell, _ = expected_tensors_and_spellings(zoo_config("kimi_linear"), by_architecture=True)
    dense = {f"model.layers.0.block_sparse_moe.{p}_proj.weight": f"model.layers.0.mlp.{p}_proj.weight"
             for p in ("gate", "up", "down")}
    assert dense.items() <= spell.items(), spell
    src = folder("kimi_linear")
    convert(src, tmp_path / "m.gguf", "f32", engine="llama.cpp")
    r = CliRunner().invoke(cli_main, ["convert", str(tmp_path / "m.gguf"), "-o", str(tmp_path / "back"),
                                      "--config", str(src)])
    assert r.exit_code == 2, r.output
    line = r.output.strip()
    assert len(line.splitlines()) == 1 and "not invertible: GGUF tensor blk.0.ssm_a" in line, r.output
    assert not (tmp_path / "back").exists()


def test_the_spellings_a_release_without_the_prefix_has(folder):
    """What the probe offers DeepSeek-V4's class, from transformers' own renames (no conversion run): the names
    transformers' save gives without the `model.` prefix (its renames anchored at the start reverse then: `embed`,
    `hc_head_fn`), the other spellings of the attention's `kv_norm` that transformers reads alike, the one the class
    maps (the release's) among the first; and the respelling never sends two names to one."""
    from ckpt_surgeon.conversion.derived.probe_child import _Respeller
    from ckpt_surgeon.conversion.model_check import expected_tensors_and_spellings
    cfg = json.loads((folder("deepseek_v4") / "config.json").read_text())
    shapes, spell, integers = expected_tensors_and_spellings(cfg, by_architecture=True)
    bare = spell.unprefixed("model.")
    assert {n: bare[n] for n in ("model.embed_tokens.weight", "model.hc_head.hc_fn", "model.layers.0.ffn.gate.tid2eid",
                                 "model.layers.0.ffn.experts.0.w1.weight")} == {
        "model.embed_tokens.weight": "embed.weight", "model.hc_head.hc_fn": "hc_head_fn",
        "model.layers.0.ffn.gate.tid2eid": "layers.0.ffn.gate.tid2eid",
        "model.layers.0.ffn.experts.0.w1.weight": "layers.0.ffn.experts.0.w1.weight"}
    # transformers' save spells the attention's kv_norm `attn.norm`, prefix or not (`.norm.` -> `.kv_norm.` reversed)
    assert bare["model.layers.0.attn.norm.weight"] == "layers.0.attn.norm.weight"
    assert spell.alternatives("layers.0.attn.norm.weight")[:2] == ["layers.0.attn.kv_norm.weight",
                                                                   "layers.0.self_attn.norm.weight"]
    assert integers == {"model.layers.0.ffn.gate.tid2eid": "int64", "model.layers.1.ffn.gate.tid2eid": "int64"}
    # two names to one spelling, or a name to one the side holds: neither is taken; a free one is
    assert _Respeller(spell)._keep({"a": "x", "b": "x", "d": "c"}, {"a": 1, "b": 1, "c": 1, "d": 1}) == {}
    assert _Respeller(spell)._keep({"a": "x", "b": "x", "c": "y"}, {"a": 1, "b": 1, "c": 1}) == {"c": "y"}


def test_a_release_form_the_class_asks_for_comes_back(folder, tmp_path):
    """DeepSeek-V4: the class reads the release's names (no `model.` prefix, which transformers' save adds; its
    `attn.kv_norm`, which transformers' reversed renames spell `attn.norm`) and its routed experts only in the
    release's FP4 form (int8 codes two a byte + an e8m0 exponent a block, moved into MXFP4 bytes).  The probe takes
    transformers' save spelling without the prefix, the next spelling transformers reads alike where the class still
    cannot map one, and the packed form, whose bit map it learns a nibble at a time.  The file comes back as the
    release stores it: every float tensor bit for bit, the codes, exponents and hash-routing table (int64) byte for
    byte, in their dtypes; converted again, by llama.cpp's converter and by ours, it gives the same GGUF bytes.  A file
    whose experts were quantized again is refused in one line."""
    src = folder("deepseek_v4")
    convert(src, tmp_path / "m.gguf", "f32", engine="llama.cpp")
    report = convert(tmp_path / "m.gguf", tmp_path / "back", config=src)
    assert report.engine.startswith("derived: inverse of llama.cpp DeepseekV4Model"), report.engine
    assert_same_as_f32(src, tmp_path / "back")
    by_name = {r.target: r for r in report.tensors}
    codes, scale = by_name["layers.0.ffn.experts.0.w1.weight"], by_name["layers.0.ffn.experts.0.w1.scale"]
    assert (codes.source, codes.target_dtype, scale.target_dtype) == ("blk.0.ffn_gate_exps.weight", "I8", "F8_E8M0")
    with open_checkpoint(tmp_path / "back") as ck:
        assert ck.tensors["layers.0.ffn.experts.0.w1.weight"].dtype == "I8"
        assert ck.tensors["layers.0.attn.kv_norm.weight"].dtype == "F32"
    convert(tmp_path / "back", tmp_path / "again-llamacpp.gguf", "f32", engine="llama.cpp")
    convert(tmp_path / "back", tmp_path / "again.gguf", "f32")
    with open_checkpoint(tmp_path / "m.gguf") as a, open_checkpoint(tmp_path / "again-llamacpp.gguf") as b, \
            open_checkpoint(tmp_path / "again.gguf") as c:
        assert sorted(a.tensors) == sorted(b.tensors) == sorted(c.tensors)
        for n in a.tensors:
            assert a.tensors[n].dtype == b.tensors[n].dtype == c.tensors[n].dtype, n
            assert a.read_raw(n) == b.read_raw(n) == c.read_raw(n), n
    # the experts quantized again (MXFP4 -> Q8_0): the release's bits are gone, so one line, exit 2, nothing written
    convert(tmp_path / "m.gguf", tmp_path / "q8.gguf", "q8_0", allow_requantize=True)
    r = CliRunner().invoke(cli_main, ["convert", str(tmp_path / "q8.gguf"), "-o", str(tmp_path / "back-q8"),
                                      "--config", str(src)])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert "tensor 'blk.0.ffn_gate_exps.weight': stored as Q8_0: llama.cpp's converter writes it as MXFP4" in r.output
    assert not (tmp_path / "back-q8").exists()


@pytest.mark.parametrize("variant", ["", "computed", "rows-reversed"])
def test_the_packed_bit_map_is_learned_from_llamacpps_repack(variant):
    """The nibble passes (conversion/derived/packed.py) on llama.cpp's own repack_mxfp4_blocks over a stack of three
    experts: the map is learned, proved on random bytes and gives the release's bytes back from the repacked stack.
    Refused: the same repack with the exponent computed (+ 1: the ids it seems to carry are the next tensor's, one
    naming no packed tensor), and with each expert's rows reversed (it only moves bits, but the learner counts a
    tensor's blocks in order: the proof on random bytes fails, so nothing wrong is written)."""
    import subprocess
    import sys

    from llamacpp_src import llamacpp_source
    script = Path(__file__).parent / "packed_probe_script.py"
    r = subprocess.run([sys.executable, str(script), str(llamacpp_source()), variant],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    if variant == "computed":
        assert got["refusal"].startswith("GGUF tensor blk.0.ffn_gate_exps.weight: ") and \
            ("converter computes them" in got["refusal"] or "does not only move" in got["refusal"]), got
    elif variant == "rows-reversed":
        assert got["refusal"] == ("GGUF tensor blk.0.ffn_gate_exps.weight: llama.cpp's converter does not only move "
                                  "the packed tensors' bits (block by block, in order), so the probe cannot invert "
                                  "it"), got
    else:
        # 34 columns (an MXFP4 block: the exponent's two nibbles, 16 code bytes), one run per expert each
        assert got == {"refusal": None, "gathered_back": True, "map_rows": 34 * 3}, got


def test_non_invertible_class_is_refused_in_one_line(folder, tmp_path):
    """Gemma 2 back through llama.cpp's class (``--config`` selects the derived path for a registry family too):
    Gemma2Model writes every RMSNorm weight as w + 1, a computed value, so the probe's proof fails and
    the tensor is named (the native path undoes that shift with its own, typed, rule)."""
    src = unbiased(folder("gemma2"), tmp_path / "gemma2")
    convert(src, tmp_path / "m.gguf", "f32")       # the native writer (llama.cpp's class wants tokenizer.model)
    r = CliRunner().invoke(cli_main, ["convert", str(tmp_path / "m.gguf"), "-o", str(tmp_path / "back"),
                                      "--config", str(src)])
    assert r.exit_code == 2, r.output
    line = r.output.strip()
    assert len(line.splitlines()) == 1 and "not invertible" in line and "norm.weight (from HF model." in line, r.output
    assert "changes its values" in line, r.output
    assert not (tmp_path / "back").exists()


@pytest.mark.parametrize("outtype,dtype", [("bf16", "bfloat16"), ("f16", "float16")])
def test_half_file_comes_back_in_half_and_converts_to_the_same_file(outtype, dtype, folder, tmp_path, monkeypatch):
    """A bf16 (f16) GGUF back to a bfloat16 (float16) HF folder, converted forward once more: every tensor the
    file holds in that type comes back with the same bytes (not rounded again); the ones it holds in F32
    (biases, norms) come back rounded to the type once, to nearest even as torch rounds.  The copied tensors
    (the embedding, the MLP matrices) are gathered in slabs of 4 KiB here, so their seams are checked too."""
    import torch
    from test_quantize import tensors
    monkeypatch.setenv("CKPT_SURGEON_DERIVED_PIECE", "4096")
    src = folder("olmo")
    convert(src, tmp_path / "m.gguf", outtype, engine="llama.cpp")
    convert(tmp_path / "m.gguf", tmp_path / "back", dtype, config=src)
    with open_checkpoint(tmp_path / "back") as b:
        assert {i.dtype for i in b.tensors.values()} == {"BF16" if outtype == "bf16" else "F16"}
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / f, tmp_path / "back" / f)
    convert(tmp_path / "back", tmp_path / "again.gguf", outtype, engine="llama.cpp")
    first, again = tensors(tmp_path / "m.gguf"), tensors(tmp_path / "again.gguf")
    assert sorted(first) == sorted(again)
    half = getattr(torch, dtype)
    kinds = set()
    for name, (typ, shape, raw) in first.items():
        assert again[name][:2] == (typ, shape), name
        kinds.add(typ)
        if typ == "F32":
            want = torch.from_numpy(np.frombuffer(raw, np.float32).copy()).to(half).float().numpy()
            assert np.array_equal(np.frombuffer(again[name][2], np.float32).view(np.uint32), want.view(np.uint32)), name
        else:
            assert again[name][2] == raw, name
    assert kinds == {"F32", outtype.upper()}        # both cases exist in the file
