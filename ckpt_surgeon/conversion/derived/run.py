"""HF -> GGUF for an architecture outside the native registry: llama.cpp's converter class plans,
our reader, quantizer and writer do the work (:mod:`.child`), in a child process.

Why a child: llama.cpp's converter imports its own ``gguf`` package (a newer gguf-py than the
installed one, same module name) and torch; a child keeps both out of this process, and gives the
memory back when it ends.  The file is written into a temp beside OUT, parsed back with our GGUF
reader and compared with what the child planned (names, types, shapes), then renamed into place.
"""
from __future__ import annotations

import difflib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from ...errors import ConfigError, FormatError, UnsupportedError
from ...publish import Staging
from ..report import ConvertReport, TensorRecord
from .source import architecture_maps, converter_root, llamacpp_version
from .spawn import run_module

__all__ = ["derived_hf_to_gguf_report", "hf_architecture", "DERIVED_DTYPES", "converter_tokenizer"]

DERIVED_DTYPES = ("f32", "f16", "bf16", "q8_0")     # llama.cpp's converter's own outtypes


def hf_architecture(folder: Path) -> str | None:
    """``architectures[0]`` of the folder's config.json (what llama.cpp's converter keys on)."""
    from ...formats.safe_input import read_json
    cfg = folder / "config.json"
    if not cfg.is_file():
        return None
    raw = read_json(cfg)
    archs = raw.get("architectures") or []
    return archs[0] if archs and isinstance(archs[0], str) else None


def _checked_arch(folder: Path, root: Path, want_mmproj: bool = False) -> str:
    arch = hf_architecture(folder)
    text, mmproj = architecture_maps(root)
    if want_mmproj:
        text, mmproj = mmproj, {}
    if arch is None:
        raise ConfigError("config.json names no architectures (llama.cpp's converter picks its class by them)",
                          path=str(folder / "config.json"))
    if arch not in text:
        near = difflib.get_close_matches(arch, list(text), n=3, cutoff=0.5)
        what = ("only a vision/audio projector (mmproj) class" if arch in mmproj else
                "no projector (mmproj) class" if want_mmproj else "no converter class")
        raise UnsupportedError(f"architecture {arch!r}: neither the native registry nor llama.cpp's converter "
                               f"(llama-cpp-python {llamacpp_version()}) has it ({what})"
                               + (f"; nearest llama.cpp names: {', '.join(near)}" if near else ""),
                               path=str(folder / "config.json"))
    return arch


def _run_child(req: dict, tmp: Path, progress=None, label: str = "") -> dict:
    from ...progress import progress_enabled
    from .feed import follow
    req_path = tmp / "request.json"
    req["report"] = str(tmp / "report.json")
    req["progress"] = str(tmp / "progress") if progress_enabled(progress) else None
    req_path.write_text(json.dumps(req), encoding="utf-8")
    verb = "quantizing + writing" if req["dtype"] not in ("f32", "f16", "bf16") else "writing"
    with follow(tmp / "progress", progress, f"{verb} {label or Path(req['output']).name}"):
        r = run_module("ckpt_surgeon.conversion.derived.child", req_path, die_with_parent=True)
    rep = Path(req["report"])
    if not rep.is_file():
        tail = (r.stderr or r.stdout).strip().splitlines()
        raise UnsupportedError(f"llama.cpp's converter process ended without a report (rc {r.returncode}): "
                               f"{tail[-1] if tail else ''}", path=req["source"])
    result = json.loads(rep.read_text(encoding="utf-8"))
    if "error" in result:
        if os.environ.get("CKPT_SURGEON_DEBUG"):
            sys.stderr.write(result.get("traceback", ""))
        if "ours" in result:        # the writer's own error (a part that does not read back, a full disk ...)
            from ... import errors
            o = result["ours"]
            cls = getattr(errors, o["class"], None)
            cls = cls if isinstance(cls, type) and issubclass(cls, errors.CkptError) else errors.CkptError
            raise cls(o["detail"], path=o["path"], tensor=o["tensor"], hint=o["hint"])
        raise UnsupportedError(f"llama.cpp's converter stopped: {result['error']}", path=req["source"])
    return result


