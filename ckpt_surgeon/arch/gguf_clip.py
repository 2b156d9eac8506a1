"""mmproj files (``general.architecture`` ``clip``): their encoders' names and keys, from gguf-py's tables.

An mmproj file is the vision / audio half of a VLM that llama.cpp and Ollama ship beside the language
model GGUF (``convert_hf_to_gguf.py --mmproj``).  It holds up to two attention stacks: a vision encoder
(``v.blk.N.attn_q`` ... in gguf-py ``MODEL_TENSOR.V_ENC_*``, sized by ``clip.vision.*`` keys,
``Keys.ClipVision``) and an audio encoder (``a.blk.N.*``, ``A_ENC_*``, ``clip.audio.*``,
``Keys.ClipAudio``), plus a projector (``mm.*``).  Every name and key here is read from gguf-py
(``constants.py``: ``MODEL_ARCH.MMPROJ``, ``MODEL_TENSOR``, ``TENSOR_NAMES``, ``Keys``); a member the
installed gguf-py lacks is skipped (an older gguf-py has no ``clip.vision.attention.head_count_kv``).
What the encoder's graph does with positions is not in the file: the registry's
:data:`~ckpt_surgeon.arch.families.CLIP_PROJECTORS` says it per projector type.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from .checked import GGUF_BOUNDS, gguf_value
from .gguf_names import _tables

# role -> gguf-py MODEL_TENSOR member, per encoder (the roles of families.ROLES; "o" is the attention output)
_ROLE_TENSORS = {
    "vision": {"q": "V_ENC_ATTN_Q", "k": "V_ENC_ATTN_K", "v": "V_ENC_ATTN_V", "qkv": "V_ENC_ATTN_QKV",
               "o": "V_ENC_ATTN_O", "q_norm": "V_ENC_ATTN_Q_NORM", "k_norm": "V_ENC_ATTN_K_NORM",
               "sinks": "V_ENC_ATTN_SINKS", "attn_norm": "V_ENC_INPUT_NORM"},
    "audio": {"q": "A_ENC_ATTN_Q", "k": "A_ENC_ATTN_K", "v": "A_ENC_ATTN_V", "o": "A_ENC_OUTPUT",
              "attn_norm": "A_ENC_INPUT_NORM"},
}
# the encoder's position table (a learned / sinusoidal table added to its input) and its gguf-py Keys class
_POSITION_TABLE = {"vision": "V_ENC_EMBD_POS", "audio": "A_ENC_EMBD_POS"}
_KEYS_CLASS = {"vision": "ClipVision", "audio": "ClipAudio"}
# Keys.<class> attribute -> HF config key of the tower's sub-config (the names transformers' vision / audio
# configs use, as for a text GGUF in gguf_config.ARCH_KEYS)
_CONFIG_KEYS = (("BLOCK_COUNT", "num_hidden_layers"), ("EMBEDDING_LENGTH", "hidden_size"),
                ("Attention.HEAD_COUNT", "num_attention_heads"), ("Attention.HEAD_COUNT_KV", "num_key_value_heads"),
                ("Attention.HEAD_DIM", "head_dim"), ("Attention.LAYERNORM_EPS", "layer_norm_eps"),
                ("PROJECTOR_TYPE", "projector_type"))


@dataclass(frozen=True)
class ClipEncoder:
    """One encoder of an mmproj file, as gguf-py names it."""

    kind: str                 # vision | audio
    layer: str                # layer prefix with {L}: "v.blk.{L}."
    roles: dict               # role -> module name under the layer prefix ("k" -> "attn_k")
    position_table: str       # "v.position_embd.weight"
    keys: dict                # HF config key -> GGUF metadata key ("num_attention_heads" -> "clip.vision.attention.head_count")


def _key(cls, path: str) -> str | None:
    for part in path.split("."):
        cls = getattr(cls, part, None)
        if cls is None:
            return None
    return cls if isinstance(cls, str) else None


@functools.lru_cache(maxsize=None)
def clip_arch() -> str:
    """gguf-py's ``general.architecture`` of mmproj files (``MODEL_ARCH_NAMES[MODEL_ARCH.MMPROJ]``)."""
    c, _ = _tables()
    return c.MODEL_ARCH_NAMES[c.MODEL_ARCH.MMPROJ]


