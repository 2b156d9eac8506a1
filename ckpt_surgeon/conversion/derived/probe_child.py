"""GGUF -> HF on the derived path, learned: llama.cpp's converter class run forward on probes.

``python -m ckpt_surgeon.conversion.derived.probe_child REQUEST.json`` (written by :mod:`.to_hf`).
The request names a folder holding only the model's ``config.json``.  The child builds, from that
config, the tensor names and shapes an HF checkpoint holds (transformers on the meta device,
:func:`~ckpt_surgeon.conversion.model_check.expected_tensors`), and runs llama.cpp's own class for
the architecture (``prepare_tensors``, i.e. its ``modify_tensors``: renames, permutations, splits,
expert stacks) several times on *probe* tensors instead of weights, capturing every tensor the
class hands its ``GGUFWriter``:

* **id**: every element of HF tensor number k (1-based, names sorted) is k;
* **index digits**: every element is its flat index within its tensor, 23 bits per pass (float32
  holds integers up to 2**24 exactly), as many passes as the largest tensor needs;
* **random**: seeded normal values.

Each GGUF element's (id, index) says which HF element it came from: that is the inverse, a gather
per HF tensor.  It is proved on the random pass: every GGUF element of that pass holds the random
input of the HF element the map names, bit for bit, and every HF element is reached.

Each output is consumed as the class writes it and kept only as *runs* (:func:`segments`: GGUF start,
HF tensor, HF start; a copied or permuted tensor is one run or a run a row, a stack of experts a run an
expert), so the probe's memory is one output's work and the maps' size, not the model's: the parent
gathers one group of tensors at a time from them (:mod:`.to_hf`).  A tensor the class transposes is a
run an element, the worst case (24 bytes an element for that tensor).  Where that
fails the class does not only move values (a sum, ``exp``, a ``+ 1`` shift, a dropped tensor) and
the answer is one line naming the tensor.  A GGUF tensor with no valid ids that is the same in
every pass is generated from the config (rope factors): kept, for the parent to compare.

An output whose lazy chain is one HF tensor through casts that keep float32 values (the read, ``.to(float32)``,
``.numpy()``, ``.astype(float32)``: :func:`.lazy_eval.identity_leaf`) is the identity map by construction and is
recorded without being evaluated: no probe tensor, no proof pass (a value-keeping cast gives each element back
unchanged).  The embedding and the MLP matrices of most models are such outputs, so the probe's memory is the
largest tensor the class moves, not the largest tensor.

The class's ``set_gguf_parameters`` key-values come back too: the parent checks them against the
GGUF's, which is what proves the given config is the one the file was made from.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np

from .child import _hook_sources, _import_llamacpp, guard_remote_code, serve

DIGIT_BITS = 23


def _values(kind: str, k: int, numel: int, digit: int = 0) -> np.ndarray:
    if kind == "id":
        return np.full(numel, k, np.float32)
    if kind == "idx":
        return _index_digit(numel, digit)
    return np.random.default_rng(k).standard_normal(numel, dtype=np.float32)


def _index_digit(numel: int, digit: int) -> np.ndarray:
    """Digit ``digit`` (``DIGIT_BITS`` bits) of each element's flat index, made in float32 a block of
    ``2**DIGIT_BITS`` at a time (no 8-byte index array): inside a block the low digit counts from 0 and every
    higher digit is the block start's."""
    block = 1 << DIGIT_BITS
    out = np.empty(numel, np.float32)
    count = np.arange(min(block, numel), dtype=np.float32)
    for start in range(0, numel, block):
        n = min(block, numel - start)
        out[start:start + n] = count[:n] if digit == 0 else (start >> (DIGIT_BITS * digit)) & (block - 1)
    return out


