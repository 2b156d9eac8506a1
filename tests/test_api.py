"""The top-level API: every public name *is* the implementation (one layer, no wrapper restating
its signature), and importing the package stays cheap."""
from __future__ import annotations

import importlib
import inspect
import subprocess
import sys

import ckpt_surgeon

# name -> the module that implements it (what the README and the CLI twins promise)
IMPLEMENTED_IN = {
    "inspect": "ckpt_surgeon.analysis.inspect", "analyze": "ckpt_surgeon.analysis.api",
    "open_checkpoint": "ckpt_surgeon.checkpoint", "verify": "ckpt_surgeon.verification.core",
    "convert": "ckpt_surgeon.conversion", "gguf_to_hf": "ckpt_surgeon.conversion.from_gguf",
    "hf_to_gguf": "ckpt_surgeon.conversion.to_gguf", "fold_bias": "ckpt_surgeon.surgery.fold",
    "qkv_fuse": "ckpt_surgeon.surgery.qkv", "qkv_split": "ckpt_surgeon.surgery.qkv",
    "diff": "ckpt_surgeon.analysis.diff", "lint": "ckpt_surgeon.analysis.lint",
    "kv_equalize": "ckpt_surgeon.surgery.kv_equalize",
    "tokenizer": "ckpt_surgeon.analysis.tokenizer.record",
}


def test_public_names_are_the_implementations():
    public = [n for n in ckpt_surgeon.__all__ if n != "__version__"]
    assert sorted(public) == sorted(IMPLEMENTED_IN)
    for name in public:
        obj = getattr(ckpt_surgeon, name)
        impl = getattr(importlib.import_module(IMPLEMENTED_IN[name]), name)
        assert obj is impl, name
        assert callable(obj) and obj.__doc__, name
        assert "source" in inspect.signature(obj).parameters or name in ("verify", "diff", "gguf_to_hf", "hf_to_gguf")
    # the subpackages re-export the same objects, not wrappers of them
    from ckpt_surgeon import conversion, surgery, verification
    assert conversion.gguf_to_hf is ckpt_surgeon.gguf_to_hf and conversion.hf_to_gguf is ckpt_surgeon.hf_to_gguf
    assert surgery.fold_bias is ckpt_surgeon.fold_bias and surgery.qkv_split is ckpt_surgeon.qkv_split
    assert verification.verify is ckpt_surgeon.verify
    assert set(dir(ckpt_surgeon)) >= set(public)


def test_unknown_attribute_is_an_attribute_error():
    try:
        ckpt_surgeon.no_such_function  # noqa: B018
    except AttributeError as e:
        assert "no_such_function" in str(e)
    else:
        raise AssertionError("expected AttributeError")


def test_import_is_cheap_until_a_function_is_used():
    code = ("import sys, ckpt_surgeon; from ckpt_surgeon import verify, convert, fold_bias; "
            "heavy = [m for m in ('torch', 'transformers', 'pandas', 'gguf') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
