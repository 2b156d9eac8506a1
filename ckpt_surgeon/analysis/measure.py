"""Measured mode of ``analyze``: run the model (transformers, eager attention) and measure what
removing parts of the key bias actually does, next to the static bound.

What is measured, per layer ``l`` and removal variant (``all`` = the whole key bias, ``exact`` =
its exactly-removable part, ``near`` = its near-redundant pairs; the sets come from the static
analysis of the *loaded* weights, so they are in the model's own row order):

* ``logit``: ``max |D_mn - mean_n D_mn|`` over heads, query rows ``m`` and the keys ``n`` the row
  may attend to, where ``D = l' - l`` are the attention logits *as they enter softmax* with the
  variant applied to layer ``l`` only (so layer ``l`` sees identical inputs) minus the reference.
  The mean over the row's keys is the per-row shift softmax ignores; the static bound ``E``
  bounds the row's spread, hence this quantity (see :mod:`.bounds`).
* ``tv``: max over rows of the total variation between the two softmax rows (float64).
* ``bound_observed``: the static formula evaluated with the observed ``|q~_j|`` and each row's
  actual key span instead of the weight bound and ``L``: ``logit <= bound_observed <= bound``.
* per layer, the observed ``max |q~_j|`` and its ratio to the static weight bound (``<= 1``).
* at the output, with the variant applied to every layer at once: ``KL(ref || cand)`` of the
  next-token distributions (max and mean over positions), top-1 agreement and the max logit
  difference; encoders without an LM head report the max last-hidden-state difference.

How logits are captured: eager attention computes ``softmax(logits + mask)`` with
``torch.nn.functional.softmax`` in every registry family (modeling_qwen2 / llama / gpt2 / bert /
bloom / falcon / gpt_neox / phi ...).  While measuring, that function is wrapped so the first
argument of the ``l``-th call (layer ``l``) is recorded in the model's dtype; a forward pass that
only needs layer ``l`` stops right after it.  The number of calls per forward is checked against
the layer count, so an architecture that computes attention differently is refused, not misread.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..arch.layouts import qkv_row_index
from ..arch.rope import rope_geometry
from ..errors import CkptError, UnsupportedError
from ..records import finite_or_none as _f
from ..runtime import quiet_transformers, resolve_device
from .layer_redundancy import DEFAULT_EPSILON
from .redundancy import analyze_checkpoint

VARIANTS = ("all", "exact", "near")
DEFAULT_MAX_TOKENS = 1024


@dataclass(frozen=True)
class VariantMeasure:
    variant: str
    dims: int                      # key-bias entries zeroed in this layer
    logit: float                   # measured max |D - row mean| (logit units)
    tv: float                      # measured max total variation of an attention row
    bound: float | None            # static bound (weights, context L)
    bound_observed: float | None   # same formula with observed |q~| and key spans
    noise: float                   # float rounding budget of the logits (see _noise)
    within_bound: bool | None      # logit <= bound + noise

    def to_dict(self) -> dict:
        return {"variant": self.variant, "dims": self.dims, "logit": _f(self.logit), "tv": _f(self.tv),
                "bound": _f(self.bound), "bound_observed": _f(self.bound_observed), "noise": _f(self.noise),
                "within_bound": self.within_bound}


@dataclass(frozen=True)
class LayerMeasure:
    layer: int
    k_class: str
    q_abs_max: float | None        # observed max |q~_j| over tokens, heads, pairs (rotary models)
    q_bound_ratio: float | None    # max over (h, j) of observed / static bound (<= 1)
    variants: tuple = ()

    def variant(self, name: str) -> VariantMeasure | None:
        return next((v for v in self.variants if v.variant == name), None)

    def to_dict(self) -> dict:
        return {"layer": self.layer, "class": self.k_class, "q_abs_max": _f(self.q_abs_max),
                "q_bound_ratio": _f(self.q_bound_ratio), "variants": [v.to_dict() for v in self.variants]}


@dataclass(frozen=True)
class OutputMeasure:
    variant: str
    positions: int
    kl_max: float | None
    kl_mean: float | None
    top1_agreement: float | None
    max_abs_logit_diff: float | None
    hidden_max_abs_diff: float | None = None   # encoders without an LM head
    hidden_scale: float | None = None          # max |reference hidden| (for a relative reading)

    def to_dict(self) -> dict:
        return {k: (_f(v) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


@dataclass(frozen=True, eq=False)
class MeasuredReport:
    model: str
    device: str
    dtype: str
    prompts: int
    tokens: tuple                  # tokens per prompt
    layers: tuple
    outputs: tuple
    notes: tuple = ()
    static: object | None = field(default=None, repr=False)   # AnalysisReport of the loaded weights
    dequantized: object | None = None   # conversion.dense.DequantizedRun: a quantized source, run dequantized

    @property
    def all_within_bound(self) -> bool:
        return all(v.within_bound is not False for lm in self.layers for v in lm.variants)

    def output(self, variant: str) -> OutputMeasure | None:
        return next((o for o in self.outputs if o.variant == variant), None)

    def to_dict(self) -> dict:
        return {"model": self.model, "device": self.device, "dtype": self.dtype, "prompts": self.prompts,
                "tokens": list(self.tokens), "all_within_bound": self.all_within_bound,
                "layers": [lm.to_dict() for lm in self.layers], "outputs": [o.to_dict() for o in self.outputs],
                "quantization": self.dequantized.to_dict() if self.dequantized is not None else None,
                "notes": list(self.notes)}

    def rows(self) -> list[dict]:
        rows = []
        for lm in self.layers:
            row = {"layer": lm.layer}
            for v in lm.variants:
                row[f"meas_{v.variant}"] = v.logit
            # the float rounding budget "ok" allows beyond the bound: a measured change above a bound
            # of 0 is explained by it, and the table must say so, not only the JSON (issue 24)
            noise = [v.noise for v in lm.variants if v.noise is not None]
            row["noise"] = max(noise) if noise else None
            checks = [v.within_bound for v in lm.variants if v.within_bound is not None]
            row["ok"] = all(checks) if checks else None
            rows.append(row)
        return rows

    def summary_items(self) -> list[tuple[str, str]]:
        items = [("measured on", f"{self.prompts} prompt(s), {sum(self.tokens)} tokens (max {max(self.tokens, default=0)}), "
                                 f"{self.device} {self.dtype}"),
                 *([("quantized model", self.dequantized.note())] if self.dequantized is not None else []),
                 ("measured <= bound + noise", "yes, every layer and variant" if self.all_within_bound else "NO (see rows)"),
                 ("noise", "the float rounding budget of the measured logits (column noise), allowed beyond the "
                           "static bound: a measured change under it is rounding, not a removed bias")]
        for o in self.outputs:
            if o.kl_max is not None:
                items.append((f"output, remove {o.variant}", f"KL max {o.kl_max:.3g} mean {o.kl_mean:.3g}, top-1 agreement "
                                                             f"{o.top1_agreement:.2%}, max |dlogit| {o.max_abs_logit_diff:.3g}"))
            elif o.hidden_max_abs_diff is not None:
                items.append((f"output, remove {o.variant}", f"max |dhidden| {o.hidden_max_abs_diff:.3g} "
                                                             f"(reference max {o.hidden_scale:.3g})"))
        return items


# ----------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------

def model_checkpoint(model, source: str):
    """A :class:`~ckpt_surgeon.checkpoint.Checkpoint` view of a loaded transformers model (so the
    static analysis sees the exact weights run, read in float64)."""
    from ..checkpoint import Checkpoint
    from ..formats.pickle import TorchTensors

    reader = TorchTensors(dict(model.named_parameters()), "<model>", float64=True)
    return Checkpoint(source, "transformers", model.config.to_dict(), None, reader)


def check_local(source) -> None:
    """Measured mode runs local files only (raise before any other work is done)."""
    if not Path(os.fspath(source)).exists():
        raise UnsupportedError("measured mode needs a local folder, .safetensors or .gguf that transformers can load "
                               "(Hub repos: download first, e.g. `hf download REPO --local-dir DIR`)", path=str(source))


def load_model(source: str, *, device: str = "cpu", dtype: str = "float32"):
    """(model, tokenizer, is_lm) for a source transformers can load.

    HF folders (or a .safetensors beside its config.json) load with ``from_pretrained``;
    GGUF files are converted to a temporary HF folder (:func:`ckpt_surgeon.runtime.gguf_as_folder`:
    dequantized, llama Q/K rows un-permuted, attention biases kept) and loaded from there; so are
    quantized HF checkpoints (:func:`ckpt_surgeon.runtime.quantized_as_folder`: each quantized
    weight as our reader dequantizes it, element-exact against its producer; the model built as the
    unquantized architecture, activations not quantized: :func:`quantized_run` says so).
    """
    import transformers

    from .. import runtime
    from ..conversion import is_gguf

    runtime.torch_dtype(dtype)      # an unknown dtype fails before any conversion
    p = Path(os.fspath(source))
    if is_gguf(p):
        # The HF copy lives in a temp dir only while the model loads.
        with runtime.gguf_as_folder(p, dtype="float32" if dtype == "float64" else dtype,
                                    prefix="ckpt-surgeon-measure-") as folder:
            return load_model(folder, device=device, dtype=dtype)
    if p.is_file():
        folder = p.parent
    elif p.is_dir():
        folder = p
    else:
        raise UnsupportedError("measured mode needs a local folder, .safetensors or .gguf that transformers can load "
                               "(Hub repos: download first, e.g. `hf download REPO --local-dir DIR`)", path=str(source))
    if not (folder / "config.json").is_file():
        raise UnsupportedError("measured mode needs config.json beside the weights", path=str(folder))
    if not runtime.has_tokenizer(folder):
        raise UnsupportedError("measured mode needs a tokenizer beside the model "
                               f"(none of {', '.join(runtime.TOKENIZER_FILES)})", path=str(folder))
    if runtime.is_quantized_folder(folder):
        # transformers runs a quantized checkpoint only through its method's package (and FP8 not
        # on a CPU, MLX not at all): run the same model from its dequantized weights instead
        with runtime.quantized_as_folder(p, prefix="ckpt-surgeon-measure-") as dense:
            return load_model(dense, device=device, dtype=dtype)
    try:
        with quiet_transformers():
            cfg = transformers.AutoConfig.from_pretrained(folder)
    except (OSError, ValueError, KeyError) as e:
        raise UnsupportedError(f"transformers could not load it for measurement ({str(e).splitlines()[0]})",
                               path=str(source)) from None
    archs = [a for a in (getattr(cfg, "architectures", None) or [])]
    is_lm = any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs)
    cls = transformers.AutoModelForCausalLM if is_lm else transformers.AutoModel
    model = runtime.load_pretrained(cls, folder, dtype=dtype, path=str(source))
    tok = runtime.load_tokenizer(folder, path=str(folder), error=UnsupportedError,
                                 why="measured mode needs a tokenizer beside the model")
    model.eval()
    model.to(device)
    return model, tok, is_lm


# ----------------------------------------------------------------------------------------------
# Logit capture
# ----------------------------------------------------------------------------------------------

class _Stop(Exception):
    """Raised inside the forward pass once the wanted layer's logits are captured."""


