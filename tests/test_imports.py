"""Every import of a ckpt_surgeon module names one that exists, lazy imports inside functions
included (they run only on paths a warm cache can skip: a cold-cache CI run once found
fixtures/zoo.py importing a module that had been merged away)."""
from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TREES = ("ckpt_surgeon", "fixtures", "tests", "benchmarks")


def _imports(path: Path):
    """(line, absolute module name) for every import of ckpt_surgeon in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    rel = path.relative_to(REPO).with_suffix("")
    package = list(rel.parts[:-1])   # the package a relative import starts from (also for __init__)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "ckpt_surgeon":
                    yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            if mod.split(".")[0] == "ckpt_surgeon":
                yield node.lineno, mod, [a.name for a in node.names]


def test_every_ckpt_surgeon_import_resolves():
    files = [p for t in TREES for p in sorted((REPO / t).rglob("*.py"))]
    assert len(files) > 100
    missing, checked = [], 0
    for path in files:
        for line, mod, names in _imports(path):
            checked += 1
            if importlib.util.find_spec(mod) is None:
                missing.append(f"{path.relative_to(REPO)}:{line}: no module {mod}")
                continue
            for name in names or ():
                # `from pkg import sub` may name a submodule or an attribute; a submodule must exist
                sub = f"{mod}.{name}"
                spec = importlib.util.find_spec(mod)
                if spec.submodule_search_locations and importlib.util.find_spec(sub) is None:
                    module = importlib.import_module(mod)
                    if not hasattr(module, name):
                        missing.append(f"{path.relative_to(REPO)}:{line}: {mod} has no {name}")
    assert checked > 200, checked
    assert not missing, "\n".join(missing)
