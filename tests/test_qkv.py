"""qkv fuse / split on the fixture families: bit-exact round trips, Phi-3 -> Llama/Mistral with logits."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from ckpt_surgeon import open_checkpoint
from ckpt_surgeon.cli import cli
from ckpt_surgeon.errors import CkptError, RefusedError
from ckpt_surgeon.formats import safetensors as st
from ckpt_surgeon.surgery.qkv import qkv_fuse, qkv_split

from tests.test_fold_bias import digest, greedy, load, outputs


def same_files_tensor_by_tensor(a, b, *, order=True, shards=True):
    """Same shard files, each holding the same tensors (same dtype, shape and bytes); with ``order``
    also in the same order.  (Fusing moves q/k/v into the q slot, so splitting a fused file back
    writes them consecutively: a file whose q/k/v were interleaved with other tensors, as
    transformers' alphabetical save order does, comes back with the same tensors reordered; and
    q/k/v that sat in different shards come back together in the fused tensor's shard.)"""
    ca, cb = open_checkpoint(a), open_checkpoint(b)
    assert sorted(p.name for p in a.glob("*.safetensors")) == sorted(p.name for p in b.glob("*.safetensors"))
    for f in a.glob("*.safetensors") if shards else ():
        ha, hb = st.read_header(f), st.read_header(b / f.name)
        if order:
            assert list(ha.tensors) == list(hb.tensors)
        else:
            assert sorted(ha.tensors) == sorted(hb.tensors)
    for name, info in ca.tensors.items():
        other = cb.tensors[name]
        assert (info.dtype, info.shape) == (other.dtype, other.shape), name
        assert ca.read_raw(name) == cb.read_raw(name), name
    assert set(ca.tensors) == set(cb.tensors)


FUSED = ["gpt2", "gpt_neox", "bloom", "falcon", "falcon_mq", "falcon_old"]


@pytest.mark.parametrize("name", FUSED)
def test_split_then_fuse_is_bit_exact(tiny, tmp_path, name):
    src = tiny(name)
    before = digest(src)
    r1 = qkv_split(src, tmp_path / "split")
    ck, cks = open_checkpoint(src), open_checkpoint(tmp_path / "split")
    layout = ck.layout()
    h, kv, d = layout.num_heads, layout.num_kv_heads, layout.head_dim
    lt, lts = layout.layers[0], cks.layout().layers[0]
    assert lts.q_weight and lts.k_weight and lts.v_weight and lts.qkv_weight is None
    # the parts are the projections transformers computes: q·x from the split equals the q slice of the
    # fused projection as the model itself splits it (per the layout's row map)
    fused_w = ck.read(lt.qkv_weight)
    x = np.random.default_rng(0).standard_normal(fused_w.shape[0 if layout.conv1d else 1])
    fused_out = x @ fused_w if layout.conv1d else fused_w @ x
    from ckpt_surgeon.arch.layouts import qkv_row_index
    iq, ik, iv = qkv_row_index(r1.plan.record["qkv_layout"].replace("conv1d", "concat"), h, kv, d)
    for role, rows in (("q", iq), ("k", ik), ("v", iv)):
        w = cks.read(getattr(lts, f"{role}_weight"))
        part = x @ w if layout.conv1d else w @ x
        assert np.array_equal(part, fused_out[rows])
    qkv_fuse(tmp_path / "split", tmp_path / "back")
    same_files_tensor_by_tensor(src, tmp_path / "back")
    assert json.loads((tmp_path / "back" / "config.json").read_text()) == json.loads((src / "config.json").read_text())
    assert digest(src) == before
    assert_loads_same(src, tmp_path / "back")


def assert_loads_same(a, b):
    ma, mb = load(a), load(b)
    assert torch.equal(outputs(ma), outputs(mb))


def test_qwen2_fused_to_qkv_proj_and_back(tiny, tmp_path):
    src = tiny("qwen2")
    r = qkv_fuse(src, tmp_path / "fused")
    ck, ckf = open_checkpoint(src), open_checkpoint(tmp_path / "fused")
    for i in range(2):
        p = f"model.layers.{i}.self_attn."
        assert f"{p}q_proj.weight" not in ckf.tensors
        for kind in ("weight", "bias"):
            fused = ckf.read(f"{p}qkv_proj.{kind}")
            parts = [ck.read(f"{p}{m}_proj.{kind}") for m in "qkv"]
            assert np.array_equal(fused, np.concatenate(parts, axis=0))      # rows [Q; K; V]
    assert ckf.layout().fused_layout == "concat"
    meta = json.loads(ckf.metadata["ckpt_surgeon"])
    assert meta["operations"][-1]["params"]["qkv_layout"] == "concat"
    # issue 24: say what the fused folder is for, and that transformers does not load it ...
    assert r.plan.notes[1] == (
        "transformers' Qwen2ForCausalLM has no self_attn.qkv_proj: it would drop it and initialise self_attn.q_proj / "
        "self_attn.k_proj / self_attn.v_proj at random (`ckpt-surgeon lint` says so), so this folder is for tools "
        "that take one fused [Q; K; V] tensor (as GGUF's attn_qkv, which llama.cpp loads for this architecture); "
        "`qkv split` restores the original bit for bit")
    back = qkv_split(tmp_path / "fused", tmp_path / "back")
    # ... and that the split folder is the one it loads (this note used to say the opposite)
    assert back.plan.notes == (
        "config kept (qwen2); q/k/v are split back into self_attn.q_proj, self_attn.k_proj and self_attn.v_proj, "
        "the modules transformers' Qwen2ForCausalLM has, so it loads this folder as it is",)
    same_files_tensor_by_tensor(src, tmp_path / "back", order=False)
    assert_loads_same(src, tmp_path / "back")
    # what transformers itself reports when it loads each folder
    import transformers
    for folder, n_missing in ((tmp_path / "fused", 12), (tmp_path / "back", 0)):
        _, info = transformers.AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
        assert len(info["missing_keys"]) == n_missing, info


def test_qwen2_sharded_and_grouped_layout(tiny, tmp_path):
    """A non-default layout is recorded in the metadata and restored by split without --layout."""
    src = tiny("qwen2_sharded")
    qkv_fuse(src, tmp_path / "fused", layout="grouped")
    ckf = open_checkpoint(tmp_path / "fused")
    assert json.loads(ckf.metadata["ckpt_surgeon"])["operations"][-1]["params"]["qkv_layout"] == "grouped"
    qkv_split(tmp_path / "fused", tmp_path / "back")
    same_files_tensor_by_tensor(src, tmp_path / "back", order=False, shards=False)
    idx = json.loads((tmp_path / "back" / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(idx) == set(open_checkpoint(src).tensors)
    assert_loads_same(src, tmp_path / "back")


def _phi3_variant(tiny, tmp_path, sliding_window):
    d = tmp_path / "phi3"
    shutil.copytree(tiny("phi3"), d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["sliding_window"] = sliding_window
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize("window,arch", [(None, "LlamaForCausalLM"), (8, "MistralForCausalLM")])
def test_phi3_split_is_a_working_llama_or_mistral(tiny, tmp_path, window, arch):
    src = _phi3_variant(tiny, tmp_path, window)
    r = qkv_split(src, tmp_path / "out")
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    src_cfg = json.loads((src / "config.json").read_text())
    assert cfg["architectures"] == [arch] and cfg["model_type"] == arch[:-len("ForCausalLM")].lower()
    assert cfg["rope_parameters"] == src_cfg["rope_parameters"]
    assert cfg.get("sliding_window") == window
    names = set(open_checkpoint(tmp_path / "out").tensors)
    assert "model.layers.0.mlp.gate_proj.weight" in names and "model.layers.0.mlp.gate_up_proj.weight" not in names
    a, b = load(src), load(tmp_path / "out")
    assert type(b).__name__ == arch
    ids = torch.randint(3, 400, (2, 24), generator=torch.Generator().manual_seed(1))   # longer than the window
    with torch.no_grad():
        x, y = a(ids).logits, b(ids).logits
    # same numbers through the same ops (split rows are the fused projection's slices); the only
    # difference is matmul blocking over 16 vs 48 rows, which can reorder float32 sums: fp32 noise
    assert float((x - y).abs().max()) <= 1e-5 * max(1.0, float(x.abs().max()))
    assert greedy(a) == greedy(b)
    assert ("model_type", "phi3", arch[:-len("ForCausalLM")].lower()) in r.plan.config_changes


def test_refusals(tiny, tmp_path):
    with pytest.raises(RefusedError, match="has no fused qkv projection to split"):
        qkv_split(tiny("qwen2"), tmp_path / "o")
    with pytest.raises(RefusedError, match="has no separate q/k/v projections to fuse"):
        qkv_fuse(tiny("phi3"), tmp_path / "o")
    with pytest.raises(CkptError, match="per-head interleaved"):
        qkv_fuse(tiny("qwen2"), tmp_path / "o", layout="per_head")       # GQA cannot be [h, 3, d]
    with pytest.raises(CkptError, match="--layout conv1d is GPT-2's Conv1D storage"):
        qkv_fuse(tiny("qwen2"), tmp_path / "o", layout="conv1d")
    assert not (tmp_path / "o").exists()


def test_cli_qkv(tiny, tmp_path):
    runner = CliRunner()
    r = runner.invoke(cli, ["qkv", "fuse", str(tiny("qwen2")), "-o", str(tmp_path / "f"), "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["operation"] == "qkv-fuse" and d["params"]["layout"] == "concat"
    r = runner.invoke(cli, ["qkv", "split", str(tmp_path / "f"), "-o", str(tmp_path / "s")])
    assert r.exit_code == 0, r.output
    same_files_tensor_by_tensor(tiny("qwen2"), tmp_path / "s", order=False)
    r = runner.invoke(cli, ["qkv", "split", "--help"])
    assert r.exit_code == 0 and "--layout" in r.output and "--to" in r.output


def test_gguf_fuse_split_round_trip(tiny, tmp_path):
    """GGUF attn_q/attn_k/attn_v <-> attn_qkv, whole quantized rows moved, bit-exact back."""
    from tests.gguf_util import write_gguf
    src = write_gguf(tiny("qwen2"), tmp_path / "q.gguf", qtype="Q8_0")
    qkv_fuse(src, tmp_path / "fused.gguf")
    ckf = open_checkpoint(tmp_path / "fused.gguf")
    assert "blk.0.attn_qkv.weight" in ckf.tensors and ckf.tensors["blk.0.attn_qkv.weight"].dtype == "Q8_0"
    qkv_split(tmp_path / "fused.gguf", tmp_path / "back.gguf")
    a, b = open_checkpoint(src), open_checkpoint(tmp_path / "back.gguf")
    assert set(a.tensors) == set(b.tensors)
    for n, info in a.tensors.items():
        assert (b.tensors[n].dtype, b.tensors[n].shape) == (info.dtype, info.shape) and b.read_raw(n) == a.read_raw(n), n


@pytest.mark.parametrize("qtype", ["Q8_0", "F32"])
def test_gguf_source_to_a_folder_says_how(tiny, tmp_path, qtype):
    """Issue 36, item 12: `qkv fuse model.gguf -o folder` said "unknown safetensors dtype 'Q8_0'"
    (and an F32 GGUF silently gave a safetensors folder of GGUF names no loader reads).  A GGUF
    source writes a GGUF: one line saying so and how to get an HF folder, nothing written."""
    from tests.cli_util import _one_line_exit_2
    from tests.gguf_util import write_gguf
    src = write_gguf(tiny("qwen2"), tmp_path / "q.gguf", qtype=qtype)
    for argv in (["qkv", "fuse", src, "-o", tmp_path / "folder"], ["qkv", "fuse", src, "-o", tmp_path / "f.safetensors"],
                 ["fold-bias", src, "--k", "--approximate", "--max-logit-change", "1e9", "-o", tmp_path / "folder"]):
        res = CliRunner().invoke(cli, list(map(str, argv)))
        _one_line_exit_2(res, f"error: {src}: is a GGUF file, so the output is a GGUF file too: give -o a path "
                              "ending in .gguf", f"ckpt-surgeon convert {src} -o FOLDER")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.gguf"]