@contextlib.contextmanager
def _capture_softmax(record: dict, *, want: int | None = None, stop: bool = False):
    """Wrap ``torch.nn.functional.softmax``: call ``i`` records its input as ``record[i]``
    (only ``i == want`` when given); with ``stop`` the forward pass ends after call ``want``."""
    import torch.nn.functional as F
    orig = F.softmax
    state = {"i": 0}

    def wrapped(x, *args, **kwargs):
        i = state["i"]
        state["i"] += 1
        if want is None or i == want:
            record[i] = x.detach()
        out = orig(x, *args, **kwargs)
        if stop and want is not None and i == want:
            raise _Stop
        return out

    F.softmax = wrapped
    try:
        yield state
    finally:
        F.softmax = orig


def _forward(model, ids, **kw):
    import torch
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False, **kw)


def _layer_logits(model, ids, layer: int) -> np.ndarray:
    """Layer ``layer``'s attention logits (+ mask) as they enter softmax -> float64 ``[heads, T, T]``."""
    import torch
    rec: dict = {}
    with _capture_softmax(rec, want=layer, stop=True):
        try:
            _forward(model, ids)
        except _Stop:
            pass
    if layer not in rec:
        raise UnsupportedError(f"measured mode: could not capture layer {layer}'s attention logits "
                               "(the model does not compute attention with torch.nn.functional.softmax)")
    x = rec[layer].to("cpu", torch.float64).numpy()
    t = ids.shape[1]
    return x.reshape(-1, t, x.shape[-1])


