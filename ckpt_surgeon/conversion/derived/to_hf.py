"""GGUF -> HF for architectures outside the native registry: the inverse of llama.cpp's converter
class, learned by running the class forward on probes (:mod:`.probe_child`), never retyped.

The config is not guessed: llama.cpp's ``set_gguf_parameters`` writes a lossy subset of
config.json, so the caller gives the original config (``--config``: the config.json, or the folder
holding it).  It is *checked*, not trusted: the class run on that config must produce exactly the
GGUF's ``{arch}.*`` key-values and its tensor names and shapes, else one line names the first
difference.  The weights are then gathered back by the learned map (each GGUF element to the HF
element it came from), the gathered tensors are mapped forward again and compared with the GGUF's
bit for bit (the round trip, on the real data; a tensor the class only casts is copied a slab of rows at a
time, and maps forward to itself), and the folder is written atomically with
the given config.json and the tokenizer files rebuilt from ``tokenizer.ggml.*``.  A tensor the class takes in a
release's own form (integers; DeepSeek-V4's FP4 experts, whose bits it moves into ggml blocks: :mod:`.packed`) is
gathered and written in that form, its dtype its own, not ``--dtype``.
docs/architecture.md ("convert: GGUF -> HF of a derived architecture") gives the reasoning.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ...errors import ConfigError, FormatError, UnsupportedError
from ..report import ConvertReport, TensorRecord
from .source import converter_root, llamacpp_version
from .spawn import run_module

__all__ = ["derived_gguf_to_hf_report", "gguf_needs_derived", "learned_inverse"]

_ST_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


def gguf_needs_derived(path) -> bool:
    """True when the native registry has no HF mapping for this GGUF file's architecture."""
    from ...checkpoint import open_checkpoint
    from .. import names as N
    with open_checkpoint(path) as ck:
        if ck.naming != "gguf":
            return False
        meta = ck.metadata
        return N.by_gguf_arch(ck.gguf_arch or meta.get("general.architecture"), meta) is None


def _read_config(config, src: Path, arch: str) -> dict:
    if config is None:
        raise UnsupportedError(f"GGUF architecture {arch!r} converts back through llama.cpp's converter class, and its "
                               "metadata is a lossy subset of config.json: pass the original config "
                               "(--config CONFIG.json or the HF folder holding it); it is checked against the file",
                               path=str(src))
    from ...formats.safe_input import read_json
    p = Path(config)
    p = p / "config.json" if p.is_dir() else p
    if not p.is_file():
        raise ConfigError("no config.json here", path=str(p))
    cfg = read_json(p)
    if not isinstance(cfg, dict) or not cfg.get("model_type"):
        raise ConfigError("config.json names no model_type", path=str(p))
    return cfg


def _probe(cfg: dict, tmp: Path, ck, src: Path, allow_dropped: bool = False) -> tuple[dict, dict]:
    """Run :mod:`.probe_child` on ``cfg`` (beside it the tokenizer files rebuilt from the file, which
    some classes read while planning tensors) -> (its report, its map arrays)."""
    from ..from_gguf import write_hf_tokenizer
    folder = tmp / "probe"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    write_hf_tokenizer(ck, cfg, folder)
    result = _probe_run(tmp, folder, src, allow_dropped=allow_dropped)
    if "error" in result and _nextn_layers(ck):
        # the class stopped, and the file holds a multi-token-prediction block, whose HF names transformers does not
        # know: the class's own no-MTP mode (convert_hf_to_gguf.py --no-mtp) says whether the rest inverts at all
        rest = _probe_run(tmp, folder, src, no_mtp=True)
        if rest.get("refusal"):
            raise UnsupportedError(f"not invertible: {rest['refusal']} (probed without the file's multi-token-"
                                   "prediction block, whose HF names transformers does not know)", path=str(src))
    if "error" in result:
        if os.environ.get("CKPT_SURGEON_DEBUG"):
            sys.stderr.write(result.get("traceback", ""))
        raise UnsupportedError(f"llama.cpp's converter stopped on this config: {result['error']}{_nextn_note(ck)}",
                               path=str(src))
    if result["refusal"]:
        raise UnsupportedError(f"not invertible: {result['refusal']}", path=str(src))
    with np.load(tmp / "maps.npz") as z:
        arrays = {k: z[k] for k in z.files}
    return result, arrays


