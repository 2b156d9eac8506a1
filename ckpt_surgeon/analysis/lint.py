"""``lint``: is a checkpoint self-consistent?

Each check looks for one silent failure: a file that loads without error and produces garbage.
A check is a function ``(ctx) -> list[Finding]`` registered in :data:`CHECKS` with its id,
severity and a one-line description (the documented list: ``docs/lint.md``).  Checks read
headers, the config / GGUF metadata and a few small tensors (biases, norms, Q/K of layer 0);
``scan=True`` adds one streaming pass over every tensor for NaN/Inf/all-zero.

Library code: returns a :class:`LintReport`, never prints or exits.  The CLI exits 1 when a
finding has severity ``error``.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace

import numpy as np

from ..arch.resolve import ModelLayout
from ..checkpoint import Checkpoint, open_checkpoint
from ..errors import ConfigError
from .findings import Finding
from .tokenizer.checks import TOKENIZER_CHECKS

SEVERITIES = ("error", "warning", "info")

# Key-bias check: without rotary embeddings the key bias only adds q·b_k, constant over keys,
# so softmax ignores it and training never moves it (ARCHITECTURE.md "Key bias and softmax");
# trained models keep it at its init (zeros in every HF init; all-MiniLM-L6-v2 measures
# ‖b_k‖ / ‖b_q‖ = 0.002 .. 0.005 over its 6 layers).  A key bias as large as a tenth of the
# query bias is a sign that the q/k/v parts were split or named wrongly by a converter.
KEY_BIAS_MAX_RATIO = 0.1

# Q/K pair check: in trained RoPE models the norm of a Q/K row follows its rotary frequency (the
# low-frequency dimensions carry the large weights), so the row norms correlate with the
# frequency index under the layout the file really holds and much less under the other one.
# Mean rank correlation over the Q and K heads of the sampled layers; reported when the other
# layout reaches TREND_MIN and beats the expected one by TREND_RATIO.  Measured on SmolLM2-135M
# (llama-arch GGUF, interleaved): 0.56 read interleaved, 0.28 read rotate_half; with its Q/K
# put back in HF order the two swap.  Random weights: |mean| <= 0.16 on the tiny fixtures (8 RoPE
# families x 2 seeds), so no finding.
TREND_MIN = 0.3
TREND_RATIO = 1.5

# Rows read per step by the --scan pass (bounded memory on large tensors).
SCAN_CHUNK_BYTES = 16 << 20


@dataclass(frozen=True)
class LintReport:
    """``lint``'s findings (each with its check, severity, file, tensor, message and fix) and what ran."""

    source: str
    format: str
    findings: tuple
    checks: tuple            # ids of the checks that ran
    scanned: bool = False
    bytes_read: int = 0
    skipped: tuple = ()      # (check, reason): checks not run on this source (Hub: no weight reads)
    cached: tuple = ()       # (check, how): checks answered from the on-disk cache (conversion.answer_cache)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def passed(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict:
        return {"source": self.source, "format": self.format, "passed": self.passed,
                "counts": {s: sum(1 for f in self.findings if f.severity == s) for s in SEVERITIES},
                "findings": [f.to_dict() for f in self.findings], "checks": list(self.checks),
                "scanned": self.scanned, "bytes_read": self.bytes_read,
                "skipped": [{"check": c, "reason": r} for c, r in self.skipped],
                "cached": [{"check": c, "how": h} for c, h in self.cached]}

    def rows(self) -> list[dict]:
        return [f.to_dict() for f in self.findings]

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame(self.rows(), columns=["check", "severity", "file", "tensor", "message", "fix"])

    def summary_items(self) -> list[tuple[str, str]]:
        c = self.to_dict()["counts"]
        verdict = "no problems found" if not self.findings else ", ".join(f"{v} {k}(s)" for k, v in c.items() if v)
        return [("source", f"{self.source} ({self.format})"), ("result", verdict),
                ("checks run", f"{len(self.checks)}" + (" (with --scan)" if self.scanned else "")),
                ("bytes read", f"{self.bytes_read:,}")] + [(f"skipped {c}", r) for c, r in self.skipped] + \
            [(f"cached {c}", h) for c, h in self.cached]


@dataclass
class _Ctx:
    ck: Checkpoint
    layout: ModelLayout | None
    cfg: dict
    gguf: bool
    file: str | None                 # the config / metadata file findings about settings name
    progress: object = None
    skipped: list = field(default_factory=list)   # (check, reason) for checks not run on this source
    cached: list = field(default_factory=list)    # (check, how) for checks answered from a cache
    memo: dict = field(default_factory=dict)      # what several checks share (the tokenizer view)

    @property
    def remote(self) -> bool:
        return self.ck.format.startswith("hub")


# --------------------------------------------------------------------------- helpers


def _tensor_file(ctx: _Ctx, name: str | None) -> str | None:
    info = ctx.ck.tensors.get(name) if name else None
    return info.file if info is not None else ctx.file


