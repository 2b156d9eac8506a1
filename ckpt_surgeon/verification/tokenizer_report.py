"""The record of verify's tokenizer section (:mod:`.tokenizer_check`): what was compared, what differs.

``TokenizerCheck.to_dict()`` is the ``tokenizer`` object of verify's JSON report; its keys are
:data:`JSON_KEYS` (extend, never rename), present whether the section ran or was skipped.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["JSON_KEYS", "RenderDifference", "TokenizerCheck", "skipped"]

# The JSON object ``tokenizer`` of verify's report, key by key (docs/verify.md is written from it).
JSON_KEYS: dict[str, str] = {
    "status": "checked | skipped (then reason says why)",
    "reason": "why the section did not run (null when it ran)",
    "passed": "no finding (null when skipped)",
    "findings": "one sentence per difference found; each is also in the report's failures",
    "notes": "how it was checked, what llama.cpp warned, what its built-in renderer does on its own",
    "encoders": "per side (reference, candidate): the tokenizer that encoded, transformers | llama.cpp",
    "parity": "encodings (texts × special tokens added or not), identical, share, normalizer_only (differing only "
              "by an HF normalizer llama.cpp does not apply: a note), first_difference (text, add_special, position, "
              "reference_ids, candidate_ids) or null",
    "templates": "reference / candidate: template names (default = the unnamed one); jinja / llama.cpp: renders "
                 "compared and identical (llama.cpp null when not run); differences: template, conversation, "
                 "add_generation_prompt, renderer, position, reference and candidate excerpts",
    "specials": "per side: eos_id and eos (the token text)",
    "elapsed_s": "wall time of the section",
}


@dataclass(frozen=True)
class RenderDifference:
    """One conversation the two sides render differently."""

    template: str                 # "default" or the template's name
    conversation: str
    add_generation_prompt: bool
    renderer: str                 # jinja | llama.cpp
    position: int | None          # first differing character (None: one side could not render it)
    reference: str                # excerpt around the position (or the error)
    candidate: str

    def to_dict(self) -> dict:
        return {"template": self.template, "conversation": self.conversation,
                "add_generation_prompt": self.add_generation_prompt, "renderer": self.renderer,
                "position": self.position, "reference": self.reference, "candidate": self.candidate}

    def describe(self) -> str:
        where = f"at character {self.position}" if self.position is not None else "one side cannot render it"
        name = "" if self.template == "default" else f" of template {self.template!r}"
        return (f"{self.conversation!r}{name} {'with' if self.add_generation_prompt else 'without'} the generation "
                f"prompt, {where}: reference {self.reference!r}, candidate {self.candidate!r}")


@dataclass(frozen=True)
class TokenizerCheck:
    """What verify's tokenizer section found (``status="skipped"``: not run, ``reason`` says why).
    ``findings`` fail the run; ``jinja`` / ``llama_cpp``: (renders compared, identical), llama_cpp None
    when llama.cpp's built-in renderer did not run."""

    status: str
    reason: str | None = None
    findings: tuple = ()
    notes: tuple = ()
    encoders: tuple = (None, None)            # (reference, candidate): transformers | llama.cpp
    encodings: int = 0
    identical: int = 0
    normalizer_only: int = 0                  # differ only by an HF normalizer llama.cpp does not apply
    first_difference: dict | None = None
    template_names: tuple = ((), ())
    jinja: tuple = (0, 0)
    llama_cpp: tuple | None = None
    differences: tuple = ()                   # RenderDifference
    eos: tuple = ((None, None), (None, None))  # per side (id, token text)
    elapsed_s: float = 0.0

    @property
    def ran(self) -> bool:
        return self.status == "checked"

    @property
    def passed(self) -> bool | None:
        return not self.findings if self.ran else None

    def to_dict(self) -> dict:
        ref, cand = self.template_names
        count = lambda c: None if c is None else {"compared": c[0], "identical": c[1]}     # noqa: E731
        return {
            "status": self.status, "reason": self.reason, "passed": self.passed,
            "findings": list(self.findings), "notes": list(self.notes),
            "encoders": {"reference": self.encoders[0], "candidate": self.encoders[1]},
            "parity": {"encodings": self.encodings, "identical": self.identical,
                       "share": self.identical / self.encodings if self.encodings else None,
                       "normalizer_only": self.normalizer_only, "first_difference": self.first_difference},
            "templates": {"reference": list(ref), "candidate": list(cand), "jinja": count(self.jinja),
                          "llama.cpp": count(self.llama_cpp), "differences": [d.to_dict() for d in self.differences]},
            "specials": {side: {"eos_id": i, "eos": t} for side, (i, t) in zip(("reference", "candidate"), self.eos)},
            "elapsed_s": round(self.elapsed_s, 3),
        }

    def summary_items(self) -> list[tuple[str, str]]:
        """The human report's lines (verify's summary, above the verdict)."""
        if not self.ran:
            return [("tokenizer", f"not checked: {self.reason}")]
        enc = f"reference by {self.encoders[0]}, candidate by {self.encoders[1]}"
        norm = f", {self.normalizer_only} more differ only by a normalizer (note)" if self.normalizer_only else ""
        items = [("tokenizer", f"{self.identical} of {self.encodings} encodings identical{norm} ({enc})"
                  if self.encodings else f"not compared ({enc}): see the verdict")]
        if self.first_difference is not None:
            d = self.first_difference
            items.append(("  first difference", f"{d['text'][:40]!r} ({'with' if d['add_special'] else 'without'} "
                                                f"special tokens added), token {d['position']}: reference "
                                                f"{ids_text(d['reference_ids'])}, candidate "
                                                f"{ids_text(d['candidate_ids'])}"))
        ref, cand = self.template_names
        if not ref and not cand:
            items.append(("chat template", "none on either side"))
            return items
        parts = [f"{r} {k} of {n} renders identical" for r, c in (("jinja", self.jinja), ("llama.cpp", self.llama_cpp))
                 if c is not None and c[0] for n, k in [c]]
        which = ", ".join(ref) if ref == cand else \
            f"reference {', '.join(ref) or 'none'}, candidate {', '.join(cand) or 'none'}"
        items.append(("chat template", f"{which}: " + ("; ".join(parts) or "not rendered")))
        firsts = {d.renderer: d for d in reversed(self.differences)}        # the first difference per renderer
        items += [(f"  differs ({r})", firsts[r].describe()) for r in ("jinja", "llama.cpp") if r in firsts]
        return items


def skipped(reason: str) -> TokenizerCheck:
    """The record of a section that did not run."""
    return TokenizerCheck(status="skipped", reason=reason)


def ids_text(ids) -> str:
    """An id list for a one-line message (the first 12 and the count beyond)."""
    ids = list(ids)
    return str(ids) if len(ids) <= 12 else f"[{', '.join(map(str, ids[:12]))}, … ({len(ids)} ids)]"
