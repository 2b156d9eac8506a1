"""House rules that can regress silently (issues 24 and 35, "the house"), over all of ``ckpt_surgeon/``:

- every function (methods and nested functions too) is at most 60 lines, counted from ``def``
  (decorators included) to the last line of the body, except the few in :data:`LONG_OK`, each with
  its reason;
- every file is at most 900 lines, except the declared data tables and the rooms still to be split
  (:data:`BIG_OK`);
- no module imports a ``_private`` name (or a name from a ``_private`` module) of another package:
  a private name is private to the package that holds it and to that package's subpackages.  The
  imports there were when the rule came are listed in :data:`PRIVATE_OK`, so that a new one fails.

An allow-list entry that no longer applies fails too, so the lists only shrink.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "ckpt_surgeon"
MAX_LINES = 60

MAX_FILE_LINES = 900

# (module under ckpt_surgeon/, function): the seven named by issue 24 item 19
SHORT = (
    ("conversion/from_gguf.py", "hf_config_from_gguf"),
    ("arch/derive/shrink.py", "shrink_config"),
    ("conversion/to_gguf.py", "plan_hf_to_gguf"),
    ("arch/resolve.py", "resolve"),
    ("conversion/tokenizer/spm.py", "spm_model_vocab"),
    ("arch/derive/derived.py", "derived_layout"),
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


# --- every function ---------------------------------------------------------------------------------

_CLICK = "a click command: one decorator per option, each with its --help text"
# (module under ckpt_surgeon/, qualified name): why it is longer than MAX_LINES
LONG_OK = {
    ("cli/cmd_verify.py", "command"): _CLICK,
    ("cli/cmd_analyze.py", "command"): _CLICK,
    ("cli/cmd_convert.py", "command"): _CLICK,
    ("cli/cmd_fold_bias.py", "command"): _CLICK,
    ("conversion/quant_mix.py", "_impl"): "a line-by-line port of llama.cpp's llama_tensor_get_type_impl mixture "
                                          "rules, kept in its order so it can be read beside the C++",
}


def function_sizes(source: str) -> dict[str, int]:
    """Qualified name (``Class.method``, ``outer.inner``) -> lines, decorators included, of every
    function in ``source``; a name defined twice keeps its longest."""
    out: dict[str, int] = {}

    def walk(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                    out[name] = max(out.get(name, 0), child.end_lineno - first + 1)
                walk(child, name + ".")
            else:
                walk(child, prefix)
    walk(ast.parse(source), "")
    return out


def _modules():
    return sorted(PKG.rglob("*.py"))


def _rel(p: Path) -> str:
    return p.relative_to(PKG).as_posix()


def test_every_function_is_at_most_60_lines():
    over = {(_rel(p), name): n for p in _modules()
            for name, n in function_sizes(p.read_text(encoding="utf-8")).items() if n > MAX_LINES}
    new = sorted(f"ckpt_surgeon/{m}: {name} is {n} lines" for (m, name), n in over.items() if (m, name) not in LONG_OK)
    assert not new, f"functions over {MAX_LINES} lines (extract a helper): " + "; ".join(new)
    stale = sorted(f"{m}: {name}" for m, name in LONG_OK if (m, name) not in over)
    assert not stale, "LONG_OK entries that are now short or gone (delete them): " + "; ".join(stale)


def test_the_function_counter_can_fail():
    body = "".join(f"        x{i} = {i}\n" for i in range(58))
    src = f"class C:\n    @property\n    def f(self):\n{body}        return 0\n\n    def g(self):\n        def h():\n" \
          f"            pass\n        return h\n"
    assert function_sizes(src) == {"C.f": 61, "C.g": 4, "C.g.h": 2}


# --- every file ---------------------------------------------------------------------------------------

# (file under ckpt_surgeon/): why it is longer than MAX_FILE_LINES
BIG_OK = {
    "arch/families.py": "a declared data table: the family registry (one record per family)",
}


def file_lines(source: str) -> int:
    return len(source.splitlines())


def test_every_file_is_at_most_900_lines():
    sizes = {_rel(p): file_lines(p.read_text(encoding="utf-8")) for p in _modules()}
    new = sorted(f"ckpt_surgeon/{m}: {n} lines" for m, n in sizes.items() if n > MAX_FILE_LINES and m not in BIG_OK)
    assert not new, f"files over {MAX_FILE_LINES} lines (split them by what they are): " + "; ".join(new)
    stale = sorted(m for m in BIG_OK if sizes.get(m, 0) <= MAX_FILE_LINES)
    assert not stale, "BIG_OK entries that are now short or gone (delete them): " + "; ".join(stale)


def test_the_file_counter_can_fail():
    assert file_lines("a = 1\n" * 901) == 901 > MAX_FILE_LINES


# --- no _private import across packages ---------------------------------------------------------------

# (importing module, imported module, name): imports allowed for a reason.  Empty: the five there
# were when the rule came (issue 35) were plain renames to public names (conversion._io ->
# conversion.output_path, from_gguf._hparams -> hparams_from_gguf, resolve._fused_layout ->
# family_fused_layout, model_layout._rope_params -> rope_params).
PRIVATE_OK: set[tuple[str, str, str]] = set()


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def _package_holding(parts: list[str]) -> str:
    """The package holding a name defined in ``parts`` (a package, or a module of one)."""
    is_package = PKG.parent.joinpath(*parts).is_dir()
    return ".".join(parts if is_package else parts[:-1])


def private_imports(source: str, module: str, is_package: bool = False) -> list[tuple[str, str]]:
    """(imported module, name) of every import in ``module`` (dotted; ``is_package``: its
    ``__init__``) of a private name, or of a name from a private module, held by a package that
    does not contain ``module``."""
    here = module.split(".") if is_package else module.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom):
            continue
        base = here[:len(here) - node.level + 1] if node.level else []
        target = ".".join(base + ([node.module] if node.module else []))
        for alias in node.names:
            parts = target.split(".") + [alias.name]
            owners = [_package_holding(parts[:i]) for i, p in enumerate(parts) if i and _private(p)]
            if any(not (module + ".").startswith(o + ".") for o in owners):
                out.append((target, alias.name))
    return out


def _module_name(p: Path) -> tuple[str, bool]:
    parts = ("ckpt_surgeon",) + p.relative_to(PKG).with_suffix("").parts
    return (".".join(parts[:-1]), True) if parts[-1] == "__init__" else (".".join(parts), False)


def test_no_private_import_across_packages():
    found = set()
    for p in _modules():
        module, pkg = _module_name(p)
        found |= {(module, t, n) for t, n in private_imports(p.read_text(encoding="utf-8"), module, pkg)}
    new = sorted(" ".join(f) for f in found - PRIVATE_OK)
    assert not new, "private names imported from another package (make them public where they are): " + "; ".join(new)
    stale = sorted(" ".join(f) for f in PRIVATE_OK - found)
    assert not stale, "PRIVATE_OK entries no longer imported (delete them): " + "; ".join(stale)


def test_the_private_import_counter_can_fail():
    src = ("from ..conversion.from_gguf import _hparams, public\n"
           "from ..conversion import _io\n"
           "from .._lazy import lazy_exports\n"       # a private module of the root: shared by every package
           "from ._helpers import x\n"                # its own package's private module
           "from .core import _inner\n")              # its own package's private name
    got = private_imports(src, "ckpt_surgeon.analysis.diff")
    assert got == [("ckpt_surgeon.conversion.from_gguf", "_hparams"), ("ckpt_surgeon.conversion", "_io")]
    assert private_imports("from . import _x\n", "ckpt_surgeon.verification", is_package=True) == []
    assert private_imports("from ._lazy import lazy_exports\n", "ckpt_surgeon", is_package=True) == []
    assert private_imports("from .conversion import _x\n", "ckpt_surgeon", is_package=True) == \
        [("ckpt_surgeon.conversion", "_x")]
    assert private_imports("from ..conversion import _x\n", "ckpt_surgeon.verification", is_package=True) == \
        [("ckpt_surgeon.conversion", "_x")]