def _finding(ctx: _Ctx, check: str, severity: str, tensor: str | None, message: str, fix: str, *,
             on_tensor: bool = True) -> Finding:
    return Finding(check, severity, _tensor_file(ctx, tensor) if on_tensor else ctx.file, tensor, message, fix)


def _special_names(ctx: _Ctx) -> dict:
    """{"embed": name, "lm_head": name} through the conversion tables (GGUF token_embd / output)."""
    from ..conversion import names as N
    if ctx.gguf:
        return {"embed": "token_embd.weight", "lm_head": "output.weight"}
    spec = N.by_model_type(ctx.cfg.get("model_type"))
    out = {}
    if spec is not None:
        table = N.hf_to_gguf_names(spec)
        for name in ctx.ck.tensors:
            hit = table.match(name)
            if hit and hit[0] == "token_embd.weight":
                out["embed"] = name
            elif hit and hit[0] == "output.weight":
                out["lm_head"] = name
        if "embed" in out:
            out.setdefault("lm_head", "lm_head.weight")
            return out
    # Architectures outside the conversion tables: the input embedding by its usual HF names; the
    # output layer only when it has the common name (GPT-NeoX calls it embed_out: unknown here).
    for name in ctx.ck.tensors:
        if re.search(r"(embed_tokens|wte|word_embeddings|embed_in)\.weight$", name):
            out["embed"] = name
            break
    if "lm_head.weight" in ctx.ck.tensors:
        out["lm_head"] = "lm_head.weight"
    return out


def _meta(ctx: _Ctx, suffix: str):
    return ctx.ck.metadata.get(f"{ctx.ck.gguf_arch}.{suffix}")


# --------------------------------------------------------------------------- checks


def check_layer_count(ctx: _Ctx) -> list[Finding]:
    """config-shapes, second half: every layer the config declares holds attention weights (the
    first half, shapes against heads x head_dim, runs in :func:`_layout`)."""
    lay = ctx.layout
    if lay is None:
        return []
    empty = [lt.layer for lt in lay.layers if not (lt.q_weight or lt.qkv_weight or lt.k_weight)]
    if empty:       # a hybrid's recurrent / MLP-only layers have none by design (analysis/kv_layers.py)
        from .kv_layers import layer_kinds
        try:
            kinds, _ = layer_kinds(dict(ctx.ck.config or {}), lay.num_layers, lay.config_source)
        except ConfigError:
            kinds = []
        empty = [i for i in empty if i >= len(kinds) or kinds[i] not in ("recurrent", "none")]
    if not empty or len(empty) == len(lay.layers):     # none at all: names the registry does not know
        return []
    return [_finding(ctx, "config-shapes", "error", None,
                     f"the config declares {lay.num_layers} layers but layer(s) {empty[:6]} hold no attention "
                     "weights", f"set the layer count to {lay.num_layers - len(empty)} or restore the layers",
                     on_tensor=False)]


def check_rope_freq_base(ctx: _Ctx) -> list[Finding]:
    if not ctx.gguf or ctx.layout is None or ctx.layout.position.type != "rope" or ctx.layout.tower_kind != "text":
        return []       # (an mmproj file's encoders: llama.cpp's clip.cpp sets their theta per projector type)
    key = f"{ctx.ck.gguf_arch}.rope.freq_base"
    if key in ctx.ck.metadata:
        return []
    return [_finding(ctx, "rope-freq-base", "warning", None,
                     f"{key} is missing: llama.cpp then uses 10000, whatever theta the model was trained with",
                     f"write {key} with the model's rope_theta (config.json rope_theta / rope_parameters)",
                     on_tensor=False)]


def check_qkv_bias(ctx: _Ctx) -> list[Finding]:
    lay = ctx.layout
    if lay is None or not lay.layers:
        return []
    out = []
    for role in ("q", "k", "v", "qkv"):
        have = [lt.layer for lt in lay.layers if getattr(lt, f"{role}_bias")]
        weights = [lt.layer for lt in lay.layers if getattr(lt, f"{role}_weight")]
        lacking = [i for i in weights if i not in have]
        if have and lacking:
            out.append(_finding(ctx, "qkv-bias", "error", None,
                                f"the {role} bias exists in layer(s) {have[:6]} but not in {lacking[:6]}: a "
                                "conversion dropped some of them", "reconvert from the original checkpoint",
                                on_tensor=False))
    from ..arch import families as F
    fam = F.by_model_type(ctx.cfg.get("model_type")) if not ctx.gguf else None
    key = fam.attention_bias_key if fam else None
    if key is not None:
        flag = ctx.cfg.get(key)
        any_bias = any(lt.q_bias or lt.k_bias or lt.v_bias or lt.qkv_bias for lt in lay.layers)
        if flag and not any_bias:
            out.append(_finding(ctx, "qkv-bias", "error", None,
                                f"config {key}=true but no q/k/v bias tensors exist: transformers initialises them "
                                "at random", f"set {key}: false, or restore the biases", on_tensor=False))
        elif any_bias and not flag:
            first = next(lt for lt in lay.layers if lt.q_bias or lt.k_bias or lt.v_bias or lt.qkv_bias)
            name = first.q_bias or first.k_bias or first.v_bias or first.qkv_bias
            out.append(_finding(ctx, "qkv-bias", "error", name,
                                f"the file holds q/k/v biases but config {key} is {flag!r}: transformers ignores "
                                "them (the converter dropped the flag)", f"set {key}: true in config.json"))
    return out


