"""Quantized checkpoints written by the real quantizers (``fixtures/quant/<scheme>/``, made by the
fixture-building step; ``PRODUCER.json`` names the library, version and call): read as their logical
layout, dequantized element-exact against the producer's own dequantization (``oracle.safetensors``:
dense float32 ``[out, in]`` per logical Linear), inspected, linted and analysed as the same model as
``fixtures/quant/base`` (the unquantized model they were made from)."""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ckpt_surgeon.checkpoint import open_checkpoint
from ckpt_surgeon.cli import cli
from ckpt_surgeon.formats import safetensors as st
from fixtures.oracle import has_oracle, read_oracle
from hubenv import hub  # noqa: F401  (the local Hub fixture)

QUANT = Path(__file__).resolve().parent.parent / "fixtures" / "quant"
BASE = QUANT / "base"
SCHEMES = sorted(p.name for p in QUANT.glob("*") if (p / "PRODUCER.json").is_file() and has_oracle(p))

assert BASE.is_dir(), f"{BASE}: the quantized fixtures are committed test data (fixtures/quant/README.md)"


def _oracle(scheme: str) -> dict:
    return read_oracle(QUANT / scheme)


def test_fixtures_present():
    # every scheme the issue names has a fixture once the fixture step has run
    assert len(SCHEMES) >= 2, SCHEMES


