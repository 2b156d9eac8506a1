"""The derived conversion, run in a child process: llama.cpp's converter class plans, we write.

``python -m ckpt_surgeon.conversion.derived.child REQUEST.json`` (written by :mod:`.run`).  The
child puts llama.cpp's ``gguf-py`` and ``conversion/`` first on ``sys.path`` (its ``gguf`` is not
the installed one, so it never shares a process with ours), picks the converter class llama.cpp's
``convert_hf_to_gguf.py`` would pick for the folder, and runs the class's own planning:
``prepare_tensors`` (``modify_tensors``: names, permutations, splits, stacking, type choice per
tensor) and ``prepare_metadata`` (``set_gguf_parameters``, ``set_vocab``).  Three hooks replace
what the class delegates, so the class's decisions are kept and only the machinery is ours:

* **reader**: ``ModelBase.index_tensors`` gives the class lazy tensors read through our
  :class:`~ckpt_surgeon.checkpoint.Checkpoint` (validated headers; stored bytes), in llama.cpp's
  order (files by name, tensors by name within a file);
* **quantizer**: ``gguf.quants.quantize(data, qtype)`` returns a deferred value of the same
  dtype, shape and size for F32 / F16 / BF16 / Q8_0, encoded at write time by our kernels
  (:func:`~ckpt_surgeon.formats.quantize.encode_rows`, byte-identical to gguf-py's); any other
  type goes to gguf-py's own function;
* **writer**: the class's own ``write()`` runs (base ``ModelBase.write``, or a class's override:
  Mistral3Model hands it to the inner model it delegates to), but ``GGUFWriter``'s file steps only
  record which writer was written; that writer's key-values and tensor infos are the plan, laid out
  by :mod:`ckpt_surgeon.formats.write.gguf` and written tensor by tensor.  A ``write()`` that would
  write more than one file (BertModel's LoRA adapters) is refused.

The one place the class's answer may be replaced: ``get_vocab_base_pre`` names a BPE
pre-tokenizer by hashing a known Hub tokenizer's ids; for a tokenizer it does not know it
refuses, and we name it from the pre-tokenizer transformers runs (the native path's rule), with
a warning in the report.  A k-quant ``dtype`` runs the class at ``f32`` (what llama-quantize reads)
and retypes the plan with llama.cpp's mixture (:mod:`..quant_plan`).
"""
from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import numpy as np

_FTYPES = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16", "q8_0": "MOSTLY_Q8_0"}
_OURS = ("F32", "F16", "BF16", "Q8_0")


class Deferred:
    """What ``gguf.quants.quantize`` would return, not computed yet: ``dtype``, ``shape`` and
    ``nbytes`` as gguf-py's result has them (bytes for the block types), ``source`` the lazy input."""

    def __init__(self, source, qtype_name: str, shape: tuple, dtype, nbytes: int):
        self.source, self.qtype_name, self.shape, self.dtype, self.nbytes = source, qtype_name, shape, dtype, nbytes

    def byteswap(self, inplace=False):   # only for big-endian output, which the derived path refuses
        raise NotImplementedError("big-endian output")


def _import_llamacpp(root: Path):
    sys.path[:0] = [str(root / "gguf-py"), str(root)]
    os.environ["NO_LOCAL_GGUF"] = "1"
    import gguf
    if not os.path.abspath(gguf.__file__).startswith(os.path.abspath(root)):
        raise RuntimeError(f"imported gguf from {gguf.__file__}, not from {root}/gguf-py")
    import conversion
    return gguf, conversion


