"""A candidate quantized from an already-quantized reference (issue 36 item 19).

``convert model.Q4_1.gguf -o model.q4_k_m.gguf --dtype q4_k_m --allow-requantize`` rounds weights that were
rounded once already (llama-quantize writes the same bytes).  ``verify model.Q4_1.gguf model.q4_k_m.gguf`` then
measures that second rounding against thresholds made for a float reference, and fails where a q4_k_m made
from the float model might pass.  The verdict says so, with what to expect, instead of a bare FAIL.

Read from the two GGUF headers only (tensor types), before any model is loaded.
"""
from __future__ import annotations

from collections import Counter

from ..errors import CkptError

__all__ = ["NOTE_PREFIX", "requantized_note"]

NOTE_PREFIX = "requantized:"


def _quantized_types(path: str) -> Counter | None:
    """{ggml type: count} of the quantized tensors of GGUF ``path``; None when it is not a GGUF file."""
    from ..checkpoint import open_checkpoint
    try:
        with open_checkpoint(path) as ck:       # headers only
            if ck.naming != "gguf":
                return None
            return Counter(i.dtype for i in ck.tensors.values() if i.quantized)
    except (OSError, CkptError):     # the run itself reports an unreadable input
        return None


def _mix(types: Counter) -> str:
    return ", ".join(f"{t} x{n}" for t, n in types.most_common(3)) + (" ..." if len(types) > 3 else "")


def requantized_note(reference, candidate) -> str | None:
    """The note for a quantized GGUF candidate of another type mix than its quantized GGUF reference, else None."""
    ref, cand = _quantized_types(str(reference)), _quantized_types(str(candidate))
    if not ref or not cand or ref == cand:
        return None
    return (f"{NOTE_PREFIX} the reference is itself quantized ({_mix(ref)}) and the candidate ({_mix(cand)}) "
            "re-rounds weights already rounded once, so the thresholds (made for a float reference) measure the "
            "second rounding alone, which can fail a 4-5-bit candidate by itself (docs/benchmarks.md: a 135M model, Q4_1 -> "
            "q4_k_m: mean KL 0.08, top-1 84 %, llama-quantize's own bytes).  To judge the quantization, verify it "
            "against the float model the reference came from; to accept this loss, pass --max-kl / --min-top1")


def pick_thresholds(criteria, dtype: str, ref, cand, notes: list[str]):
    """The thresholds to judge by: the named row, else the coarsest of ``dtype`` and both storage dtypes
    (``ref`` / ``cand``: ``.given`` and ``.storage_dtype``), with the notes a quantized or requantized pair gets."""
    from .thresholds import coarsest, thresholds_for
    thr_dtype = criteria.thresholds or coarsest(dtype, ref.storage_dtype, cand.storage_dtype)
    thr = thresholds_for(thr_dtype, **criteria.overrides())
    if thr_dtype == "quantized":
        notes.append("quantized weights: judged by the bfloat16 row; quantization error usually exceeds it, "
                     "pass explicit thresholds for a quantized candidate")
    requant = requantized_note(ref.given, cand.given)     # issue 36 item 19: the verdict points at it
    if requant:
        notes.append(requant)
    return thr
