"""llama.cpp's own tokenizer and built-in chat renderer, run in a child process.

The GGUF side of verify's tokenizer section (:mod:`.tokenizer_check`) is llama.cpp itself, through
llama-cpp-python's bindings of the C API: a ``vocab_only`` model (``llama_model_load_from_file`` with
``llama_model_params.vocab_only``: the vocabulary and metadata, no tensors), ``llama_tokenize`` for
the ids, ``llama_model_chat_template`` for the template text llama.cpp reads from the file, and
``llama_chat_apply_template`` for llama.cpp's built-in renderer (what it uses without ``--jinja``:
``common_chat_templates_apply_legacy`` in llama.cpp's common/chat.cpp).

Why a child: llama.cpp ends the process on some malformed vocabularies (``GGML_ABORT``) and a build
compiled for instructions this CPU lacks dies with SIGILL; neither can be caught in Python.  The child
(``python -m ckpt_surgeon.verification.llama_vocab REQUEST``) prints one JSON line per job as soon as
the job is done, so when it dies the parent knows which job killed it and says so in one sentence
(:func:`run_jobs`).  The child imports llama_cpp only (about 0.4 s), never torch.

A job: ``{"gguf": path or null, "texts": [...], "modes": [[add_special, parse_special], ...],
"conversations": [[[role, content], ...], ...], "add_ass": [bool per conversation],
"templates": [{"label": ..., "text": ...} or {"label": ..., "name": null | "tool_use" ...}]}``.
A template with ``"name"`` is the GGUF's own (``llama_model_chat_template(model, name)``; null = the
default ``tokenizer.chat_template``), one with ``"text"`` is rendered as given (an HF side's
template).  The job's answer: ``{"ids": [[...] per text, per mode], "templates": {label: text read or
null}, "renders": {label: [text, or null where llama.cpp does not recognise the template]},
"specials": {...}, "warnings": [...]}`` or ``{"error": "..."}``.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

__all__ = ["run_jobs", "LlamaUnavailable"]

_TIMEOUT_S = 600        # a vocabulary loads in about a second; a hung child must not hang the CLI


class LlamaUnavailable(Exception):
    """llama.cpp cannot run here (not installed, or a build this CPU cannot execute)."""


# --- the parent side -------------------------------------------------------------------------------

def run_jobs(jobs: list[dict], *, tmp_dir: str | os.PathLike | None = None) -> list[dict]:
    """Each job's answer, in order.  A job whose child died gets ``{"error": "llama.cpp crashed
    (SIGSEGV) ...: <its last log line>"}`` and the jobs after it ``{"error": "not run: ..."}``.
    Raises :class:`LlamaUnavailable` when llama-cpp-python is missing or its build would crash here
    (:func:`.llama_build.build_problem`, the instruction check only: a vocabulary-only model runs no
    matmul, so the AMX matmul kernels are never reached)."""
    import tempfile
    try:
        import llama_cpp  # noqa: F401   (only to say early that it is missing)
    except ImportError as e:
        raise LlamaUnavailable(f"llama-cpp-python is not installed ({e})") from None
    from .llama_build import build_problem
    problem = build_problem(matmul=False)
    if problem:
        raise LlamaUnavailable(problem)
    with tempfile.TemporaryDirectory(prefix="ckpt-surgeon-llama-vocab-", dir=tmp_dir) as tmp:
        req = Path(tmp) / "request.json"
        req.write_text(json.dumps({"jobs": jobs}), encoding="utf-8")
        # GGML_NO_BACKTRACE: ggml_abort prints its message and aborts, without attaching gdb for a backtrace
        # (ggml_print_backtrace in ggml/src/ggml.c), so the message is the last line of stderr
        env = dict(os.environ, GGML_NO_BACKTRACE="1")
        pkg_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH")) if p)
        try:
            r = subprocess.run([sys.executable, "-m", __name__, str(req)], capture_output=True, text=True,
                               env=env, timeout=_TIMEOUT_S)
            out, err, rc = r.stdout, r.stderr, r.returncode
        except subprocess.TimeoutExpired as e:
            out, err, rc = _text(e.stdout), _text(e.stderr), None
    answers = []
    for line in out.splitlines():
        try:
            answers.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    if len(answers) < len(jobs):
        how = (f"did not finish in {_TIMEOUT_S} s" if rc is None else
               f"crashed ({_signal_name(-rc)})" if rc < 0 else f"exited with status {rc}")
        last = _last_line(err)
        answers.append({"error": f"llama.cpp {how}" + (f": {last}" if last else "")})
        while len(answers) < len(jobs):
            answers.append({"error": "not run: llama.cpp stopped on an earlier job"})
    return answers[:len(jobs)]


def _text(b) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def _last_line(err: str) -> str:
    """The child's last meaningful stderr line; ggml_abort's ``/build/path/file.cpp:123: message`` with
    the file's name only."""
    import re
    lines = [ln.strip() for ln in err.splitlines() if any(ch.isalnum() for ch in ln)]
    if not lines:
        return ""
    m = re.match(r"^(\S+?):(\d+): (.*)$", lines[-1])
    return f"{os.path.basename(m.group(1))}:{m.group(2)}: {m.group(3)}" if m else lines[-1]


# --- the child side --------------------------------------------------------------------------------