def _check_written(path: Path, result: dict) -> None:
    """The file parses with our reader and holds exactly the planned tensors (name, type, shape)."""
    from ...formats.gguf import read_header
    header = read_header(path)
    if header.missing_bytes or header.ggml_layout is not None:
        raise FormatError("the derived conversion wrote a file that llama.cpp would not load", path=str(path))
    got = {n: (t.dtype, tuple(t.shape)) for n, t in header.tensors.items()}
    want = {t["target"]: (t["type"], tuple(t["shape"])) for t in result["tensors"]}
    if got != want:
        bad = next((n for n in sorted(set(got) | set(want)) if got.get(n) != want.get(n)), None)
        raise FormatError("the derived conversion wrote a file that differs from its plan",
                          path=str(path), tensor=bad, expected=want.get(bad), got=got.get(bad))


def derived_hf_to_gguf_report(src, out_path, dtype: str = "f16", force: bool = False, *, name: str | None = None,
                              imatrix=None, mmproj: bool = False, split=None, progress=None,
                              trust_remote_code: bool = False) -> ConvertReport:
    """Convert the HF folder ``src`` to the GGUF ``out_path`` through llama.cpp's own converter class
    for its architecture (:mod:`.child`); ``dtype`` one of :data:`DERIVED_DTYPES` or a k-quant file
    type (the class at f32, then llama.cpp's mixture and kernels, as llama-quantize on that file).
    ``mmproj``: the vision / audio projector file instead (``convert_hf_to_gguf.py --mmproj``).
    ``split``: a :class:`~..split_output.SplitRequest`, the output then llama.cpp's split set, written
    by the native path's splitter in the child (:mod:`.split_write`; resumable after a kill).
    ``progress``: a bar over the bytes written (tensors, rate, ETA) and a line for the class's planning
    (:mod:`.feed`; None: on when stderr is a terminal).  ``trust_remote_code``: let the class load Python shipped
    with the model (a tokenizer module its auto_map names, as Kimi-K2's); without it that is refused
    (:class:`~ckpt_surgeon.errors.RemoteCodeRefusedError`) before any of it runs."""
    from ..quant_plan import check_quant_request
    t0 = time.perf_counter()
    src, out = Path(src), Path(out_path)
    folder = src if src.is_dir() else src.parent
    check_quant_request(dtype, imatrix)
    inputs = _checked_inputs(folder, out, force, split is not None)
    root = converter_root()
    if mmproj and dtype not in DERIVED_DTYPES:
        raise UnsupportedError(f"--mmproj writes llama.cpp's converter's own outtypes ({', '.join(DERIVED_DTYPES)}), "
                               f"not {dtype}")
    arch = _checked_arch(folder, root, mmproj)
    base = dtype if dtype in DERIVED_DTYPES else "f32"
    req = {"llamacpp": str(root), "source": str(folder), "dtype": dtype, "base_dtype": base, "name": name,
           "imatrix": str(imatrix) if imatrix is not None else None, "mmproj": mmproj,
           "trust_remote_code": bool(trust_remote_code)}
    if split is not None:
        # the child writes the parts through the splitter, beside OUT, and renames them into place
        req.update(output=str(out), split=split.to_dict(),
                   inputs=[os.fspath(p) for p in (*inputs, *([imatrix] if imatrix is not None else []))])
        with tempfile.TemporaryDirectory(prefix="ckpt-surgeon-derived-") as tmp:
            result = _run_child(req, Path(tmp), progress)
    else:
        result = _write_one(req, out, progress)
    files = tuple(Path(f) for f in result["files"])
    how = f"derived: llama.cpp {result['converter_class'].rsplit('.', 1)[-1]} (llama-cpp-python {llamacpp_version()})"
    records = tuple(TensorRecord(t["source"], t["target"], "llama.cpp", t.get("source_dtype") or "-", t["type"],
                                 tuple(t["shape"])) for t in result["tensors"])
    tied = not any(t["target"] == "output.weight" for t in result["tensors"])
    kv = result["kv"]
    return ConvertReport("hf->gguf", str(src), str(files[0]), result["gguf_arch"], arch, dtype, len(records),
                         sum(f.stat().st_size for f in files), time.perf_counter() - t0, tied,
                         kv.get("tokenizer.ggml.model"), records, tuple(result["warnings"]), kv,
                         tuple(str(f) for f in files), engine=how)


