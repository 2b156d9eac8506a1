"""Every import of a ckpt_surgeon module names one that exists, lazy imports inside functions
included (they run only on paths a warm cache can skip: a cold-cache CI run once found
fixtures/zoo.py importing a module that had been merged away)."""
from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
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


# ---------------------------------------------------------------------------------------------
# The import graph of ckpt_surgeon: no cycles, and every import goes down the layers written in
# docs/architecture.md ("Layers"); every module imports on its own in a fresh interpreter.

PKG = REPO / "ckpt_surgeon"
ARCH_DOC = REPO / "docs" / "architecture.md"

# Upward imports and cycles that other work of issue 13 is removing.  Names are relative to
# ckpt_surgeon/ ("ckpt_surgeon" is the package's own __init__).  Both lists may only shrink: an
# entry that no longer occurs fails the tests below, so whoever removes the import removes the
# entry too.  Empty them, do not add to them.
LAYER_EXCEPTIONS: set[tuple[str, str]] = set()    # upward imports still being removed (none now)
KNOWN_CYCLES: set[frozenset] = set()    # import cycles still being removed (none now)


def _module_names() -> dict[str, Path]:
    """Every ckpt_surgeon module, named relative to the package ("ckpt_surgeon" for __init__)."""
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(PKG).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts) or "ckpt_surgeon"] = path
    return out


def _short(absolute: str) -> str:
    return "ckpt_surgeon" if absolute == "ckpt_surgeon" else absolute.removeprefix("ckpt_surgeon.")


@functools.lru_cache(maxsize=1)
def _parsed_graph() -> dict[str, dict[str, int]]:
    """importer -> {imported module: first line}, imports inside functions included.  ``from X
    import y`` is an import of module X.y when that is a module, else of X."""
    modules = _module_names()
    graph: dict[str, dict[str, int]] = {m: {} for m in modules}
    for mod, path in modules.items():
        for line, target, names in _imports(path):
            for name in names or [None]:
                sub = _short(f"{target}.{name}") if name else None
                dest = sub if sub in modules else _short(target)
                if dest in modules and dest != mod:
                    graph[mod].setdefault(dest, line)
        for line, rel in _lazy_exports(path):
            dest = _short(importlib.util.resolve_name(rel, "ckpt_surgeon" if mod == "ckpt_surgeon" else f"ckpt_surgeon.{mod}"))
            graph[mod].setdefault(dest, line)
    return graph


