"""notebooks/bias_analysis.ipynb runs top to bottom (nbclient, a real Jupyter kernel) and writes its
figures as PNG files, for the fixture and for a model path given through the environment."""
from __future__ import annotations

import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "bias_analysis.ipynb"


def test_notebook_runs_and_writes_pngs(tiny, monkeypatch):
    model = tiny("gpt_neox")              # the "any model path" cell gets a partial-rotary model
    monkeypatch.setenv("CKPT_SURGEON_NOTEBOOK_MODEL", str(model))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    start = time.time()
    # 300 s: kernel start + torch/transformers import for the fixture build on a cold cache.
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    out = ROOT / "notebooks" / "out"
    expected = ["qwen2_long_bias_norms.png", "qwen2_long_layer0_pair_energy.png",
                f"{model.name}_bias_norms.png", f"{model.name}_layer0_pair_energy.png"]
    for name in expected:
        p = out / name
        assert p.is_file(), name
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert p.stat().st_mtime >= start - 1            # written by this run
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert all(name in printed for name in expected)