def guard_remote_code(allowed: bool, who: str, folder: Path) -> None:
    """transformers runs a model folder's own Python (the modules an ``auto_map`` in its config names) only
    through ``dynamic_module_utils.get_cached_module_file`` and ``get_class_in_module``; some of llama.cpp's
    classes ask it to (``AutoTokenizer.from_pretrained(dir, trust_remote_code=True)`` in the set_vocab of
    DeepSeek-V3's for Kimi-K2, GLM-4's, Kimi-Linear's, Hunyuan's ...).  Unless ``allowed`` both refuse, naming
    the module, before any of its code is copied or imported: converting a folder runs no code from it, as
    reading a pickle needs --allow-pickle.  A folder that names no module is read as before (transformers
    never reaches them), so the file is llama.cpp's converter's either way."""
    if allowed:
        return
    from transformers import dynamic_module_utils as dmu

    from ...errors import RemoteCodeRefusedError

    def refuse(what: str):
        raise RemoteCodeRefusedError(f"llama.cpp's {who} would run Python shipped with the model ({what}, named by "
                                     "an auto_map in its config); convert runs no code from a model folder",
                                     path=str(folder), hint="pass --trust-remote-code to run it, as "
                                     "convert_hf_to_gguf.py does")

    dmu.get_cached_module_file = lambda repo, module_file, *a, **k: refuse(str(module_file))
    dmu.get_class_in_module = lambda class_name, module_path, *a, **k: refuse(f"{module_path}: {class_name}")


def _hook_quantize(gguf) -> None:
    original = gguf.quants.quantize
    sizes = gguf.GGML_QUANT_SIZES

    def quantize(data, qtype):
        name = gguf.GGMLQuantizationType(qtype).name
        if name not in _OURS:
            return original(data, qtype)
        shape = tuple(data.shape)
        if name in ("F32", "F16"):
            dt = np.dtype(np.float32 if name == "F32" else np.float16)
            return Deferred(data, name, shape, dt, int(np.prod(shape, dtype=np.int64)) * dt.itemsize)
        block, size = sizes[qtype]
        if shape[-1] % block:
            raise gguf.QuantError(f"Quantized tensor row size ({shape[-1]}) is not a multiple of {name} block "
                                  f"size ({block})")
        byte_shape = (*shape[:-1], shape[-1] // block * size)
        return Deferred(data, name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape, dtype=np.int64)))

    gguf.quants.quantize = quantize


class StoredReader:
    """The folder's stored tensors as llama.cpp's class reads them (``load``: one whole tensor, the function of
    the lazy leaves), and rows of one (``rows``: what :class:`.lazy_eval.RowChain` reads a slab with)."""

    def __init__(self, src: Path, dtypes: dict):
        from ...checkpoint import open_stored
        self._ck = open_stored(src)     # as stored: the class applies the checkpoint's quantization (FP8, MXFP4 ...)
        self.infos, self._dtypes = self._ck.stored_tensors, dtypes
        self.load = self._load          # one bound object: lazy leaves are recognised by it

    def _tensor(self, raw: np.ndarray, name: str, shape: tuple):
        import torch
        return torch.frombuffer(raw, dtype=torch.uint8).view(self._dtypes[self.infos[name].dtype]).reshape(shape)

    def _load(self, name: str):
        import torch
        info = self.infos[name]
        n = info.end - info.start
        if not n:
            return torch.empty(info.shape, dtype=self._dtypes[info.dtype])
        # read straight into the tensor's own buffer (np.empty: not zero-filled first, as bytearray(n) is)
        raw = np.empty(n, np.uint8)
        self._ck.read_raw_into(name, raw)
        return self._tensor(raw, name, tuple(info.shape))

    def rows(self, name: str, start: int, stop: int):
        info = self.infos[name]
        raw = np.empty((info.end - info.start) // info.shape[0] * (stop - start), np.uint8)
        self._ck.read_rows_into(name, start, stop, raw)
        return self._tensor(raw, name, (stop - start, *info.shape[1:]))


def _hook_reader(base, src: Path) -> StoredReader:
    """Every class's ``index_tensors`` (theirs call ``super()``) reads through our Checkpoint."""
    lazy_cls = base.LazyTorchTensor
    reader = StoredReader(src, lazy_cls._dtype_str_map)
    infos, load = reader.infos, reader.load

    def index_tensors(self, remote_hf_model_id=None):
        out = {}
        for name in sorted(infos, key=lambda n: (os.path.basename(infos[n].file), n)):
            info = infos[name]
            if info.dtype not in lazy_cls._dtype_str_map:
                raise ValueError(f"tensor {name!r}: safetensors dtype {info.dtype} is not read by llama.cpp's converter")
            dt = lazy_cls._dtype_str_map[info.dtype]
            gen = (lambda n=name, d=dt, s=tuple(info.shape): lazy_cls(
                meta=lazy_cls.meta_with_dtype_and_shape(d, s), args=(n,), func=load)) if self.lazy else \
                (lambda n=name: load(n))
            if item := self.filter_tensors((name, gen)):
                out[item[0]] = item[1]
        return out

    base.ModelBase.index_tensors = index_tensors
    return reader


def _hook_pre(base, warnings: list) -> None:
    original = base.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer):
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            from ..tokenizer.pretokenizers import pre_name_for_json
            pre = pre_name_for_json(json.loads(tokenizer.backend_tokenizer.to_str()))
            if pre is None:
                raise
            warnings.append(f"tokenizer.ggml.pre {pre!r}: llama.cpp's converter does not know this tokenizer's hash "
                            "(it would refuse); named from the pre-tokenizer transformers runs")
            return pre

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre


