"""House rules that can regress silently (issue 24, "the house"): the functions that were over
60 lines stay at most 60, counted from ``def`` (decorators included) to the last line of the body."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "ckpt_surgeon"
MAX_LINES = 60

# (module under ckpt_surgeon/, function): the seven named by issue 24 item 19
SHORT = (
    ("conversion/from_gguf.py", "hf_config_from_gguf"),
    ("arch/probe.py", "shrink_config"),
    ("conversion/to_gguf.py", "plan_hf_to_gguf"),
    ("arch/resolve.py", "resolve"),
    ("conversion/tokenizer/spm.py", "spm_model_vocab"),
    ("arch/derive.py", "derived_layout"),
    ("conversion/from_gguf.py", "gguf_to_hf_report"),
)


def function_lines(source: str, name: str) -> int:
    """Lines of the top-level function ``name`` in ``source`` (decorators included); KeyError if absent."""
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            return node.end_lineno - first + 1
    raise KeyError(name)


@pytest.mark.parametrize("module, name", SHORT, ids=[n for _, n in SHORT])
def test_function_is_at_most_60_lines(module, name):
    n = function_lines((PKG / module).read_text(encoding="utf-8"), name)
    assert n <= MAX_LINES, f"ckpt_surgeon/{module}: {name} is {n} lines (at most {MAX_LINES}): extract a helper"


def test_the_count_can_fail():
    """The counter sees a 61-line function as 61 lines, decorators included, and a missing one as missing."""
    body = "".join(f"    x{i} = {i}\n" for i in range(58))
    src = f"@staticmethod\ndef f():\n{body}    return 0\n"
    assert function_lines(src, "f") == 61
    with pytest.raises(KeyError):
        function_lines(src, "g")