@functools.lru_cache(maxsize=None)
def clip_encoders() -> tuple[ClipEncoder, ...]:
    """The vision and audio encoders gguf-py names (members the installed gguf-py lacks are left out)."""
    c, _ = _tables()
    out = []
    for kind, members in _ROLE_TENSORS.items():
        names = {role: c.TENSOR_NAMES[c.MODEL_TENSOR[m]] for role, m in members.items() if m in c.MODEL_TENSOR.__members__}
        layer = names["q"].split("{bid}")[0] + "{bid}."
        if not all(n.startswith(layer) for n in names.values()):    # a gguf-py that moved them would break every read
            raise RuntimeError(f"gguf-py names the {kind} encoder's tensors outside {layer!r}: {names}")
        keys_cls = getattr(c.Keys, _KEYS_CLASS[kind])
        keys = {hf: k for attr, hf in _CONFIG_KEYS if (k := _key(keys_cls, attr)) is not None}
        out.append(ClipEncoder(kind, layer.replace("{bid}", "{L}"), {r: n[len(layer):] for r, n in names.items()},
                               c.TENSOR_NAMES[c.MODEL_TENSOR[_POSITION_TABLE[kind]]] + ".weight", keys))
    return tuple(out)


def shared_projector_key() -> str:
    """``clip.projector_type``: the projector type of a single-encoder file (gguf-py ``Keys.Clip``)."""
    c, _ = _tables()
    return c.Keys.Clip.PROJECTOR_TYPE


def _bounds(key: str, prefix: str):
    """The bounds of a ``clip.<encoder>.<suffix>`` key: those of ``<suffix>`` for a text model."""
    return GGUF_BOUNDS[key[len(prefix) + 1:]]


def clip_config(metadata: dict, *, path: str | None = None) -> dict:
    """``{"vision_config": {...}, "audio_config": {...}}`` from an mmproj file's ``clip.*`` keys (HF key
    names, values checked; an encoder without any key is absent).  The projector type of an encoder is its
    own key (``clip.vision.projector_type``, a file with two encoders) or else ``clip.projector_type``."""
    cfg: dict = {}
    shared = gguf_value(metadata, shared_projector_key(), GGUF_BOUNDS["projector_type"], path=path)
    for enc in clip_encoders():
        prefix = enc.keys["num_hidden_layers"].rsplit(".", 1)[0]        # "clip.vision"
        sub = {}
        for hf, key in enc.keys.items():
            v = gguf_value(metadata, key, _bounds(key, prefix), path=path)
            if v is not None:
                sub[hf] = v
        if sub:
            sub.setdefault("projector_type", shared)
            cfg[f"{enc.kind}_config"] = sub
    return cfg


@functools.lru_cache(maxsize=None)
def _attention_bias_pattern() -> re.Pattern:
    """Every gguf-py tensor that is an attention q / k / v / fused-qkv projection (``blk.N.attn_k``,
    ``v.blk.N.attn_k``, ``resampler.attn.k``, ``a.qf.blk.N.cross_attn_k`` ...), with ``.bias``."""
    c, _ = _tables()
    rx = re.compile(r"(^|_)ATTN_(Q|K|V|QKV)$")
    alts = sorted({re.escape(c.TENSOR_NAMES[m]).replace(r"\{bid\}", r"\d+").replace(r"\{xid\}", r"\d+")
                   for m in c.MODEL_TENSOR if rx.search(m.name) and m in c.TENSOR_NAMES})
    return re.compile("^(?:" + "|".join(alts) + r")\.bias$")


def is_attention_bias(name: str) -> bool:
    """Whether gguf-py names ``name`` an attention projection bias (any architecture, any tower)."""
    return bool(_attention_bias_pattern().match(name))