def _probe_run(tmp: Path, folder: Path, src: Path, no_mtp: bool = False, allow_dropped: bool = False) -> dict:
    """One run of :mod:`.probe_child` on ``folder`` (``no_mtp``: the class's ``no_mtp`` mode) -> its report."""
    req = {"folder": str(folder), "llamacpp": str(converter_root()), "maps": str(tmp / "maps.npz"),
           "report": str(tmp / "report.json"), "no_mtp": no_mtp, "allow_dropped": allow_dropped}
    (tmp / "request.json").write_text(json.dumps(req), encoding="utf-8")
    rep = Path(req["report"])
    rep.unlink(missing_ok=True)
    r = run_module("ckpt_surgeon.conversion.derived.probe_child", tmp / "request.json")
    if not rep.is_file():
        tail = (r.stderr or r.stdout).strip().splitlines()
        raise UnsupportedError(f"the probe of llama.cpp's converter ended without a report (rc {r.returncode}): "
                               f"{tail[-1] if tail else ''}", path=str(src))
    return json.loads(rep.read_text(encoding="utf-8"))


def _nextn_layers(ck) -> int:
    arch = ck.metadata.get("general.architecture")
    return int(ck.metadata.get(f"{arch}.nextn_predict_layers") or 0)


def _nextn_note(ck) -> str:
    """Where the file holds multi-token-prediction layers (llama.cpp's NextN: the HF checkpoint's ``mtp.*`` block,
    which transformers' classes do not build, so the probe, whose HF side is transformers' model, has no tensors
    for them), what the class's stop most likely means."""
    arch, n = ck.metadata.get("general.architecture"), _nextn_layers(ck)
    if not n:
        return ""
    return (f"; the file holds {n} multi-token-prediction layer(s) ({arch}.nextn_predict_layers), the checkpoint's "
            "mtp.* block, which transformers' class for this config does not build: there are no HF tensors to "
            "give them back to")


def _same_value(a, b) -> bool:
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        a, b = list(a) if isinstance(a, (list, tuple)) else [a], list(b) if isinstance(b, (list, tuple)) else [b]
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return np.float32(a) == np.float32(b)
    return a == b


def _check_metadata(meta: dict, result: dict, src: Path) -> None:
    """The class's ``{arch}.*`` key-values for the given config equal the file's (both ways)."""
    arch = result["gguf_arch"]
    if meta.get("general.architecture") != arch:
        raise ConfigError(f"this config converts to GGUF architecture {arch!r}, the file is "
                          f"{meta.get('general.architecture')!r}: not the config the file was made from", path=str(src))
    want = {k: v for k, v in result["kv"].items() if k.startswith(arch + ".")}
    have = {k: v for k, v in meta.items() if k.startswith(arch + ".")}
    for key in sorted(set(want) | set(have)):
        if key not in have or key not in want or not _same_value(have[key], want[key]):
            raise ConfigError(f"metadata {key}: the file has {have.get(key)!r}, the given config gives "
                              f"{want.get(key)!r}: not the config the file was made from", path=str(src))


def _check_tensors(ck, result: dict, arrays: dict, src: Path) -> None:
    """The file's tensor names and shapes are the class's plan for this config; generated tensors
    (no HF source: rope factors from the config) hold the values the class computes."""
    plan = {t: tuple(s) for t, s in result["mapped"]}
    for i, t in enumerate(result["generated"]):
        plan[t] = tuple(arrays[f"gen{i}"].shape)
    for t, shape, qtype in result["raw"]:       # ggml blocks the class writes from a release's packed tensors
        plan[t] = tuple(shape)
        if t in ck.tensors and ck.tensors[t].dtype != qtype:
            raise FormatError(f"stored as {ck.tensors[t].dtype}: llama.cpp's converter writes it as {qtype} (the "
                              "release's packed bits, moved), so this file was quantized again and cannot give the "
                              "release's tensors back", path=str(src), tensor=t)
    have = {n: tuple(i.shape) for n, i in ck.tensors.items()}
    for name in sorted(set(plan) | set(have)):
        if name not in have:
            raise FormatError("missing: llama.cpp's converter writes it for the given config", path=str(src),
                              tensor=name)
        if name not in plan:
            raise FormatError("llama.cpp's converter writes no such tensor for the given config", path=str(src),
                              tensor=name)
        if int(np.prod(have[name])) != int(np.prod(plan[name])) or have[name] != plan[name][-len(have[name]):]:
            raise FormatError(f"shape {list(have[name])}, the given config gives {list(plan[name])}", path=str(src),
                              tensor=name)
    for i, t in enumerate(result["generated"]):
        if not np.array_equal(ck.read(t).astype(np.float32).ravel(), arrays[f"gen{i}"].ravel()):
            raise ConfigError("generated from the config by llama.cpp's converter, with other values than the "
                              "given config gives: not the config the file was made from", path=str(src), tensor=t)