def _lazy_exports(path: Path):
    """(line, relative module) for each entry of a package's ``lazy_exports(globals(), {name:
    module})`` table (``ckpt_surgeon/_lazy.py``): imports made on first access, by name."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy_exports"
                and len(node.args) == 2 and isinstance(node.args[1], ast.Dict)):
            for value in node.args[1].values:
                assert isinstance(value, ast.Constant) and value.value.startswith("."), ast.dump(value)
                yield value.lineno, value.value


def _graph() -> dict[str, dict[str, int]]:
    """A fresh copy of :func:`_parsed_graph` (a test may drop edges from it)."""
    return {m: dict(deps) for m, deps in _parsed_graph().items()}


def _layers() -> list[tuple[str, list[str]]]:
    """The layer block of docs/architecture.md: [(layer, [module or package names])], lowest first."""
    text = ARCH_DOC.read_text(encoding="utf-8")
    marker = text.index("<!-- layers:")
    block = text[marker:].split("```text\n", 1)[1].split("```", 1)[0]
    layers = []
    for row in block.strip().splitlines():
        name, members = row.split(":", 1)
        layers.append((name.strip(), members.split()))
    return layers


def _layer_of(mod: str, layers) -> int | None:
    """Index of the layer whose longest member is ``mod`` or a package holding it."""
    best = None
    for i, (_, members) in enumerate(layers):
        for m in members:
            if (mod == m or mod.startswith(m + ".")) and (best is None or len(m) > best[1]):
                best = (i, len(m))
    return None if best is None else best[0]


def _cycles(graph: dict[str, dict[str, int]]) -> set[frozenset]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], set()
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = set()
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.add(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.add(frozenset(comp))
    return out


def test_cycle_finder_finds_rings_and_only_rings():
    g = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1, "d": 1}, "d": {}, "e": {"f": 1}, "f": {"e": 1}, "g": {"a": 1}}
    assert _cycles(g) == {frozenset("abc"), frozenset("ef")}
    assert _cycles({"a": {"b": 1}, "b": {}}) == set()


def test_every_module_is_in_one_layer_and_imports_only_downward():
    layers = _layers()
    assert [n for n, _ in layers][:4] == ["base", "formats", "arch", "checkpoint"], layers
    graph = _graph()
    assert len(graph) > 60 and sum(len(v) for v in graph.values()) > 200
    unplaced = [m for m in graph if _layer_of(m, layers) is None]
    assert not unplaced, f"modules in no layer of {ARCH_DOC.name}: {unplaced}"
    upward, seen_exceptions = [], set()
    for mod, deps in graph.items():
        for dep, line in deps.items():
            if _layer_of(dep, layers) > _layer_of(mod, layers):
                if (mod, dep) in LAYER_EXCEPTIONS:
                    seen_exceptions.add((mod, dep))
                    continue
                upward.append(f"{mod} (layer {layers[_layer_of(mod, layers)][0]}) imports {dep} "
                              f"(layer {layers[_layer_of(dep, layers)][0]}) at line {line}")
    assert not upward, "\n".join(upward)
    stale = LAYER_EXCEPTIONS - seen_exceptions
    assert not stale, f"these upward imports are gone: remove them from LAYER_EXCEPTIONS: {sorted(stale)}"
    # the reader protocol's own room: formats never import the checkpoint (or anything above)
    assert not [d for m, deps in graph.items() if m.startswith("formats.") for d in deps if d == "checkpoint"]


def test_no_import_cycle_among_ckpt_surgeon_modules():
    graph = _graph()
    # the upward imports listed above are what ties layers into rings; without them, what remains
    # of a ring lies inside one layer
    for mod, dep in LAYER_EXCEPTIONS:
        graph[mod].pop(dep, None)
    found = _cycles(graph)
    new = [sorted(c) for c in found if c not in KNOWN_CYCLES]
    assert not new, "import cycles: " + "; ".join(
        " / ".join(f"{m} -> {', '.join(d for d in graph[m] if d in c)}" for m in c) for c in map(set, new))
    gone = [sorted(c) for c in KNOWN_CYCLES if c not in found]
    assert not gone, f"these cycles are gone or changed: update KNOWN_CYCLES: {gone}"
    # the rooms this issue untangled stay untangled
    tangled = {m for c in found for m in c}
    assert not tangled & ({"checkpoint", "ckpt_surgeon"} | {m for m in graph if m.startswith("formats.")})


_ISOLATED = r"""
import importlib, json, os, sys, traceback
for lib in json.loads(sys.argv[2]):   # other packages the modules import at load time: once, before the forks
    importlib.import_module(lib)


def child(mod, w):                    # a process that has imported nothing of ckpt_surgeon yet
    try:
        importlib.import_module(mod)
        msg = {"ok": True, "heavy": [h for h in ("torch", "transformers") if h in sys.modules]}
    except BaseException:
        msg = {"ok": False, "error": traceback.format_exc(limit=-4)}
    os.write(w, json.dumps(msg).encode())
    os._exit(0)


mods, result = json.loads(sys.argv[1]), {}
batch = max(2, os.cpu_count() or 1)
for i in range(0, len(mods), batch):
    running = []
    for mod in mods[i:i + batch]:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            child(mod, w)
        os.close(w)
        running.append((mod, pid, r))
    for mod, pid, r in running:
        chunks = []
        while chunk := os.read(r, 1 << 16):
            chunks.append(chunk)
        os.close(r)
        os.waitpid(pid, 0)
        result[mod] = json.loads(b"".join(chunks) or b'{"ok": false, "error": "the child died"}')