class _Log:
    """llama.cpp's log lines at WARN and ERROR (``enum ggml_log_level`` in ggml/include/ggml.h: 3 and 4;
    llama-cpp-python's own _logger.py still maps the older numbering), kept for the answer; the rest
    (DEBUG, INFO, CONT) is dropped.  The ctypes callback is kept referenced here: a collected
    callback would be called after it was freed."""

    def __init__(self, llama_cpp):
        self.lines: list[str] = []

        @llama_cpp.llama_log_callback
        def callback(level, text, user_data):
            if level in (3, 4) and text:
                line = text.decode("utf-8", errors="replace").strip()
                if any(ch.isalnum() for ch in line.partition(":")[2]):      # not a line of llama.cpp's banners
                    self.lines.append(line)

        self._callback = callback
        llama_cpp.llama_log_set(callback, None)

    def take(self) -> list[str]:
        out, self.lines = list(dict.fromkeys(self.lines)), []
        return out


def _tokenize(llama_cpp, vocab, text: str, add_special: bool, parse_special: bool) -> list[int]:
    """``llama_tokenize`` (llama.cpp's ``common_tokenize`` does the same two calls: a negative count
    is the size needed)."""
    raw = text.encode("utf-8")
    n = len(raw) + 16
    buf = (llama_cpp.llama_token * n)()
    got = llama_cpp.llama_tokenize(vocab, raw, len(raw), buf, n, add_special, parse_special)
    if got < 0:
        n = -got
        buf = (llama_cpp.llama_token * n)()
        got = llama_cpp.llama_tokenize(vocab, raw, len(raw), buf, n, add_special, parse_special)
    if got < 0:
        raise RuntimeError(f"llama_tokenize failed ({got}) on a text of {len(raw)} bytes")
    return [int(t) for t in buf[:got]]


def _render(llama_cpp, template: bytes, messages, add_ass: bool) -> str | None:
    """``llama_chat_apply_template`` (None where llama.cpp recognises no family in the template)."""
    from ..analysis.tokenizer.templates import apply_chat_template
    return apply_chat_template(llama_cpp, template, messages, add_ass)


def _specials(llama_cpp, vocab) -> dict:
    """The special ids as llama.cpp resolved them (LLAMA_TOKEN_NULL = -1 where there is none), whether
    it adds BOS / EOS, and its end-of-generation set (``llama_vocab_is_eog`` over the vocabulary)."""
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    out = {name: int(getattr(llama_cpp, f"llama_vocab_{name}")(vocab)) for name in ("bos", "eos", "eot", "pad")}
    out["add_bos"] = bool(llama_cpp.llama_vocab_get_add_bos(vocab))
    out["add_eos"] = bool(llama_cpp.llama_vocab_get_add_eos(vocab))
    out["n_tokens"] = int(n)
    out["eog"] = [i for i in range(n) if llama_cpp.llama_vocab_is_eog(vocab, i)]
    return out


def _load_error(lines: list[str]) -> str:
    """What llama.cpp logged about a failed load, shortly: the first error line (the cause, e.g.
    ``invalid magic characters``) and the one naming the part that failed (``error loading model
    vocabulary: unknown pre-tokenizer type: 'x'``), without the generic ``failed to load model``."""
    useful = [ln for ln in lines if not ln.endswith("failed to load model")]
    named = [ln.split("error loading model", 1)[1].lstrip(": ") for ln in useful if "error loading model" in ln]
    picked = list(dict.fromkeys(([useful[0]] if useful and "error loading model" not in useful[0] else [])
                                + named[-1:]))
    return "; ".join(picked) or (lines[-1] if lines else "")


def _job(llama_cpp, log: _Log, job: dict) -> dict:
    model = None
    if job.get("gguf"):
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        model = llama_cpp.llama_model_load_from_file(os.fsencode(job["gguf"]), params)
        if not model:
            why = _load_error(log.take())
            return {"error": "llama.cpp cannot load its vocabulary" + (f" ({why})" if why else "")}
    try:
        out = {"warnings": log.take(), "ids": [], "templates": {}, "renders": {}}
        if model is not None:
            vocab = llama_cpp.llama_model_get_vocab(model)
            out["specials"] = _specials(llama_cpp, vocab)
            out["ids"] = [[_tokenize(llama_cpp, vocab, t, bool(a), bool(p)) for a, p in job.get("modes", ())]
                          for t in job.get("texts", ())]
        for tmpl in job.get("templates", ()):
            if "text" in tmpl:
                raw = tmpl["text"].encode("utf-8") if tmpl["text"] is not None else None
            else:
                name = tmpl.get("name")
                raw = llama_cpp.llama_model_chat_template(model, name.encode("utf-8") if name else None)
                out["templates"][tmpl["label"]] = raw.decode("utf-8", errors="replace") if raw else None
            out["renders"][tmpl["label"]] = None if raw is None else [
                _render(llama_cpp, raw, msgs, bool(add)) for msgs, add in zip(job["conversations"], job["add_ass"])]
        out["warnings"] += log.take()
        return out
    finally:
        if model is not None:
            llama_cpp.llama_model_free(model)


def main(argv: list[str]) -> int:
    request = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    import llama_cpp
    log = _Log(llama_cpp)
    llama_cpp.llama_backend_init()
    for job in request["jobs"]:
        try:
            answer = _job(llama_cpp, log, job)
        except (RuntimeError, ValueError, OSError, UnicodeError) as e:
            answer = {"error": f"{type(e).__name__}: {e}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()          # the parent learns which job was done if a later one crashes
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