class _Gather:
    """HF tensors gathered back from the file by the learned map (:mod:`.probe_child`'s segments), one
    *group* at a time: the HF and GGUF tensors the map connects (a tensor and its copy; a fused QKV and its
    three parts; a layer's experts and their stack).  Each HF element comes from the GGUF element the map
    names; then the group's GGUF tensors are mapped forward again from the gathered tensors and compared
    with the file bit for bit (the round trip on the real data).  Memory is the largest group, not the model."""

    def __init__(self, ck, result: dict, arrays: dict, src: Path):
        self.ck, self.src = ck, src
        self.hf = [(n, tuple(s)) for n, s, _stored in result["hf"]]
        # HF tensors stored in a dtype of their own, not the --dtype: integers (a routing table) and a release's
        # packed form (their bits gathered a nibble at a time: :mod:`.packed`)
        self.stored = {k: st for k, (_n, _s, st) in enumerate(result["hf"], 1) if st}
        self.per_block = {int(k): v for k, v in result["per_block"].items()}
        self.segs = {t: arrays[f"seg{i}"] for i, (t, _s) in enumerate(result["mapped"])}
        self.raw = {t: arrays[f"raw{i}"] for i, (t, _s, _q) in enumerate(result["raw"])}
        parent = list(range(len(self.hf) + 1))

        def root(a):
            while parent[a] != a:
                parent[a] = parent[parent[a]]
                a = parent[a]
            return a
        self.sources = {t: [int(k) for k in np.unique(seg[:, 1])] for t, seg in self.segs.items()}
        self.sources.update({t: [int(k) for k in np.unique(rows[:, 2])] for t, rows in self.raw.items()})
        for ks in self.sources.values():
            for k in ks[1:]:
                parent[root(k)] = root(ks[0])
        self._root = {k: root(k) for k in range(1, len(self.hf) + 1)}
        self._members: dict[int, list] = {}
        for k, g in self._root.items():
            self._members.setdefault(g, []).append(k)
        self._targets: dict[int, list] = {}
        for t, ks in self.sources.items():
            self._targets.setdefault(self._root[ks[0]], []).append(t)
        self._ready: dict[int, np.ndarray] = {}
        # groups of one HF tensor copied whole, in its own order, into one GGUF tensor (the class only casts it:
        # the embedding, the MLP matrices): HF id -> that GGUF tensor, streamed a slab of rows at a time
        self.copies = {ks[0]: t for t, ks in self.sources.items()
                       if t in self.segs and ks[0] not in self.stored and len(self.segs[t]) == 1
                       and self.segs[t][0].tolist() == [0, ks[0], 0]
                       and self._targets[self._root[ks[0]]] == [t] and self._members[self._root[ks[0]]] == [ks[0]]
                       and int(np.prod(ck.tensors[t].shape, dtype=np.int64))
                       == int(np.prod(self.hf[ks[0] - 1][1], dtype=np.int64))}

    def slabs(self, k: int):
        """HF tensor ``k`` of :attr:`copies` as float32 slabs of its GGUF tensor's rows (flat order is the same),
        ~64 MiB each (``CKPT_SURGEON_DERIVED_PIECE`` bytes: tests cut tiny tensors): memory is a slab, not the
        tensor; no check to run again (a copy maps forward to itself)."""
        piece_bytes = int(os.environ.get("CKPT_SURGEON_DERIVED_PIECE", 64 << 20))
        t = self.copies[k]
        shape = tuple(self.ck.tensors[t].shape) or (1,)
        per_row = max(1, int(np.prod(shape[1:], dtype=np.int64)))
        step = max(1, piece_bytes // (per_row * 4))
        for a in range(0, shape[0], step):
            yield self.ck.read_rows(t, a, min(a + step, shape[0])).astype(np.float32, copy=False).ravel()

    def source_of(self) -> dict:
        """HF name -> the first GGUF tensor it went to (for the report)."""
        out = {}
        for t, ks in self.sources.items():
            for k in ks:
                out.setdefault(self.hf[k - 1][0], t)
        return out

    def _empty(self, k: int) -> np.ndarray:
        """HF tensor ``k``'s gather buffer: nibbles of its bytes (packed), int64 (integers) or float32 values."""
        numel = int(np.prod(self.hf[k - 1][1], dtype=np.int64))
        if k in self.per_block:
            return np.zeros(2 * numel, np.uint8)
        return np.zeros(numel, np.int64 if k in self.stored else np.float32)

    def _read(self, t: str) -> np.ndarray:
        """GGUF tensor ``t``: ggml blocks as rows of nibbles (``raw``), else its values (int64 or float32)."""
        if t in self.raw:
            from ...formats.quant.ggml_types import block_size, nbytes

            from .packed import nibbles
            qtype = self.ck.tensors[t].dtype
            return nibbles(np.frombuffer(self.ck.read_raw(t), np.uint8)).reshape(
                -1, 2 * nbytes(qtype, (block_size(qtype),)))
        v = self.ck.read(t)
        return v.astype(np.int64 if v.dtype.kind in "iu" else np.float32, copy=False).ravel()

    def _group(self, g: int) -> None:
        from . import packed
        from .probe_child import pairs
        flat = {k: self._empty(k) for k in self._members[g]}
        data = {}
        for t in self._targets.get(g, ()):
            data[t] = vals = self._read(t)
            if t in self.raw:
                packed.scatter(self.raw[t], vals, flat, self.per_block)
                continue
            for k, at, src in pairs(self.segs[t], vals.size):
                flat[k][src] = vals[at]
        for t, vals in data.items():
            if t in self.raw:
                same = np.array_equal(packed.predict(self.raw[t], *vals.shape, flat.__getitem__, self.per_block), vals)
            else:
                same = all(_same(flat[k][src], vals[at]) for k, at, src in pairs(self.segs[t], vals.size))
            if not same:
                raise FormatError("mapped forward again, the gathered HF tensors do not give this tensor back "
                                  "(llama.cpp's converter copies one HF element to several places, and the file's "
                                  "copies differ)", path=str(self.src), tensor=t)
        self._ready.update({k: packed.pack(v) if k in self.per_block else v for k, v in flat.items()})

    def tensor(self, k: int) -> np.ndarray:
        """HF tensor number ``k`` (1-based), gathered with its group the first time one of them is asked for."""
        if k not in self._ready:
            self._group(self._root[k])
        return self._ready.pop(k).reshape(self.hf[k - 1][1])


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit (float32), or value for value (integers)."""
    if a.dtype == np.float32 and b.dtype == np.float32:
        return np.array_equal(a.view(np.uint32), b.view(np.uint32))
    return np.array_equal(a, b)


def _write(out: Path, ck, gather: _Gather, cfg: dict, dtype: str, force: bool, progress, src: Path) -> int:
    """The folder, each tensor gathered (with its group) when the writer comes to it."""
    from ...formats.write.writer import CheckpointWriter
    from ..from_gguf import write_hf_tokenizer
    st = _ST_DTYPES[dtype]
    w = CheckpointWriter(out, force=force, progress=progress)
    for k, (name, shape) in enumerate(gather.hf, 1):
        if k in gather.copies:      # a slab at a time (the writer takes the pieces in order)
            w.put(name, lambda k=k: gather.slabs(k), dtype=st, shape=shape)
        elif k in gather.per_block:     # a release's packed form: its bytes, as gathered
            w.put(name, lambda k=k: gather.tensor(k).tobytes(), dtype=gather.stored[k], shape=shape)
        else:       # float32 values, rounded to nearest even by the writer for float16 / bfloat16; integers as stored
            w.put(name, lambda k=k: gather.tensor(k), dtype=gather.stored.get(k, st), shape=shape)
    cfg = dict(cfg)
    cfg["dtype"] = dtype
    cfg.pop("torch_dtype", None)
    w.set_config(cfg)
    with tempfile.TemporaryDirectory(prefix="ckpt-surgeon-tok-") as tmp:
        if write_hf_tokenizer(ck, cfg, Path(tmp)):
            for f in sorted(Path(tmp).iterdir()):
                w.add_file(f.name, f.read_bytes())
        w.record("convert", {"from": "gguf", "source": src.name, "engine": "derived", "dtype": dtype})
        result = w.commit()
    return result.bytes_written


def learned_inverse(ck, cfg: dict, src: Path, progress=None, *, allow_dropped: bool = False) -> tuple["_Gather", dict]:
    """The open GGUF ``ck``'s HF tensors, as llama.cpp's converter class for its architecture would have taken them
    from a folder with config ``cfg``: the class probed (its inverse learned), the file's metadata and tensor plan
    checked against that config (else one line: not the config the file was made from), and the gatherer of HF
    tensors by the learned map (``tensor(k)``, one group at a time) with the probe's report.  ``allow_dropped``: an HF
    tensor the class drops whole (no element reaches the file: BERT's pooler) is listed in the report's ``dropped``
    (it cannot be gathered), not refused."""
    from ...progress import phase
    arch = ck.gguf_arch or ck.metadata.get("general.architecture")
    with tempfile.TemporaryDirectory(prefix="ckpt-surgeon-g2h-") as tmp, \
            phase(progress, f"probing llama.cpp's class for {arch} (its inverse, learned)"):
        result, arrays = _probe(cfg, Path(tmp), ck, src, allow_dropped)
    _check_metadata(ck.metadata, result, src)
    _check_tensors(ck, result, arrays, src)
    return _Gather(ck, result, arrays, src), result


def derived_gguf_to_hf_report(gguf_path, out_dir, config=None, dtype: str = "float32", force: bool = False, *,
                              progress: bool | None = False) -> ConvertReport:
    """GGUF (from llama.cpp's converter, or ours on the derived path) -> HF folder ``out_dir``,
    inverting llama.cpp's converter class for the file's architecture (see the module doc).
    ``config``: the original config.json (or its folder), required and checked against the file."""
    from ...checkpoint import open_checkpoint
    t0 = time.perf_counter()
    src, out = Path(gguf_path), Path(out_dir)
    if dtype not in _ST_DTYPES:
        raise UnsupportedError(f"--dtype {dtype}: GGUF -> HF writes float32 | float16 | bfloat16")
    with open_checkpoint(src) as ck:
        meta = ck.metadata
        arch = ck.gguf_arch or meta.get("general.architecture")
        ck.refuse_truncated()
        if meta.get("general.type") == "mmproj" or arch == "clip":
            raise UnsupportedError("an mmproj file (a vision or audio tower and its projector, for llama.cpp's "
                                   "multimodal runtime) holds only part of an HF model, so it has no HF folder to "
                                   "convert back to; the model's HF folder converts to it (convert --mmproj)",
                                   path=str(src))
        cfg = _read_config(config, src, arch)
        gather, result = learned_inverse(ck, cfg, src, progress)
        nbytes = _write(out, ck, gather, cfg, dtype, force, progress, src)
        types = {n: i.dtype for n, i in ck.tensors.items()}
    how = f"derived: inverse of llama.cpp {result['converter_class'].rsplit('.', 1)[-1]} (llama-cpp-python " \
          f"{llamacpp_version()}), learned by probing it"
    src_of = gather.source_of()
    records = tuple(TensorRecord(src_of.get(n, ""), n, "llama.cpp inverse", types.get(src_of.get(n, ""), "-"),
                                 gather.stored.get(k, _ST_DTYPES[dtype]), shape)
                    for k, (n, shape) in enumerate(gather.hf, 1))
    tied = bool(cfg.get("tie_word_embeddings"))
    return ConvertReport("gguf->hf", str(src), str(out), arch, cfg["model_type"], dtype, len(records), nbytes,
                         time.perf_counter() - t0, tied, meta.get("tokenizer.ggml.model"), records, (), cfg,
                         engine=how)
