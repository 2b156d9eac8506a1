"""The one registry: its names agree with gguf-py, every gguf-py attention architecture is read,
and no module outside the registry names a family."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ckpt_surgeon.arch import families as F
from ckpt_surgeon.arch import gguf_names as G
from ckpt_surgeon.cli import cli
from ckpt_surgeon.conversion import names as N

_PKG = Path(__file__).resolve().parent.parent / "ckpt_surgeon"
_PROJECTIONS = ("q", "k", "v", "qkv", "o")


# --- HF -> GGUF names agree with gguf-py's TensorNameMap -------------------------------------

def _gguf_archs(fam):
    return tuple(dict.fromkeys(fam.gguf_archs + ((fam.conversion.gguf_arch,) if fam.conversion and
                                                 fam.conversion.gguf_arch else ())))


def _split_of(fam, mod: str):
    """The conversion's Split row whose HF tensor is ``mod``'s weight, if any."""
    rows = fam.conversion.tensors if fam.conversion else ()
    return next((r for r in rows if isinstance(r, F.Split) and r.hf.endswith(f".{mod}.weight")), None)


@pytest.mark.parametrize("fam", [f for f in F.FAMILIES if _gguf_archs(f)], ids=lambda f: f.name)
def test_family_roles_agree_with_tensor_name_map(fam):
    """Every module a family's roles name (bar the `qkv split`/`fuse` outputs, which no converter
    knows) is called by gguf-py's TensorNameMap exactly what the GGUF reader looks for."""
    generic = G.gguf_roles()
    named = set()
    for arch in _gguf_archs(fam):
        for role, mods in fam.roles.items():
            if role in fam.surgery_roles:
                continue
            for mod in (mods,) if isinstance(mods, str) else mods:
                split = _split_of(fam, mod)
                if split is not None:       # cut into the parts' tensors (InternLM2's wqkv -> q, k, v)
                    parts = [G.gguf_tensor_name(arch, p).split(".")[-2] for p in split.parts]
                    assert parts == [generic[r] for r in "qkv"], (fam.name, arch, role, mod, parts)
                    named |= {"q", "k", "v"}
                    continue
                got = G.module_gguf_name(arch, fam.layer, mod)
                if role in _PROJECTIONS:
                    assert got == generic[role], (fam.name, arch, role, mod, got)
                elif got is not None:
                    # llama.cpp's falcon graph feeds attention from attn_norm_2 when the file has it
                    # (Falcon-40B ln_attn); every other norm keeps the role's own name.
                    allowed = {generic[role], generic[role] + "_2"} if role == "attn_norm" else {generic[role]}
                    assert got in allowed, (fam.name, arch, role, mod, got)
                if got is not None:
                    named.add(role)
    # the attention projections (separate or fused) and the output were all checked; MLA families
    # (DeepSeek-V2) have no key or value projection, only q and o
    mla = not {"k", "v", "qkv"} & set(fam.roles)
    assert {"q", "k", "v", "o"} <= named or {"qkv", "o"} <= named or (mla and {"q", "o"} <= named), named


@pytest.mark.parametrize("spec", N.ARCHS, ids=lambda s: s.gguf_arch)
def test_conversion_rules_are_bijective(spec):
    """The derived conversion table maps distinct HF tensors to distinct GGUF tensors."""
    gguf = [g for r in spec.tensors for g in (r.parts or (r.gguf,))]
    assert len(set(gguf)) == len(gguf) and len(spec.tensors) == len({r.hf for r in spec.tensors})


@pytest.mark.parametrize("fam", [f for f in F.FAMILIES if f.conversion], ids=lambda f: f.name)
def test_every_declared_conversion_has_a_spec(fam):
    target = fam.conversion.gguf_arch or fam.gguf_archs[0]
    for mt in fam.conversion.model_types or fam.model_types:
        # a GGUF -> HF-only conversion (InternLM2, written as llama) never captures HF -> GGUF
        assert (N.by_model_type(mt).gguf_arch == target) is fam.conversion.hf_to_gguf, (fam.name, mt)
    # reading the target back gives the family that owns it, with its HF class
    assert N.by_gguf_arch(target).hf_architecture == F.by_gguf_arch(target).hf_class


@pytest.mark.parametrize("fam", [f for f in F.FAMILIES if f.conversion], ids=lambda f: f.name)
def test_conversion_rows_agree_with_the_family_record(fam):
    """A family's Q/K permutation and norm offset are stated once as facts and once as conversion
    transforms: both must say the same (llama.cpp permutes Q/K rows exactly for the families whose
    GGUF rows are interleaved; it adds 1 to exactly the norms of families storing gamma - 1)."""
    # (a Split row is one HF tensor cut into several GGUF tensors: no offset or transpose)
    from ckpt_surgeon.conversion.splits import PERMUTING
    transforms = {row[1] for row in fam.conversion.tensors if not isinstance(row, F.Split)}
    # (a Split kind may permute its q / k parts itself: InternLM2's wqkv)
    permuting = any(isinstance(row, F.Split) and row.kind in PERMUTING for row in fam.conversion.tensors)
    assert ({"perm_q", "perm_k"} <= transforms or permuting) == fam.gguf_qk_permuted
    assert ("norm_shift" in transforms) == (fam.norm_weight_offset == 1.0)
    assert ("conv1d" in transforms) == fam.conv1d