def _run_pass(gguf, base, cls, folder: Path, names: list, shapes: dict, kind: str, on_tensor, on_identity,
              digit: int = 0):
    """One forward run of the class, lazily as llama.cpp runs it, on probe tensors; each output handed to
    ``on_tensor(GGUF name, float32 values, shape)`` as the class writes it (and not kept: memory is one output's
    work), or, when it is an HF tensor through value-keeping casts only (:func:`.lazy_eval.identity_leaf`: the
    map is the identity, nothing to probe), to ``on_identity(GGUF name, HF id, shape)`` unevaluated, so the
    largest tensors of most models (the embedding, the MLP matrices) never get a probe tensor.  Returns the model
    and the GGUF writer its tensors went to: the model's own, or that of the model it delegates its planning to
    (Mistral3Model's ``impl``); a class that writes tensors to a second writer (a LoRA adapter file beside the
    model: BertModel's jina-v3 adapters) is refused."""
    import torch

    from .lazy_eval import identity_leaf
    lazy_cls = base.LazyTorchTensor

    def probe(k: int):
        shape = shapes[names[k - 1]]
        numel = int(np.prod(shape, dtype=np.int64))
        return torch.from_numpy(_values(kind, k, numel, digit).reshape(shape))

    def index_tensors(self, remote_hf_model_id=None):
        out = {}
        for k, name in enumerate(names, 1):
            gen = (lambda k=k, s=tuple(shapes[name]): lazy_cls(
                meta=lazy_cls.meta_with_dtype_and_shape(torch.float32, s), args=(k,), func=probe))
            if item := self.filter_tensors((name, gen)):
                out[item[0]] = item[1]
        return out

    writers = []

    def add_tensor(self, name, tensor, raw_shape=None, raw_dtype=None, tensor_endianess=None):
        if not any(w is self for w in writers):
            writers.append(self)
            if len(writers) > 1:
                raise NotImplementedError(f"{cls.__name__} writes tensors to more than one GGUF file (an adapter "
                                          "beside the model); not derived")
        if isinstance(tensor, gguf.LazyBase):
            k = identity_leaf(tensor, gguf.LazyBase, probe)
            if k is not None:
                on_identity(name, k, tuple(tensor._meta.shape))
                return
        arr = gguf.LazyNumpyTensor.to_eager(tensor) if isinstance(tensor, gguf.LazyBase) else np.asarray(tensor)
        on_tensor(name, np.asarray(arr, dtype=np.float32).ravel(), tuple(arr.shape))

    base.ModelBase.index_tensors = index_tensors
    gguf.GGUFWriter.add_tensor = add_tensor
    with torch.inference_mode():
        model = cls(folder, gguf.LlamaFileType.ALL_F32, folder / "probe.gguf", model_name="probe")
        model.prepare_tensors()
    return model, (writers[0] if writers else model.gguf_writer)


def runs(values: np.ndarray, slope: int) -> tuple[np.ndarray, np.ndarray]:
    """``values`` (1-D integers, or floats holding integers below 2**24: exact) as runs: (start positions, the
    value at each) where inside a run each value is the one before plus ``slope`` (0: constant runs; 1:
    counting runs)."""
    if not values.size:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts = np.concatenate(([0], np.flatnonzero(values[1:] != values[:-1] + slope) + 1)).astype(np.int64)
    return starts, values[starts].astype(np.int64)


def _at(run: tuple, slope: int, pos: np.ndarray) -> np.ndarray:
    starts, vals = run
    r = np.searchsorted(starts, pos, side="right") - 1
    return vals[r] + slope * (pos - starts[r])


def segments(id_run: tuple, digit_runs: list, numel: int, bits: int = DIGIT_BITS) -> np.ndarray:
    """The map of one GGUF tensor as segments: rows (GGUF start, HF tensor id, HF start); inside a segment
    GGUF element ``start + j`` came from element ``HF start + j`` of HF tensor ``id`` (up to the next row's
    start, the last up to ``numel``).  The runs of the id pass (constant) and of each index digit's pass
    (digit 0 counting, the others constant; ``bits`` a digit) are cut at every run start of any of them."""
    pos = np.unique(np.concatenate([id_run[0]] + [r[0] for r in digit_runs]))
    ids = _at(id_run, 0, pos)
    idx = np.zeros(pos.size, np.int64)
    for d, run in enumerate(digit_runs):
        idx |= _at(run, 1 if d == 0 else 0, pos) << (bits * d)
    if pos.size > 1:          # a cut where the map runs on (an id or digit run ends where another starts): joined
        lengths = np.diff(np.append(pos, numel))
        keep = np.ones(pos.size, bool)
        keep[1:] = (ids[1:] != ids[:-1]) | (idx[1:] != idx[:-1] + lengths[:-1])
        pos, ids, idx = pos[keep], ids[keep], idx[keep]
    return np.stack([pos, ids, idx], axis=1)


