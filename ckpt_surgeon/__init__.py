"""ckpt-surgeon: look inside LLM checkpoints and operate on them safely.

The Python API mirrors the CLI; heavy modules (torch, transformers, pandas) are
imported only by the functions that need them, so ``import ckpt_surgeon`` is cheap.
"""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["analyze", "convert", "fold_bias", "gguf_to_hf", "hf_to_gguf", "inspect", "open_checkpoint", "qkv_fuse",
           "qkv_split", "verify", "__version__"]
__all__ += ["diff", "lint"]


def inspect(source, **kwargs):
    """Inspect a checkpoint (folder, .safetensors, .gguf or Hub repo id); see ``ckpt-surgeon inspect``."""
    from .analysis.inspect import inspect as _inspect
    return _inspect(source, **kwargs)


def analyze(source, context=None, epsilon=0.1, measure=False, prompts=None, **kwargs):
    """Which q/k/v biases are redundant, per layer and kv head, with sound bounds (and, with
    ``measure=True``, measured effects) -> :class:`ckpt_surgeon.analysis.redundancy.AnalysisReport`;
    see ``ckpt-surgeon analyze``."""
    from .analysis.redundancy import analyze as _analyze
    return _analyze(source, context=context, epsilon=epsilon, measure=measure, prompts=prompts, **kwargs)


def open_checkpoint(source, **kwargs):
    """Open any supported source lazily (headers only); see :class:`ckpt_surgeon.checkpoint.Checkpoint`."""
    from .checkpoint import open_checkpoint as _open
    return _open(source, **kwargs)


def verify(reference, candidate, **kwargs):
    """Run REFERENCE and CANDIDATE with transformers on the same prompts and compare logits, KL,
    top-1 and greedy continuations -> :class:`ckpt_surgeon.verification.VerifyReport`; see
    ``ckpt-surgeon verify``."""
    from .verification.core import verify as _verify
    return _verify(reference, candidate, **kwargs)


def convert(source, out, **kwargs):
    """Convert between GGUF and HF safetensors (direction from SOURCE) -> ConvertReport; see
    ``ckpt-surgeon convert``."""
    from .conversion import convert as _convert
    return _convert(source, out, **kwargs)


def gguf_to_hf(gguf_path, out_dir, dtype="float32", force=False):
    """GGUF file -> HF folder (config, tokenizer, safetensors) -> its Path; see
    :func:`ckpt_surgeon.conversion.from_gguf.gguf_to_hf`."""
    from .conversion import gguf_to_hf as _f
    return _f(gguf_path, out_dir, dtype=dtype, force=force)


def hf_to_gguf(src, out_path, dtype="f16", force=False, *, name=None):
    """HF folder -> GGUF file -> its Path; see :func:`ckpt_surgeon.conversion.to_gguf.hf_to_gguf`."""
    from .conversion import hf_to_gguf as _f
    return _f(src, out_path, dtype=dtype, force=force, name=name)


def fold_bias(source, out, *, k=False, v=False, approximate=False, max_logit_change=None, context=None,
              delete=False, force=False, **kwargs):
    """Remove redundant key biases (``k``) and fold value biases into the output bias (``v``),
    writing OUT atomically -> :class:`ckpt_surgeon.surgery.plan.SurgeryResult`; see
    ``ckpt-surgeon fold-bias``.  Raises RefusedError where the fold would not be exact."""
    from .surgery.fold import fold_bias as _fold
    return _fold(source, out, k=k, v=v, approximate=approximate, max_logit_change=max_logit_change,
                 context=context, delete=delete, force=force, **kwargs)


def qkv_fuse(source, out, *, layout=None, force=False, **kwargs):
    """Fuse separate q/k/v projections into one tensor (bit-exact row moves); see ``ckpt-surgeon qkv fuse``."""
    from .surgery.qkv import qkv_fuse as _fuse
    return _fuse(source, out, layout=layout, force=force, **kwargs)


def qkv_split(source, out, *, layout=None, to=None, force=False, **kwargs):
    """Split a fused qkv projection into q/k/v (Phi-3 -> Llama/Mistral); see ``ckpt-surgeon qkv split``."""
    from .surgery.qkv import qkv_split as _split
    return _split(source, out, layout=layout, to=to, force=force, **kwargs)


def diff(a, b, **kwargs):
    """Compare two checkpoints tensor by tensor (any sources, GGUF mapped to HF names) ->
    :class:`ckpt_surgeon.analysis.diff.DiffReport`; see ``ckpt-surgeon diff``."""
    from .analysis.diff import diff as _diff
    return _diff(a, b, **kwargs)


def lint(source, **kwargs):
    """Self-consistency checks (shapes, head_dim, biases, rope base, Q/K pairing, tied embeddings,
    vocabulary, special tokens; ``scan=True``: NaN/Inf/all-zero) ->
    :class:`ckpt_surgeon.analysis.lint.LintReport`; see ``ckpt-surgeon lint``."""
    from .analysis.lint import lint as _lint
    return _lint(source, **kwargs)