print(json.dumps(result))
"""


def _outside_imports() -> list[str]:
    """Top-level modules other than ckpt_surgeon (torch and transformers excepted) that ckpt_surgeon
    modules import when they load."""
    out = set()
    for path in _module_names().values():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                out.add(node.module)
    return sorted(m for m in out if m.split(".")[0] not in {"ckpt_surgeon", "torch", "transformers", "__future__"})


def test_every_module_imports_in_isolation():
    """Each module imported first, in a process that has imported no other ckpt_surgeon module
    (one interpreter, forked per module): an import that works only because another module ran
    first, or a cycle that breaks at import time, fails here."""
    names = [m if m == "ckpt_surgeon" else f"ckpt_surgeon.{m}" for m in _module_names() if m != "__main__"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", _ISOLATED, json.dumps(names), json.dumps(_outside_imports())], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(result) == set(names)
    failed = {m: r["error"] for m, r in result.items() if not r["ok"]}
    assert not failed, "\n".join(f"{m}:\n{e}" for m, e in failed.items())
    # the modules that inspect, lint, diff and static analyze run import neither torch nor transformers
    light = ("ckpt_surgeon.checkpoint", "ckpt_surgeon.formats.", "ckpt_surgeon.arch.", "ckpt_surgeon.analysis.inspect",
             "ckpt_surgeon.analysis.lint", "ckpt_surgeon.analysis.diff", "ckpt_surgeon.analysis.redundancy")
    heavy = {m: r["heavy"] for m, r in result.items() if r["heavy"] and m.startswith(light)}
    assert not heavy, heavy


# ---------------------------------------------------------------------------------------------
# The operations layer in its real order, and where torch / transformers may be imported.

OPERATIONS = ["conversion", "runtime", "analysis", "surgery"]


def _upward(graph: dict[str, dict[str, int]], layers) -> list[tuple[str, str]]:
    return [(m, d) for m, deps in graph.items() for d in deps if _layer_of(d, layers) > _layer_of(m, layers)]


def test_the_operations_are_rows_in_their_import_order():
    """conversion < runtime < analysis < surgery, each its own row of the layer block, so an import
    against that order (analysis importing surgery, conversion importing runtime ...) fails the layer
    test above; the rows between checkpoint and verification are these four, in this order."""
    names = [n for n, _ in _layers()]
    assert names[names.index("checkpoint") + 1:names.index("verification")] == OPERATIONS, names
    assert [members for n, members in _layers() if n in OPERATIONS] == [[n] for n in OPERATIONS]
    # the order is the one the code has: each row imports the one below it somewhere
    graph = _graph()
    for low, high in zip(OPERATIONS, OPERATIONS[1:]):
        assert any(m.split(".")[0] == high and d.split(".")[0] == low for m, deps in graph.items() for d in deps), \
            f"nothing in {high} imports {low}: the order in {ARCH_DOC.name} is no longer the code's"


def test_the_layer_check_catches_an_import_against_the_operations_order():
    layers = _layers()
    graph = {"analysis.api": {"surgery.fold": 1}, "surgery.fold": {"analysis.redundancy": 1},
             "conversion.to_gguf": {"runtime": 3}, "runtime": {"conversion.dense": 2}}
    assert sorted(_upward(graph, layers)) == [("analysis.api", "surgery.fold"), ("conversion.to_gguf", "runtime")]


def _heavy_allowed() -> list[str]:
    """The modules / packages docs/architecture.md allows to import torch or transformers."""
    text = ARCH_DOC.read_text(encoding="utf-8")
    block = text.split("<!-- heavy: -->", 1)[1].split("<!-- :heavy -->", 1)[0]
    return [p.removesuffix(".py").removesuffix("/").replace("/", ".") for p in re.findall(r"`([\w/.]+)`", block)]


def _heavy_importers() -> dict[str, bool]:
    """module -> whether it imports torch or transformers at module level (else inside functions)."""
    out = {}
    for mod, path in _module_names().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and not node.level and node.module else [])
            if {n.split(".")[0] for n in names} & {"torch", "transformers"}:
                out[mod] = out.get(mod, False) or node in tree.body
    return out


def test_torch_and_transformers_only_where_the_architecture_page_says():
    allowed = _heavy_allowed()
    assert "arch.derive" in allowed and "runtime" in allowed and len(allowed) > 8, allowed
    found = _heavy_importers()
    assert len(found) > 10, found
    at_load = sorted(m for m, top in found.items() if top)
    assert not at_load, f"torch / transformers imported at module level (import them inside the function): {at_load}"
    covered = lambda m, entry: m == entry or m.startswith(entry + ".")     # noqa: E731
    outside = sorted(m for m in found if not any(covered(m, e) for e in allowed))
    assert not outside, f"modules importing torch / transformers that {ARCH_DOC.name} does not list: {outside}"
    stale = sorted(e for e in allowed if not any(covered(m, e) for m in found))
    assert not stale, f"{ARCH_DOC.name} lists modules that no longer import torch / transformers: {stale}"


def test_only_the_entry_point_imports_the_cli():
    """The CLI sits on top of everything: the library (``demo`` included, which takes its table renderer
    from ``cmd_demo``) never imports it, so no arrow runs back up into ``cli``."""
    graph = _graph()
    into_cli = sorted((m, d) for m, deps in graph.items() for d in deps
                      if (d == "cli" or d.startswith("cli.")) and not (m == "cli" or m.startswith("cli.")))
    assert into_cli == [("__main__", "cli")], into_cli