@pytest.mark.parametrize("scheme", SCHEMES)
def test_dequantized_equals_producer(scheme):
    """Every logical weight equals the producer's own dequantization, bit for bit, and every
    quantized weight of the checkpoint is in the oracle (none read as raw codes)."""
    oracle = _oracle(scheme)
    with open_checkpoint(QUANT / scheme) as ck:
        q = ck.quantization
        assert q is not None
        assert set(q.tensors) == set(oracle)
        for name, want in oracle.items():
            got = ck.read(name)
            assert got.dtype == np.float32 and got.shape == want.shape, name
            np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_logical_layout_is_the_base_model(scheme):
    """Same tensor names and shapes as the unquantized model; companions hidden; the q/k/v biases
    (never quantized; MLX's ``*.biases`` offsets beside them are not taken for them) carry the base
    model's values exactly."""
    with open_checkpoint(BASE) as b, open_checkpoint(QUANT / scheme) as ck:
        assert {n: tuple(i.shape) for n, i in ck.tensors.items()} == {n: tuple(i.shape) for n, i in b.tensors.items()}
        assert all(n not in ck.tensors for n in ck.quantization.hidden)
        lay = ck.layout()
        assert lay.num_layers == b.layout().num_layers
        for lt in lay.layers:
            for name in (lt.q_bias, lt.k_bias, lt.v_bias):
                np.testing.assert_array_equal(ck.read(name), b.read(name), err_msg=name)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_inspect_names_the_quantization(scheme):
    res = CliRunner().invoke(cli, ["inspect", str(QUANT / scheme), "--format", "json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    base = json.loads(CliRunner().invoke(cli, ["inspect", str(BASE), "--format", "json"]).output)
    assert d["parameter_count"] == base["parameter_count"]
    q = d["quantization"]
    with open_checkpoint(QUANT / scheme) as ck:
        qq = ck.quantization
        stored = sum(i.nbytes for i in ck.stored_tensors.values())
        assert q["method"] == qq.method and q["bits"] == list(qq.bits)
        assert q["quantized_parameters"] == sum(ck.tensors[n].numel for n in qq.tensors)
    assert 0 < q["quantized_share"] <= 1
    assert d["memory"]["weight_bytes_total"] == stored
    assert base["quantization"] is None
    table = CliRunner().invoke(cli, ["inspect", str(QUANT / scheme)]).output
    assert "quantization" in table and q["method"] in table


@pytest.mark.parametrize("scheme", SCHEMES)
def test_lint_clean(scheme):
    res = CliRunner().invoke(cli, ["lint", str(QUANT / scheme), "--format", "json"])
    d = json.loads(res.output)
    checks = {f["check"] for f in d["findings"]}
    assert "dtype-mix" not in checks and "config-shapes" not in checks and "quantization" not in checks, d["findings"]


def _row_error(w: np.ndarray, ref: np.ndarray) -> float:
    """Largest relative change of a row pair norm (the bound is linear in W_q's rotary-pair norms)."""
    return float(np.max(np.linalg.norm(w - ref, axis=1) / np.linalg.norm(ref, axis=1)))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_analyze_bound_from_dequantized_weights(scheme):
    """The key-bias bound of the quantized model is the base model's within the quantization error
    of W_q: the bound is a sum of |b_j| times norms of the row pairs of W_q diag(gamma) (gamma: the
    attention-input RMSNorm weight; AWQ moves scales between the two, the product stays), so its
    relative change is at most the largest relative change of such a row norm (x2 for the pair
    sum, and the q bias term)."""
    from ckpt_surgeon.analysis import redundancy as R
    rb, rq = R.analyze(str(BASE)), R.analyze(str(QUANT / scheme))
    assert any("bounds use the dequantized weights" in n for n in rq.notes)
    assert not any("dequantized" in n for n in rb.notes)
    with open_checkpoint(BASE) as b, open_checkpoint(QUANT / scheme) as ck:
        for lb, lq, lt in zip(rb.layers, rq.layers, ck.layout().layers):
            g = f"model.layers.{lt.layer}.input_layernorm.weight"
            eps = _row_error(ck.read(lt.q_weight) * ck.read(g), b.read(lt.q_weight) * b.read(g))
            # the dequantized weights, not raw codes (off by 1e2 or more); GPTQ trades weight error for
            # output error: rows move up to 0.29 on these random tiny weights
            assert eps < 0.5, eps
            for x, y in ((lq.bound, lb.bound), (lq.bound_all, lb.bound_all)):
                assert y and abs(x - y) <= 2 * eps * y + 1e-12, (lt.layer, x, y, eps)


# ------------------------------------------------------------------------------------ bad input


def _rewrite(src: Path, dst: Path, *, drop: tuple = (), config: dict | None = None, patch: dict | None = None) -> Path:
    """A copy of a fixture with tensors dropped / config keys replaced / tensors' bytes replaced
    (``patch``: name -> function of the stored numpy array returning the new one, same dtype and
    shape); everything else copied as stored."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("oracle.safetensors", "model.safetensors.index.json"))
    files = sorted(dst.glob("*.safetensors"))
    for f in files:
        h = st.read_header(f)
        raw = f.read_bytes()
        hdr, blobs, off = {}, [], 0
        for n, i in h.tensors.items():
            if n in drop:
                continue
            b = raw[i.start:i.end]
            if patch and n in patch:
                arr = np.frombuffer(b, dtype=_NP[i.dtype]).reshape(i.shape).copy()
                b = np.ascontiguousarray(patch[n](arr)).astype(_NP[i.dtype]).tobytes()
                assert len(b) == i.end - i.start
            hdr[n] = {"dtype": i.dtype, "shape": list(i.shape), "data_offsets": [off, off + len(b)]}
            off += len(b)
            blobs.append(b)
        j = json.dumps(hdr).encode()
        f.write_bytes(struct.pack("<Q", len(j)) + j + b"".join(blobs))
    if config:
        c = json.loads((dst / "config.json").read_text())
        c.update(config)
        (dst / "config.json").write_text(json.dumps(c))
    return dst


_NP = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "U32": np.uint32, "I8": np.int8, "U8": np.uint8,
       "BF16": np.uint16}


def _one_line_exit_2(args) -> str:
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2, res.output
    lines = [x for x in res.output.strip().splitlines() if x.strip()]
    assert len(lines) == 1, res.output
    return lines[0]


def _a_quantized_weight(scheme: str) -> tuple[str, str]:
    with open_checkpoint(QUANT / scheme) as ck:
        t = next(iter(ck.quantization.tensors.values()))
        scale = next(n for r, n in t.members if r in ("scales", "weight_scale", "weight_scale_inv", "SCB",
                                                        "weight.absmax"))
        return t.scheme, scale


@pytest.mark.parametrize("scheme", SCHEMES)
def test_missing_scales_refused(scheme, tmp_path):
    key, scale = _a_quantized_weight(scheme)
    bad = _rewrite(QUANT / scheme, tmp_path / "m", drop=(scale,))
    for cmd in ("inspect", "analyze", "lint"):
        line = _one_line_exit_2([cmd, str(bad)])
        assert "missing" in line and key in line and scale.rsplit(".", 1)[0] in line, line


def test_unsupported_method_refused(tmp_path):
    bad = _rewrite(QUANT / SCHEMES[0], tmp_path / "u", config={"quantization_config": {"quant_method": "hqq"}})
    line = _one_line_exit_2(["inspect", str(bad)])
    assert "'hqq'" in line and "not supported" in line


@pytest.mark.parametrize("scheme", [s for s in SCHEMES if s.startswith("mlx")])
def test_mlx_shape_contradicting_bits_refused(scheme, tmp_path):
    c = json.loads((QUANT / scheme / "config.json").read_text())
    bits = c["quantization"]["bits"]
    wrong = {"quantization": {**c["quantization"], "bits": 8 if bits == 4 else 4}}
    bad = _rewrite(QUANT / scheme, tmp_path / "b", config=wrong)
    line = _one_line_exit_2(["inspect", str(bad)])
    assert "contradicts bits x group size" in line and "(mlx)" in line and ".weight" in line


@pytest.mark.parametrize("scheme", SCHEMES)
def test_diff_same_model_quantized(scheme):
    """Paired by logical names, compared by dequantized values: "same model, quantized", with the
    relative errors the oracle gives."""
    res = CliRunner().invoke(cli, ["diff", str(BASE), str(QUANT / scheme), "--format", "json"])
    assert res.exit_code == 1, res.output        # 1: the checkpoints differ (diff's exit codes)
    d = json.loads(res.output)
    with open_checkpoint(QUANT / scheme) as ck:
        q = ck.quantization
    assert d["verdict"] == "quantized", d["verdict_line"]
    assert d["verdict_line"].startswith(f"same model, quantized ({q.method}, ")
    rows = {t["name"]: t for t in d["tensors"]}
    oracle = _oracle(scheme)
    with open_checkpoint(BASE) as b:
        for name, w in oracle.items():
            ref = b.read(name).astype(np.float64)
            want = np.linalg.norm(w - ref) / np.linalg.norm(ref)
            assert rows[name]["rel_fro"] == pytest.approx(want, rel=1e-9), name


# ------------------------------------------------------------------------------------ qkv


def _stored(folder: Path) -> dict:
    with open_checkpoint(folder) as ck:
        return {n: ck.read_raw(n) for n in ck.stored_tensors}


@pytest.mark.parametrize("scheme", SCHEMES)
def test_qkv_fuse_split_moves_every_companion(scheme, tmp_path):
    """Where the scheme keeps one scale per output (MLX, bitsandbytes int8, compressed-tensors
    per-channel: rows; GPTQ / AWQ: columns, packed zero points in whole words), fusing moves codes
    and scales output for output: the fused logical
    weight is the q/k/v rows of the dequantized parts, nothing is orphaned (the fused checkpoint
    opens: a code tensor without its scales would be refused), and split gives back every stored
    tensor byte for byte.  Elsewhere: one line naming the scheme, exit 2, nothing written."""
    src = QUANT / scheme
    with open_checkpoint(src) as ck:
        t = ck.quantization.tensors["model.layers.0.self_attn.q_proj.weight"]
        from ckpt_surgeon.formats.quant.schemes import SCHEMES as REC
        rec = REC[t.scheme]
        exact = bool(rec.col_members) or (bool(rec.row_members) and all(
            ck.stored_tensors[n].shape[:1] == (t.shape[0],) for r, n in t.members if r in rec.row_members))
        parts = [ck.read(f"model.layers.0.self_attn.{p}_proj.weight") for p in "qkv"]
    fused, back = tmp_path / "fused", tmp_path / "back"
    if not exact:
        line = _one_line_exit_2(["qkv", "fuse", str(src), "-o", str(fused)])
        assert "refused" in line and "quantized" in line and t.scheme in line
        assert not fused.exists()
        return
    res = CliRunner().invoke(cli, ["qkv", "fuse", str(src), "-o", str(fused), "--format", "json"])
    assert res.exit_code == 0, res.output
    with open_checkpoint(fused) as f:
        assert not any(n.endswith((".q_proj.weight", ".k_proj.weight", ".v_proj.weight")) for n in f.stored_tensors)
        np.testing.assert_array_equal(f.read("model.layers.0.self_attn.qkv_proj.weight"), np.concatenate(parts))
        # every stored tensor is a logical one or a member of one (no orphan), every member is stored
        assert set(f.stored_tensors) <= set(f.tensors) | f.quantization.hidden <= set(f.stored_tensors) | set(f.tensors)
        assert f.quantization.hidden <= set(f.stored_tensors)
    res = CliRunner().invoke(cli, ["qkv", "split", str(fused), "-o", str(back), "--format", "json"])
    assert res.exit_code == 0, res.output
    assert _stored(back) == _stored(src)


# ------------------------------------------------------------------------------------ fold-bias


@pytest.mark.parametrize("scheme", SCHEMES)
def test_fold_bias_leaves_quantized_bytes_alone(scheme, tmp_path):
    """An approximate key fold budgets with the bound of the dequantized W_q (so it removes the
    pairs the unquantized model would, not nothing), edits only the key biases, copies every other
    stored tensor byte for byte and keeps the quantization config."""
    out = tmp_path / "folded"
    res = CliRunner().invoke(cli, ["fold-bias", str(QUANT / scheme), "-o", str(out), "--k", "--approximate",
                                   "--max-logit-change", "0.5", "--format", "json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    base = json.loads(CliRunner().invoke(cli, ["fold-bias", str(BASE), "-o", str(tmp_path / "b"), "--k",
                                               "--approximate", "--max-logit-change", "0.5", "--format",
                                               "json"]).stdout)
    assert [lr["k_removed"] for lr in d["layers"]] == [lr["k_removed"] for lr in base["layers"]]
    assert all(lr["k_removed"] > 0 for lr in d["layers"])
    changed = set(d["tensors_changed"])
    assert changed and all(n.endswith("k_proj.bias") for n in changed)
    a, b = _stored(QUANT / scheme), _stored(out)
    assert set(a) == set(b)
    assert {n for n in a if a[n] != b[n]} == changed
    src_cfg = json.loads((QUANT / scheme / "config.json").read_text())
    out_cfg = json.loads((out / "config.json").read_text())
    for key in ("quantization_config", "quantization"):
        assert out_cfg.get(key) == src_cfg.get(key)
    with open_checkpoint(out) as ck:
        assert ck.quantization is not None


# ------------------------------------------------------------------------------------ lint faults


def _lint(folder: Path) -> list:
    res = CliRunner().invoke(cli, ["lint", str(folder), "--format", "json"])
    return [f for f in json.loads(res.stdout)["findings"] if f["check"] == "quantization"]


def test_lint_nan_and_zero_scales(tmp_path):
    name = "model.layers.0.self_attn.q_proj.scales"
    def spoil(a):
        a = a.copy()
        a.reshape(-1)[0] = np.nan
        a.reshape(-1)[1] = 0
        return a
    bad = _rewrite(QUANT / "gptqmodel_gptq", tmp_path / "s", patch={name: spoil})
    (f,) = _lint(bad)
    assert f["severity"] == "error" and f["tensor"] == name and "1 NaN/Inf and 1 zero" in f["message"]


def test_lint_g_idx_out_of_range(tmp_path):
    name = "model.layers.1.mlp.down_proj.g_idx"
    bad = _rewrite(QUANT / "gptqmodel_gptq", tmp_path / "g", patch={name: lambda a: a + 7})
    (f,) = _lint(bad)
    assert f["tensor"] == name and "g_idx holds groups" in f["message"]
    # and nothing is dequantized through it
    line = _one_line_exit_2(["lint", str(bad), "--scan"])
    assert "g_idx" in line and "gptq" in line


def test_lint_ignore_list_names_a_quantized_module(tmp_path):
    c = json.loads((QUANT / "ct_w8a8_int" / "config.json").read_text())
    q = dict(c["quantization_config"], ignore=["lm_head", "re:.*layers[.]0[.]mlp[.]up_proj"])
    bad = _rewrite(QUANT / "ct_w8a8_int", tmp_path / "i", config={"quantization_config": q})
    (f,) = _lint(bad)
    assert f["tensor"] == "model.layers.0.mlp.up_proj.weight" and "among the modules left unquantized" in f["message"]


def test_lint_sym_contradicting_zero_points(tmp_path):
    c = json.loads((QUANT / "autoawq_gemm" / "config.json").read_text())
    assert c["quantization_config"]["zero_point"] is True
    bad = _rewrite(QUANT / "autoawq_gemm", tmp_path / "z",
                   config={"quantization_config": dict(c["quantization_config"], zero_point=False)})
    found = _lint(bad)
    assert found and all("zero points range over" in f["message"] for f in found)


def test_gptq_shape_contradicting_group_size_refused(tmp_path):
    c = json.loads((QUANT / "gptqmodel_gptq" / "config.json").read_text())
    bad = _rewrite(QUANT / "gptqmodel_gptq", tmp_path / "c",
                   config={"quantization_config": dict(c["quantization_config"], group_size=64)})
    line = _one_line_exit_2(["inspect", str(bad)])
    assert "contradicts bits x group size" in line and "(gptq)" in line and "qweight" in line


def test_quantized_tensors_without_quantization_config_refused(tmp_path):
    """Codes are never read as weights: a config that declares no quantization beside packed
    tensors is refused, naming one of them."""
    c = json.loads((QUANT / "gptqmodel_gptq" / "config.json").read_text())
    c.pop("quantization_config")
    bad = _rewrite(QUANT / "gptqmodel_gptq", tmp_path / "n")
    (bad / "config.json").write_text(json.dumps(c))
    line = _one_line_exit_2(["inspect", str(bad)])
    assert "declares no quantization_config" in line and ".qweight" in line


@pytest.mark.parametrize("scheme, key, value", [("fp8_block_deepseek", "weight_block_size", [128, "a"]),
                                                ("gptqmodel_gptq", "group_size", "128"),
                                                ("ct_w4a16_gptq", "config_groups", [])])
def test_malformed_quantization_config_refused(scheme, key, value, tmp_path):
    c = json.loads((QUANT / scheme / "config.json").read_text())
    bad = _rewrite(QUANT / scheme, tmp_path / "m", config={"quantization_config": {**c["quantization_config"], key: value}})
    line = _one_line_exit_2(["inspect", str(bad)])
    assert "config.json" in line


# ------------------------------------------------------------------------------------ Hub


@pytest.mark.parametrize("scheme", ["bnb_nf4", "ct_w4a16_gptq", "gptqmodel_fp8_block"])
def test_hub_repo_inspected_as_local_reading_no_weights(scheme, hub):
    """Over HTTP ranges a quantized repo gives the local report, reading headers, biases and the
    few bytes the logical shapes need (bitsandbytes' quant state, compressed-tensors' weight_shape),
    never a packed weight or its scales."""
    from ckpt_surgeon.analysis.inspect import inspect
    hub.add_repo("owner/q", QUANT / scheme)
    rep, local = inspect("owner/q"), inspect(str(QUANT / scheme))
    assert rep.parameter_count == local.parameter_count
    assert rep.quantization.to_dict() == local.quantization.to_dict()
    with open_checkpoint(QUANT / scheme) as ck:
        weights = sum(ck.stored_tensors[n].nbytes for t in ck.quantization.tensors.values() for r, n in t.members
                      if r in ("weight", "qweight", "weight_packed", "scales", "weight_scale", "weight_scale_inv",
                               "weight.absmax"))
    # what is read is headers (~11% of this tiny model's packed bytes; ~0.001% of a 7B's), biases and
    # the small shape tensors; dequantizing on inspect would read all of them, four times this bound
    assert rep.bytes_read < weights / 4, (rep.bytes_read, weights)