def expand(seg: np.ndarray, numel: int) -> tuple[np.ndarray, np.ndarray]:
    """A tensor's segments as (HF id, HF flat index) of each of its ``numel`` elements."""
    pos, ids, idx = seg[:, 0], seg[:, 1], seg[:, 2]
    lengths = np.diff(np.append(pos, numel))
    return np.repeat(ids, lengths), np.repeat(idx - pos, lengths) + np.arange(numel, dtype=np.int64)


FEW_SEGMENTS = 4096     # up to this many, a map is applied segment by segment (slices, no index arrays)


def pairs(seg: np.ndarray, numel: int):
    """(HF id, positions in the GGUF tensor, positions in the HF tensor) covering a tensor's ``numel`` elements:
    slices a segment (a copy, a permutation by rows, an expert of a stack: no index array, whatever the
    tensor's size) when there are at most :data:`FEW_SEGMENTS`, else index arrays grouped by HF id (a
    transposed tensor: 8 bytes an element for each)."""
    if len(seg) <= FEW_SEGMENTS:
        ends = np.append(seg[1:, 0], numel)
        for (pos, k, idx), end in zip(seg.tolist(), ends.tolist()):
            yield k, slice(pos, end), slice(idx, idx + end - pos)
        return
    ids, idx = expand(seg, numel)
    for k, m in by_id(ids):
        yield k, m, idx[m]


def by_id(ids: np.ndarray):
    """(HF id, the positions holding it) for each id in ``ids``: one sort, not a pass over ``ids`` an id (a
    stack of 256 experts)."""
    if ids.size and ids.min() == ids.max():
        yield int(ids[0]), slice(None)
        return
    order = np.argsort(ids, kind="stable")
    uniq, first = np.unique(ids[order], return_index=True)
    for k, a, b in zip(uniq, first, np.append(first[1:], ids.size)):
        yield int(k), order[a:b]


def _within(src, numel: int) -> bool:
    if isinstance(src, slice):
        return 0 <= src.start and src.stop <= numel
    return bool(src.size == 0 or (src.min() >= 0 and src.max() < numel))


def _changes(t: str, sources: dict) -> str:
    src = f" (from HF {sources[t]})" if t in sources else ""
    return (f"GGUF tensor {t}{src}: llama.cpp's converter changes its values (not only their places: a shift, a "
            "scale, exp, a sum ...), so it cannot be inverted")


