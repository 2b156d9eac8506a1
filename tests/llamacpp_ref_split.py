"""Run llama.cpp's ``convert_hf_to_gguf.py`` with extra options (the split ones):
``python llamacpp_ref_split.py LLAMA_CPP_DIR MODEL_DIR OUTFILE PRE OUTTYPE [OPTION ...]``.

The same single change to the converter as tests/llamacpp_ref_convert.py, for the same reason
(``PRE`` answers the pre-tokenizer hash of a locally trained tokenizer); every option after
OUTTYPE is passed to the converter as given (``--split-max-size 20K`` ...).  A separate runner so
that the cached references of tests/test_llamacpp_converter.py (keyed by that runner's bytes) stay valid.
"""
from __future__ import annotations

import os
import runpy
import sys


def main() -> None:
    root, model, outfile, pre, outtype, *options = sys.argv[1:]
    sys.path[:0] = [os.path.join(root, "gguf-py"), root]
    import gguf
    from conversion.base import TextModel

    if not os.path.abspath(gguf.__file__).startswith(os.path.abspath(root)):
        raise SystemExit(f"imported gguf from {gguf.__file__}, not from {root}/gguf-py")
    TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
    script = os.path.join(root, "convert_hf_to_gguf.py")
    ns = runpy.run_path(script, run_name="llamacpp_convert_hf_to_gguf")
    sys.argv = [script, model, "--outfile", outfile, "--outtype", outtype, *options]
    ns["main"]()


if __name__ == "__main__":
    main()
