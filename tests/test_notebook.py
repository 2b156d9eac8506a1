"""notebooks/bias_analysis.ipynb runs top to bottom (nbclient, a real Jupyter kernel) from a copy
outside the repository, as a user of the pip-installed package runs it: the fixture comes from
``ckpt_surgeon.tiny_cache``, the figures land in ``out/`` beside the notebook, for the fixture
and for a model path given through the environment."""
from __future__ import annotations

import shutil
import time
import warnings
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from fixtures.build_fixtures import fixture_base

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "bias_analysis.ipynb"


def test_notebook_reads_without_nbformat_warnings():
    """Every cell has a unique id (nbformat 4.5): a cell without one made nbformat.read warn
    MissingIDFieldWarning in the test below (issue 24), and a future nbformat makes it an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nb = nbformat.read(NOTEBOOK, as_version=4)
        nbformat.validate(nb)
    ids = [c.get("id") for c in nb.cells]
    assert all(ids) and len(set(ids)) == len(ids), ids


def test_notebook_runs_outside_the_repo_and_writes_pngs_beside_itself(tiny, tmp_path, monkeypatch):
    model = tiny("gpt_neox")              # the "any model path" cell gets a partial-rotary model
    monkeypatch.setenv("CKPT_SURGEON_NOTEBOOK_MODEL", str(model))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    # The kernel builds the fixture through ckpt_surgeon.tiny_cache: point it at the suite's cache.
    monkeypatch.setenv("CKPT_SURGEON_FIXTURE_CACHE", str(fixture_base()))
    here = tmp_path / "my-notebooks"
    here.mkdir()
    copy = Path(shutil.copy(NOTEBOOK, here / NOTEBOOK.name))
    # Nothing on the walk-up path from the copy is the repository (the old notebook looked for
    # a folder holding ckpt_surgeon/ there and failed with StopIteration when installed).
    assert not any((p / "ckpt_surgeon").is_dir() for p in [here, *here.parents])
    nb = nbformat.read(copy, as_version=4)
    start = time.time()
    # 300 s: kernel start + torch/transformers import for the fixture build on a cold cache.
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(here)}}).execute()
    expected = ["qwen2_long_bias_norms.png", "qwen2_long_layer0_pair_energy.png", "qwen2_long_bias_consumers.png",
                f"{model.name}_bias_norms.png", f"{model.name}_layer0_pair_energy.png",
                f"{model.name}_bias_consumers.png"]
    # the distance profile's three plots (layer 0's g and pair plots, the heatmap), both models
    expected += [f"{tag}_distance_profile/{png}" for tag in ("qwen2_long", model.name)
                 for png in ("g_layer0.png", "pairs_layer0.png", "g_heatmap.png")]
    for name in expected:
        p = here / "out" / name
        assert p.is_file(), name
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert p.stat().st_mtime >= start - 1            # written by this run
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert all(f"out/{name}" in printed for name in expected)
    in_repo = ROOT / "notebooks" / "out" / "qwen2_long_bias_norms.png"
    assert not in_repo.exists() or in_repo.stat().st_mtime < start      # nothing written into the repo
