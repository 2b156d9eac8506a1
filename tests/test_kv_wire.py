"""``analyze --kv-cache TYPES --measure`` and ``--plot DIR`` (issue 32): the static prediction and the
measurement side by side, worst layers named in the table, and the before/after-equalizing PNGs.

The model is tests/kv_models.py's tiny Qwen2 (head_dim 64, 3 layers) with a key bias of 60 planted in two
rotary pairs of layer 1: the block-quantization physics makes layer 1 the worst under every block type,
so both the predicted and the measured column must name it, and only it (a third of 3 layers is 1).
"""
from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kv_models import build_kv_qwen2

from ckpt_surgeon.cli import cli

REPO = Path(__file__).resolve().parent.parent
PROMPTS = ["The quick brown fox jumps over the lazy dog. " * 3, "def f(x):\n    return x * 2 + 1\n" * 3]


@pytest.fixture(scope="module")
def hot(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("kvwire")
    (root / "prompts.json").write_text(json.dumps(PROMPTS))
    return build_kv_qwen2(tiny, root / "hot", plant={1: 60.0}), root / "prompts.json"


def _measure_args(model, prompts):
    return ["analyze", str(model), "--kv-cache", "q4_0,q8_0", "--measure", "--prompts", str(prompts),
            "--max-tokens", "24", "--device", "cpu"]


def _png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's signature and IHDR chunk; fails on anything else."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", path
    return struct.unpack(">II", data[16:24])


def test_measure_json_and_plots(hot, tmp_path):
    model, prompts = hot
    pytest.importorskip("matplotlib")
    plots = tmp_path / "plots"
    r = CliRunner().invoke(cli, _measure_args(model, prompts) + ["--plot", str(plots), "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)["kv_cache"]
    assert d["worst_predicted"] == {"q4_0": [1], "q8_0": [1]}
    m = d["measured"]
    assert m["worst_layers"]["q4_0"][0] == 1 and m["worst_layers"]["q8_0"][0] == 1
    assert {(x["layer"], x["cache_type"]) for x in m["layers"]} == {(i, t) for i in range(3) for t in ("q4_0", "q8_0")}
    assert m["prompts"] == 2 and all(t <= 24 for t in m["tokens"])
    # 3 layers: the planted one first in both rankings, so Spearman is 1 or 0.5 (the clean pair's order)
    assert all(d["rank_agreement"][t] in (pytest.approx(1.0), pytest.approx(0.5)) for t in ("q4_0", "q8_0"))
    for x in m["layers"]:
        assert x["k_logit_rms"] > 0 and x["k_row_kl"] > 0
    # one PNG per cache type, each a real image of plausible size
    written = sorted(p.name for p in plots.iterdir())
    assert written == ["kv_q4_0.png", "kv_q8_0.png"]
    for p in plots.iterdir():
        w, h = _png_size(p)
        assert w > 600 and h > 300, (p, w, h)


def _row(table: str, layer: int) -> list[str]:
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if cells and cells[0] == str(layer):
            return cells
    raise AssertionError(f"no row for layer {layer} in:\n{table}")


def test_measure_table_names_worst_layers(hot):
    model, prompts = hot
    r = CliRunner().invoke(cli, _measure_args(model, prompts))
    assert r.exit_code == 0, r.output
    header = next(line for line in r.output.splitlines() if "layer" in line and "KL q4_0" in line)
    cols = [c.strip() for c in header.strip("┃ ").split("┃")]
    for want in ("K q4_0", "meas K q4_0", "KL q4_0", "meas K q8_0", "KL q8_0", "worst (pred)", "worst (meas)"):
        assert want in cols, (want, cols)
    wp, wm = cols.index("worst (pred)"), cols.index("worst (meas)")
    assert _row(r.output, 1)[wp] == "q4_0, q8_0" and _row(r.output, 1)[wm] == "q4_0, q8_0"
    for i in (0, 2):
        assert _row(r.output, i)[wp] == "-" and _row(r.output, i)[wm] == "-"
    assert "worst layers (q4_0)  predicted 1; measured 1; rank agreement (Spearman)" in r.output


def test_static_kv_path_stays_torch_free(hot):
    model, _ = hot
    code = ("import sys; from ckpt_surgeon.analysis.api import analyze; "
            f"r = analyze({str(model)!r}, kv_cache='q4_0'); assert r.measured is None; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_kv_options_refused_in_one_line(hot, tmp_path):
    model, prompts = hot
    cases = [["--prompts", str(prompts)], ["--max-tokens", "8"], ["--measure", "--dtype", "float16"],
             ["--distance-profile"], ["--by-bias"]]
    for extra in cases:
        r = CliRunner().invoke(cli, ["analyze", str(model), "--kv-cache", "q4_0", *extra])
        assert r.exit_code == 2, (extra, r.output)
        # click's usage errors print the usage first; the reason is one line, the last
        err = [line for line in r.output.splitlines() if line.startswith(("Error:", "error:"))]
        assert len(err) == 1 and err[0] == r.output.strip().splitlines()[-1], (extra, r.output)
        assert any(w in err[0] for w in ("--kv-cache", "float32", "--measure")), (extra, r.output)


def test_plot_without_matplotlib_is_one_line(hot, tmp_path):
    """matplotlib made unimportable (``sys.modules[name] = None``: the import system raises ImportError):
    one line naming the extra, exit 2, no plot folder created."""
    model, _ = hot
    plots = tmp_path / "plots"
    code = ("import sys; sys.modules['matplotlib'] = None; from ckpt_surgeon.cli import main; "
            f"sys.argv = ['ckpt-surgeon', 'analyze', {str(model)!r}, '--kv-cache', 'q4_0', '--plot', {str(plots)!r}];"
            " main()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "matplotlib" in out.stderr and "[plot]" in out.stderr and out.stderr.strip().count("\n") == 0, out.stderr
    assert not plots.exists() and out.stdout == ""


def _tiny_deepseek_v3(out: Path) -> Path:
    """A 2-layer DeepSeek-V3 (MLA with a query LoRA, as V3 has; ckpt_surgeon.tiny has no V3 spec), built
    with transformers' own class and saved as safetensors."""
    import torch
    import transformers
    cfg = transformers.DeepseekV3Config(
        vocab_size=256, hidden_size=64, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=16,
        qk_rope_head_dim=8, v_head_dim=16, head_dim=8, first_k_dense_replace=2, n_routed_experts=4,
        num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1, max_position_embeddings=256)
    torch.manual_seed(0)
    transformers.DeepseekV3ForCausalLM(cfg).save_pretrained(out)
    return out


def test_mla_latent_cache_is_refused_with_what_remains(tmp_path):
    """MLA caches a latent c_kv and one shared rotary key: no per-head key blocks, no pairs to rescale.
    ``--kv-cache`` (with --measure and --plot too) is one line, exit 2, before any measuring or plotting,
    and it names what plain ``analyze`` still gives, which then runs."""
    model = _tiny_deepseek_v3(tmp_path / "dsv3")
    plots = tmp_path / "plots"
    for extra in ([], ["--measure", "--device", "cpu", "--plot", str(plots)]):
        r = CliRunner().invoke(cli, ["analyze", str(model), "--kv-cache", "q4_0", *extra])
        assert r.exit_code == 2 and r.output.count("\n") == 1, (extra, r.output)
        assert "latent" in r.output and "without --kv-cache still reports the bias classes" in r.output
    assert not plots.exists()
    r = CliRunner().invoke(cli, ["analyze", str(model), "--format", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["layers"], r.output


def test_plot_without_measure_on_a_gguf(hot, tmp_path):
    """Predicted only: one single-panel PNG per type; a GGUF source is equalized in its own format (the
    planner in dry run: nothing written beside the source)."""
    pytest.importorskip("matplotlib")
    from ckpt_surgeon import convert
    model, _ = hot
    gguf = tmp_path / "hot.gguf"
    convert(str(model), str(gguf))
    plots = tmp_path / "plots"
    r = CliRunner().invoke(cli, ["analyze", str(gguf), "--kv-cache", "q4_0,q5_1,fp8_e4m3", "--plot", str(plots)])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in plots.iterdir()) == ["kv_fp8_e4m3.png", "kv_q4_0.png", "kv_q5_1.png"]
    for p in plots.iterdir():
        w, h = _png_size(p)
        assert 500 < w < 1000 and h > 300, (p, w, h)      # one panel (6.5 in at 110 dpi), not two
    assert sorted(x.name for x in tmp_path.iterdir()) == ["hot.gguf", "plots"]
    assert "meas K" not in r.output and "worst (meas)" not in r.output
