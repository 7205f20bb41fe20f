"""The package's layering: no module of rpt/ imports, directly or through others, a module that imports it back.

The import graph is read from the source with `ast`: every `import rpt.x` and `from rpt.x import y` (y resolved to the
module rpt.x.y when there is one, else to rpt.x), at module level or inside a function or method. Imports under
`if TYPE_CHECKING:` are left out: they never run. A cycle means two modules that cannot be understood, tested or
moved apart; the shared piece belongs in the lower module, or in a small module of its own.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_names() -> dict[str, Path]:
    """Dotted name -> file of every module under rpt/ and lab/ (a package by its __init__.py)."""
    out = {}
    for folder in ("rpt", "lab"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and (
        (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
        or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING"))


def _imports(tree: ast.AST):
    """Every Import / ImportFrom node, at any depth, outside `if TYPE_CHECKING:` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        children = list(ast.iter_child_nodes(node))
        if _type_checking_only(node):
            children = node.orelse  # the body never runs
        stack.extend(children)


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> dict[str, int]:
    """The rpt modules `name` imports -> the line of the first such import."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in _imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:  # relative: from . import x, from ..y import z
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for t in targets:
            if t in modules and t != name:
                found.setdefault(t, node.lineno)
    return found


@functools.cache  # one parse of the library for the checks below (none changes the graph)
def import_graph() -> dict[str, dict[str, int]]:
    modules = module_names()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _where(graph: dict[str, dict[str, int]], a: str, b: str) -> str:
    return f"{a} (line {graph[a][b]}) -> {b}"


def test_the_graph_sees_module_and_function_level_imports():
    graph = import_graph()
    assert "rpt.model.decoder" in graph["rpt.model.rpt"]  # a module-level `from rpt.model.decoder import`
    assert "lab.demo" in graph["lab.commands.demo"]  # a function-level `from lab.demo import`
    assert "rpt.hf" in graph["rpt"]  # `from rpt import hf`: a module, not a name of rpt
    toy = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}
    assert cycles(toy) == [["a", "b", "c"]]


def test_no_two_modules_import_each_other():
    graph = import_graph()
    pairs = sorted({tuple(sorted((a, b))) for a, deps in graph.items() for b in deps if a in graph.get(b, {})})
    assert not pairs, "modules that import each other:\n" + "\n".join(
        f"  {_where(graph, a, b)}; {_where(graph, b, a)}" for a, b in pairs)


def test_no_import_cycles():
    graph = import_graph()
    found = cycles(graph)
    lines = []
    for component in found:
        inside = set(component)
        lines.append("  " + ", ".join(component) + ":")
        lines += [f"    {_where(graph, a, b)}" for a in component for b in graph[a] if b in inside]
    assert not found, "import cycles:\n" + "\n".join(lines)


def test_the_library_does_not_import_the_experiments():
    """lab/ drives the library; no module of the library depends on it."""
    graph = import_graph()
    bad = [_where(graph, a, b) for a, deps in graph.items() for b in deps
           if (b == "lab" or b.startswith("lab.")) and a.startswith("rpt")]
    assert not bad, "library modules importing the experiments:\n" + "\n".join(bad)


def test_pip_installs_the_library_alone():
    import tomllib

    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert found["include"] == ["rpt*"], found


# The floors of the library, lowest first: a module imports only modules of its own floor or below. The model knows
# nothing of data, labels, training or evaluation; those know nothing of the API; the API nothing of the command line.
FLOORS = [
    ("base", ("rpt.version", "rpt.utils", "rpt.locks", "rpt.outputs", "rpt.chunks", "rpt.config")),
    ("model", ("rpt.model",)),
    ("data, labels, checkpoints", ("rpt.data", "rpt.labels", "rpt.checkpoint", "rpt.retrievers")),
    ("training, evaluation, decoding", ("rpt.training", "rpt.eval", "rpt.decoding", "rpt.retrofit")),
    ("Hugging Face, export, API", ("rpt.hf", "rpt.api", "rpt")),
    ("command line", ("rpt.commands", "rpt.cli")),
    ("experiments (lab/, beside the library)", ("lab",)),
]


def floor(module: str) -> int:
    """The floor of `module` (its longest matching prefix in FLOORS)."""
    best, length = -1, -1
    for i, (_, prefixes) in enumerate(FLOORS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > length:
                best, length = i, len(p)
    return best


def test_every_module_has_a_floor():
    missing = [m for m in import_graph() if floor(m) < 0]
    assert not missing, f"modules on no floor of FLOORS (add them): {missing}"


def test_no_import_climbs_to_a_higher_floor():
    graph = import_graph()
    bad = [f"{_where(graph, a, b)}  ({FLOORS[floor(a)][0]} -> {FLOORS[floor(b)][0]})" for a, deps in graph.items()
           for b in deps if floor(b) > floor(a) and a != "rpt"]
    assert not bad, "imports that climb the layering:\n" + "\n".join(sorted(bad))
