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

A tensor the model keeps as integers (DeepSeek-V4's hash-routing table) is given in its own dtype, its random pass
random integers float32 holds exactly; the parent writes it back in that dtype.  A tensor the class asks for in a
release's packed form (DeepSeek-V4's routed experts: its ``KeyError`` names one the HF side holds as floats) is given
in that form (:func:`_pack`, :data:`.packed.FORMS`), and the bits the class moves into ggml blocks are learned by
nibble passes (:mod:`.packed`); a raw block the class quantizes itself is refused.

The HF side's names are transformers' save spelling; where the class cannot map one, or asks for another spelling
of one, the probe takes one transformers reads alike (:class:`_Respeller`) and runs the pass again.

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
from .runlength import at as _at
from .runlength import runs

DIGIT_BITS = 23


def _values(kind: str, k: int, numel: int, digit: int = 0, integer: bool = False) -> np.ndarray:
    if kind == "id":
        return np.full(numel, k, np.float32)
    if kind == "idx":
        return _index_digit(numel, digit)
    rng = np.random.default_rng(k)
    if integer:         # an integer tensor (a routing table): integers float32 holds exactly
        return rng.integers(0, 1 << 24, numel).astype(np.float32)
    return rng.standard_normal(numel, dtype=np.float32)


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


class _Feed:
    """The probe tensors of one pass (``mode``: the pass kind and the digit it carries): float passes (``id``,
    ``idx``, ``rand``) give the float and integer HF tensors their values and the packed ones zeros; nibble passes
    (``nid``, ``npos``, ``nrand``: :mod:`.packed`) the other way round.  ``integers``: name -> torch dtype of the
    tensors the model keeps as integers (given in that dtype); ``packed``: name -> (stored dtype, elements per
    block) of the tensors given in a release's packed form (:data:`.packed.FORMS`)."""

    def __init__(self, names: list, shapes: dict, integers: dict, packed: dict):
        self.names, self.shapes, self.integers, self.packed = names, shapes, integers, packed
        self.mode = ("id", 0)

    def numel(self, k: int) -> int:
        return int(np.prod(self.shapes[self.names[k - 1]], dtype=np.int64))

    def dtype(self, k: int):
        import torch
        name = self.names[k - 1]
        kind = self.packed[name][0] if name in self.packed else None
        return getattr(torch, _torch_name(kind) if kind else self.integers.get(name, "float32"))

    def rand(self, k: int) -> np.ndarray:
        """HF tensor ``k``'s values on the random pass, as float32."""
        return _values("rand", k, self.numel(k), integer=self.names[k - 1] in self.integers)

    def __call__(self, k: int):
        import torch

        from .packed import probe_bytes
        name, (kind, digit) = self.names[k - 1], self.mode
        shape, numel = tuple(self.shapes[name]), self.numel(k)
        if name in self.packed:
            data = probe_bytes(kind, k, numel, self.packed[name][1], digit) if kind.startswith("n") else \
                np.zeros(numel, np.uint8)
            return torch.from_numpy(data.reshape(shape)).view(self.dtype(k))
        if kind.startswith("n"):
            return torch.zeros(shape, dtype=self.dtype(k))
        vals = _values(kind, k, numel, digit, name in self.integers)
        return torch.from_numpy(vals.reshape(shape)).to(self.dtype(k))


def _torch_name(stored: str) -> str:
    """The torch dtype name of safetensors dtype ``stored``."""
    from ...formats.safetensors import ML_DTYPES, TORCH_TO_ST
    return {**{v: k for k, v in TORCH_TO_ST.items()}, **ML_DTYPES}[stored]