class _Learner:
    """The passes' outputs, consumed one tensor at a time and kept as runs (a copied, permuted or stacked
    tensor is a few runs; a transposed one a run an element, the worst case)."""

    def __init__(self, names: list, shapes: dict, sources: dict):
        self.n, self.names, self.sources = len(names), names, sources
        self.numel = {k: int(np.prod(shapes[nm], dtype=np.int64)) for k, nm in enumerate(names, 1)}
        self.id_runs, self.digits, self.shape = {}, {}, {}
        self.odd: dict[str, np.ndarray] = {}        # no valid ids: generated (rope factors) if every pass agrees
        self.segs: dict[str, np.ndarray] = {}
        self.ident: dict[str, int] = {}     # outputs that are an HF tensor's values in its own order (casts only)
        self.refusal: str | None = None
        self.digit = 0      # the index digit the current pass carries
        self._last = (0, None)

    def _refuse(self, why: str) -> None:
        self.refusal = self.refusal or why

    def on_id(self, t, v, shape):
        self.shape[t] = shape
        ok = v.size and v.min() >= 1 and v.max() <= self.n and np.all(v == np.round(v))
        if ok:
            self.id_runs[t] = runs(v, 0)
        else:
            self.odd[t] = v.copy()

    def on_identity(self, t, k, shape):
        """Output ``t`` is HF tensor ``k`` through value-keeping casts: GGUF element i is its element i."""
        self.shape[t] = shape
        self.ident[t] = int(k)

    def skip(self, t, k, shape):
        """Later passes: the same output, recognised the same way (the class is deterministic), not run."""
        if self.ident.get(t) != int(k):
            self._refuse(f"GGUF tensor {t}: llama.cpp's converter wrote it differently in two probe passes")

    def on_digit(self, t, v, shape):
        if t in self.odd:
            if not np.array_equal(v, self.odd[t]):
                self._refuse(_changes(t, self.sources))
            return
        if t not in self.id_runs or not (v.min() >= 0 and v.max() < 1 << DIGIT_BITS and np.all(v == np.round(v))):
            self._refuse(_changes(t, self.sources))
            return
        self.digits.setdefault(t, []).append(runs(v, 1 if self.digit == 0 else 0))

    def merge(self) -> None:
        for t, id_run in self.id_runs.items():
            numel = int(np.prod(self.shape[t], dtype=np.int64))
            self.segs[t] = segments(id_run, self.digits.get(t, []), numel)
        for t, k in self.ident.items():
            self.segs[t] = np.array([[0, k, 0]], np.int64)
        self.id_runs, self.digits = {}, {}

    def on_rand(self, t, v, shape):
        """Proof on the random pass: each GGUF element holds the random value of the HF element the map names."""
        if t in self.odd:
            if not np.array_equal(v, self.odd[t]):
                self._refuse(_changes(t, self.sources))
            return
        if t not in self.segs or self.refusal:
            return
        for k, at, src in pairs(self.segs[t], v.size):
            if not _within(src, self.numel[int(k)]):
                self._refuse(f"GGUF tensor {t}: its probe values name no element of an HF tensor (llama.cpp's "
                             "converter changes its values, not only their places: a shift, a scale, exp ...), so it "
                             "cannot be inverted")
                return
            want = self._rand(int(k))[src]
            if not np.array_equal(v[at].view(np.uint32), want.view(np.uint32)):
                # named by the GGUF tensor and the HF tensor it came from: the map a shifted output seems to have
                # (w + 1 turns the id and the index digits into the next ones) names an innocent neighbour
                self._refuse(_changes(t, self.sources))
                return

    def _rand(self, k: int) -> np.ndarray:
        """HF tensor ``k``'s random probe values, kept while the outputs come from it (a stack's experts one
        after the other; a fused QKV's three parts)."""
        if self._last[0] != k:
            self._last = (k, _values("rand", k, self.numel[k]))
        return self._last[1]

    def check_coverage(self) -> None:
        """Every element of every HF tensor reaches some GGUF element (else the class drops or merges it)."""
        spans: dict[int, list] = {}
        for t, seg in self.segs.items():
            lengths = np.diff(np.append(seg[:, 0], int(np.prod(self.shape[t], dtype=np.int64))))
            for k, start, length in zip(seg[:, 1], seg[:, 2], lengths):
                spans.setdefault(int(k), []).append((int(start), int(start + length)))
        for k, name in enumerate(self.names, 1):
            reach, missing = 0, 0
            for a, b in sorted(spans.get(k, ())):
                missing += max(0, a - reach)
                reach = max(reach, b)
            missing += max(0, self.numel[k] - reach)
            if missing:
                self._refuse(f"HF tensor {name}: {missing} of {self.numel[k]} elements reach no GGUF tensor "
                             "(llama.cpp's converter drops or merges them), so the GGUF cannot give it back")
                return


def _kv_values(writer) -> dict:
    out = {}
    for key, val in writer.kv_data[0].items():
        v = val.value
        out[key] = list(v) if isinstance(v, (list, tuple, bytes, bytearray)) else v
    return out


