"""verify's tokenizer section: the other half of a model, each side run by its own tokenizer.

When REFERENCE and CANDIDATE each carry a tokenizer (an HF folder with tokenizer files, a GGUF with
``tokenizer.ggml.*``), :func:`check_tokenizers` runs

* **parity**: the built-in texts (:mod:`.tokenizer_texts`), both sides' special tokens written as
  text and every conversation as either side renders it, each encoded with special tokens added and
  without, by each side's own tokenizer: transformers for an HF folder, llama.cpp itself for a GGUF
  (:mod:`.llama_vocab`: ``llama_tokenize`` on a vocabulary-only model, special tokens in the text
  parsed, as llama.cpp's ``common_tokenize`` does for chat prompts);
* **chat templates**: the built-in conversations, with and without ``add_generation_prompt``,
  rendered through jinja (:func:`.tokenizer_sides.render_jinja`) and through llama.cpp's built-in
  renderer (``llama_chat_apply_template``, what llama.cpp uses without ``--jinja``), the two sides
  compared renderer by renderer, template by template (named templates too);
* **eos**: the token both sides' generation stops at.

How llama.cpp's built-in renderer is judged (llama.cpp's src/llama-chat.cpp): it is no template
engine; ``llm_chat_detect_template`` picks a known family by substrings of the template text and
``llm_chat_apply_template`` prints that family's fixed format (it ignores, for example, a default
system prompt the template adds).  So it is compared with itself on the other side's template (a
GGUF's as llama.cpp reads it, an HF side's text): a different output is a finding.  Where it
disagrees with the template's own rendering it does so for any copy of that template: a note.  A
template it recognises on neither side (it returns -1) is a note too: llama.cpp then refuses to chat
without ``--jinja`` ("this custom template is not supported, try using --jinja",
``common_chat_templates_apply_legacy`` in common/chat.cpp); ``--jinja`` is on by default in
llama-server and llama-cli (``common_params.use_jinja``), off in llama-completion and the multimodal
CLI (common/arg.cpp).  Recognised on one side only is a finding (a render against none).

Every difference is a finding: verify fails (exit 1) even when the logits agree.
"""
from __future__ import annotations

import os
import time

from ..errors import ConfigError
from .metrics import first_difference
from .tokenizer_report import JSON_KEYS, RenderDifference, TokenizerCheck, ids_text, skipped
from .tokenizer_sides import Side, Unnormalized, encode_hf, load_side, render_jinja, resolve, takes_tools
from .tokenizer_texts import CONVERSATIONS, TEXTS, special_texts

__all__ = ["check_tokenizers", "section", "own_judged", "TokenizerCheck", "skipped", "JSON_KEYS", "MODES"]

MODES = ((False, True), (True, True))      # (add_special, parse_special): special tokens added or not
_MAX_SPECIALS = 32                         # special-token texts per pair (Gemma and Llama 3 reserve hundreds)
_EXCERPT = (24, 40)                        # characters shown before / after a differing position


def section(reference, candidate, o) -> TokenizerCheck:
    """The section as verify's options ``o`` (:class:`~.options.VerifyOptions`) ask for it."""
    if not o.tokenizer_check:
        return skipped("switched off (--no-tokenizer-check)")
    return check_tokenizers(reference, candidate, revision=o.revision, candidate_revision=o.candidate_revision,
                            progress=o.placement.progress, tmp_dir=o.placement.tmp_dir)


def own_judged(o, check: TokenizerCheck | None) -> str | None:
    """Why verify need not insist that the candidate's own tokenizer encodes the prompts as the
    reference's does (:func:`.tokens.tokenize_pair`), or None when it must."""
    if not o.tokenizer_check:
        return "--no-tokenizer-check"
    return "the tokenizer section reports tokenizer differences" if check is not None and check.ran else None