def _hook_sources(cls, sources: dict) -> None:
    """Remember, for each GGUF tensor, the HF tensor whose ``modify_tensors`` call produced it."""
    original = cls.modify_tensors

    def modify_tensors(self, data_torch, name, bid):
        for new_name, data in original(self, data_torch, name, bid):
            sources.setdefault(new_name, name)
            yield new_name, data

    cls.modify_tensors = modify_tensors


_ORIGINAL_QUANTIZE = []


def _eager(gguf, t):
    return gguf.LazyNumpyTensor.to_eager(t) if isinstance(t, gguf.LazyBase) else np.asarray(t)


def _kvs(gguf, writer) -> list:
    """The class's key-values, in its order, as our writer's records."""
    from ...formats.write import gguf as gw
    out = []
    for key, val in writer.kv_data[0].items():
        vtype, value, item = int(val.type), val.value, None
        if vtype == gw.VT.ARRAY:
            if isinstance(value, (bytes, bytearray)):
                item, value = int(gw.VT.UINT8), list(value)
            else:
                item = int(val.sub_type) if val.sub_type is not None else int(gguf.GGUFValueType.get_type(value[0]))
        out.append(gw.KV(key, vtype, value, item))
    return out


# bytes of float32 input encoded at a time (the environment variable: tests make it small, to cut tiny tensors)
_PIECE = int(os.environ.get("CKPT_SURGEON_DERIVED_PIECE", 64 << 20))