def _class_for(conversion, base, folder: Path):
    hparams = base.ModelBase.load_hparams(folder, False)
    arch_name = base.get_model_architecture(hparams, base.ModelType.TEXT)
    cls = conversion.get_model_class(arch_name, mmproj=False)
    guard_remote_code(False, cls.__name__, folder)     # the probe folder holds a config and rebuilt tokenizer files
    return arch_name, cls


def _unmapped(e: BaseException) -> str | None:
    """The HF name in llama.cpp's ``Can not map tensor 'NAME'`` (``ModelBase.map_tensor_name``), else None."""
    m = re.fullmatch(r"Can not map tensor '(.+)'", str(e)) if isinstance(e, ValueError) else None
    return m.group(1) if m else None


def _tensor_map(gguf, cls, config: dict):
    """llama.cpp's tensor map (gguf-py's ``TensorNameMap``) for the class's architecture, over the config's layers
    and its multi-token-prediction ones (the keys llama.cpp's ``TextModel`` reads)."""
    text = {**config, **(config.get("text_config") or {})}
    n = max(int(text.get(k) or 0) for k in ("n_layers", "num_hidden_layers", "n_layer", "num_layers"))
    n += int(text.get("num_nextn_predict_layers") or 0) + int(text.get("mtp_num_hidden_layers") or 0)
    return gguf.get_tensor_name_map(cls.model_arch, n)


class _Respeller:
    """The HF names to spell otherwise after the class could not map ``failed`` (llama.cpp's message names our name,
    or it with the ``.weight`` / ``.bias`` the class appends): that name's other spelling, one llama.cpp's tensor map
    holds (HY-V4's Hub names) or else transformers' key (Kimi-Linear's dense MLP), both read by transformers into
    the same parameter (:class:`~ckpt_surgeon.conversion.model_check.Spellings`); and with it every other name the
    map cannot map and spells otherwise, so the pass runs once more, not once a name.  A name is respelled once."""

    def __init__(self, spellings, tensor_map):
        self.spellings, self._tensor_map, self._map, self._among, self.done = spellings, tensor_map, None, None, set()

    def __call__(self, failed: str | None, shapes: dict) -> dict[str, str]:
        own = next((n for n in (failed, failed.rsplit(".", 1)[0]) if n in shapes), None) if failed else None
        if own is None or own in self.done:
            return {}
        if self._among is None:
            self._map = self._tensor_map()
            self._among = self.spellings.among(c + s for c in self._map.mapping for s in ("", ".weight", ".bias"))
        fixes = {own: self._among.get(own, self.spellings.get(own))}
        fixes.update({n: c for n, c in self._among.items()
                      if self._map.get_name(n, try_suffixes=(".weight", ".bias")) is None})
        return self._keep(fixes, shapes)

    def wanted(self, name: str | None, shapes: dict) -> dict[str, str]:
        """The class asked for ``name`` (``KeyError: 'Missing hash routing tensor layers.0.ffn.gate.tid2eid'``), another
        spelling of one of ours: that one respelled, and where ours is ``name`` under a prefix (transformers' save
        adds its base-model prefix, ``model.``; DeepSeek-V4's release has none), every name the prefix-less spelling
        also spells."""
        own = self.spellings.among([name]) if name else {}
        fixes = {n: c for n, c in own.items() if n in shapes}
        for n, c in list(fixes.items()):
            if n.endswith("." + c):
                cut = len(n) - len(c)
                bare = self.spellings.among(m[cut:] for m in shapes if m.startswith(n[:cut]))
                fixes.update({m: b for m, b in bare.items() if b == m[cut:]})
        return self._keep(fixes, shapes)

    def _keep(self, fixes: dict, shapes: dict) -> dict[str, str]:
        """The fixes that rename a name not yet respelled to a free name, no two to the same one."""
        targets = list(fixes.values())
        fixes = {n: c for n, c in fixes.items() if c and n in shapes and n not in self.done and c not in shapes
                 and targets.count(c) == 1}
        self.done.update(fixes.values())
        self.done.update(fixes)
        return fixes


