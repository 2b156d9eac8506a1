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
per HF tensor.  It is proved on the random pass: scattering the GGUF tensors of that pass back by
the learned map gives the random inputs bit for bit, and every HF element is reached.  Where that
fails the class does not only move values (a sum, ``exp``, a ``+ 1`` shift, a dropped tensor) and
the answer is one line naming the tensor.  A GGUF tensor with no valid ids that is the same in
every pass is generated from the config (rope factors): kept, for the parent to compare.

The class's ``set_gguf_parameters`` key-values come back too: the parent checks them against the
GGUF's, which is what proves the given config is the one the file was made from.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from .child import _import_llamacpp, serve

DIGIT_BITS = 23


def _values(kind: str, k: int, numel: int, digit: int = 0) -> np.ndarray:
    if kind == "id":
        return np.full(numel, k, np.float32)
    if kind == "idx":
        return ((np.arange(numel, dtype=np.int64) >> (DIGIT_BITS * digit)) & ((1 << DIGIT_BITS) - 1)).astype(np.float32)
    return np.random.default_rng(k).standard_normal(numel, dtype=np.float32)


def _hook_sources(cls) -> None:
    """Remember, for each GGUF tensor, the HF tensor whose ``modify_tensors`` call produced it."""
    original, sources = cls.modify_tensors, {}

    def modify_tensors(self, data_torch, name, bid):
        for new_name, data in original(self, data_torch, name, bid):
            sources.setdefault(new_name, name)
            yield new_name, data

    cls.modify_tensors = modify_tensors
    cls._ckpt_surgeon_sources = sources


def _run_pass(gguf, base, cls, folder: Path, names: list, shapes: dict, kind: str, digit: int = 0):
    """One forward run of the class on probe tensors -> (GGUF name -> float32 array, the model)."""
    import torch
    captured: dict[str, np.ndarray] = {}

    def index_tensors(self, remote_hf_model_id=None):
        out = {}
        for k, name in enumerate(names, 1):
            numel = int(np.prod(shapes[name], dtype=np.int64))
            gen = (lambda k=k, n=numel, s=shapes[name]: torch.from_numpy(_values(kind, k, n, digit).reshape(s)))
            if item := self.filter_tensors((name, gen)):
                out[item[0]] = item[1]
        return out

    def add_tensor(self, name, tensor, raw_shape=None, raw_dtype=None, tensor_endianess=None):
        arr = gguf.LazyNumpyTensor.to_eager(tensor) if isinstance(tensor, gguf.LazyBase) else np.asarray(tensor)
        captured[name] = np.array(arr, dtype=np.float32)

    base.ModelBase.index_tensors = index_tensors
    gguf.GGUFWriter.add_tensor = add_tensor
    if "_ckpt_surgeon_sources" not in cls.__dict__:
        _hook_sources(cls)
    with torch.inference_mode():
        model = cls(folder, gguf.LlamaFileType.ALL_F32, folder / "probe.gguf", eager=True, model_name="probe")
        model.prepare_tensors()
    return captured, model


def _learn(passes: dict, n_digits: int, names: list, sources: dict) -> tuple[dict, dict, str | None]:
    """(GGUF name -> (ids, flat indices)), (GGUF name -> generated values), refusal or None."""
    maps, generated = {}, {}
    n = len(names)
    for t, ids_f in passes["id"].items():
        same = all(np.array_equal(passes[p][t], ids_f) for p in passes if p != "id")
        valid = np.all(ids_f == np.round(ids_f)) and ids_f.size and ids_f.min() >= 1 and ids_f.max() <= n
        if not valid:
            if same:
                generated[t] = ids_f
                continue
            src = f" (from HF {sources[t]})" if t in sources else ""
            return maps, generated, (f"GGUF tensor {t}{src}: llama.cpp's converter changes its values (not only "
                                     "their places: a shift, a scale, exp, a sum ...), so it cannot be inverted")
        idx = np.zeros(ids_f.shape, np.int64)
        for d in range(n_digits):
            idx |= passes[f"idx{d}"][t].astype(np.int64) << (DIGIT_BITS * d)
        maps[t] = (ids_f.astype(np.int32), idx)
    return maps, generated, None


