"""Run llama.cpp's ``convert_hf_to_gguf.py`` (from the sdist, with its own gguf-py) several times
in one process: ``python llamacpp_ref_convert.py LLAMA_CPP_DIR MODEL_DIR OUT_DIR PRE OUTTYPE...``
writes ``OUT_DIR/<outtype>.gguf`` per outtype (importing torch and the converter once).  An outtype
``mmproj-<type>`` runs the converter with ``--mmproj`` (a VLM's vision / audio projector file, CLIP arch);
``vocab`` with ``--vocab-only`` (the tokenizer's metadata, no tensor: ``vocab.gguf``).

One change to the converter, and why: it names a BPE pre-tokenizer (``tokenizer.ggml.pre``) by
hashing the ids a *known* Hub tokenizer gives a fixed text (``TextModel.get_vocab_base_pre``);
the tiny fixtures' tokenizer is trained locally, so no hash matches and it refuses.  ``PRE``
is returned instead: the pre-tokenizer transformers runs for that model (the test says which).
Everything else (names, shapes, transforms, types, metadata) is the converter's own.
"""
from __future__ import annotations

import os
import runpy
import sys


def main() -> None:
    root, model, out, pre, *outtypes = sys.argv[1:]
    # llama.cpp's gguf-py first: the installed gguf may be a different version
    sys.path[:0] = [os.path.join(root, "gguf-py"), root]
    import gguf
    from conversion.base import TextModel

    if not os.path.abspath(gguf.__file__).startswith(os.path.abspath(root)):
        raise SystemExit(f"imported gguf from {gguf.__file__}, not from {root}/gguf-py")
    TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
    script = os.path.join(root, "convert_hf_to_gguf.py")
    ns = runpy.run_path(script, run_name="llamacpp_convert_hf_to_gguf")
    for outtype in outtypes:
        mmproj, vocab = outtype.startswith("mmproj-"), outtype == "vocab"
        sys.argv = [script, model, "--outfile", os.path.join(out, f"{outtype}.gguf"),
                    "--outtype", "f32" if vocab else outtype.removeprefix("mmproj-"),
                    *(["--mmproj"] if mmproj else []), *(["--vocab-only"] if vocab else [])]
        ns["main"]()


if __name__ == "__main__":
    main()
