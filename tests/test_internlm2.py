"""InternLM2 both ways, against llama.cpp's own converter and runtime.

InternLM2's HF checkpoints need ``trust_remote_code`` (``modeling_internlm2`` is not in
transformers), so nothing here can run one; llama.cpp's ``convert_hf_to_gguf.py`` converts it
without that code (``InternLM2Model``: config.json, ``tokenizer.model``, the fused ``wqkv``).
The fixture is an InternLM2-layout folder holding the weights of a known tiny
``LlamaForCausalLM``: ``wqkv`` packed per kv group as ``[q heads of the group; k; v]`` (InternLM2's
layout, which the reference converter unpacks), ``w1``/``w3``/``w2`` for gate/up/down.  So:

* our HF -> GGUF of the InternLM2 folder is byte-identical to the reference's at f32 / f16 /
  bf16 / q8_0, metadata a superset, also for a chat tokenizer with the reference's quirks;
* our GGUF -> HF of either file gives back every weight of that llama bit for bit (the Q/K
  un-permutation inverts the reference's ``LlamaModel.permute``);
* llama.cpp runs either internlm2 file like transformers runs our HF folder (f32: 1e-3, as for
  every family in tests/test_llamacpp.py);
* the tokenizer rebuilt from the file tokenizes like llama.cpp's own vocabulary.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from convert_variants import MULTILINGUAL, STRAYS, gguf_metadata, hf_tensor_bytes, train_spm
from test_llamacpp_converter import OUTTYPES, _run_reference, assert_matches_reference

from ckpt_surgeon.conversion import gguf_to_hf, hf_to_gguf
from ckpt_surgeon.errors import UnsupportedError

import llama_cpp  # noqa: E402  (installed by the test extra)


def _pack(q, k, v, n_kv: int):
    """InternLM2's wqkv: per kv group, the group's q heads, then its k head, then its v head."""
    import torch
    d = q.shape[1]
    hd = k.shape[0] // n_kv
    qg = q.reshape(n_kv, -1, hd, d)
    return torch.cat([qg, k.reshape(n_kv, 1, hd, d), v.reshape(n_kv, 1, hd, d)], 1).reshape(-1, d)


@pytest.fixture(scope="module")
def internlm2(tiny, tmp_path_factory):
    """(llama folder, internlm2 folder, reference f32 GGUF)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaTokenizer

    root = tmp_path_factory.mktemp("internlm2")
    train_spm(root / "sp", unk_id=0, bos_id=1, eos_id=2, pad_id=-1)      # as spm_llama's
    (root / "tok").mkdir()
    shutil.copy(root / "sp.model", root / "tok" / "tokenizer.model")
    tok = LlamaTokenizer.from_pretrained(root / "tok")
    cfg = AutoConfig.from_pretrained(tiny("llama"))
    # grouped-query attention (2 q heads per kv head), so the group packing is exercised
    cfg.num_key_value_heads = cfg.num_attention_heads // 2
    cfg.vocab_size = len(tok)                   # the reference writes one token per row
    cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = 1, 2, None
    cfg.tie_word_embeddings = False             # llama.cpp's internlm2 requires output.weight
    cfg.attention_bias = False
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    llama = root / "llama"
    model.save_pretrained(llama)
    tok.save_pretrained(llama)

    sd = {n: t.detach().clone().contiguous() for n, t in model.state_dict().items()}
    n_kv = cfg.num_key_value_heads
    out = {"model.tok_embeddings.weight": sd["model.embed_tokens.weight"], "model.norm.weight": sd["model.norm.weight"],
           "output.weight": sd["lm_head.weight"]}
    for i in range(cfg.num_hidden_layers):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        out[p + "attention.wqkv.weight"] = _pack(sd[a + "q_proj.weight"], sd[a + "k_proj.weight"],
                                                 sd[a + "v_proj.weight"], n_kv).contiguous()
        out[p + "attention.wo.weight"] = sd[a + "o_proj.weight"]
        out[p + "attention_norm.weight"] = sd[p + "input_layernorm.weight"]
        out[p + "ffn_norm.weight"] = sd[p + "post_attention_layernorm.weight"]
        for w, m in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")):
            out[p + f"feed_forward.{w}.weight"] = sd[p + f"mlp.{m}.weight"]
    ilm = root / "internlm2"
    ilm.mkdir()
    save_file(out, str(ilm / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(root / "sp.model", ilm / "tokenizer.model")
    (ilm / "config.json").write_text(json.dumps({
        "architectures": ["InternLM2ForCausalLM"], "model_type": "internlm2",
        "auto_map": {"AutoConfig": "configuration_internlm2.InternLM2Config",
                     "AutoModelForCausalLM": "modeling_internlm2.InternLM2ForCausalLM"},
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": n_kv,
        "num_hidden_layers": cfg.num_hidden_layers, "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_parameters["rope_theta"], "rope_scaling": None,
        "max_position_embeddings": cfg.max_position_embeddings, "vocab_size": cfg.vocab_size,
        "bias": False, "hidden_act": "silu", "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}))
    (root / "ref").mkdir()
    r = _run_reference(ilm, root / "ref", OUTTYPES)
    if r.returncode != 0:
        pytest.fail(f"llama.cpp's convert_hf_to_gguf.py failed on InternLM2: {r.stderr.strip()[-1500:]}")
    return llama, ilm, root / "ref" / "f32.gguf"


@pytest.fixture(scope="module")
def internlm2_chat(internlm2, tmp_path_factory):
    """The same weights as a chat checkpoint's folder: tokenizer.model with a literal "\\x00" piece
    and [UNUSED_TOKEN_*] pieces (InternLM2's own tokenizer has both), two of them renamed to
    <|im_start|> / <|im_end|> by tokenizer_config.json (special), which names the remote-code
    tokenizer class; and llama.cpp's reference f32 file of it."""
    from sentencepiece import sentencepiece_model_pb2 as pb
    _, ilm, _ = internlm2
    root = tmp_path_factory.mktemp("internlm2-chat")
    chat = root / "internlm2-chat"
    shutil.copytree(ilm, chat)
    m = pb.ModelProto()
    m.ParseFromString((chat / "tokenizer.model").read_bytes())
    n = len(m.pieces)
    for i, piece in zip(range(n - 4, n), ("\x00", "[UNUSED_TOKEN_141]", "[UNUSED_TOKEN_142]", "[UNUSED_TOKEN_143]")):
        m.pieces[i].piece = piece
        m.pieces[i].type = pb.ModelProto.SentencePiece.USER_DEFINED
    (chat / "tokenizer.model").write_bytes(m.SerializeToString())
    (chat / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "InternLM2Tokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_internlm2.InternLM2Tokenizer", None]},
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "added_tokens_decoder": {str(n - 2): {"content": "<|im_start|>", "special": True},
                                 str(n - 1): {"content": "<|im_end|>", "special": True}},
        "chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"}))
    (root / "ref").mkdir()
    r = _run_reference(chat, root / "ref", ("f32",))
    if r.returncode != 0:
        pytest.fail(f"llama.cpp's convert_hf_to_gguf.py failed on InternLM2 chat: {r.stderr.strip()[-1500:]}")
    return chat, root / "ref" / "f32.gguf", n


def test_chat_tokenizer_quirks_are_llama_cpp_converters(internlm2_chat, tmp_path, monkeypatch):
    """llama.cpp's InternLM2Model writes "\\x00" as "🐉" (llama.cpp would read it as an empty
    string), types [UNUSED*] pieces UNUSED, the added tokens CONTROL with score -1000, and makes
    <|im_end|> the eos: ours writes the same keys with the same values, tensors byte-identical.
    Without those quirks (the registry's spm_quirks) the generic SentencePiece path differs from
    it in all four."""
    from ckpt_surgeon.checkpoint import open_checkpoint
    chat, ref, n = internlm2_chat
    ours = hf_to_gguf(chat, tmp_path / "c.gguf", dtype="f32", name="tiny")
    assert_matches_reference(ours, ref, "internlm2", "f32")
    meta_b, _ = gguf_metadata(ref)
    with open_checkpoint(ours) as ck:
        md = ck.metadata
    assert md["tokenizer.ggml.tokens"][n - 4:] == ["\U0001f409", "[UNUSED_TOKEN_141]", "<|im_start|>", "<|im_end|>"]
    # (SentencePiece's IsUnused holds for its user-defined pieces too: the reference types both 5)
    assert md["tokenizer.ggml.token_type"][n - 4:] == [5, 5, 3, 3]
    assert md["tokenizer.ggml.eos_token_id"] == n - 1
    import dataclasses

    from ckpt_surgeon.conversion import names as N
    by_model_type = N.by_model_type
    monkeypatch.setattr(N, "by_model_type", lambda mt: dataclasses.replace(by_model_type(mt), spm_quirks=None)
                        if mt == "internlm2" else by_model_type(mt))
    plain, _ = gguf_metadata(hf_to_gguf(chat, tmp_path / "plain.gguf", dtype="f32", name="tiny"))
    for key in ("tokens", "scores", "token_type", "eos_token_id"):
        assert plain[f"tokenizer.ggml.{key}"] != meta_b[f"tokenizer.ggml.{key}"], key


def test_reference_file_is_internlm2(internlm2):
    from ckpt_surgeon.checkpoint import open_checkpoint
    with open_checkpoint(internlm2[2]) as ck:
        assert ck.metadata["general.architecture"] == "internlm2"
        assert ck.metadata["tokenizer.ggml.model"] == "llama"
        names = set(ck.tensors)
    assert "blk.0.attn_q.weight" in names and not any("qkv" in n for n in names)


def test_gguf_to_hf_gives_back_the_llama_weights_bit_for_bit(internlm2, tmp_path):
    llama, _, ref = internlm2
    out = gguf_to_hf(ref, tmp_path / "hf", dtype="float32")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    assert cfg["attention_bias"] is False and cfg["tie_word_embeddings"] is False
    want, got = hf_tensor_bytes(llama), hf_tensor_bytes(out)
    assert len(want) == 3 + 9 * json.loads((llama / "config.json").read_text())["num_hidden_layers"]
    assert set(got) == set(want)
    for n in want:
        assert got[n] == want[n], n


@pytest.mark.parametrize("which", ["reference", "ours"])
def test_llama_cpp_runs_the_internlm2_file_like_transformers_runs_ours(which, internlm2, tmp_path):
    """llama.cpp runs the internlm2 file (its converter's, or ours of the same InternLM2 folder) like
    transformers runs our GGUF -> HF folder of it (which is the fixture's llama, bit for bit)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, ilm, ref = internlm2
    if which == "ours":
        ref = hf_to_gguf(ilm, tmp_path / "ours.gguf", dtype="f32", name="tiny")
    out = gguf_to_hf(ref, tmp_path / "hf", dtype="float32")
    ids = AutoTokenizer.from_pretrained(out).encode(MULTILINGUAL, add_special_tokens=False)
    vocab_only = llama_cpp.Llama(model_path=str(ref), vocab_only=True, verbose=False)
    try:
        # the rebuilt tokenizer splits the text as llama.cpp's SPM tokenizer does
        assert vocab_only.tokenize(MULTILINGUAL.encode(), add_bos=False, special=True) == ids
    finally:
        vocab_only.close()
    assert len(ids) > 20
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        hf = model(torch.tensor([ids])).logits[0].numpy()
    llm = llama_cpp.Llama(model_path=str(ref), logits_all=True, n_ctx=512, verbose=False, n_threads=2)
    try:
        llm.eval(ids)
        lc = np.array(llm.scores[: len(ids)], dtype=np.float32)[:, : hf.shape[1]]
    finally:
        llm.close()
    # f32: llama.cpp's kernels sum in another order (tests/test_llamacpp.py: observed <= 2.5e-4)
    rel = float(np.abs(lc - hf).max() / np.abs(hf).max())
    assert rel <= 1e-3, rel


def test_hf_to_gguf_is_identical_to_llama_cpp_converter(internlm2, tmp_path):
    """Our HF -> GGUF of the InternLM2 folder against llama.cpp's InternLM2Model at every outtype:
    the same tensors (wqkv split into attn_q / attn_k / attn_v, q and k permuted), byte for byte,
    and every metadata key it writes written with its value (bar the provenance labels)."""
    _, ilm, ref = internlm2
    for outtype in OUTTYPES:
        ours = hf_to_gguf(ilm, tmp_path / f"{outtype}.gguf", dtype=outtype, name="tiny")
        assert_matches_reference(ours, ref.with_name(f"{outtype}.gguf"), "internlm2", outtype)


def test_stray_config_keys_change_nothing(internlm2, tmp_path):
    """issue 24 for the one converted family without a transformers class: the config keys of
    :data:`convert_variants.STRAYS` that neither InternLM2's config (the fixture's, as the remote
    code declares it) nor the LlamaForCausalLM it is checked as declares, all at once, leave our
    f32 file byte-identical (the remote-code class cannot run here to show it ignores them; the
    keys are other families' spellings and one made up)."""
    import transformers

    from ckpt_surgeon.conversion import names as N
    from ckpt_surgeon.conversion.model_check import declared_config_keys
    _, ilm, _ = internlm2
    cfg = json.loads((ilm / "config.json").read_text())
    known = set(cfg) | set(declared_config_keys(transformers.LlamaConfig)) | N.UNDECLARED_READ
    stray = {k: v for k, v in STRAYS.items() if k not in known}
    assert len(stray) >= 30, sorted(stray)
    noisy = tmp_path / "noisy"
    shutil.copytree(ilm, noisy)
    (noisy / "config.json").write_text(json.dumps({**cfg, **stray}))
    a = hf_to_gguf(ilm, tmp_path / "a.gguf", dtype="f32", name="tiny")
    b = hf_to_gguf(noisy, tmp_path / "b.gguf", dtype="f32", name="tiny")
    assert a.read_bytes() == b.read_bytes(), sorted(stray)


def test_internlm2_round_trips_through_llama(internlm2, tmp_path):
    """InternLM2 HF -> GGUF (internlm2) -> HF gives the llama the fixture was made from, bit for
    bit; and a llama HF folder still converts to llama.cpp's llama, not internlm2."""
    from ckpt_surgeon.checkpoint import open_checkpoint
    llama, ilm, _ = internlm2
    g = hf_to_gguf(ilm, tmp_path / "i.gguf", dtype="f32", name="tiny")
    out = gguf_to_hf(g, tmp_path / "hf", dtype="float32")
    want, got = hf_tensor_bytes(llama), hf_tensor_bytes(out)
    assert set(got) == set(want)
    for n in want:
        assert got[n] == want[n], n
    with open_checkpoint(hf_to_gguf(llama, tmp_path / "l.gguf", dtype="f32")) as ck:
        assert ck.metadata["general.architecture"] == "llama"


@pytest.mark.parametrize("edit, message", [
    ({"bias": True}, "bias = True is not converted (llama.cpp's internlm2 graph has no attn_output bias slot); "
                     "only bias = False is"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}},
     "rope_scaling.type = 'dynamic' is not converted (only plain RoPE: rope_type 'default')"),
    ({"num_key_value_heads": 4}, "tensor 'model.layers.0.attention.wqkv.weight': shape [128, 64] but internlm2 "
                                 "checkpoint (checked as the Llama model it computes) expects [192, 64]"),
])
def test_internlm2_hf_settings_llama_cpp_cannot_run_are_refused(edit, message, internlm2, tmp_path):
    """InternLM2 HF -> GGUF refuses, naming config.json's key as written (``bias``, not the
    equivalent Llama's attention_bias), what llama.cpp's internlm2 graph cannot run, and a wqkv
    that is not the shape the config describes; nothing is written, the folder is untouched."""
    _, ilm, _ = internlm2
    src = tmp_path / "src"
    shutil.copytree(ilm, src)
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(edit)
    (src / "config.json").write_text(json.dumps(cfg))
    from ckpt_surgeon.errors import CkptError
    with pytest.raises(CkptError) as e:
        hf_to_gguf(src, tmp_path / "i.gguf")
    assert message in str(e.value) and str(e.value).startswith(str(src)), str(e.value)
    assert not (tmp_path / "i.gguf").exists()


def test_internlm2_with_biases_is_refused_naming_the_tensor(internlm2, tmp_path):
    """llama's attention_bias would add an o_proj bias InternLM2 does not have: a file with a q
    bias is refused naming it, nothing written."""
    from gguf_util import rewrite_gguf

    from ckpt_surgeon.errors import CkptError
    _, _, ref = internlm2
    n_embd = json.loads((internlm2[0] / "config.json").read_text())["hidden_size"]
    src = rewrite_gguf(ref, tmp_path / "b.gguf", add={"blk.0.attn_q.bias": np.ones(n_embd, np.float32)})
    with pytest.raises(CkptError) as e:
        gguf_to_hf(src, tmp_path / "hf")
    assert "blk.0.attn_q.bias" in str(e.value)
    assert not (tmp_path / "hf").exists()
