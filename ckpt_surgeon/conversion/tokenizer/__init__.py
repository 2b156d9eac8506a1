"""Tokenizers both ways: ``tokenizer.json`` (+ config files) <-> GGUF ``tokenizer.ggml.*``.

One module per idea:

================  ==========================================================================
``vocab``         the record both directions share (:class:`GGUFVocab`, token types, the
                  special-token keys) and its typed read from GGUF metadata
``pretokenizers`` llama.cpp's ``tokenizer.ggml.pre`` table: each name's regexes and flags, as
                  tokenizer.json spells them and back
``bpe``           byte-level BPE (``gpt2``: GPT-2, Qwen2, Llama 3, SmolLM ...) both ways, and BPE
                  over raw UTF-8 (``gemma4``, ``whitespace``) GGUF -> HF
``spm``           SentencePiece-style BPE with byte fallback (``llama``: Llama 2, Mistral v0.1,
                  Phi-3 ...) both ways, and the vocabulary read from ``tokenizer.model``
``wordpiece``     WordPiece (``bert``), GGUF -> HF
``unigram``       Unigram (``t5``, llama.cpp's UGM), GGUF -> HF
``hf_files``      reading an HF tokenizer folder (the tokenizer transformers runs, the configs,
                  the chat template)
``specials``      an HF tokenizer's special ids and whether it adds BOS / EOS / a separator
``from_hf``       HF -> GGUF: :func:`hf_vocab`
``to_hf``         GGUF -> HF: :func:`hf_tokenizer_files`
================  ==========================================================================

Token types are gguf-py's ``TokenType``: 1 normal, 2 unknown, 3 control, 4 user-defined,
5 unused, 6 byte.  Vocabulary rows the model has beyond the tokenizer (embeddings padded to a
multiple of 64) become ``[PAD{id}]`` UNUSED tokens, as ``convert_hf_to_gguf.py`` does, and are
dropped again on the way back.

The names callers use are importable from this package itself.
"""
from __future__ import annotations

from .from_hf import check_name_for_llamacpp, hf_vocab
from .hf_files import effective_tokenizer_json
from .pretokenizers import (PRE_TOKENIZERS, PRE_TYPE_REGEXES, PreTokenizer, pre_by_name, pre_name_for,
                            pre_name_for_json)
from .spm import spm_model_vocab
from .to_hf import HFTokenizerFiles, hf_tokenizer_files
from .vocab import BYTE, CONTROL, NORMAL, SPECIAL_KEYS, UNKNOWN, UNUSED, USER_DEFINED, GGUFVocab, vocab_from_metadata

__all__ = ["BYTE", "CONTROL", "NORMAL", "PRE_TOKENIZERS", "PRE_TYPE_REGEXES", "SPECIAL_KEYS", "UNKNOWN", "UNUSED",
           "USER_DEFINED", "GGUFVocab", "HFTokenizerFiles", "PreTokenizer", "effective_tokenizer_json",
           "check_name_for_llamacpp", "hf_tokenizer_files", "hf_vocab", "pre_by_name", "pre_name_for",
           "pre_name_for_json", "spm_model_vocab", "vocab_from_metadata"]