def check_unplaced_bias(ctx: _Ctx) -> list[Finding]:
    """Attention projection biases no report row holds (the layout's ``skipped``): inspect / analyze say so in a
    warning; for lint it is an error, the file holds biases this tool cannot account for (issue 27)."""
    from ..arch.model_layout import unplaced_warning, unreported
    lost = unreported(ctx.layout) if ctx.layout is not None else ()
    if not lost:
        return []
    return [_finding(ctx, "unplaced-bias", "error", lost[0], unplaced_warning(lost),
                     "report the architecture (its attention stack or tensor names are not understood); until then "
                     "treat every q/k/v statement of inspect / analyze for this file as incomplete")]


def check_tied_embeddings(ctx: _Ctx) -> list[Finding]:
    if ctx.gguf or "tie_word_embeddings" not in ctx.cfg:
        return []       # GGUF: a missing output.weight is how a tied model is stored
    names = _special_names(ctx)
    embed, head = names.get("embed"), names.get("lm_head")
    if head is None:
        return []     # the output layer's name is not known for this architecture
    tie = bool(ctx.cfg["tie_word_embeddings"])
    has_head = head in ctx.ck.tensors
    if tie and has_head and ctx.remote:
        ctx.skipped.append(("tied-embeddings", "comparing lm_head with the embedding reads both; not over HTTP"))
        return []
    if tie and has_head and embed in ctx.ck.tensors:
        from .diff import bytes_equal
        ie, ih = ctx.ck.tensors[embed], ctx.ck.tensors[head]
        same = (ie.shape, ie.dtype) == (ih.shape, ih.dtype) and bytes_equal(ctx.ck, embed, ctx.ck, head)
        if not same:
            return [_finding(ctx, "tied-embeddings", "error", head,
                             "config says tie_word_embeddings=true, but lm_head differs from the input embedding: "
                             "transformers ties them and silently discards this lm_head",
                             "set tie_word_embeddings: false in config.json")]
    if not tie and not has_head:
        return [_finding(ctx, "tied-embeddings", "error", None,
                         f"config says tie_word_embeddings=false, but there is no {head}: transformers initialises "
                         "the output layer at random", "set tie_word_embeddings: true, or add the lm_head weight",
                         on_tensor=False)]
    return []


def _embedding_rows(ctx: _Ctx) -> tuple[str | None, int | None]:
    embed = _special_names(ctx).get("embed")
    info = ctx.ck.tensors.get(embed) if embed else None
    return (embed, info.shape[0]) if info is not None and info.shape else (None, None)


def check_vocab_size(ctx: _Ctx) -> list[Finding]:
    embed, rows = _embedding_rows(ctx)
    if rows is None:
        return []
    out = []
    if ctx.gguf:
        toks = ctx.ck.metadata.get("tokenizer.ggml.tokens")
        n = len(toks) if toks is not None else None
        declared = _meta(ctx, "vocab_size")
        if n is not None and n > rows:
            out.append(_finding(ctx, "vocab-size", "error", embed,
                                f"the tokenizer has {n} tokens but the embedding has {rows} rows: ids >= {rows} "
                                "read past the table", "reconvert with the matching tokenizer"))
        elif n is not None and n < rows:
            out.append(_finding(ctx, "vocab-size", "info", embed,
                                f"the embedding has {rows} rows for {n} tokens (padding rows)", "nothing to do"))
        if declared is not None and declared != rows:
            out.append(_finding(ctx, "vocab-size", "error", embed,
                                f"{ctx.ck.gguf_arch}.vocab_size is {declared} but the embedding has {rows} rows",
                                f"set {ctx.ck.gguf_arch}.vocab_size to {rows}"))
        return out
    declared = ctx.cfg.get("vocab_size")
    if declared is not None and declared != rows:
        out.append(_finding(ctx, "vocab-size", "error", embed,
                            f"config vocab_size is {declared} but the embedding has {rows} rows",
                            f"set vocab_size: {rows} in config.json"))
    return out


_HF_SPECIAL = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "sep_token_id", "cls_token_id",
               "decoder_start_token_id")
_GGUF_SPECIAL = ("bos_token_id", "eos_token_id", "padding_token_id", "unknown_token_id", "seperator_token_id",
                 "separator_token_id", "eot_token_id", "eom_token_id", "cls_token_id", "mask_token_id")


