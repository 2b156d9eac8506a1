"""Which transformers class loads a model and which output ``verify`` compares, as data.

A causal LM is compared on its next-token logits and its greedy continuations; a masked LM on
its logits (no generation); a bare encoder (``BertModel``, what sentence-transformers ships) on
its last hidden state, the thing its embeddings are pooled from.  The kind is picked from
``config.json``: the ``architectures`` class name by suffix, else ``model_type``.  No branch
anywhere names a model.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..arch.families import ENCODER_MODEL_TYPES as _ENCODER_MODEL_TYPES
from ..errors import UnsupportedError


@dataclass(frozen=True)
class ModelKind:
    name: str
    auto_class: str        # transformers Auto* class that loads it
    output: str            # attribute of the forward output that is compared
    distribution: bool     # output is logits over the vocabulary: KL and top-1 apply
    generates: bool        # greedy continuations are compared


KINDS: dict[str, ModelKind] = {
    "causal-lm": ModelKind("causal-lm", "AutoModelForCausalLM", "logits", distribution=True, generates=True),
    "masked-lm": ModelKind("masked-lm", "AutoModelForMaskedLM", "logits", distribution=True, generates=False),
    "encoder": ModelKind("encoder", "AutoModel", "last_hidden_state", distribution=False, generates=False),
    # a vision- / audio-language model (LLaVA, Qwen2-VL ...): its own class (architectures[0]) runs the text path on
    # token ids; its towers are judged alone on their own outputs (verification/towers.py)
    "multimodal": ModelKind("multimodal", "", "logits", distribution=True, generates=True),
    # an encoder-decoder that generates (Whisper, Canary, BART, T5 ...): its own class; the prompt's ids are the
    # decoder's input, the encoder reads the same ids (text) or seeded audio features built from its config
    # (speech: no processor runs), identical in both models; a speech encoder is also judged alone as a tower
    "seq2seq": ModelKind("seq2seq", "", "logits", distribution=True, generates=False),
}
# encoder-decoder heads that generate text (others, e.g. a sequence classifier, are not compared)
_SEQ2SEQ_SUFFIXES = ("ForConditionalGeneration", "MTModel", "ForSpeechToText")
# sub-configs that make a decoder-only config multimodal (a text decoder beside a vision / audio tower)
_TOWER_CONFIGS = ("vision_config", "audio_config")

# Suffix of the config's ``architectures[0]`` class name -> kind.  First match wins, so the
# longer suffixes come before the bare "Model" (GPT2LMHeadModel is a causal LM, BertModel is not).
ARCH_SUFFIX_KIND: tuple[tuple[str, str], ...] = (
    ("ForCausalLM", "causal-lm"),
    ("LMHeadModel", "causal-lm"),       # GPT2LMHeadModel, GPTJ..., CodeGen...
    ("ForMaskedLM", "masked-lm"),
    ("Model", "encoder"),               # BertModel, RobertaModel, XLMRobertaModel, MPNetModel ...
)

# Configs without ``architectures``: model types whose checkpoints are bare encoders (the arch
# registry's list).  Anything else is treated as a causal LM (the common case for the checkpoints
# this tool operates on).
ENCODER_MODEL_TYPES = _ENCODER_MODEL_TYPES


def model_kind(config: dict, *, path: str | None = None) -> ModelKind:
    """The :class:`ModelKind` for a parsed ``config.json``; raises UnsupportedError for other heads
    (sequence classifiers ...).  A ``*ForConditionalGeneration`` decoder with a vision / audio sub-config is
    ``multimodal``; an encoder-decoder generation class (``is_encoder_decoder``) is ``seq2seq``."""
    archs = config.get("architectures") or []
    if archs:
        arch = str(archs[0])
        if (arch.endswith("ForConditionalGeneration") and not config.get("is_encoder_decoder")
                and any(isinstance(config.get(k), dict) for k in _TOWER_CONFIGS)):
            return KINDS["multimodal"]
        if config.get("is_encoder_decoder") and arch.endswith(_SEQ2SEQ_SUFFIXES):
            return KINDS["seq2seq"]
        for suffix, kind in ARCH_SUFFIX_KIND:
            if arch.endswith(suffix):
                return KINDS[kind]
        raise UnsupportedError(
            f"architecture {arch} is not a causal LM, masked LM, bare encoder, vision/audio-language decoder or "
            "encoder-decoder generation model; "
            "verify compares those only",
            path=path)
    return KINDS["encoder" if config.get("model_type") in ENCODER_MODEL_TYPES else "causal-lm"]