def check_tokenizers(reference: str | os.PathLike, candidate: str | os.PathLike, *, revision: str | None = None,
                     candidate_revision: str | None = None, progress: bool | None = False,
                     tmp_dir: str | os.PathLike | None = None) -> TokenizerCheck:
    """Tokenizer parity, chat-template rendering and the eos token of ``reference`` and ``candidate``,
    each run by its own tokenizer (module docstring).  A side without a tokenizer of its own gives a
    skipped record; a tokenizer that cannot be loaded is a :class:`ConfigError`; llama.cpp failing
    on a GGUF's vocabulary (or crashing on it, in its child process) is a finding."""
    t0 = time.perf_counter()
    sides = []
    for given, role, rev in ((reference, "reference", revision), (candidate, "candidate", candidate_revision)):
        found = resolve(os.fspath(given), role, rev, progress)
        side = found if isinstance(found, str) else load_side(role, os.fspath(given), *found)
        if isinstance(side, str):
            return skipped(side)
        sides.append(side)
    from ..progress import phase
    with phase(progress, "tokenizer and chat template: each side's own tokenizer"):
        check = _Check(*sides, tmp_dir=tmp_dir)
        check.run()
    return check.record(time.perf_counter() - t0)


class _Check:
    """One run of the section over two loaded sides."""

    def __init__(self, ref: Side, cand: Side, *, tmp_dir):
        self.ref, self.cand, self.tmp_dir = ref, cand, tmp_dir
        self.findings: list[str] = []
        self.notes: list[str] = []
        self.differences: list[RenderDifference] = []
        self.encodings = self.identical = self.normalizer_only = 0
        self.first: dict | None = None
        self.jinja = (0, 0)
        self.llama_cpp: tuple | None = None
        self.c_renders: dict | None = None        # llama.cpp's built-in renders by "role:name"; None: not run

    @property
    def sides(self) -> tuple[Side, Side]:
        return self.ref, self.cand

    def run(self) -> None:
        names = self._template_names()
        cases = [(n, conv, agp) for n in names for conv in CONVERSATIONS
                 if not conv.tools or any(takes_tools(s.templates[n]) for s in self.sides) for agp in (False, True)]
        jinja = {s.role: [render_jinja(s, *case) for case in cases] for s in self.sides}
        # llama.cpp's C API carries role and content only: the tool conversation is not given to it
        plain = [(conv, agp) for conv in CONVERSATIONS if not conv.tools for agp in (False, True)]
        texts = self._texts(jinja)
        if not self._llama(texts, plain, names):
            return                                 # a finding says llama.cpp failed on a GGUF's vocabulary
        self._parity(texts)
        self.jinja = self._compare("jinja", cases, jinja["reference"], jinja["candidate"])
        keys = [(n, conv.name, agp) for n, conv, agp in cases]
        self._compare_builtin(names, plain, {role: dict(zip(keys, renders)) for role, renders in jinja.items()})
        self._eos()

    def record(self, elapsed: float) -> TokenizerCheck:
        return TokenizerCheck(
            status="checked", findings=tuple(self.findings), notes=tuple(dict.fromkeys(self.notes)),
            encoders=(self.ref.encoder, self.cand.encoder), encodings=self.encodings, identical=self.identical,
            normalizer_only=self.normalizer_only, first_difference=self.first,
            template_names=(tuple(sorted(self.ref.templates)), tuple(sorted(self.cand.templates))),
            jinja=self.jinja, llama_cpp=self.llama_cpp, differences=tuple(self.differences),
            eos=tuple((s.eos_id, s.eos) for s in self.sides), elapsed_s=elapsed)

    # -- steps ---------------------------------------------------------------------------------------

    def _template_names(self) -> list[str]:
        """The template names both sides have (default first); one side's alone are findings."""
        r, c = set(self.ref.templates), set(self.cand.templates)
        for name in sorted(r ^ c):
            has, lacks = ("reference", "candidate") if name in r else ("candidate", "reference")
            what = "a chat template" if name == "default" else f"a chat template named {name!r}"
            self.findings.append(f"chat template: the {has} has {what}, the {lacks} has none")
        if not r and not c:
            self.notes.append("tokenizer section: no chat template on either side, none rendered")
        return sorted(r & c, key=lambda n: (n != "default", n))

    def _texts(self, jinja: dict) -> list[str]:
        """The built-in texts, both sides' special tokens written as text (named ones and those the
        templates print first), and every conversation as either side rendered it."""
        specials = list(dict.fromkeys(self.ref.specials + self.cand.specials))
        in_templates = [t for t in specials if any(t in x for s in self.sides for x in s.templates.values())]
        chosen = list(dict.fromkeys(specials[:6] + in_templates + specials))[:_MAX_SPECIALS]
        rendered = [r for side in jinja.values() for r in side if not r.startswith("error: ")]
        return list(dict.fromkeys(list(TEXTS) + list(special_texts(chosen)) + rendered))

    def _llama(self, texts, plain, names) -> bool:
        """llama.cpp's answers: one child job per GGUF side (its encodings; its own templates as
        llama.cpp reads them, and an HF side's template texts, through the built-in renderer).  An HF
        pair gets a job only when the template texts differ: the renderer is a function of the text.
        False when llama.cpp failed on a GGUF's vocabulary (a finding then says so)."""
        from .llama_vocab import LlamaUnavailable, run_jobs
        base = {"conversations": [[[m["role"], m["content"]] for m in conv.messages] for conv, _ in plain],
                "add_ass": [agp for _, agp in plain]}
        hf_texts = [{"label": f"{s.role}:{n}", "text": s.templates[n]} for s in self.sides if s.kind == "hf"
                    for n in names]
        jobs = []
        for s in self.sides:
            if s.kind == "gguf":
                own = [{"label": f"{s.role}:{n}", "name": None if n == "default" else n} for n in names]
                jobs.append((s, {**base, "gguf": s.path, "texts": texts, "modes": [list(m) for m in MODES],
                                 "templates": own + (hf_texts if not jobs else [])}))
        if not jobs and names and any(self.ref.templates[n] != self.cand.templates[n] for n in names):
            jobs.append((None, {**base, "templates": hf_texts}))
        if not jobs:
            if names:
                self.llama_cpp = (len(plain) * len(names),) * 2
                self.notes.append("llama.cpp's built-in chat renderer not run: both sides' template texts are "
                                  "identical, and so are its renders")
            return True
        try:
            answers = run_jobs([job for _, job in jobs], tmp_dir=self.tmp_dir)
        except LlamaUnavailable as e:
            if jobs[0][0] is not None:
                raise ConfigError(f"a GGUF's tokenizer is run by llama.cpp, which cannot run here: {e}",
                                  path=jobs[0][0].given, hint="or skip the tokenizer section: --no-tokenizer-check"
                                  ) from None
            self.notes.append(f"llama.cpp's built-in chat renderer not run: {e}")
            return True
        self.c_renders = {}
        ok = True
        for (owner, _), answer in zip(jobs, answers):
            if "error" in answer:
                whose = f"the {owner.role}'s tokenizer" if owner is not None else "chat template"
                self.findings.append(f"{whose}: {answer['error']}")
                ok = ok and owner is None
                continue
            if owner is not None:
                owner.llama = answer
                warns = answer.get("warnings") or []
                if warns:
                    more = f" / … ({len(warns) - 3} more)" if len(warns) > 3 else ""
                    self.notes.append(f"{owner.role}: llama.cpp warns: {' / '.join(warns[:3])}{more}")
            self.c_renders.update(answer.get("renders") or {})
        return ok

    def _parity(self, texts) -> None:
        """Every text, with special tokens added and without, by both sides.  Where a GGUF meets an HF
        side, a difference that is exactly the HF tokenizer's normalizer, which llama.cpp does not apply
        (:class:`~.tokenizer_sides.Unnormalized`), is a note: the same for every GGUF of that tokenizer."""
        a, b = (s.llama["ids"] if s.kind == "gguf" else encode_hf(s, texts, MODES) for s in self.sides)
        kinds = {s.kind for s in self.sides}
        hf = next((s for s in self.sides if s.kind == "hf"), None)
        norm = Unnormalized.of(hf) if kinds == {"gguf", "hf"} else None
        differ, explained = [], []
        for t, ra, rb in zip(texts, a, b):
            for (add, _), x, y in zip(MODES, ra, rb):
                self.encodings += 1
                j = first_difference(x, y)
                if j is None:
                    self.identical += 1
                    continue
                hf_ids, other = (x, y) if hf is self.ref else (y, x)
                case = {"text": t, "add_special": add, "position": j, "reference_ids": list(x),
                        "candidate_ids": list(y)}
                (explained if norm is not None and norm.explains(t, add, hf_ids, other) else differ).append(case)
        self.normalizer_only = len(explained)
        if explained:
            d = explained[0]
            self.notes.append(
                f"tokenizer: {len(explained)} of {self.encodings} encodings differ only by the {hf.role}'s {norm.name} "
                f"normalizer, which llama.cpp does not apply (the same for every GGUF of this tokenizer; first: "
                f"{d['text'][:40]!r}, from token {d['position']})")
        if differ:
            d = self.first = differ[0]
            self.findings.append(
                f"tokenizer: {len(differ)} of {self.encodings} encodings differ (first: {d['text'][:40]!r} "
                f"{'with' if d['add_special'] else 'without'} special tokens added, from token {d['position']}: "
                f"reference {ids_text(d['reference_ids'])}, candidate {ids_text(d['candidate_ids'])})")

    def _compare(self, renderer: str, cases, a: list, b: list) -> tuple[int, int]:
        """Renders of the two sides case by case -> (compared, identical); each difference is kept and
        the first named in one finding."""
        diffs = [_difference(case, renderer, x, y) for case, x, y in zip(cases, a, b) if x != y]
        self.differences += diffs
        if diffs:
            what = "transformers' jinja" if renderer == "jinja" else "llama.cpp's built-in renderer (no --jinja)"
            self.findings.append(f"chat template: {len(diffs)} of {len(cases)} renders differ in {what} "
                                 f"(first: {diffs[0].describe()})")
        return len(cases), len(cases) - len(diffs)

    def _compare_builtin(self, names, plain, jinja: dict) -> None:
        """llama.cpp's built-in renderer on both sides' templates, compared; on a GGUF side also
        against the template's own rendering, and a template it recognises on neither side (notes)."""
        if self.c_renders is None:
            return
        cases, a, b = [], [], []
        for n in names:
            ra, rb = self.c_renders.get(f"reference:{n}"), self.c_renders.get(f"candidate:{n}")
            if ra is None or rb is None:
                continue
            cases += [(n, conv, agp) for conv, agp in plain]
            a += ra
            b += rb
            if all(x is None for x in ra + rb):
                label = "" if n == "default" else f"{n!r} "
                self.notes.append(
                    f"llama.cpp's built-in chat renderer recognises the {label}chat template on neither side: "
                    "without --jinja llama.cpp refuses to chat with it ('this custom template is not supported, try "
                    "using --jinja'); --jinja is the default of llama-server and llama-cli")
        self.llama_cpp = self._compare("llama.cpp", cases, a, b)
        for s, builtin in ((self.ref, a), (self.cand, b)):
            if s.kind != "gguf":
                continue
            own = [jinja[s.role][(n, conv.name, agp)] for n, conv, agp in cases]
            diffs = [_difference(case, "llama.cpp", j, r) for case, j, r in zip(cases, own, builtin)
                     if r is not None and r != j]
            if diffs:
                d = diffs[0]
                self.notes.append(
                    f"{s.role}: llama.cpp's built-in renderer (used without --jinja) renders {len(diffs)} of "
                    f"{len(cases)} conversations otherwise than the template itself does, as it would for any copy "
                    f"of this template (first: {d.conversation!r} at character {d.position}: template "
                    f"{d.reference!r}, llama.cpp {d.candidate!r})")

    def _eos(self) -> None:
        r, c = self.ref, self.cand
        if r.eos_id is None or c.eos_id is None:
            if (r.eos_id is None) != (c.eos_id is None):
                who = "reference" if r.eos_id is None else "candidate"
                self.notes.append(f"eos: the {who}'s tokenizer names no eos token")
            return
        if r.eos_id != c.eos_id or r.eos != c.eos:
            self.findings.append(f"eos: reference {r.eos_id} {r.eos!r}, candidate {c.eos_id} {c.eos!r} (generation "
                                 "stops at another token)")


def _difference(case, renderer: str, a: str | None, b: str | None) -> RenderDifference:
    """One case rendered differently: the first differing character and excerpts around it (an error or
    an unrecognised template shown as such, without a position)."""
    name, conv, agp = case
    if a is None or b is None or a.startswith("error: ") or b.startswith("error: "):
        show = lambda s: "not recognised by llama.cpp" if s is None else s[:80]      # noqa: E731
        return RenderDifference(name, conv.name, agp, renderer, None, show(a), show(b))
    pos = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    lo, hi = max(0, pos - _EXCERPT[0]), pos + _EXCERPT[1]
    cut = lambda s: ("…" if lo else "") + s[lo:hi] + ("…" if len(s) > hi else "")     # noqa: E731
    return RenderDifference(name, conv.name, agp, renderer, pos, cut(a), cut(b))