def check_special_tokens(ctx: _Ctx) -> list[Finding]:
    embed, rows = _embedding_rows(ctx)
    if rows is None:
        return []
    if ctx.gguf:
        items = [(f"tokenizer.ggml.{k}", ctx.ck.metadata.get(f"tokenizer.ggml.{k}")) for k in _GGUF_SPECIAL]
        where = "the GGUF metadata"
    else:
        items = [(k, ctx.cfg.get(k)) for k in _HF_SPECIAL]
        where = "config.json"
    out = []
    for key, v in items:
        for tid in (v if isinstance(v, (list, tuple)) else [v]):
            if isinstance(tid, (int, np.integer)) and not isinstance(tid, bool) and not 0 <= int(tid) < rows:
                out.append(_finding(ctx, "special-tokens", "error", None,
                                    f"{key}={int(tid)} in {where} is outside the vocabulary (0..{rows - 1})",
                                    f"set {key} to the token's id in the tokenizer", on_tensor=False))
    return out


def check_dtype_mix(ctx: _Ctx) -> list[Finding]:
    from .inspect import _NON_PARAM_DTYPES    # integer buffers (position ids ...) are not weights
    kinds: dict[str, list[str]] = {}
    for name, info in ctx.ck.tensors.items():
        # a quantized checkpoint's packed weights and their scales are one scheme, not a dtype mix
        if len(info.shape) >= 2 and info.dtype not in _NON_PARAM_DTYPES and not info.quantized:
            kinds.setdefault(info.dtype, []).append(name)
    if len(kinds) <= 1:
        return []
    desc = ", ".join(f"{len(v)} {k}" for k, v in sorted(kinds.items(), key=lambda kv: -len(kv[1])))
    if ctx.gguf:   # llama.cpp mixes quantization types on purpose (Q4_K_M keeps some tensors Q6_K)
        return [_finding(ctx, "dtype-mix", "info", None, f"2-D tensors in several types: {desc}",
                         "nothing to do (mixed quantization is normal)", on_tensor=False)]
    minority = min(kinds.items(), key=lambda kv: len(kv[1]))
    return [_finding(ctx, "dtype-mix", "warning", minority[1][0],
                     f"2-D weights in several dtypes: {desc}: torch_dtype='auto' loads them all in one dtype, "
                     "and a half-converted file looks like this", "cast every weight to one dtype")]


def check_config_missing(ctx: _Ctx) -> list[Finding]:
    """An HF folder without config.json: transformers cannot load it, and what only the config says
    (heads, position encoding) is unknown, so the checks that need it are skipped, never guessed."""
    where = ctx.ck.missing_config
    if where is None:
        return []
    for check in ("key-bias-nonrotary", "qk-permutation", "loads-cleanly"):
        ctx.skipped.append((check, "config.json is missing"))
    return [Finding("config-missing", "error" if os.path.isdir(ctx.ck.source) else "warning", where, None,
                    "config.json is missing: transformers cannot load this folder, and the architecture, heads / kv "
                    "heads / head_dim and position encoding (rotary or not) cannot be known without it",
                    "add the model's config.json (from where the weights came from)")]


def check_key_bias_nonrotary(ctx: _Ctx) -> list[Finding]:
    lay = ctx.layout
    # "unknown" (no config, or an architecture nobody declared) is not "no rotary": never guessed
    if lay is None or lay.position.type in ("rope", "unknown") or ctx.ck.missing_config:
        return []
    from .inspect import _split_fused_bias
    out = []
    for lt in lay.layers:
        if lt.k_bias and lt.q_bias:
            bq, bk, name = ctx.ck.read(lt.q_bias), ctx.ck.read(lt.k_bias), lt.k_bias
        elif lt.qkv_bias and lay.num_heads and lay.num_kv_heads and lay.head_dim:
            bq, bk, _ = _split_fused_bias(ctx.ck.read(lt.qkv_bias), lay)
            name = lt.qkv_bias
        else:
            continue
        nq = float(np.linalg.norm(np.asarray(bq, np.float64)))
        nk = float(np.linalg.norm(np.asarray(bk, np.float64)))
        if nk > KEY_BIAS_MAX_RATIO * nq and nk > 0:
            out.append(_finding(ctx, "key-bias-nonrotary", "warning", name,
                                f"layer {lt.layer}: key bias ‖b_k‖={nk:.4g} is {nk / max(nq, 1e-30):.2f} x the "
                                "query "
                                f"bias; without RoPE ({lay.position.type} positions) training leaves b_k at its init, "
                                "so q/k parts were probably split or named wrongly",
                                "reconvert; check the fused qkv layout and the q/k/v tensor names"))
    return out


# KV-cache check: the cache types llama.cpp users pick first; a layer at risk under either (analysis/kv_cache.py:
# predicted error > 4 x the model's median layer, or >= 0.5 logit) is named with its key bias.
KV_LINT_TYPES = ("q8_0", "q4_0")


