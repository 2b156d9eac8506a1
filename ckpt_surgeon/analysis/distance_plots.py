"""PNG plots of a distance profile (``analyze --distance-profile --plot DIR``; the notebook).

matplotlib is an optional extra (``pip install 'ckpt-surgeon[plot]'``): imported here only, with
the Agg backend (no display).  Three figures, each written atomically:

* ``g_layer<L>.png`` per profiled layer: ``g(Δ) = f(Δ) - f(0)`` on a symlog Δ axis, one line per
  query head coloured by its kv group, marks at 4k, 32k and the context;
* ``g_heatmap.png``: layer × log-Δ heatmap of the median ``g`` over the layer's heads;
* ``pairs_layer<L>.png``: per rotary pair, ``Re h_j`` (scaled, summed over the layer's heads)
  against ``θ_j L`` (log axis): which frequencies carry the bias product.
"""
from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np

from ..errors import UnsupportedError
from ..publish import write_file_atomic

MARKS = (4096, 32768)


def _plt():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UnsupportedError("--plot needs matplotlib: pip install 'ckpt-surgeon[plot]'") from None
    return plt


def _save(fig, path: Path) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    write_file_atomic(path, buf.getvalue())
    return path


def _marks(ax, context):
    # a mark within 15 % of the context would print over the context's label
    marks = [(m, f"{m // 1024}k") for m in MARKS if abs(m - (context - 1)) > 0.15 * context]
    for x, lab in marks + [(context - 1, "context")]:
        if x and x <= ax.get_xlim()[1] * 1.01:
            ax.axvline(x, color="0.6", lw=0.8, ls=":")
            ax.text(x, 1.0, lab, transform=ax.get_xaxis_transform(), fontsize=7, ha="center", va="bottom")


def plot_layer_g(profile, layer: int, ax=None):
    """``g(Δ)`` of every query head of ``layer`` on ``ax`` (a new figure when None) -> figure."""
    plt = _plt()
    lp = profile.layer(layer)
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 4))
    cmap = plt.get_cmap("tab10")
    d = np.asarray(profile.deltas)
    seen = set()
    for h in lp.heads:
        ax.plot(d, h.f - h.f[0], color=cmap(h.kv_head % 10), lw=1, alpha=0.8,
                label=None if h.kv_head in seen else f"kv group {h.kv_head}")
        seen.add(h.kv_head)
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlabel("distance Δ = m - n")
    ax.set_ylabel("g(Δ) = f(Δ) - f(0)  [logit]")
    ax.set_title(f"layer {layer}: bias·bias profile ({profile.label})", fontsize=9, pad=14)
    ax.axhline(0, color="k", lw=0.5)
    _marks(ax, profile.context)
    ax.legend(fontsize=7, loc="best")
    return fig or ax.figure


def plot_heatmap(profile, ax=None):
    """Layer × Δ heatmap of the median ``g`` over each layer's heads -> figure."""
    plt = _plt()
    lps = [lp for lp in profile.layers if lp.heads]
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(7, max(2.5, 0.25 * len(lps) + 1.5)))
    d = np.asarray(profile.deltas)
    z = np.array([np.median([h.f - h.f[0] for h in lp.heads], axis=0) for lp in lps])
    lim = float(np.abs(z).max()) or 1.0
    cols = np.arange(len(d) + 1) - 0.5
    im = ax.pcolormesh(cols, np.arange(len(lps) + 1) - 0.5, z, cmap="RdBu_r", vmin=-lim, vmax=lim, shading="flat")
    ticks = np.unique(np.linspace(0, len(d) - 1, min(8, len(d))).round().astype(int))
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{int(d[i]):,}" for i in ticks], fontsize=7, rotation=30)
    ax.set_yticks(range(len(lps)))
    ax.set_yticklabels([str(lp.layer) for lp in lps], fontsize=7)
    ax.set_xlabel("distance Δ (log-spaced grid)")
    ax.set_ylabel("layer")
    ax.set_title("median g(Δ) over heads [logit]", fontsize=9)
    (fig or ax.figure).colorbar(im, ax=ax)
    return fig or ax.figure


def plot_pairs(profile, layer: int, ax=None):
    """Per rotary pair: ``Re h_j`` summed over the layer's heads against ``θ_j L`` -> figure."""
    plt = _plt()
    lp = profile.layer(layer)
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 3.5))
    ang = np.asarray(profile.rope.inv_freq) * (profile.context - 1)
    re = np.sum([h.re_h for h in lp.heads], axis=0)
    x = np.log10(np.maximum(ang, 1e-300))
    ax.bar(x, re, width=0.8 * (float(np.ptp(x)) / max(1, len(ang))) or 0.05,
           color=np.where(re >= 0, "tab:blue", "tab:red"))
    ax.axvline(0, color="0.5", ls=":", lw=0.8)
    ax.text(0, 1.0, "θL = 1", transform=ax.get_xaxis_transform(), fontsize=7, ha="center", va="bottom")
    ax.set_xlabel("log10(θ_j L)  (left of 0, θ_j L < 1: plateau, invisible to softmax)")
    ax.set_ylabel("Σ_heads s a² Re h_j")
    ax.set_title(f"layer {layer}: which frequency pairs carry the bias product", fontsize=9, pad=14)
    return fig or ax.figure


def plot_profile(profile, out_dir: str | os.PathLike, *, layers=None) -> list[Path]:
    """Write the three kinds of PNG for ``profile`` into ``out_dir`` -> the paths written.

    ``layers``: which layers get their own ``g`` and pair plots (default: every profiled layer)."""
    plt = _plt()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    done = []
    chosen = [lp.layer for lp in profile.layers if lp.heads]
    if layers is not None:
        chosen = [i for i in chosen if i in set(layers)]
    if not chosen:
        return done
    for i in chosen:
        for kind, fn in (("g", plot_layer_g), ("pairs", plot_pairs)):
            fig = fn(profile, i)
            done.append(_save(fig, out / f"{kind}_layer{i}.png"))
            plt.close(fig)
    fig = plot_heatmap(profile)
    done.append(_save(fig, out / "g_heatmap.png"))
    plt.close(fig)
    return done