def _run_pass(gguf, base, cls, folder: Path, feed: _Feed, on_tensor, on_identity, on_raw, built: list | None = None):
    """One forward run of the class, lazily as llama.cpp runs it, on ``feed``'s probe tensors; each output handed to
    ``on_tensor(GGUF name, float32 values, shape)`` as the class writes it (and not kept: memory is one output's
    work), or, when it is an HF tensor through value-keeping casts only (:func:`.lazy_eval.identity_leaf`: the
    map is the identity, nothing to probe), to ``on_identity(GGUF name, HF id, shape)`` unevaluated, so the
    largest tensors of most models (the embedding, the MLP matrices) never get a probe tensor; or, when the class
    hands raw blocks of a ggml block type (DeepSeek-V4's experts repacked into MXFP4), to ``on_raw(GGUF name, bytes,
    ggml type)``.  Returns the model
    and the GGUF writer its tensors went to: the model's own, or that of the model it delegates its planning to
    (Mistral3Model's ``impl``); a class that writes tensors to a second writer (a LoRA adapter file beside the
    model: BertModel's jina-v3 adapters) is refused.  ``built`` gets the model once constructed (its own tensor map,
    for :class:`_Respeller`, when the pass then fails)."""
    import torch

    from .lazy_eval import identity_leaf
    lazy_cls = base.LazyTorchTensor

    def index_tensors(self, remote_hf_model_id=None):
        out = {}
        for k, name in enumerate(feed.names, 1):
            gen = (lambda k=k, s=tuple(feed.shapes[name]): lazy_cls(
                meta=lazy_cls.meta_with_dtype_and_shape(feed.dtype(k), s), args=(k,), func=feed))
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
            k = identity_leaf(tensor, gguf.LazyBase, feed)
            if k is not None:
                on_identity(name, k, tuple(tensor._meta.shape))
                return
        arr = gguf.LazyNumpyTensor.to_eager(tensor) if isinstance(tensor, gguf.LazyBase) else np.asarray(tensor)
        if raw_dtype is not None and gguf.GGML_QUANT_SIZES[raw_dtype][0] > 1:
            on_raw(name, np.asarray(arr), raw_dtype.name, gguf.GGML_QUANT_SIZES[raw_dtype])
            return
        on_tensor(name, np.asarray(arr, dtype=np.float32).ravel(), tuple(arr.shape))

    base.ModelBase.index_tensors = index_tensors
    gguf.GGUFWriter.add_tensor = add_tensor
    with torch.inference_mode():
        model = cls(folder, gguf.LlamaFileType.ALL_F32, folder / "probe.gguf", model_name="probe")
        if built is not None:
            built.append(model)
        model.prepare_tensors()
    return model, (writers[0] if writers else model.gguf_writer)


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

    def __init__(self, feed: _Feed, sources: dict):
        self.feed, self.n, self.names, self.sources = feed, len(feed.names), feed.names, sources
        self.numel = {k: feed.numel(k) for k in range(1, self.n + 1)}
        self.raw: dict[str, tuple] = {}     # raw ggml blocks the class writes (:mod:`.packed`): name -> (shape, type)
        self.id_runs, self.digits, self.shape = {}, {}, {}
        self.odd: dict[str, np.ndarray] = {}        # no valid ids: generated (rope factors) if every pass agrees
        self.segs: dict[str, np.ndarray] = {}
        self.ident: dict[str, int] = {}     # outputs that are an HF tensor's values in its own order (casts only)
        self.refusal: str | None = None
        self.allow_dropped = False      # an HF tensor no element of which reaches the file: listed, not refused
        self.dropped: list[str] = []
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

    def on_raw(self, t, raw, qtype: str, sizes: tuple):
        """Raw ggml blocks (learned by the nibble passes): their logical shape and type, for the plan."""
        block, type_size = sizes
        self.raw[t] = ((*raw.shape[:-1], raw.shape[-1] // type_size * block), qtype)

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
            self._last = (k, self.feed.rand(k))
        return self._last[1]

    def check_coverage(self) -> None:
        """Every element of every HF tensor reaches some GGUF element (else the class drops or merges it)."""
        spans: dict[int, list] = {}
        for t, seg in self.segs.items():
            lengths = np.diff(np.append(seg[:, 0], int(np.prod(self.shape[t], dtype=np.int64))))
            for k, start, length in zip(seg[:, 1], seg[:, 2], lengths):
                spans.setdefault(int(k), []).append((int(start), int(start + length)))
        for k, name in enumerate(self.names, 1):
            if name in self.feed.packed:        # its bits: the nibble passes' coverage
                continue
            reach, missing = 0, 0
            for a, b in sorted(spans.get(k, ())):
                missing += max(0, a - reach)
                reach = max(reach, b)
            missing += max(0, self.numel[k] - reach)
            if missing == self.numel[k] and getattr(self, "allow_dropped", False):
                self.dropped.append(name)   # the class drops it whole (BERT's pooler): diff says so; convert refuses
                continue
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
    """The HF name in llama.cpp's ``Can not map tensor 'NAME'`` (``ModelBase.map_tensor_name``), or the quoted
    dotted name of a class's own ``ValueError`` (DeepSeek-V4's ``Unsupported DeepSeek-V4 tensor 'NAME'``), else None."""
    m = re.search(r"'(\w+(?:\.\w+)+)'", str(e)) if isinstance(e, ValueError) else None
    return m.group(1) if m else None


def _own(failed: str | None, shapes: dict) -> str | None:
    """The HF name llama.cpp's message names: ``failed`` itself, or it without the ``.weight`` / ``.bias`` the class
    appended; None when it is not one of ours."""
    return next((n for n in (failed, failed.rsplit(".", 1)[0]) if n in shapes), None) if failed else None


def _numbers_any(name: str) -> re.Pattern:
    """``name``'s pattern with its numbers any (every layer's, every expert's), each number a group."""
    return re.compile(re.sub(r"\d+", r"(\\d+)", re.escape(name)))


class _Respeller:
    """The HF names to spell otherwise after the class could not map ``failed`` (llama.cpp's message names our name,
    or it with the ``.weight`` / ``.bias`` the class appends): that name's other spelling, one the class's own tensor
    map holds (``tensor_map``, gguf-py's ``TensorNameMap`` as the class built it: HY-V4's Hub names) or else
    transformers' key (Kimi-Linear's dense MLP), both read by transformers into
    the same parameter (:class:`~ckpt_surgeon.conversion.model_check.Spellings`); and with it every other name the
    map cannot map and spells otherwise, so the pass runs once more, not once a name.  A name is respelled once."""

    def __init__(self, spellings):
        self.spellings, self._map, self._among, self.done = spellings, None, None, set()
        self.built: list = []       # the models the passes constructed: the last one's tensor map is the class's own
        self.tried: set = set()     # spellings :meth:`other` gave

    def __call__(self, failed: str | None, shapes: dict) -> dict[str, str]:
        own = _own(failed, shapes)
        if own is None or own in self.done:
            return {}
        if self._among is None and self.built:      # the class's own tensor map (TextModel's ``tensor_map``)
            self._map = self.built[-1].tensor_map
            self._among = self.spellings.among(c + s for c in self._map.mapping for s in ("", ".weight", ".bias"))
        among = self._among or {}
        fixes = {own: among.get(own, self.spellings.get(own))}
        fixes.update({n: c for n, c in among.items()
                      if self._map.get_name(n, try_suffixes=(".weight", ".bias")) is None})
        return self._keep(fixes, shapes)

    def wanted(self, name: str | None, shapes: dict) -> dict[str, str]:
        """The class asked for ``name`` (``KeyError: 'Missing hash routing tensor layers.0.ffn.gate.tid2eid'``), another
        spelling of one of ours: that one respelled; and where ours is ``name`` under a prefix (transformers' save
        adds its base-model prefix, ``model.``; DeepSeek-V4's release has none), every name as transformers' save
        spells it without the prefix (:meth:`~ckpt_surgeon.conversion.model_check.Spellings.unprefixed`)."""
        own = self.spellings.among([name]) if name else {}
        fixes = {n: c for n, c in own.items() if n in shapes}
        for n, c in list(fixes.items()):
            if n.endswith("." + c):
                fixes.update(self.spellings.unprefixed(n[:len(n) - len(c)]))
        return self._keep(fixes, shapes)

    def other(self, failed: str | None, shapes: dict) -> dict[str, str]:
        """The class still cannot map ``failed`` (one of ours, already respelled): its next spelling transformers reads
        alike (:meth:`~ckpt_surgeon.conversion.model_check.Spellings.alternatives`), not tried before, and the same
        change on every name of its pattern (its numbers any: every layer's), where transformers reads that alike
        too."""
        own = _own(failed, shapes)
        for alt in self.spellings.alternatives(own) if own else ():
            if alt in self.tried or alt in shapes:
                continue
            fixes = {own: alt}
            digits = re.findall(r"\d+", own)
            if re.findall(r"\d+", alt) == digits:
                pattern = _numbers_any(own)
                parts = re.split(r"\d+", alt)
                for n in shapes:
                    m = pattern.fullmatch(n)
                    other = "".join(p + d for p, d in zip(parts, (*m.groups(), ""))) if m and n != own else None
                    if other and other not in shapes and other in self.spellings.alternatives(n):
                        fixes[n] = other
            self.tried.update(fixes.values())
            return fixes
        return {}

    def _keep(self, fixes: dict, shapes: dict) -> dict[str, str]:
        """The fixes that rename a name not yet respelled to a free name, no two to the same one."""
        targets = list(fixes.values())
        fixes = {n: c for n, c in fixes.items() if c and n in shapes and n not in self.done and c not in shapes
                 and targets.count(c) == 1}
        self.done.update(fixes.values())
        self.done.update(fixes)
        return fixes


def _wanted(e: BaseException) -> str | None:
    """The dotted tensor name a ``KeyError`` of the class ends with (``Missing hash routing tensor NAME``), else
    None."""
    m = re.search(r"(\w+(?:\.\w+)+)$", str(e.args[0]) if isinstance(e, KeyError) and e.args else "")
    return m.group(1) if m else None


def _pack(gguf, held: str, want: str, feed: _Feed) -> bool:
    """``held`` (the class asked for it as ``want``: the same name, or it under a prefix the release does not have,
    DeepSeek-V4's ``model.``) and every HF name of its pattern (its numbers any: every expert of every layer) given
    as the class asks, in the first release form (:data:`.packed.FORMS`) that stores them: ``feed``'s shapes and
    ``packed`` changed in place.  False when none does (or they are given so already)."""
    from .packed import FORMS, packed_parts
    pattern = _numbers_any(held)
    names = [n for n in feed.shapes if pattern.fullmatch(n)]
    cut = len(held) - len(want)
    if any(n in feed.packed for n in names) or not names:
        return False
    for form in FORMS:
        block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[form.ggml_type]][0]
        parts = [packed_parts(form, n[cut:], feed.shapes[n], block) for n in names]
        if all(parts) and not any(m in feed.shapes and m not in names for p in parts for m in p):
            for n, p in zip(names, parts):
                del feed.shapes[n]
                for m, (shape, dtype, per_block) in p.items():
                    feed.shapes[m], feed.packed[m] = shape, (dtype, per_block)
            return True
    return False


def _first_pass(gguf, base, cls, folder: Path, feed: _Feed, sources: dict, respell: _Respeller):
    """The id pass -> (its learner, the model, its writer).  The HF side is spelled as transformers' save writes it;
    where the class cannot map a name or asks for another spelling of one, transformers reading both into the same
    parameter (:class:`_Respeller`), that spelling is taken (``feed``'s names changed in place) and the pass run
    again; where it asks for a tensor the side holds in transformers' (float) form, that tensor is given in a
    release's packed form (:func:`_pack`) and the pass run again."""
    shapes = feed.shapes
    while True:
        feed.names, feed.mode = sorted(shapes), ("id", 0)
        sources.clear()
        learn = _Learner(feed, sources)
        try:
            model, writer = _run_pass(gguf, base, cls, folder, feed, learn.on_id, learn.on_identity, learn.on_raw,
                                      respell.built)
            return learn, model, writer
        except (ValueError, KeyError) as e:
            want = _wanted(e)
            failed = _unmapped(e)
            fixes = respell(failed, shapes) or respell.wanted(want, shapes) or respell.other(failed, shapes)
            held = next((n for n in shapes if n == want or n.endswith(f".{want}")), None) if want else None
            if not fixes and held and _pack(gguf, held, want, feed):
                continue
            if not fixes and held:
                raise KeyError(f"{e.args[0]} (the probe's HF side holds {held}, in transformers' form: the class "
                               "wants another form of it, as the release stores it (quantized?), which the probe "
                               "does not write)") from e
            if not fixes:
                raise
            for old, new in fixes.items():
                shapes[new] = shapes.pop(old)
                if old in feed.integers:
                    feed.integers[new] = feed.integers.pop(old)


def _nibble_passes(gguf, base, cls, folder: Path, feed: _Feed, learn: _Learner):
    """The packed HF tensors' bit maps (:mod:`.packed`): the id and place passes, then the proof on random bytes ->
    the :class:`~.packed.NibbleLearner` (None when nothing is packed).  A raw output with no map (ggml blocks the
    class quantizes itself) is refused."""
    from .packed import NibbleLearner, digits_for
    ids = {k: feed.packed[n][1] for k, n in enumerate(feed.names, 1) if n in feed.packed}
    nib = None
    if ids:
        nib = NibbleLearner(ids, {k: feed.numel(k) for k in ids}, feed.names)

        def raw(handler):
            return lambda t, arr, qtype, sizes: handler(t, arr, sizes[1])
        passes = [("nid", d, nib.on_id) for d in range(digits_for(max(ids)))]
        passes += [("npos", d, nib.on_place) for d in range(digits_for(max(ids.values()) - 1))]
        for kind, d, handler in passes + [("merge", 0, None), ("nrand", 0, nib.on_rand)]:
            if kind == "merge":
                nib.merge()
                continue
            feed.mode, nib.digit = (kind, d), d
            _run_pass(gguf, base, cls, folder, feed, _ignore, _ignore, raw(handler))
        if not nib.refusal:
            nib.check_coverage()
        learn.refusal = learn.refusal or nib.refusal
    unmapped = [t for t in learn.raw if nib is None or t not in nib.maps]
    if unmapped and not learn.refusal:
        learn.refusal = (f"GGUF tensor {unmapped[0]}: llama.cpp's converter quantizes it into ggml blocks itself "
                         f"({learn.raw[unmapped[0]][1]}), which is not invertible")
    return nib


def _ignore(*_args) -> None:
    return None


def _float_passes(gguf, base, cls, folder: Path, feed: _Feed, learn: _Learner) -> None:
    """The index-digit passes (as many as the largest tensor needs), the merge, the random pass and the coverage."""
    biggest = max(feed.numel(k) for k in range(1, len(feed.names) + 1))
    for d in range(max(1, -(-max(1, biggest - 1).bit_length() // DIGIT_BITS))):
        feed.mode, learn.digit = ("idx", d), d
        _run_pass(gguf, base, cls, folder, feed, learn.on_digit, learn.skip, _ignore)
    learn.merge()
    feed.mode = ("rand", 0)
    _run_pass(gguf, base, cls, folder, feed, learn.on_rand, learn.skip, _ignore)
    if not learn.refusal:
        learn.check_coverage()


def run(req: dict) -> dict:
    from ..model_check import expected_tensors_and_spellings
    folder = Path(req["folder"])
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    shapes, spellings, integers = expected_tensors_and_spellings(config, by_architecture=True)
    feed = _Feed([], {n: tuple(s) for n, s in shapes.items()}, integers, {})
    gguf, conversion = _import_llamacpp(Path(req["llamacpp"]))
    from conversion import base
    arch_name, cls = _class_for(conversion, base, folder)
    if req.get("no_mtp"):
        cls.no_mtp = True   # as convert_hf_to_gguf.py --no-mtp sets it (else the class's own default: Qwen4Exp's is on)
    sources: dict[str, str] = {}
    _hook_sources(cls, sources)         # once: each pass's outputs name the HF tensor they came from
    learn, model, writer = _first_pass(gguf, base, cls, folder, feed, sources, _Respeller(spellings))
    learn.allow_dropped = bool(req.get("allow_dropped"))
    _float_passes(gguf, base, cls, folder, feed, learn)
    nib = _nibble_passes(gguf, base, cls, folder, feed, learn)
    model.set_gguf_parameters()
    arrays = {f"seg{i}": seg for i, seg in enumerate(learn.segs.values())}
    arrays.update({f"gen{i}": vals.reshape(learn.shape[t]) for i, (t, vals) in enumerate(learn.odd.items())})
    raw = dict(nib.maps) if nib is not None and not learn.refusal else {}
    arrays.update({f"raw{i}": rows for i, rows in enumerate(raw.values())})
    np.savez(req["maps"], **arrays)
    from ...formats.safetensors import TORCH_TO_ST
    stored = {**{n: TORCH_TO_ST[d] for n, d in feed.integers.items()}, **{n: p[0] for n, p in feed.packed.items()}}
    return {"hf_architecture": arch_name, "converter_class": f"{cls.__module__}.{cls.__name__}",
            "gguf_arch": writer.arch, "refusal": learn.refusal, "dropped": list(learn.dropped),
            "hf": [[n, list(feed.shapes[n]), stored.get(n)] for n in feed.names],
            "per_block": {str(k): p for k, p in (nib.packed.items() if nib else ())},
            "mapped": [[t, list(learn.shape[t])] for t in learn.segs], "generated": list(learn.odd),
            "raw": [[t, list(learn.raw[t][0]), learn.raw[t][1]] for t in raw],
            "kv": _kv_values(writer)}


def main(argv: list[str]) -> int:
    return serve(argv, run)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