def check_kv_cache_risk(ctx: _Ctx) -> list[Finding]:
    lay = ctx.layout
    if lay is None or ctx.ck.missing_config or not any(lt.k_bias or lt.qkv_bias for lt in lay.layers):
        return []
    if ctx.remote:
        ctx.skipped.append(("kv-cache-risk", "reads q/k/v/o weights of every layer; not over HTTP (lint a local copy)"))
        return []
    from ..errors import CkptError
    from .kv_cache import kv_cache_report
    try:
        rep = kv_cache_report(ctx.ck, KV_LINT_TYPES, values=False)
    except CkptError:
        return []       # MLA, unpaired heads, rows that hold no block: the cache model does not apply
    out = []
    by_layer = {lt.layer: lt for lt in lay.layers}
    for r in rep.layers:
        lt = by_layer.get(r.layer)
        if not r.k_at_risk or lt is None or not (lt.k_bias or lt.qkv_bias):
            continue
        out.append(_finding(ctx, "kv-cache-risk", "warning", lt.k_bias or lt.qkv_bias,
                            f"layer {r.layer}: a {r.cache_type} K cache is predicted to move attention logits by "
                            f"{r.k_error:.3g} RMS (the key bias sets {r.k_share:.0%} of its block steps)",
                            "keep this layer's K cache in f16, or run `ckpt-surgeon kv-equalize SRC -o OUT "
                            f"--cache-type-k {r.cache_type}` (exact); `analyze --kv-cache` has the table"))
    return out