def _pieces(arr: np.ndarray, qtype_name: str, imatrix=None, first: int = 0):
    """``arr``'s rows encoded as ``qtype_name``, ~64 MiB of input at a time: the same bytes as encoding it at
    once (every ggml type encodes each row on its own), without a second whole-tensor buffer.  ``first``: the
    index of ``arr``'s first expert in its tensor, for a 3-D slab (an importance matrix may hold one per expert)."""
    from ...formats.quant.quantize import encode_rows
    if qtype_name == "F16" and arr.dtype == np.float16 or qtype_name == "F32" and arr.dtype == np.float32:
        yield np.ascontiguousarray(arr).reshape(-1)
        return
    arr = arr if arr.dtype in (np.float32, np.float16) else arr.astype(np.float32)
    if arr.ndim > 2:        # stacked experts: whole experts a piece (an importance matrix may hold one per expert)
        step = max(1, _PIECE // max(1, arr[0].size * 4))
        for e in range(0, arr.shape[0], step):
            yield encode_rows(arr[e:e + step], qtype_name, imatrix, first=first + e)
        return
    rows = arr.reshape(-1, arr.shape[-1]) if arr.ndim > 1 else arr.reshape(1, -1)
    step = max(1, _PIECE // max(1, rows.shape[1] * 4))
    for i in range(0, rows.shape[0], step):
        yield encode_rows(rows[i:i + step], qtype_name, imatrix)


def _tensor_pieces(gguf, ti, value):
    """One tensor's file bytes, as pieces in order: ours for the deferred float / Q8_0 encodings (``value()``:
    its evaluated source), else gguf-py's value."""
    t = ti.tensor
    if isinstance(t, Deferred):
        yield from _pieces(np.asarray(value()), t.qtype_name)
        return
    real = _ORIGINAL_QUANTIZE[0]
    hooked, gguf.quants.quantize = gguf.quants.quantize, real     # chunked tensors quantize while written
    try:
        if isinstance(t, gguf.LazyChunkedTensor):
            import io
            buf = io.BytesIO()
            t.tofile(buf)
            out = np.frombuffer(buf.getvalue(), np.uint8)
        else:
            out = np.ascontiguousarray(_eager(gguf, t))
    finally:
        gguf.quants.quantize = hooked
    yield out


def counted(pieces, nbytes: int, name: str):
    """``pieces`` as byte views, checked to add up to the planned ``nbytes``."""
    total = 0
    for p in pieces:
        mv = memoryview(p).cast("B")
        total += mv.nbytes
        if total > nbytes:
            break
        yield mv
    if total != nbytes:
        raise ValueError(f"tensor {name!r} gives {'more than ' if total > nbytes else ''}{total} bytes, "
                         f"its info says {nbytes}")


def _write(gguf, writer, out_path: Path, kvs: list, slots: list, encode) -> list[str]:
    """The file through our layout: header block, then each tensor at its offset (one at a time)."""
    from ...formats.write import gguf as gw
    from ...formats.write.shard_io import pwrite_all
    lay = gw.layout(gw.encode_kvs(kvs), len(kvs), slots, alignment=writer.data_alignment)
    fd = os.open(out_path, os.O_RDWR)
    try:
        pwrite_all(fd, lay.head, 0)
        gw.write_padding(fd, lay, [s.nbytes for s in slots])
        for slot, off in zip(slots, lay.offsets):
            for piece in encode(slot):      # written as encoded: no whole-tensor output buffer
                pwrite_all(fd, piece, off)
                off += piece.nbytes
            piece = None    # not alive beside the next tensor's work
        os.ftruncate(fd, lay.end)
        os.fsync(fd)
    finally:
        os.close(fd)
    return [str(out_path)]


def _write_split(req: dict, writer, kvs: list, slots: list, encode, warnings: list) -> list[str]:
    """``--split-max-size`` / ``--split-max-tensors``: the plan through our splitter (:mod:`.split_write`)."""
    from ...formats.quant import ggml_types as GT
    from ...formats.write import gguf as gw
    from .split_write import PlannedTensor, write_split_set
    by_name = {s.name: s for s in slots}
    plan = [PlannedTensor(s.name, tuple(s.shape), GT.ggml_type(s.type_id).name, s.nbytes) for s in slots]
    files = write_split_set(Path(req["output"]), gw.encode_kvs(kvs), len(kvs), plan, lambda n: encode(by_name[n]),
                            max_size=req["split"]["max_size"], max_tensors=req["split"]["max_tensors"],
                            small_first=bool(req["split"].get("small_first")),
                            alignment=writer.data_alignment, architecture=writer.arch, inputs=req["inputs"],
                            warnings=warnings)
    return [str(f) for f in files]


def _model(gguf, conversion, req: dict, warnings: list, sources: dict, feed, vocab_only: bool = False):
    import torch
    from conversion import base
    folder = Path(req["source"])
    hparams = base.ModelBase.load_hparams(folder, False)
    kind = base.ModelType.MMPROJ if req.get("mmproj") else base.ModelType.TEXT
    arch_name = base.get_model_architecture(hparams, kind)
    cls = conversion.get_model_class(arch_name, mmproj=bool(req.get("mmproj")))
    feed.phase(f"llama.cpp's {cls.__name__} plans the tensors and metadata")
    guard_remote_code(bool(req.get("trust_remote_code")), cls.__name__, folder)
    _ORIGINAL_QUANTIZE.append(gguf.quants.quantize)
    _hook_quantize(gguf)
    if vocab_only:      # the tokenizer needs no tensor (set_vocab reads none; the ftype is given): none indexed,
        #                 so a folder of side files only (a Hub repo's, fetched without its weights) plans too
        base.ModelBase.index_tensors = lambda self, remote_hf_model_id=None: {}
        reader = None
    else:
        reader = _hook_reader(base, folder)
    _hook_pre(base, warnings)
    _hook_sources(cls, sources)
    written = _hook_writer(gguf)
    ftype = gguf.LlamaFileType[_FTYPES[req["base_dtype"]]]
    with torch.inference_mode():
        model = cls(folder, ftype, Path(req["output"]), model_name=req.get("name"))
        for inner in _inner_models(base, model, cls):      # a class that delegates (Mistral3Model.impl)
            _hook_sources(type(inner), sources)
        if vocab_only:      # convert_hf_to_gguf.py --vocab-only: set_gguf_parameters and set_vocab, no tensors
            model.write_vocab()
        else:
            model.write()       # the class's own write(): its writers only record that they were written
    if len(written) != 1:
        raise NotImplementedError(f"{cls.__name__}.write() wrote {len(written)} GGUF files (LoRA adapters beside the "
                                  "model ...); the derived path writes one file")
    writer = written[0]
    if len(writer.tensors) != 1:
        raise ValueError("the class planned several shards")
    return arch_name, cls, writer, reader


def _hook_writer(gguf) -> list:
    """``GGUFWriter``'s file output, replaced: ``write_header_to_file`` records the writer and writes
    nothing; the key-value / tensor / close steps after it do nothing.  The class's ``write()`` then runs
    as llama.cpp runs it (base ``ModelBase.write``: ``prepare_tensors``, ``prepare_metadata``; a class's
    own ``write()`` whatever it calls), and the recorded writers are the files it would have written."""
    written = []
    cls = gguf.GGUFWriter

    def write_header_to_file(self, path=None):
        if any(w is self for w in written):
            raise ValueError("a GGUF writer was written twice")
        written.append(self)

    cls.write_header_to_file = write_header_to_file
    cls.write_kv_data_to_file = lambda self: None
    cls.write_tensors_to_file = lambda self, *, progress=False: None
    cls.close = lambda self: None
    return written


def _inner_models(base, model, cls) -> list:
    """Model objects the class holds and may delegate its planning to (their tensors' HF names are kept too)."""
    return [v for v in vars(model).values() if isinstance(v, base.ModelBase) and not isinstance(v, cls)]


def _first(v):
    return int(v[0]) if isinstance(v, (list, tuple)) else int(v)


def _refuse_requantize(gguf, slots: list, types: dict, req: dict) -> None:
    """A tensor the class keeps in the source's own quantization (gpt-oss's MXFP4 experts) that the
    mixture would retype: llama-quantize refuses it on llama.cpp's f32 file ("requantizing from type
    mxfp4 is disabled"), and so does this path, in one line."""
    from ...errors import RefusedError
    for s in slots:
        have = gguf.GGMLQuantizationType(s.type_id).name
        if have not in ("F32", "F16", "BF16") and types[s.name].ggml_type != have:
            raise RefusedError(f"llama.cpp's converter keeps this tensor {have} (the source's own quantization); "
                               f"--dtype {req['dtype']} would quantize it again as {types[s.name].ggml_type}, which "
                               f"llama-quantize refuses (requantizing from type {have.lower()} is disabled)",
                               path=req["source"], tensor=s.name,
                               hint="convert at f32, f16, bf16 or q8_0 to keep it as the source has it")


def _kquant(gguf, writer, kvs: list, slots: list, req: dict, warnings: list):
    """Retype the F32 plan as llama-quantize would retype llama.cpp's F32 file (``req["dtype"]``)."""
    from dataclasses import replace
    from ...formats.write import gguf as gw
    from ...formats.quant.ggml_types import nbytes as ggml_nbytes
    from ..quant_plan import file_type_name, ggml_shape, mixture
    arch = writer.arch
    kv = {k.key: k.value for k in kvs}
    if f"{arch}.block_count" not in kv:
        raise ValueError(f"--dtype {req['dtype']}: llama.cpp's mixture needs {arch}.block_count, which this file lacks")
    # llama.cpp's hparams as llama-quantize loads them: layer 0's head counts, 0 when absent or attention-free
    # (a Mamba model; a hybrid whose layer 0 is recurrent: n_gqa() is then 0), kv heads defaulting to heads
    n_head = _first(kv.get(f"{arch}.attention.head_count", 0))
    hp = {"n_layer": _first(kv[f"{arch}.block_count"]), "n_head": n_head,
          "n_head_kv": _first(kv.get(f"{arch}.attention.head_count_kv", n_head)),
          "n_expert": _first(kv.get(f"{arch}.expert_count", 0))}
    types, weights = mixture([(s.name, tuple(s.shape), gguf.GGMLQuantizationType(s.type_id).name) for s in slots],
                             req["dtype"], arch, hp, req.get("imatrix"), req["source"])
    _refuse_requantize(gguf, slots, types, req)
    fell = [s.name for s in slots if types[s.name].fell_back]
    if fell:
        warnings.append(f"{len(fell)} tensor(s) fall back as llama.cpp does: {', '.join(fell[:4])}")
    ftype = int(gguf.LlamaFileType[file_type_name(req["dtype"])])
    kvs = [replace(k, value=ftype) if k.key == "general.file_type" else k for k in kvs]
    if "general.file_type" not in kv:
        kvs.append(gw.KV("general.file_type", gw.VT.UINT32, ftype))
    out = []
    for s in slots:
        t = types[s.name].ggml_type
        shape = ggml_shape(s.shape)
        out.append(gw.Slot(s.name, shape, gguf.GGMLQuantizationType[t].value, ggml_nbytes(t, shape)))
    return kvs, out, {s.name: weights.get(s.name) for s in slots}


def run(req: dict) -> dict:
    warnings: list[str] = []
    sources: dict[str, str] = {}
    gguf, conversion = _import_llamacpp(Path(req["llamacpp"]))
    from ...formats.write import gguf as gw
    from .feed import Feed
    feed = Feed(req.get("progress"))
    arch_name, cls, writer, reader = _model(gguf, conversion, req, warnings, sources, feed)
    stored = reader.infos
    infos = writer.tensors[0]
    kvs = _kvs(gguf, writer)
    slots = [gw.Slot(n, tuple(int(d) for d in ti.shape), int(ti.dtype), int(ti.nbytes)) for n, ti in infos.items()]
    imatrix = {}
    if req["dtype"] != req["base_dtype"]:
        kvs, slots, imatrix = _kquant(gguf, writer, kvs, slots, req, warnings)
    by_name = dict(infos)
    from .lazy_eval import Evaluator
    # every output counted, those gguf-py's own code writes too (they may share a node with ours)
    ev = Evaluator(gguf.LazyBase, {n: ti.tensor.source if isinstance(ti.tensor, Deferred) else ti.tensor
                                   for n, ti in infos.items()})

    def encode_one(slot):
        ti = by_name[slot.name]
        qtype = gguf.GGMLQuantizationType(slot.type_id).name
        if isinstance(ti.tensor, Deferred) and (chain := ev.row_chain(ti.tensor.source, reader.load)) and \
                (slot.type_id == int(ti.dtype) or chain.shape == tuple(slot.shape)):
            for first, slab in chain.slabs(reader.rows, _PIECE):     # element-wise casts: a slab at a time
                yield from _pieces(np.asarray(slab), qtype, imatrix.get(slot.name), first)
            return
        value = lambda: ev.eager(slot.name, ti.tensor.source)     # noqa: E731
        if slot.type_id == int(ti.dtype):
            yield from _tensor_pieces(gguf, ti, value)
            return
        arr = np.asarray(value()).astype(np.float32, copy=False).reshape(slot.shape)
        yield from _pieces(arr, qtype, imatrix.get(slot.name))

    def encode(slot):
        """The slot's bytes as checked pieces; once they are all out, the tensor is dropped: its lazy
        chain would keep each node's evaluated data (gguf-py's LazyBase), and llama.cpp's own writer pops each
        tensor as it writes it; memory is then one tensor's work at a time, not the model's."""
        yield from counted(encode_one(slot), slot.nbytes, slot.name)
        ev.release(slot.name)
        by_name.pop(slot.name).tensor = None
        infos.pop(slot.name, None)
        feed.done(slot.nbytes)

    feed.total(sum(s.nbytes for s in slots), len(slots))

    files = _write_split(req, writer, kvs, slots, encode, warnings) if req.get("split") else \
        _write(gguf, writer, Path(req["output"]), kvs, slots, encode)
    return {"hf_architecture": arch_name, "converter_class": f"{cls.__module__}.{cls.__name__}",
            "gguf_arch": writer.arch, "warnings": warnings, "files": files,
            "tensors": [{"target": s.name, "source": sources.get(s.name, ""),
                         "source_dtype": getattr(stored.get(sources.get(s.name, "")), "dtype", None),
                         "type": gguf.GGMLQuantizationType(s.type_id).name,
                         "shape": list(s.shape), "nbytes": s.nbytes} for s in slots],
            "kv": {k.key: (k.value if k.vtype != gw.VT.ARRAY else f"[{len(k.value)}]") for k in kvs
                   if not k.key.startswith("tokenizer.ggml.") or k.key == "tokenizer.ggml.model"}}


def _plain(k) -> object:
    """A planned key-value's value as the file would hold it, in JSON's types: packed by its GGUF type as the
    writer packs it (a BOOL the class gave as None is written false: Ernie's ``add_prefix_space: null``), a
    string as our GGUF reader decodes one (UTF-8, invalid bytes kept)."""
    from ...formats.write import gguf as gw

    def one(v, vtype):
        if vtype == gw.VT.STRING:
            return bytes(v).decode("utf-8", "surrogateescape") if isinstance(v, (bytes, bytearray)) else str(v)
        if vtype == gw.VT.BOOL:
            return bool(v)
        return np.asarray(v, dtype=gw._NUMPY[vtype]).item()
    if k.vtype != gw.VT.ARRAY:
        return one(k.value, k.vtype)
    if k.item_type in (gw.VT.STRING, gw.VT.BOOL):
        return [one(v, k.item_type) for v in k.value]
    return np.asarray(k.value, dtype=gw._NUMPY[k.item_type]).tolist()


def run_vocab(req: dict) -> dict:
    """``convert_hf_to_gguf.py --vocab-only``'s metadata without a file: the class's ``write_vocab()`` runs
    (its ``set_gguf_parameters`` and ``set_vocab``), and the ``tokenizer.*`` key-values it planned come back
    with their values (the tokenizer llama.cpp's converter writes for the folder)."""
    warnings: list[str] = []
    gguf, conversion = _import_llamacpp(Path(req["llamacpp"]))
    from .feed import Feed
    arch_name, cls, writer, _ = _model(gguf, conversion, req, warnings, {}, Feed(None), vocab_only=True)
    return {"hf_architecture": arch_name, "converter_class": f"{cls.__module__}.{cls.__name__}",
            "gguf_arch": writer.arch, "warnings": warnings,
            "kv": {k.key: _plain(k) for k in _kvs(gguf, writer) if k.key.startswith("tokenizer.")}}


def main(argv: list[str]) -> int:
    req = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    return serve(argv, run_vocab if req.get("vocab_only") else run)


def error_line(e: BaseException) -> str:
    """One line for an exception the class raised: its type and message; where the message says nothing
    (a bare ``assert``, llama.cpp's usual check of a config or tensor), the statement that stopped it and
    where (``AssertionError at qwen.py:212: assert self.hparams[...] ...``)."""
    msg, frames = str(e).strip(), traceback.extract_tb(e.__traceback__)
    if not msg and frames:
        f = frames[-1]
        line = f"{type(e).__name__} at {Path(f.filename).name}:{f.lineno}" + (f": {f.line.strip()}" if f.line else "")
    else:
        line = f"{type(e).__name__}: {msg}".strip()
    return line.splitlines()[0][:600]


def serve(argv: list[str], run) -> int:
    """A child's main: ``run`` the request ``argv[1]`` names, its result or its error (one line, the
    traceback beside; a ``CkptError`` of ours with its fields) written to the request's ``report``."""
    req = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    import logging
    logging.basicConfig(level=logging.WARNING)
    try:
        result = run(req)
        code = 0
    except Exception as e:          # noqa: BLE001 -- the parent turns it into one typed error line
        result = {"error": error_line(e), "traceback": traceback.format_exc()[-4000:]}
        from ...errors import CkptError
        if isinstance(e, CkptError):    # ours (the writer's), not llama.cpp's: raised again as it is
            result["ours"] = {"class": type(e).__name__, "detail": e.detail, "path": e.path, "tensor": e.tensor,
                              "hint": e.hint}
        code = 3
    Path(req["report"]).write_text(json.dumps(result, default=str), encoding="utf-8")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
