"""The package's shape (issue #27): no import cycles anywhere in opforge/, and no oversized module.

Pure source analysis (``ast``), nothing of opforge is imported: every ``import`` statement of
every module counts, the ones inside functions too (a deferred import that closes a cycle is a
cycle all the same, only one that fails later and more confusingly).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "opforge"

#: The issue's bound (#27). Modules allowed over it, each with the reason: none today (keep it
#: that way: split instead).
MAX_LINES = 600
LONG_MODULES: dict[str, int] = {}


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


#: Compiled submodules (setup.py builds them; a source checkout may not have them yet). They
#: import nothing of the package's Python code, so importing one is no edge of the graph.
COMPILED = {"opforge._C"}


def _is_extension(root: Path, name: str) -> bool:
    *parent, last = name.split(".")
    return name in COMPILED or any(root.parent.joinpath(*parent).glob(f"{last}.*so"))


def import_graph(root: Path) -> dict[str, dict[str, int]]:
    """``{module: {imported module of the same package: line}}`` for every ``*.py`` under
    ``root`` (a package directory). ``from pkg import name`` counts as an import of the
    submodule ``pkg.name`` where there is one, else of ``pkg`` itself; relative imports are
    resolved; an implicit import of a parent package (``import a.b`` runs ``a/__init__``) is
    not counted, as the parent is imported before any of its modules anyway."""
    files = {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, dict[str, int]] = {}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        edges = graph.setdefault(module, {})
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base_parts = module.split(".") if is_package else module.split(".")[:-1]
                    base_parts = base_parts[:len(base_parts) - (node.level - 1)]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = []
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in files:
                        targets.append(sub)
                    elif not _is_extension(root, sub):
                        targets.append(base)
            else:
                continue
            for target in targets:
                while target and target not in files:  # the longest module of the package it names
                    target = target.rpartition(".")[0]
                if target and target != module:
                    edges.setdefault(target, node.lineno)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _describe(graph, component) -> str:
    return "\n".join(f"  {a} -> {b} (line {line})" for a in component for b, line in graph[a].items()
                     if b in component)


def test_no_import_cycles_in_opforge():
    graph = import_graph(PACKAGE)
    assert "opforge.aten.bridge" in graph and graph["opforge.aten.bridge"], "the graph is empty: the walk is broken"
    found = cycles(graph)
    assert found == [], "import cycles:\n" + "\n\n".join(_describe(graph, c) for c in found)


def test_no_module_over_the_line_limit():
    sizes = {_module_name(p, PACKAGE): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    too_long = {m: n for m, n in sizes.items() if n > LONG_MODULES.get(m, MAX_LINES)}
    assert too_long == {}, f"modules over {MAX_LINES} lines (split them): {too_long}"
    stale = {m for m, limit in LONG_MODULES.items() if m not in sizes or sizes[m] <= MAX_LINES}
    assert stale == set(), f"LONG_MODULES entries no longer needed: {stale}"


#: opforge/aten/, lowest layer first: a module imports only modules of earlier layers
#: (docs/architecture.md, "What may import what").
ATEN_LAYERS = (
    {"errors", "policy", "samples", "rules"},
    {"nodes"},
    {"lowerings", "fallback"},
    {"binding", "compositions", "downgrade", "fallback_dynamo"},
    {"translation"},
    {"bridge"},
    {"coverage"},
    {"diagnosis"},
)


def test_the_aten_package_is_layered():
    graph = import_graph(PACKAGE)
    layer = {f"opforge.aten.{m}": i for i, names in enumerate(ATEN_LAYERS) for m in names}
    modules = {m for m in graph if m.startswith("opforge.aten.")}
    assert modules == set(layer), f"put each module of opforge/aten/ in a layer: {modules ^ set(layer)}"
    wrong = {(m, t) for m in modules for t in graph[m]
             if t in ("opforge", "opforge.aten") or (t in layer and layer[t] >= layer[m])}
    assert wrong == set(), f"imports against the layers (importer, imported): {sorted(wrong)}"


def test_the_aten_subsystem_is_one_package():
    assert sorted(p.name for p in (PACKAGE / "symbolics").glob("aten*")) == []
    assert not (PACKAGE / "coverage.py").exists() and not (PACKAGE / "diagnosis.py").exists()
    assert not (PACKAGE / "ort_kernels" / "aten_csrc").exists()
    assert (PACKAGE / "aten" / "csrc" / "aten_op.cc").exists()


# The checker itself, on packages made for it: it must see what it is meant to see.

def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for name, text in {"__init__.py": "", **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize("files, cycle", [
    # module level, relative
    ({"a.py": "from . import b\n", "b.py": "from .a import x\n"}, ["pkg.a", "pkg.b"]),
    # deferred (inside a function), through a subpackage and two levels up
    ({"a.py": "from .sub import c\n", "sub/__init__.py": "", "sub/c.py": "def f():\n    from ..a import y\n"},
     ["pkg.a", "pkg.sub.c"]),
    # absolute, three modules
    ({"a.py": "import pkg.b\n", "b.py": "from pkg import c\n", "c.py": "def g():\n    import pkg.a\n"},
     ["pkg.a", "pkg.b", "pkg.c"]),
    # through a package's __init__ that re-exports a name
    ({"__init__.py": "from .a import x\n", "a.py": "def f():\n    from pkg import thing\n"}, ["pkg", "pkg.a"]),
])
def test_the_cycle_check_finds_cycles(tmp_path, files, cycle):
    assert cycles(import_graph(_package(tmp_path, files))) == [cycle]


def test_the_cycle_check_passes_a_layered_package(tmp_path):
    root = _package(tmp_path, {"errors.py": "class E(Exception): pass\n",
                               "low.py": "from .errors import E\n",
                               "high.py": "from . import low\ndef f():\n    from .errors import E\n",
                               "sub/__init__.py": "from .. import high\n"})
    graph = import_graph(root)
    assert graph["pkg.high"] == {"pkg.low": 1, "pkg.errors": 3}
    assert cycles(graph) == []