def _prove(maps: dict, rand: dict, names: list, shapes: dict) -> str | None:
    """Scatter the random pass back by the learned map: every HF element reached, values bit-exact."""
    hf = {k: np.full(int(np.prod(shapes[n], dtype=np.int64)), np.nan, np.float32) for k, n in enumerate(names, 1)}
    seen = {k: np.zeros(a.size, bool) for k, a in hf.items()}
    for t, (ids, idx) in maps.items():
        vals = rand[t].ravel()
        for k in np.unique(ids):
            m = ids.ravel() == k
            if idx.ravel()[m].max() >= hf[int(k)].size:
                return (f"GGUF tensor {t}: its probe values name no element of an HF tensor (llama.cpp's converter "
                        "changes its values, not only their places: a shift, a scale, exp ...), so it cannot be inverted")
            hf[int(k)][idx.ravel()[m]] = vals[m]
            seen[int(k)][idx.ravel()[m]] = True
    for k, name in enumerate(names, 1):
        want = _values("rand", k, hf[k].size)
        if not seen[k].all():
            return (f"HF tensor {name}: {int((~seen[k]).sum())} of {seen[k].size} elements reach no GGUF tensor "
                    "(llama.cpp's converter drops or merges them), so the GGUF cannot give it back")
        if not np.array_equal(hf[k].view(np.uint32), want.view(np.uint32)):
            return (f"HF tensor {name}: llama.cpp's converter changes its values (not only their places: a shift, "
                    "a scale, exp ...), so the GGUF does not give it back bit for bit")
    return None


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
    if cls.write is not base.ModelBase.write:
        raise NotImplementedError(f"{cls.__name__} writes more than one GGUF file (its own write()); not derived")
    return arch_name, cls


def run(req: dict) -> dict:
    from ..model_check import expected_tensors
    folder = Path(req["folder"])
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    shapes = {n: tuple(s) for n, s in expected_tensors(config).items()}
    names = sorted(shapes)
    gguf, conversion = _import_llamacpp(Path(req["llamacpp"]))
    from conversion import base
    arch_name, cls = _class_for(conversion, base, folder)
    biggest = max(int(np.prod(s, dtype=np.int64)) for s in shapes.values())
    n_digits = max(1, -(-max(1, biggest - 1).bit_length() // DIGIT_BITS))
    passes = {}
    passes["id"], model = _run_pass(gguf, base, cls, folder, names, shapes, "id")
    for d in range(n_digits):
        passes[f"idx{d}"], _ = _run_pass(gguf, base, cls, folder, names, shapes, "idx", d)
    passes["rand"], _ = _run_pass(gguf, base, cls, folder, names, shapes, "rand")
    maps, generated, refusal = _learn(passes, n_digits, names, cls._ckpt_surgeon_sources)
    refusal = refusal or _prove(maps, passes["rand"], names, shapes)
    model.set_gguf_parameters()
    arrays = {}
    for i, (t, (ids, idx)) in enumerate(maps.items()):
        arrays[f"ids{i}"], arrays[f"idx{i}"] = ids, idx
    for i, (t, vals) in enumerate(generated.items()):
        arrays[f"gen{i}"] = vals
    np.savez(req["maps"], **arrays)
    return {"hf_architecture": arch_name, "converter_class": f"{cls.__module__}.{cls.__name__}",
            "gguf_arch": model.gguf_writer.arch, "refusal": refusal, "hf": [[n, list(shapes[n])] for n in names],
            "mapped": [[t, list(maps[t][0].shape)] for t in maps], "generated": list(generated),
            "kv": _kv_values(model.gguf_writer)}


def main(argv: list[str]) -> int:
    return serve(argv, run)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