def test_falcon40b_gguf_attention_norm_is_attn_norm_2(tiny, tmp_path):
    """Falcon new-decoder files: llama.cpp's converter writes ln_attn as attn_norm_2 and ln_mlp as
    attn_norm; the attention input norm (the |q| bound's source) must be attn_norm_2's values."""
    from gguf_util import write_gguf

    from ckpt_surgeon.checkpoint import open_checkpoint
    src = tiny("falcon")
    g = write_gguf(src, tmp_path / "falcon.gguf")
    with open_checkpoint(g) as ck:
        lay = ck.layout()
        assert [lt.attn_norm for lt in lay.layers] == ["blk.0.attn_norm_2.weight", "blk.1.attn_norm_2.weight"]
        gamma = ck.read("blk.1.attn_norm_2.weight")
    with open_checkpoint(src) as hf:
        assert [lt.attn_norm for lt in hf.layout().layers][1].endswith("h.1.ln_attn.weight")
        np.testing.assert_array_equal(np.asarray(gamma), np.asarray(hf.read("transformer.h.1.ln_attn.weight")))


# --- every gguf-py architecture with attention projections is read ---------------------------

H, KV, D, HIDDEN, LAYERS = 4, 2, 16, 64, 2


def _write_attention_gguf(path: Path, arch: str, rng) -> dict:
    """A GGUF holding only the attention projections (with biases) of ``arch``, written by
    gguf-py's own GGUFWriter; returns the k bias vectors per layer."""
    import gguf
    from gguf.constants import MODEL_ARCH_NAMES, MODEL_TENSOR, MODEL_TENSORS

    enum = next(k for k, v in MODEL_ARCH_NAMES.items() if v == arch)
    have = set(MODEL_TENSORS[enum])
    separate = {MODEL_TENSOR.ATTN_Q, MODEL_TENSOR.ATTN_K, MODEL_TENSOR.ATTN_V} <= have
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(LAYERS)
    w.add_head_count(H)
    w.add_head_count_kv(KV)
    w.add_embedding_length(HIDDEN)
    w.add_key_length(D)
    w.add_value_length(D)
    w.add_context_length(128)
    k_bias = {}
    for i in range(LAYERS):
        kb = rng.standard_normal(KV * D).astype(np.float32)
        k_bias[i] = kb
        if separate:
            for part, rows, bias in (("attn_q", H * D, None), ("attn_k", KV * D, kb), ("attn_v", KV * D, None)):
                w.add_tensor(f"blk.{i}.{part}.weight", rng.standard_normal((rows, HIDDEN)).astype(np.float32))
                w.add_tensor(f"blk.{i}.{part}.bias", bias if bias is not None
                             else rng.standard_normal(rows).astype(np.float32))
        else:
            rows = (H + 2 * KV) * D
            qb, vb = rng.standard_normal(H * D), rng.standard_normal(KV * D)
            w.add_tensor(f"blk.{i}.attn_qkv.weight", rng.standard_normal((rows, HIDDEN)).astype(np.float32))
            w.add_tensor(f"blk.{i}.attn_qkv.bias", np.concatenate([qb, kb, vb]).astype(np.float32))
        w.add_tensor(f"blk.{i}.attn_output.weight", rng.standard_normal((HIDDEN, H * D)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return k_bias


def test_gguf_attention_archs_cover_gguf_py():
    """The walk below is over gguf-py's MODEL_ARCH, not a list of ours (sanity: it is large and
    includes archs with separate and with fused projections)."""
    import gguf
    archs = G.gguf_attention_archs()
    assert len(archs) > 50 and {"llama", "qwen2", "gpt2", "bloom", "phi3"} <= set(archs)
    assert set(archs) <= set(gguf.MODEL_ARCH_NAMES.values())


@pytest.mark.parametrize("arch", G.gguf_attention_archs())
def test_every_gguf_py_attention_arch_is_read(arch, tmp_path):
    """`inspect` reads a GGUF of every gguf-py architecture that has attn_q/k/v or attn_qkv: every
    layer's biases are placed and the key-bias statistics are the written values.  The position
    encoding comes from the registry, else it is reported unknown (never guessed)."""
    rng = np.random.default_rng(abs(hash(arch)) % 2**32)
    path = tmp_path / f"{arch}.gguf"
    k_bias = _write_attention_gguf(path, arch, rng)
    res = CliRunner().invoke(cli, ["inspect", str(path), "--format", "json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    fam = F.by_gguf_arch(arch)
    assert out["family"] == (fam.name if fam else None)
    assert out["num_layers"] == LAYERS and len(out["layers"]) == LAYERS
    assert out["layers_with_qkv_bias"] == LAYERS and out["skipped"] == []
    for i, lay in enumerate(out["layers"]):
        # float32 values summed in float64 by the reader: agreement to float32 rounding
        assert lay["k_bias"]["l2"] == pytest.approx(float(np.linalg.norm(k_bias[i].astype(np.float64))), rel=1e-6)
        assert len(lay["k_bias"]["per_head_l2"]) == KV
    if fam is None:
        assert out["position_encoding"]["type"] == "unknown"
        assert any("not in the registry" in n for n in out["notes"])
    else:
        assert out["position_encoding"]["type"] == fam.position


# A sample through `analyze` (registry families and archs outside it), and a real subprocess.
_ANALYZE_SAMPLE = ("qwen2", "bloom", "gpt2", "phi3", "starcoder", "mpt", "internlm2", "baichuan")


@pytest.mark.parametrize("arch", [a for a in _ANALYZE_SAMPLE if a in G.gguf_attention_archs()])
def test_gguf_arch_analyze_classes(arch, tmp_path):
    path = tmp_path / f"{arch}.gguf"
    _write_attention_gguf(path, arch, np.random.default_rng(0))
    res = CliRunner().invoke(cli, ["analyze", str(path), "--format", "json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert len(out["layers"]) == LAYERS
    fam = F.by_gguf_arch(arch)
    want = "unknown" if fam is None else ("rope" if fam.position == "rope" else "exact")
    assert {lay["class"] for lay in out["layers"]} == {want}, out["layers"]


def test_unregistered_gguf_arch_through_subprocess(tmp_path):
    arch = next(a for a in G.gguf_attention_archs() if F.by_gguf_arch(a) is None)
    path = tmp_path / f"{arch}.gguf"
    _write_attention_gguf(path, arch, np.random.default_rng(1))
    p = subprocess.run([sys.executable, "-m", "ckpt_surgeon", "inspect", str(path), "--format", "json"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["architecture"] == arch and out["family"] is None and out["layers_with_qkv_bias"] == LAYERS


# --- nothing outside the registry names a family ---------------------------------------------

# Files where a family-looking literal means something else, and which literals:
_ALLOWED = {
    # tokenizer.ggml.model / tokenizer.ggml.pre values (gguf-py Keys.Tokenizer), vocabulary kinds:
    # "gpt2" byte-level BPE, "llama" SentencePiece BPE, "bert" the WordPiece model, "qwen2" a
    # pre-tokenizer regex set (llama-vocab.cpp), not families
    "conversion/tokenizer/bpe.py": {"gpt2"},
    "conversion/tokenizer/from_hf.py": {"gpt2", "llama"},
    "conversion/tokenizer/pretokenizers.py": {"qwen2"},
    "conversion/tokenizer/to_hf.py": {"gpt2", "llama", "bert"},
    # the same vocabulary kinds, in llama.cpp's load rules (defaults per tokenizer.ggml.model) and its
    # by-name token attributes ("phi3" is a needle llama.cpp looks for in general.name), mirrored as data
    "conversion/tokenizer/llama_specials.py": {"gpt2", "llama", "bert", "phi3"},
    # the tokenizer record and its comparison / checks: tokenizer.ggml.model values, not families
    "analysis/tokenizer/record.py": {"gpt2", "llama", "bert"},
    "analysis/tokenizer/compare.py": {"gpt2", "llama", "bert"},
    "analysis/tokenizer/checks.py": {"gpt2"},
}
# Fixture catalogue: ids of tiny test/demo checkpoints (with their transformers config classes),
# built by name and never consulted by analysis, surgery or conversion.
_FIXTURE_FILES = {"tiny.py", "demo.py", "tiny_kv.py", "demo_kv.py"}
_REGISTRY_FILES = {"arch/families.py"}


def _family_words() -> set:
    words = set()
    for fam in F.FAMILIES:
        words |= {fam.name, *fam.model_types, *fam.gguf_archs}
        if fam.hf_class:
            words.add(fam.hf_class)
    return words


def _literals(path: Path):
    """String constants of a module, docstrings excluded, with their line numbers."""
    tree = ast.parse(path.read_text(), str(path))
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docs.add(id(body[0].value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


def family_literals_outside_registry(root: Path) -> list[str]:
    words = _family_words()
    hits = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in _REGISTRY_FILES or rel in _FIXTURE_FILES:
            continue
        allowed = _ALLOWED.get(rel, set())
        for line, value in _literals(path):
            if value in words and value not in allowed:
                hits.append(f"{rel}:{line}: {value!r}")
    return hits


def test_no_family_name_outside_the_registry():
    assert family_literals_outside_registry(_PKG) == []


def test_family_literal_check_catches_a_branch(tmp_path):
    """The check above can fail: a module that branches on a family name is reported."""
    (tmp_path / "analysis").mkdir()
    (tmp_path / "analysis" / "bad.py").write_text('"""doc mentioning gpt2 is fine."""\n'
                                                  'def f(layout):\n    return layout.family == "gpt2"\n')
    assert family_literals_outside_registry(tmp_path) == ["analysis/bad.py:3: 'gpt2'"]