def _checked_inputs(folder: Path, out: Path, force: bool, split: bool) -> list[str]:
    """The files the conversion reads, the source's headers validated here (one line before the child
    starts) and the output checked against them.  The checkpoint (its index: 92k headers for a
    DeepSeek-V3 layout) is closed and dropped on return, so the parent holds nothing model-sized while
    the child converts; the child reports each tensor's source dtype itself."""
    from ...checkpoint import open_stored
    from ..output_path import check_output
    with open_stored(folder) as ck:        # llama.cpp's class reads a quantized source itself
        inputs = list(ck.files) + [str(folder / "config.json")]
    check_output(out, inputs, force)
    if split:
        from ..split_output import check_split_destination
        check_split_destination(out, inputs, force)
    return inputs


def _write_one(req: dict, out: Path, progress=None) -> dict:
    """One file: the child writes a temp beside OUT, checked here against the plan, then renamed."""
    staging = Staging(out, folder=False)
    try:
        req["output"] = str(staging.path)
        with tempfile.TemporaryDirectory(prefix="ckpt-surgeon-derived-") as tmp:
            result = _run_child(req, Path(tmp), progress, out.name)
        _check_written(staging.path, result)
        staging.publish(replace=True)
    except BaseException:
        staging.discard()
        raise
    result["files"] = [str(out)]
    return result


def converter_tokenizer(folder, *, trust_remote_code: bool = False) -> dict:
    """The ``tokenizer.*`` key-values llama.cpp's converter class writes for the HF folder (what
    ``convert_hf_to_gguf.py --vocab-only`` plans: the class's own ``set_vocab``, run in the child of
    :mod:`.child`, no tensor read), with ``converter_class`` and ``warnings``.  The answer is kept in the
    transformers-answer cache by the folder's config and tokenizer files and llama-cpp-python's version,
    so only the first question about a folder pays for the child (seconds: torch, transformers and the
    class imported).  Raises :class:`~ckpt_surgeon.errors.UnsupportedError` when the class cannot run."""
    from .. import answer_cache
    folder = Path(folder)
    root = converter_root()
    arch = _checked_arch(folder, root)
    inputs = answer_cache.folder_inputs(folder)
    path = answer_cache.answer_path("llamacpp-vocab", arch, {"files": inputs, "llama-cpp-python": llamacpp_version(),
                                                             "trust_remote_code": bool(trust_remote_code)}) \
        if inputs is not None else None
    got = answer_cache.load(path)
    if got is not None:
        return got
    from ...progress import phase
    with tempfile.TemporaryDirectory(prefix="ckpt-surgeon-vocab-") as tmp, \
            phase(None, f"reading the tokenizer as llama.cpp's converter class for {arch} writes it (once a folder)"):
        req = {"llamacpp": str(root), "source": str(folder), "dtype": "f32", "base_dtype": "f32", "name": None,
               "output": str(Path(tmp) / "vocab.gguf"), "vocab_only": True,
               "trust_remote_code": bool(trust_remote_code)}
        result = _run_child(req, Path(tmp), progress=False)
    got = {k: result[k] for k in ("converter_class", "gguf_arch", "warnings", "kv")}
    answer_cache.store(path, got)
    return got