def _frequency_trend(w: np.ndarray, n_head: int) -> tuple[float, float] | None:
    """Mean over heads of the rank correlation between a row's norm and its rotary frequency
    index, if the rows are (rotate_half, interleaved) pairs.  Row i has frequency index
    ``i mod d/2`` under rotate_half and ``i // 2`` interleaved; each index occurs twice, so the
    Pearson correlation with the index itself equals the tie-averaged Spearman correlation."""
    rows = w.shape[0]
    if n_head <= 0 or rows % n_head or (rows // n_head) % 2:
        return None
    d = rows // n_head
    norms = np.linalg.norm(np.asarray(w, np.float64).reshape(n_head, d, -1), axis=2)
    ranks = np.argsort(np.argsort(norms, axis=1), axis=1).astype(np.float64)
    i = np.arange(d)
    out = []
    for freq in (i % (d // 2), i // 2):
        f = (freq - freq.mean()) / freq.std()
        r = (ranks - ranks.mean(axis=1, keepdims=True)) / ranks.std(axis=1, keepdims=True)
        out.append(float((r * f).mean(axis=1).mean()))
    return out[0], out[1]


def _sample_layers(n: int) -> list[int]:
    """Up to four layers spread over the depth (the first layers of trained models show the
    weakest structure)."""
    return sorted({n // 4, n // 2, (3 * n) // 4, n - 1}) if n else []


def check_qk_permutation(ctx: _Ctx) -> list[Finding]:
    lay = ctx.layout
    if ctx.ck.missing_config:
        return []
    if ctx.remote:
        ctx.skipped.append(("qk-permutation", "reads Q/K weights of four layers; not over HTTP (lint a local copy)"))
        return []
    if lay is None or lay.position.type != "rope" or not lay.layers or lay.position.rotary_dim != lay.head_dim:
        return []
    trends = []
    first = None
    for i in _sample_layers(len(lay.layers)):
        lt = lay.layers[i]
        for name, heads in ((lt.q_weight, lay.num_heads), (lt.k_weight, lay.num_kv_heads)):
            got = _frequency_trend(ctx.ck.read(name), heads) if name and heads else None
            if got is not None:
                trends.append(got)
                first = first or name
    if first is None:
        return []
    rh, il = (abs(float(np.mean([t[k] for t in trends]))) for k in (0, 1))
    expected = lay.position.pair_layout    # interleaved: llama.cpp-permuted GGUF; rotate_half: HF and the rest
    other, seen = (il, "interleaved") if expected == "rotate_half" else (rh, "rotate_half")
    mine = rh if expected == "rotate_half" else il
    if not (other >= TREND_MIN and other >= TREND_RATIO * mine):
        return []
    fix = ("reconvert: llama.cpp's converter permutes Q/K of llama-arch models (LlamaModel.permute)"
           if ctx.gguf else "un-permute the Q/K rows (reshape(n_head, hd/2, 2, ...).swapaxes(1, 2)) or reconvert")
    return [_finding(ctx, "qk-permutation", "error", first,
                     f"Q/K rows pair up as {seen} rotary pairs (row norms follow the rotary frequency with "
                     f"rank correlation {other:.2f} read as {seen}, {mine:.2f} read as {expected}), but this "
                     f"{'GGUF architecture' if ctx.gguf else 'format'} expects {expected}", fix)]


def _listed(names, n: int = 4) -> str:
    names = list(names)
    return ", ".join(names[:n]) + (f" ... ({len(names)} in all)" if len(names) > n else "")


def check_loads_cleanly(ctx: _Ctx) -> list[Finding]:
    """Every tensor loads into the class config.json names, and every weight of that class comes
    from the file.  transformers' from_pretrained only warns about missing keys (initialised at
    random) and unexpected ones (dropped): the most common silent failure.  The key sets and the
    rules for what may be missing or extra are transformers' own
    (:func:`ckpt_surgeon.conversion.model_check.load_keys_report`, on the meta device; the only
    check that imports transformers, seconds once per process)."""
    if ctx.gguf or ctx.ck.missing_config:
        return []
    if ctx.cfg.get("quantization_config"):
        ctx.skipped.append(("loads-cleanly", "a quantized checkpoint loads through its quantizer, whose key rules "
                                             "this check does not apply"))
        return []
    if not ctx.cfg.get("model_type"):
        ctx.skipped.append(("loads-cleanly", "config.json has no model_type"))
        return []
    try:
        from ..conversion.model_check import load_keys_report_cached
        got = load_keys_report_cached(ctx.cfg, {n: i.shape for n, i in ctx.ck.tensors.items()})
    except ImportError as e:
        ctx.skipped.append(("loads-cleanly", f"transformers is not available ({e})"))
        return []
    except (ValueError, KeyError, TypeError, RuntimeError, AttributeError) as e:
        # a config transformers cannot build from: its own error, named (config-shapes and the
        # other checks say what is wrong with the values)
        ctx.skipped.append(("loads-cleanly", f"transformers cannot build the model from config.json "
                                             f"({type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]})"))
        return []
    if got.get("cached"):
        ctx.cached.append(("loads-cleanly", "from the cache: an earlier run asked transformers about this config "
                                            "and tensor set (same release); not imported this time"))
    if "skipped" in got:
        ctx.skipped.append(("loads-cleanly", got["skipped"]))
        return []
    cls, out = got["class"], []
    if got["missing"]:
        out.append(_finding(ctx, "loads-cleanly", "error", got["missing"][0],
                            f"{cls} (config.json architectures) has {len(got['missing'])} weight(s) this checkpoint "
                            f"does not hold ({_listed(got['missing'])}): transformers initialises them at random when "
                            "it loads it, with only a warning",
                            "restore those tensors (reconvert from the original; `qkv split` after `qkv fuse`), or "
                            "name the class that holds these tensors in config.json", on_tensor=False))
    if got["unexpected"]:
        first = got["unexpected"][0]
        out.append(_finding(ctx, "loads-cleanly", "error", first,
                            f"{len(got['unexpected'])} tensor(s) have no place in {cls} "
                            f"({_listed(got['unexpected'])}): transformers drops them when it loads this checkpoint",
                            "rename them to the model's keys (`qkv split` a `qkv fuse` output) or remove them"))
    # (a shape mismatch is not silent, from_pretrained refuses it; config-shapes / vocab-size name it)
    return out


def check_ggml_layout(ctx: _Ctx) -> list[Finding]:
    """A GGUF whose tensor data does not follow ggml's layout rule (formats.gguf.ggml_layout_problem):
    every other reader opens it, llama.cpp refuses it."""
    if not ctx.gguf:
        return []
    from ..formats.gguf import ggml_layout_message
    headers = getattr(ctx.ck.reader, "headers", None) or ([ctx.ck.reader.header] if hasattr(ctx.ck.reader, "header")
                                                         else [])
    out = []
    for h in headers:
        problem = getattr(h, "ggml_layout", None)
        if problem is not None:
            out.append(Finding("ggml-layout", "error", h.path, problem[0], ggml_layout_message(problem, h.alignment),
                               "rewrite the file with a GGUF writer (e.g. `ckpt-surgeon convert` to HF and back, or "
                               "gguf-py), which lays the data out in tensor-info order"))
    return out


def check_nonfinite_zero(ctx: _Ctx) -> list[Finding]:
    """--scan: every tensor streamed once in row chunks."""
    out = []
    offset = ctx.layout.norm_weight_offset if ctx.layout is not None else 0.0
    for name, info in ctx.ck.tensors.items():
        if info.missing:
            continue
        rows = info.shape[0] if info.shape else 1
        per_row = max(1, info.nbytes // max(rows, 1))
        step = max(1, SCAN_CHUNK_BYTES // per_row)
        bad, nonzero = 0, False
        for r0 in range(0, rows, step):
            part = ctx.ck.read_rows(name, r0, min(rows, r0 + step)) if info.shape else ctx.ck.read(name)
            if ctx.progress:
                ctx.progress(info.nbytes * (min(rows, r0 + step) - r0) // max(rows, 1))
            if np.issubdtype(part.dtype, np.floating):
                bad += int(np.count_nonzero(~np.isfinite(part)))
            nonzero = nonzero or bool(np.any(part))
        if bad:
            out.append(_finding(ctx, "nonfinite", "error", name, f"{bad} NaN/Inf value(s)",
                                "redo the merge / conversion that produced this tensor"))
        elif not nonzero and info.numel and not (offset and len(info.shape) == 1 and "norm" in name):
            # (a zero norm weight is gamma = 1 where the family stores gamma - 1: Gemma HF files)
            bias = name.endswith(".bias")
            out.append(_finding(ctx, "all-zero", "info" if bias else "warning", name,
                                "every value is zero" + (" (a zeroed bias can be intended, e.g. after fold-bias)"
                                                         if bias else ""),
                                "nothing to do if intended" if bias else
                                "redo the merge / conversion that produced this tensor"))
    return out


def check_quantization(ctx: _Ctx) -> list[Finding]:
    """A quantized checkpoint's scales are finite and non-zero, its g_idx name existing groups, its
    zero points agree with a symmetric config, and its ignore list names no quantized module (what
    contradicts the packed shapes was refused when it was opened, naming the tensor)."""
    q = ctx.ck.quantization
    if q is None:
        return []
    from ..formats.quant.kernels import unpack_last
    from .quant import ignored_but_quantized
    out = []
    for pat, name in ignored_but_quantized(ctx.ck):
        out.append(_finding(ctx, "quantization", "error", name,
                            f"{q.config_key} lists {pat!r} among the modules left unquantized, but {name} is stored "
                            f"quantized ({q.method})", f"remove {pat!r} from the ignore list, or store the module dense"))
    if ctx.remote:
        # scales are ~1-3% of a 4-bit model's bytes: not fetched from the Hub for a lint
        ctx.skipped.append(("quantization", "scales, g_idx and zero points are not read from the Hub (run lint on a "
                                            "downloaded copy); the ignore list was checked"))
        return out
    # (MX E8M0 exponents are uint8, a power of two each, never zero: not read here)
    scale_roles = ("scales", "weight_scale", "weight_scale_inv", "SCB", "weight.absmax", "weight.nested_absmax",
                   "weight_global_scale", "weight_scale_2", "input_global_scale", "input_scale")
    for t in q.tensors.values():
        for role, name in t.members:
            info = ctx.ck.stored_tensors[name]
            if info.missing:
                continue
            if role in scale_roles and info.dtype not in ("U8",):
                v = np.asarray(ctx.ck.read_stored(name), dtype=np.float64)
                bad, zero = int(np.count_nonzero(~np.isfinite(v))), int(np.count_nonzero(v == 0))
                if bad or zero:
                    what = " and ".join(x for x in (f"{bad} NaN/Inf" if bad else "", f"{zero} zero" if zero else "") if x)
                    out.append(_finding(ctx, "quantization", "error", name,
                                        f"{what} scale(s) of {t.logical} ({t.scheme}): the weights they scale dequantize "
                                        "to NaN/Inf or to zero", "requantize this module"))
            elif role in ("g_idx", "weight_g_idx"):
                g = np.asarray(ctx.ck.read_stored(name))
                groups = ctx.ck.stored_tensors[t.member("scales") or t.member("weight_scale")].shape
                n = groups[0] if t.scheme == "gptq" else groups[-1]
                if g.size and (g.min() < 0 or g.max() >= n):
                    out.append(_finding(ctx, "quantization", "error", name,
                                        f"g_idx holds groups {int(g.min())}..{int(g.max())}, the scales have {n} "
                                        f"({t.scheme})", "requantize this module"))
        if q.symmetric and t.scheme in ("gptq", "awq") and t.member("qzeros"):
            z = unpack_last(ctx.ck.read_stored(t.member("qzeros")), t.bits).astype(np.int64) + t.param("zero_offset", 0)
            mid = 1 << (t.bits - 1)
            if z.size and np.any(z != mid):
                out.append(_finding(ctx, "quantization", "error", t.member("qzeros"),
                                    f"{q.config_key} says sym = true but zero points range over {int(z.min())}..{int(z.max())} "
                                    f"(symmetric {t.bits}-bit would be {mid}) ({t.scheme})",
                                    "fix sym in config.json to match how the weights were quantized"))
    return out


@dataclass(frozen=True)
class Check:
    id: str
    severity: str
    fn: object               # None: found while building the layout (see _layout)
    description: str
    scan_only: bool = False


CHECKS: tuple[Check, ...] = (
    Check("ggml-layout", "error", check_ggml_layout,
          "GGUF: tensor data contiguous in tensor-info order, each padded to the alignment (ggml's loader "
          "refuses any other layout)"),
    Check("config-missing", "error", check_config_missing,
          "an HF folder has its config.json (a lone .safetensors file without one: warning)"),
    Check("loads-cleanly", "error", check_loads_cleanly,
          "every tensor loads into the class config.json names and every weight of that class is in the file "
          "(transformers' own key sets and rules: missing weights are initialised at random, extra tensors dropped)"),
    Check("config-shapes", "error", check_layer_count,
          "config / GGUF metadata agree with the tensor shapes (q/k/v rows = heads x head_dim, layer count)"),
    Check("head-dim", "error", None,
          "head_dim (config head_dim, GGUF attention.key_length) matches the q/k rows (Gemma 2/3, Qwen3 set it "
          "explicitly)"),
    Check("qkv-bias", "error", check_qkv_bias,
          "q/k/v biases present in every layer or in none; the config's attention-bias switch matches the file"),
    Check("unplaced-bias", "error", check_unplaced_bias,
          "every attention projection bias of the file (by name, incl. in_proj_bias) is placed in a layer row"),
    Check("rope-freq-base", "warning", check_rope_freq_base, "a RoPE GGUF declares {arch}.rope.freq_base"),
    Check("qk-permutation", "error", check_qk_permutation,
          "Q rows pair up as the format expects (interleaved in llama-arch GGUF, rotate_half elsewhere)"),
    Check("tied-embeddings", "error", check_tied_embeddings,
          "tie_word_embeddings agrees with the presence (and bytes) of lm_head"),
    Check("vocab-size", "error", check_vocab_size,
          "config vocab_size / GGUF token list agree with the embedding rows"),
    Check("special-tokens", "error", check_special_tokens, "special-token ids lie inside the vocabulary"),
    Check("dtype-mix", "warning", check_dtype_mix, "2-D weights share one dtype (GGUF: info only)"),
    Check("quantization", "error", check_quantization,
          "quantized weights: scales (FP4 global / second-level scales included) finite and non-zero, g_idx within "
          "the groups, zero points as the config says, "
          "no quantized module in the ignore list"),
    Check("key-bias-nonrotary", "warning", check_key_bias_nonrotary,
          "without RoPE, the key bias is near zero relative to the query bias"),
    Check("kv-cache-risk", "warning", check_kv_cache_risk,
          "no layer whose key bias makes a q8_0 / q4_0 K cache much worse than the model's median layer"),
    *(Check(cid, sev, fn, text) for cid, sev, fn, text in TOKENIZER_CHECKS),
    Check("nonfinite", "error", check_nonfinite_zero, "--scan: no NaN/Inf values", scan_only=True),
    Check("all-zero", "warning", check_nonfinite_zero, "--scan: no all-zero tensor", scan_only=True),
)


# --------------------------------------------------------------------------- driver


def _layout(ck: Checkpoint, cfg: dict, findings: list, file: str | None) -> ModelLayout | None:
    """The model layout; a config that contradicts the tensors becomes a finding (head-dim when
    another head_dim makes every shape agree), and the layout is rebuilt with the tensors' value."""
    from ..arch.resolve import resolve
    try:
        return ck.layout(all_layers=False)      # layers without tensors: the layer-count check's finding
    except ConfigError as e:
        base = Finding("config-shapes", "error", e.path or file, e.tensor, e.detail,
                       "fix config.json / the GGUF metadata to match the tensors")
        layout = None
        heads = [cfg.get(k) for k in ("num_attention_heads", "num_key_value_heads", "n_head", "num_heads")]
        for h in heads:
            if isinstance(e.got, int) and isinstance(h, int) and h and e.got % h == 0:
                fixed = dict(cfg, head_dim=e.got // h)
                try:
                    layout = resolve(fixed, ck.tensors, naming=ck.naming, config_source=ck.config_path,
                                     gguf_arch=ck.gguf_arch)
                except ConfigError:
                    continue
                key = f"{ck.gguf_arch}.attention.key_length" if ck.naming == "gguf" else "head_dim"
                findings.append(replace(base, check="head-dim",
                                        message=f"head_dim is {cfg.get('head_dim')} but the q/k/v rows say "
                                                f"{e.got // h} ({e.detail})",
                                        fix=f"set {key} = {e.got // h}"))
                return layout
        findings.append(base)
        return None


def lint_checkpoint(ck: Checkpoint, *, scan: bool = False, progress=None) -> LintReport:
    ck.refuse_truncated()       # the source cannot be read: exit 2, as every command but inspect
    cfg = dict(ck.config or {})
    gguf = ck.naming == "gguf"
    file = ck.config_path if not gguf else (ck.files[0] if ck.files else ck.source)
    findings: list[Finding] = []
    layout = _layout(ck, cfg, findings, file)
    ctx = _Ctx(ck, layout, cfg, gguf, file, progress)
    ran, done = [], set()
    for check in CHECKS:
        if check.scan_only and not scan:
            continue
        ran.append(check.id)
        if check.fn is None or check.fn in done:
            continue
        done.add(check.fn)
        findings.extend(check.fn(ctx))
    order = {s: i for i, s in enumerate(SEVERITIES)}
    findings.sort(key=lambda f: order[f.severity])
    ran = [c for c in ran if c not in {s for s, _ in ctx.skipped}]
    return LintReport(ck.source, ck.format, tuple(findings), tuple(ran), scanned=scan, bytes_read=ck.bytes_read,
                      skipped=tuple(ctx.skipped), cached=tuple(ctx.cached))


def lint(source, *, scan: bool = False, progress=None, **open_kwargs) -> LintReport:
    """The silent failures of one checkpoint: the twin of ``ckpt-surgeon lint SOURCE`` (docs/lint.md).

    ``source``: any source :func:`open_checkpoint` takes, or an open Checkpoint.  ``scan``: also stream every
    tensor once (NaN/Inf, all-zero tensors); ``progress``: called with the bytes read.

    Returns:
        :class:`~ckpt_surgeon.analysis.lint.LintReport`

    Example::

        import ckpt_surgeon
        r = ckpt_surgeon.lint("model.Q4_K_M.gguf", scan=True)
        r.passed, [(f.check, f.severity, f.fix) for f in r.findings]
    """
    if isinstance(source, Checkpoint):
        return lint_checkpoint(source, scan=scan, progress=progress)
    with open_checkpoint(source, **open_kwargs) as ck:
        return lint_checkpoint(ck, scan=scan, progress=progress)
