"""The layer contract of src/headcount (issue 38): no import circle, no import from a lower layer
into a higher one, every module assigned to a layer.

The import graph is built with `ast` from the source files, imports inside functions included
(they run too, only later); imports under `if TYPE_CHECKING:` are left out (they never run).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "headcount"

# Bottom to top. A module may import its own layer and the layers below it. A name ending in "."
# covers a subpackage; any other name is one module.
LAYERS: dict[str, tuple[str, ...]] = {
    # report.preregistered: the rules fixed before the runs they judge, constants importing nothing,
    # read by the analyses and pruning methods that apply them as well as by the report
    # settings: every default setting, dataclasses importing nothing, read by every layer above
    "base": ("headcount.version", "headcount.io", "headcount.progress", "headcount.signals", "headcount.provenance",
             "headcount.report.preregistered", "headcount.settings"),
    "data": ("headcount.data.",),
    "config": ("headcount.config",),  # reads the synthetic language's piece length; never a model
    "models": ("headcount.models.",),
    "testing": ("headcount.testing.",),  # fixtures for tests and dry runs: tiny models of each family
    "training": ("headcount.training.",),
    "analysis": ("headcount.analysis.",),
    "pruning": ("headcount.pruning.",),
    "report": ("headcount.report.",),
    "drivers": ("headcount.pipeline.",),
    "api": ("headcount", "headcount.api"),  # the package re-exports the API (lazily)
}
ORDER = list(LAYERS)


@dataclass(frozen=True)
class Import:
    importer: str  # module name
    imported: str  # module name
    where: str  # file:line


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every import node that runs, at any depth, skipping `if TYPE_CHECKING:` bodies."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph(root: Path = PACKAGE) -> tuple[set[str], list[Import]]:
    """The modules of the package at `root` and the imports between them."""
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    modules = set(files)
    top = root.name
    edges = []
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        where = path.relative_to(root.parent)
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base = package.split(".")
                    base = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                # `from pkg import name`: the module pkg.name where there is one, else pkg itself.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                if target != top and not target.startswith(top + "."):
                    continue
                while target not in modules and "." in target:  # `import pkg.mod.attr` and the like
                    target = target.rpartition(".")[0]
                edge = Import(name, target, f"{where}:{node.lineno}")
                if target != name and edge not in edges:
                    edges.append(edge)
    return modules, edges


def layer_of(module: str) -> str | None:
    for layer, names in LAYERS.items():
        for entry in names:
            if module == entry or (entry.endswith(".") and (module + ".").startswith(entry)):
                return layer
    return None


def circles(modules: set[str], edges: list[Import]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    graph = {m: sorted({e.imported for e in edges if e.importer == m}) for m in modules}
    index, low, on_stack, stack, out = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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
                out.append(sorted(component))

    for v in sorted(modules):
        if v not in index:
            visit(v)
    return out


def upward(edges: list[Import], layer=layer_of) -> list[Import]:
    return [e for e in edges if layer(e.importer) and layer(e.imported)
            and ORDER.index(layer(e.imported)) > ORDER.index(layer(e.importer))]


@pytest.mark.slow
def test_every_module_has_a_layer():
    modules, _ = import_graph()
    assert not [m for m in sorted(modules) if layer_of(m) is None], "add these modules to a layer in LAYERS"


@pytest.mark.slow
def test_no_import_circle():
    modules, edges = import_graph()
    found = circles(modules, edges)
    detail = [f"{e.where}: {e.importer} imports {e.imported}" for c in found for e in edges
              if e.importer in c and e.imported in c]
    assert not found, "import circles:\n" + "\n".join(detail)


@pytest.mark.slow
def test_no_import_from_a_lower_layer_into_a_higher_one():
    _, edges = import_graph()
    found = [f"{e.where}: {e.importer} ({layer_of(e.importer)}) imports {e.imported} ({layer_of(e.imported)})"
             for e in upward(edges)]
    assert not found, f"layers, bottom to top: {' < '.join(ORDER)}\n" + "\n".join(found)


def test_the_graph_builder_sees_function_level_imports_and_skips_type_checking(tmp_path):
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sub" / "__init__.py").write_text("")
    (root / "a.py").write_text("def f():\n    from .sub import b\n")
    (root / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import f\n"
                                       "from .. import c\n")
    (root / "c.py").write_text("import pkg.a\n")
    modules, edges = import_graph(root)
    assert modules == {"pkg", "pkg.a", "pkg.c", "pkg.sub", "pkg.sub.b"}
    assert {(e.importer, e.imported, e.where) for e in edges} == {
        ("pkg.a", "pkg.sub.b", "pkg/a.py:2"), ("pkg.sub.b", "pkg.c", "pkg/sub/b.py:4"),
        ("pkg.c", "pkg.a", "pkg/c.py:1")}
    assert circles(modules, edges) == [["pkg.a", "pkg.c", "pkg.sub.b"]]
