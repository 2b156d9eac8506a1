"""Which tensors write into the residual stream, and which read it, by name (data, no math).

The attention roles (q/k/v/qkv/o) come from :mod:`ckpt_surgeon.arch.families`; this module adds
the MLP, embedding and output-head modules the bias-consumer analysis and ``fold-bias --center``
need.  Module paths are relative to the family's layer prefix (``h.{L}.``, ``layers.{L}.``,
``layer.{L}.``; GGUF: ``blk.{L}.``), as in ``Family.roles``.  Whether the stream's readers are
centering norms is a per-family registry fact (``Family.residual_readers_centering``), not
decided here.

Sources (transformers 5 modeling files; llama.cpp gguf-py ``constants.py`` ``MODEL_TENSOR``):

- MLP output (writes the stream): GPT-2 / StarCoder2 ``mlp.c_proj``; GPT-NeoX / BLOOM / Falcon
  ``mlp.dense_4h_to_h``; Phi ``mlp.fc2``; OPT ``fc2``; BERT ``output.dense`` (``BertOutput``); Llama-style
  ``mlp.down_proj``; GGUF ``ffn_down``.
- MLP input (feeds the activation): ``mlp.c_fc``, ``mlp.dense_h_to_4h``, ``mlp.fc1``, BERT
  ``intermediate.dense``, ``mlp.up_proj`` / ``mlp.gate_proj`` / ``mlp.gate_up_proj``; GGUF
  ``ffn_up`` / ``ffn_gate``.
- Embedding tables added into the stream: token (``wte``, ``embed_in``, ``word_embeddings``,
  ``embed_tokens``; GGUF ``token_embd``) and additive ones (``wpe``, BERT ``position_embeddings``
  / ``token_type_embeddings``, OPT ``embed_positions``; GGUF ``position_embd``, ``token_types``).
- Embedding norm of pre-norm models (its beta is added into the stream): BLOOM
  ``word_embeddings_layernorm`` (GGUF ``token_embd_norm``).  BERT's ``embeddings.LayerNorm`` is not
  one: in a post-norm model that output is read by the first attention's projections.
- Output head: ``lm_head``, GPT-NeoX ``embed_out``; GGUF ``output``.
"""
from __future__ import annotations

import re

MLP_OUT = ("mlp.c_proj", "mlp.dense_4h_to_h", "mlp.fc2", "output.dense", "mlp.down_proj", "fc2")
MLP_IN = ("mlp.c_fc", "mlp.dense_h_to_4h", "mlp.fc1", "intermediate.dense", "mlp.up_proj", "mlp.gate_proj",
          "mlp.gate_up_proj", "fc1")
GGUF_MLP_OUT = ("ffn_down",)
GGUF_MLP_IN = ("ffn_up", "ffn_gate")

# whole-model tensors: (role, name regex)
EMBEDDINGS = (
    ("embed_token", re.compile(r"(?:^|\.)(?:wte|embed_in|word_embeddings|embed_tokens)\.weight$")),
    ("embed_add", re.compile(r"(?:^|\.)(?:wpe|position_embeddings|token_type_embeddings|embed_positions)\.weight$")),
)
GGUF_EMBEDDINGS = (
    ("embed_token", re.compile(r"^token_embd\.weight$")),
    ("embed_add", re.compile(r"^(?:position_embd|token_types)\.weight$")),
)
EMBED_NORM = re.compile(r"(?:^|\.)word_embeddings_layernorm\.bias$")
GGUF_EMBED_NORM = re.compile(r"^token_embd_norm\.bias$")
HEAD = re.compile(r"(?:^|\.)(?:lm_head|embed_out)\.(weight|bias)$")
GGUF_HEAD = re.compile(r"^output\.(weight|bias)$")


def layer_module_regex(layer_pattern: str, modules) -> re.Pattern:
    """``<prefix>.<layer>.<module>.(weight|bias)`` for any of ``modules`` (groups: layer, module, kind)."""
    lay = re.escape(layer_pattern).replace(re.escape("{L}"), r"(\d+)")
    alt = "|".join(re.escape(m) for m in modules)
    return re.compile(r"^(?:.*\.)?" + lay + "(" + alt + r")\.(weight|bias)$")