def _noise(logits_abs_max: float, dtype: str) -> float:
    """Rounding budget for a logit difference: logits of size ``|l|`` computed in ``dtype`` carry
    an error of a few ulps of ``|l|`` each (dot product accumulation, the mask add); 64 ulps
    covers a head_dim-long accumulation with room to spare."""
    eps = {"float64": 2.2e-16, "float32": 1.2e-7, "bfloat16": 7.8e-3, "float16": 9.8e-4}[dtype]
    return 64 * eps * (1.0 + logits_abs_max)


def _row_metrics(l_ref: np.ndarray, l_cand: np.ndarray, allowed: np.ndarray) -> tuple[float, float]:
    """(max |D - row mean over allowed keys|, max total variation) over heads and rows."""
    d = np.where(allowed, l_cand - l_ref, 0.0)
    cnt = allowed.sum(-1, keepdims=True)
    mean = d.sum(-1, keepdims=True) / np.maximum(cnt, 1)
    dev = np.where(allowed, np.abs(d - mean), 0.0).max()

    def sm(l):
        z = np.where(allowed, l, -np.inf)
        z = z - z.max(-1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(-1, keepdims=True)
    tv = 0.5 * np.abs(sm(l_cand) - sm(l_ref)).sum(-1).max()
    return float(dev), float(tv)


# ----------------------------------------------------------------------------------------------
# The measurement
# ----------------------------------------------------------------------------------------------

def _module(model, tensor_name: str):
    return model.get_submodule(tensor_name.rsplit(".", 1)[0])


def _variant_dims(lr, variant: str, hd: int) -> list[int]:
    if not lr.has_k_bias:
        return []
    if variant == "all":
        n = (lr.heads and len(lr.heads) * hd) or 0
        return list(range(n))
    if variant == "exact":
        return list(lr.exact_dims)
    if lr.pairs is None:
        return []
    g = len(lr.heads)
    return sorted(int(k * hd + d) for k in range(g) for j in lr.near_pairs for d in lr.pairs[j])


def _variant_bound(lr, variant: str):
    if variant == "all":
        return lr.bound_all
    if variant == "exact":
        return 0.0 if lr.k_class in ("exact", "partial") else None
    return lr.bound            # the exact part adds 0, so exact + near == near


def quantized_run(source):
    """How measured mode runs ``source`` when it is a quantized HF checkpoint (a
    :class:`~ckpt_surgeon.conversion.dense.DequantizedRun`: weights dequantized by ckpt-surgeon,
    activations not quantized), else None."""
    from ..checkpoint import open_checkpoint
    from ..conversion import is_gguf
    from ..conversion.dense import dequantized_run
    if is_gguf(source):
        return None
    with open_checkpoint(source) as ck:
        return dequantized_run(ck)


def _check_key_biases_loaded(source, layout) -> None:
    """The loaded model must carry every key bias the checkpoint has (a loader that drops them
    would make every measurement describe a different model)."""
    from ..checkpoint import open_checkpoint
    with open_checkpoint(source) as src_ck:
        src_k = {lt.layer for lt in src_ck.layout().layers if lt.k_bias or lt.qkv_bias}
    got_k = {lt.layer for lt in layout.layers if lt.k_bias or lt.qkv_bias}
    if src_k - got_k:
        raise UnsupportedError(f"the model transformers loaded has no key bias in layer(s) {sorted(src_k - got_k)[:5]} "
                               "although the checkpoint has one; measuring it would describe a different model",
                               path=str(source))


def _encode_prompts(tok, prompts, limit: int, dev) -> list:
    """Token ids per prompt, truncated to ``limit``; prompts shorter than 2 tokens are dropped."""
    if not prompts:
        raise CkptError("measured mode needs at least one prompt")
    with quiet_transformers():
        encoded = [tok(p, return_tensors="pt")["input_ids"][:, :limit] for p in prompts]
    encoded = [e.to(dev) for e in encoded if e.shape[1] >= 2]
    if not encoded:
        raise CkptError("every prompt tokenizes to fewer than 2 tokens")
    return encoded


class _KeyBiasRemover:
    """``with remover({layer: dims}):`` zeroes those key-bias entries of the loaded model for the
    duration (rows of a fused qkv bias mapped through the layout)."""

    def __init__(self, model, layout):
        H, G, hd = layout.num_heads, layout.num_kv_heads, layout.head_dim
        self.layout = layout
        self.fused_k = qkv_row_index(layout.fused_layout, H, G, hd)[1] if layout.fused_layout and H and G and hd else None
        self.params = dict(model.named_parameters())

    def _param(self, lt):
        if lt.k_bias:
            return self.params[lt.k_bias], None
        if lt.qkv_bias:
            return self.params[lt.qkv_bias], self.fused_k
        return None, None

    @contextlib.contextmanager
    def __call__(self, targets: dict):
        import torch
        saved = []
        with torch.no_grad():
            for li, dims in targets.items():
                p, rows = self._param(self.layout.layers[li])
                if p is None or not dims:
                    continue
                idx = torch.as_tensor(np.asarray(dims) if rows is None else rows[np.asarray(dims)], device=p.device)
                saved.append((p, idx, p[idx].clone()))
                p[idx] = 0
        try:
            yield
        finally:
            with torch.no_grad():
                for p, idx, old in saved:
                    p[idx] = old


def _check_capture(model, ids, num_layers: int) -> None:
    """One softmax call per layer, shaped [.., T, T]: the capture sees every layer's logits."""
    rec: dict = {}
    with _capture_softmax(rec) as st:
        _forward(model, ids)
    if st["i"] != num_layers:
        raise UnsupportedError(f"measured mode: expected one attention softmax per layer ({num_layers}), "
                               f"saw {st['i']} calls; this architecture computes attention differently")


@dataclass(frozen=True)
class _Bench:
    """What every layer's measurement shares: the model, its layout, the prompts' ids, the dims
    each variant removes per layer, the remover and the bound's rope terms."""

    model: object
    layout: object
    encoded: tuple
    variants: tuple
    dims: dict                      # variant -> {layer: dims}
    remove: _KeyBiasRemover
    rope: object
    scale_eff: float
    dtype: str


def _layer_pass(b: _Bench, lr, lt, ids) -> tuple:
    """Reference logits of layer ``lt`` for one prompt, and the observed ``|q~|`` per pair
    (``[T, H, P]``, from a hook on the query projection; None when there is none)."""
    import torch
    H, G, hd = b.layout.num_heads, b.layout.num_kv_heads, b.layout.head_dim
    t = ids.shape[1]
    cap: dict = {}
    hook = iq = None
    qname = lt.q_weight or lt.qkv_weight
    if qname and lr.pairs is not None:
        mod = _module(b.model, qname)
        iq = None if lt.q_weight else qkv_row_index(b.layout.fused_layout or "concat", H, G, hd)[0]

        def fn(_m, _inp, out):
            o = out[0] if isinstance(out, tuple) else out
            cap["q"] = o.detach().to("cpu", torch.float64).numpy().reshape(o.shape[-2], o.shape[-1])
        hook = mod.register_forward_hook(fn)
    try:
        l_ref = _layer_logits(b.model, ids, lt.layer)
    finally:
        if hook is not None:
            hook.remove()
    q_obs = None
    if "q" in cap:
        q = cap["q"] if iq is None else cap["q"][:, iq]
        qh = q.reshape(t, H, hd)
        q_obs = np.sqrt(qh[:, :, lr.pairs[:, 0]] ** 2 + qh[:, :, lr.pairs[:, 1]] ** 2)   # [T, H, P]
    return l_ref, q_obs


def _observed_bound(b: _Bench, lr, dv: list, q_obs: np.ndarray, span: np.ndarray) -> float:
    """The bound with the observed ``|q~|`` of this prompt in place of its static bound, for the
    pairs the variant's dims ``dv`` touch and each row's real key span."""
    H, G, hd = b.layout.num_heads, b.layout.num_kv_heads, b.layout.head_dim
    sel = np.zeros((G, lr.pairs.shape[0]), bool)
    for d in dv:
        g, w = divmod(d, hd)
        hit = np.flatnonzero((lr.pairs == w).any(1))
        sel[g, hit] = True
    b_pair = np.sqrt(lr.pair_energy)                           # [G, P]
    fac = np.minimum(2.0, b.rope.inv_freq[None, :] * np.maximum(span, 0)[:, None])   # [T, P]
    kv_of = np.arange(H) // (H // G)
    per = (q_obs * (b_pair * sel)[kv_of][None, :, :] * fac[:, None, :]).sum(-1) * b.scale_eff
    return float(per.max())


def _measure_layer(b: _Bench, lr, lt) -> LayerMeasure:
    """Layer ``lt``'s logits with each variant's part removed in this layer only, on every prompt."""
    # bound_observed: computable for rotary classes from the observed |q~|; 0 for exact parts.
    obs0 = 0.0 if lr.k_class in ("exact", "partial", "rope") else None
    acc = {v: {"logit": 0.0, "tv": 0.0, "obs": obs0, "lmax": 0.0} for v in b.variants}
    q_abs = ratio = None
    for ids in b.encoded:
        t = ids.shape[1]
        l_ref, q_obs = _layer_pass(b, lr, lt, ids)
        # Masked keys enter softmax as logit + finfo(dtype).min (or -inf): far below -1e30.
        allowed = l_ref > -1e30
        noise = _noise(float(np.abs(np.where(allowed, l_ref, 0)).max()), b.dtype)
        if q_obs is not None:
            q_abs = max(q_abs or 0.0, float(q_obs.max()))
            if lr.q_pair_bound is not None:
                ratio = max(ratio or 0.0, float((q_obs.max(0) / lr.q_pair_bound).max()))
        # key span of every row: max - min allowed key index (same for all heads of a causal mask)
        kidx = np.arange(t)
        any_allowed = allowed.reshape(-1, t, t).any(0)
        span = np.where(any_allowed, kidx[None, :], -1).max(1) - np.where(any_allowed, kidx[None, :], t).min(1)
        for v in b.variants:
            dv = b.dims[v][lt.layer]
            if not dv:
                continue
            with b.remove({lt.layer: dv}):
                l_c = _layer_logits(b.model, ids, lt.layer)
            dev_, tv_ = _row_metrics(l_ref, l_c, allowed)
            a = acc[v]
            a["logit"], a["tv"], a["lmax"] = max(a["logit"], dev_), max(a["tv"], tv_), max(a["lmax"], noise)
            if a["obs"] is not None and q_obs is not None and lr.pair_energy is not None:
                a["obs"] = max(a["obs"], _observed_bound(b, lr, dv, q_obs, span))
            elif lr.k_class in ("partial", "rope") and v != "exact":
                a["obs"] = None      # no observed |q~| (hook found nothing): no observed bound
    vms = []
    for v in b.variants:
        dv = b.dims[v][lt.layer]
        if not dv:
            continue
        a, bound = acc[v], _variant_bound(lr, v)
        vms.append(VariantMeasure(v, len(dv), a["logit"], a["tv"], bound, a["obs"], a["lmax"],
                                  None if bound is None else bool(a["logit"] <= bound + a["lmax"])))
    return LayerMeasure(lt.layer, lr.k_class, q_abs, ratio, tuple(vms))


def _measure_outputs(b: _Bench, is_lm: bool) -> list:
    """Model outputs with each variant's part removed in every layer at once (real forward passes)."""
    import torch
    outputs = []
    refs = [_forward(b.model, ids) for ids in b.encoded]
    for v in b.variants:
        if not any(b.dims[v].values()):
            continue
        kls, agree, maxd, hid, hscale, npos = [], 0, 0.0, 0.0, 0.0, 0
        with b.remove(b.dims[v]):
            cands = [_forward(b.model, ids) for ids in b.encoded]
        for r, c in zip(refs, cands):
            if is_lm:
                lr_ = r.logits[0].to("cpu", torch.float64)
                lc_ = c.logits[0].to("cpu", torch.float64)
                pr, pc = torch.log_softmax(lr_, -1), torch.log_softmax(lc_, -1)
                kls.append((pr.exp() * (pr - pc)).sum(-1).numpy())
                agree += int((lr_.argmax(-1) == lc_.argmax(-1)).sum())
                npos += lr_.shape[0]
                maxd = max(maxd, float((lr_ - lc_).abs().max()))
            else:
                hr = r.last_hidden_state[0].to("cpu", torch.float64)
                hc = c.last_hidden_state[0].to("cpu", torch.float64)
                hid, hscale = max(hid, float((hr - hc).abs().max())), max(hscale, float(hr.abs().max()))
                npos += hr.shape[0]
        if is_lm:
            k = np.concatenate(kls)
            outputs.append(OutputMeasure(v, npos, float(k.max()), float(k.mean()), agree / npos, maxd))
        else:
            outputs.append(OutputMeasure(v, npos, None, None, None, None, hid, hscale))
    return outputs


def measure(source, *, context: int | None = None, epsilon: float | None = None, prompts=None,
            device: str = "auto", dtype: str = "float32", max_tokens: int | None = None,
            variants=VARIANTS, progress: bool | None = None) -> MeasuredReport:
    """Load ``source`` with transformers and measure the effect of removing key-bias parts.

    ``prompts``: list of strings (default :func:`~ckpt_surgeon.analysis.prompts.default_prompts`);
    each is truncated to ``max_tokens`` (default 1024) and to the context ``L`` the bounds assume
    (``context``, else the model's max positions).  ``progress``: the loading phase and a bar over the
    layers measured, then over the whole-model passes, on stderr (:mod:`ckpt_surgeon.progress`).
    """
    from ..progress import phase, steps
    from .prompts import default_prompts

    dev = resolve_device(device)
    dq = quantized_run(source)
    with phase(progress, f"loading {Path(str(source)).name} with transformers ({dtype}, {dev})"):
        model, tok, is_lm = load_model(source, device=dev, dtype=dtype)
    view = model_checkpoint(model, str(source))
    layout = view.layout()
    static = analyze_checkpoint(view, context=context, epsilon=DEFAULT_EPSILON if epsilon is None else epsilon,
                                layout=layout, consumers=False)
    _check_key_biases_loaded(source, layout)
    rope = rope_geometry(layout, view.config)
    # Prompts never exceed the context the bounds assume (--context L, else max positions).
    limit = max_tokens or DEFAULT_MAX_TOKENS
    if static.context:
        limit = min(limit, int(static.context))
    encoded = _encode_prompts(tok, list(default_prompts() if prompts is None else prompts), limit, dev)
    # Which parameter rows each (layer, variant) zeroes.
    dims = {v: {lr.layer: _variant_dims(lr, v, layout.head_dim) for lr in static.layers} for v in variants}
    _check_capture(model, encoded[0], layout.num_layers)
    bench = _Bench(model, layout, tuple(encoded), tuple(variants), dims, _KeyBiasRemover(model, layout), rope,
                   static.attn_scale * (rope.attention_factor ** 2 if rope else 1.0), dtype)
    todo = [(lr, lt) for lr, lt in zip(static.layers, layout.layers) if lr.has_k_bias]
    layers_out = [_measure_layer(bench, lr, lt) for lr, lt in steps(progress, todo, desc="measuring layers",
                                                                      unit="layer")]
    with phase(progress, f"whole-model passes ({len(encoded)} prompts, each part removed in every layer)"):
        outputs = _measure_outputs(bench, is_lm)
    notes = []
    if not is_lm:
        notes.append("no LM head: output compared on the last hidden state")
    notes.append("logit/tv: layer l's attention logits with the part removed in layer l only (identical inputs); "
                  "outputs: removed in every layer at once")
    return MeasuredReport(str(source), dev, dtype, len(encoded), tuple(int(e.shape[1]) for e in encoded),
                          tuple(layers_out), tuple(outputs), tuple(notes), static, dq)
