"""PNG plots of the KV-cache error before and after equalizing (``analyze --kv-cache T --plot DIR``).

matplotlib is the optional ``plot`` extra, imported here only (Agg backend), as in
:mod:`.distance_plots`.  The records drawn come from :func:`ckpt_surgeon.surgery.kv_effect.equalize_effect`
(read by attribute: this module does not import surgery).  One figure per cache type,
``kv_<type>.png``, each written atomically:

* left: per layer, the attention-logit RMS error of a ``<type>`` K cache (log axis): predicted before
  and after kv-equalize (lines), and with ``--measure`` measured before and after (markers);
* right (with ``--measure``): the measured mean attention-row KL, before and after.
"""
from __future__ import annotations

import os
from pathlib import Path

from .distance_plots import _plt, _save


def check_matplotlib() -> None:
    """Raise the one-line UnsupportedError now (before any work) when matplotlib is missing."""
    _plt()


def _positive(xs):
    """Log axes take positive values: a zero error (nothing quantized away) is drawn as missing."""
    return [x if (x is not None and x > 0) else float("nan") for x in xs]


def _per_layer_log(ax, layers, ylabel: str, title: str) -> None:
    """One panel's axes: layers along x (one tick each), ``ylabel`` on a log axis, ``title``, the legend."""
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.set_xticks(layers)
    ax.legend(fontsize=7, loc="best")


def plot_kv_type(effect, cache_type: str):
    """One cache type's figure -> matplotlib figure."""
    plt = _plt()
    rows = sorted(effect.of(cache_type), key=lambda r: r.layer)
    x = [r.layer for r in rows]
    ncols = 2 if effect.measured else 1
    fig, axes = plt.subplots(1, ncols, figsize=(6.5 * ncols, 4), squeeze=False)
    ax = axes[0][0]
    ax.plot(x, _positive([r.predicted_before for r in rows]), "-", color="tab:red", label="predicted, before")
    ax.plot(x, _positive([r.predicted_after for r in rows]), "--", color="tab:blue", label="predicted, after")
    if effect.measured:
        ax.plot(x, _positive([r.measured_before for r in rows]), "o", color="tab:red", label="measured, before")
        ax.plot(x, _positive([r.measured_after for r in rows]), "s", mfc="none", color="tab:blue",
                label="measured, after")
    _per_layer_log(ax, x, "attention-logit RMS error [logit]",
                   f"K cache {cache_type}: logit error before / after kv-equalize")
    if effect.measured:
        ax = axes[0][1]
        ax.plot(x, _positive([r.kl_before for r in rows]), "o-", color="tab:red", label="measured, before")
        ax.plot(x, _positive([r.kl_after for r in rows]), "s--", mfc="none", color="tab:blue", label="measured, after")
        _per_layer_log(ax, x, "mean attention-row KL [nats]",
                       f"K cache {cache_type}: attention-row KL (real Q, K; ggml kernels)")
    fig.tight_layout()
    return fig


def plot_kv_cache(effect, out_dir: str | os.PathLike) -> list[Path]:
    """Write ``kv_<type>.png`` for every cache type of ``effect`` into ``out_dir`` -> the paths written."""
    plt = _plt()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    done = []
    for t in effect.cache_types:
        fig = plot_kv_type(effect, t)
        done.append(_save(fig, out / f"kv_{t}.png"))
        plt.close(fig)
    return done