def _wanted(e: BaseException) -> str | None:
    """The dotted tensor name a ``KeyError`` of the class ends with (``Missing hash routing tensor NAME``), else None."""
    m = re.search(r"(\w+(?:\.\w+)+)$", str(e.args[0]) if isinstance(e, KeyError) and e.args else "")
    return m.group(1) if m else None


def _first_pass(gguf, base, cls, folder: Path, shapes: dict, sources: dict, respell: _Respeller):
    """The id pass -> (its learner, the model, its writer).  The HF side is spelled as transformers' save writes it;
    where the class cannot map a name or asks for another spelling of one, transformers reading both into the same
    parameter (:class:`_Respeller`), that spelling is taken (``shapes`` renamed in place) and the pass run again."""
    while True:
        names = sorted(shapes)
        sources.clear()
        learn = _Learner(names, shapes, sources)
        try:
            model, writer = _run_pass(gguf, base, cls, folder, names, shapes, "id", learn.on_id, learn.on_identity)
            return learn, model, writer
        except (ValueError, KeyError) as e:
            want = _wanted(e)
            fixes = respell(_unmapped(e), shapes) or respell.wanted(want, shapes)
            held = next((n for n in shapes if n == want or n.endswith(f".{want}")), None) if want else None
            if not fixes and held:
                raise KeyError(f"{e.args[0]} (the probe's HF side holds {held}, in transformers' form: the class "
                               "wants another form of it, as the release stores it (quantized?), which the probe "
                               "does not write)") from e
            if not fixes:
                raise
            for old, new in fixes.items():
                shapes[new] = shapes.pop(old)


def run(req: dict) -> dict:
    from ..model_check import expected_tensors_and_spellings
    folder = Path(req["folder"])
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    shapes, spellings = expected_tensors_and_spellings(config, by_architecture=True)
    shapes = {n: tuple(s) for n, s in shapes.items()}
    gguf, conversion = _import_llamacpp(Path(req["llamacpp"]))
    from conversion import base
    arch_name, cls = _class_for(conversion, base, folder)
    if req.get("no_mtp"):
        cls.no_mtp = True       # as convert_hf_to_gguf.py --no-mtp sets it (else the class's own default: Qwen4Exp's is on)
    biggest = max(int(np.prod(s, dtype=np.int64)) for s in shapes.values())
    n_digits = max(1, -(-max(1, biggest - 1).bit_length() // DIGIT_BITS))
    sources: dict[str, str] = {}
    _hook_sources(cls, sources)         # once: each pass's outputs name the HF tensor they came from
    learn, model, writer = _first_pass(gguf, base, cls, folder, shapes, sources,
                                       _Respeller(spellings, lambda: _tensor_map(gguf, cls, config)))
    names = learn.names
    for d in range(n_digits):
        learn.digit = d
        _run_pass(gguf, base, cls, folder, names, shapes, "idx", learn.on_digit, learn.skip, d)
    learn.merge()
    _run_pass(gguf, base, cls, folder, names, shapes, "rand", learn.on_rand, learn.skip)
    if not learn.refusal:
        learn.check_coverage()
    model.set_gguf_parameters()
    arrays = {f"seg{i}": seg for i, seg in enumerate(learn.segs.values())}
    arrays.update({f"gen{i}": vals.reshape(learn.shape[t]) for i, (t, vals) in enumerate(learn.odd.items())})
    np.savez(req["maps"], **arrays)
    return {"hf_architecture": arch_name, "converter_class": f"{cls.__module__}.{cls.__name__}",
            "gguf_arch": writer.arch, "refusal": learn.refusal,
            "hf": [[n, list(shapes[n])] for n in names],
            "mapped": [[t, list(learn.shape[t])] for t in learn.segs], "generated": list(learn.odd),
            "kv": _kv_values(writer)}


def main(argv: list[str]) -> int:
    return serve(argv, run)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
