"""The model's code for an exported folder, so that it loads without rpt:

    AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)   # a process where `import rpt` fails

transformers reads `auto_map` in config.json, imports configuration_rpt.py and modeling_rpt.py from the folder and,
with them, every file of the folder they import relatively (`from .x import y`, one flat folder). This module writes
those files from rpt's own source at export time: nothing is maintained twice.

    configuration_rpt.py    rpt/hf/configuration.py
    modeling_rpt.py         rpt/hf/modeling.py
    rpt_model_*.py          rpt/model/*.py that the model imports (every variant's module, the retrofit's too), whole
    rpt_chunks.py           rpt/chunks.py, whole
    rpt_config.py, ...      the other rpt modules they import (rpt/config.py, rpt/utils.py, rpt/labels/bm25.py), cut
                            down to the definitions used (`ModelConfig`, `from_dict`, `require`, the NumPy BM25 ...),
                            with what those use in turn; `RPTConfig`, the whole run's config, is a stub (`STUBS`)

Every `from rpt.a.b import x` (at any depth, in functions too) becomes `from .rpt_a_b import x`. The result imports
only the standard library, torch, numpy and transformers (checked here: `check_imports`); optional pieces stay optional
(Faiss is imported by name when asked for, as in rpt). The copy in the folder registers nothing with the Auto classes
(rpt.hf.modeling's IN_RPT): transformers loads it for that folder alone.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the rpt package
ENTRY = {"rpt.hf.configuration": "configuration_rpt", "rpt.hf.modeling": "modeling_rpt"}
AUTO_MAP = {"AutoConfig": "configuration_rpt.RPTHFConfig", "AutoModelForCausalLM": "modeling_rpt.RPTForCausalLM"}
ALLOWED = {"torch", "numpy", "transformers"}  # besides the standard library

# modules copied whole; of the others only the definitions the copied code uses
WHOLE = ("rpt.model.", "rpt.chunks")

# definitions replaced in the copy: the run's whole config (data, training, presets from YAML files) is not part of
# an exported model; the model code only asks whether it was handed one
STUBS = {("rpt.config", "RPTConfig"): '''class RPTConfig:
    """A stand-in: an exported folder holds the model section of a run's config only (ModelConfig)."""

    model: ModelConfig
'''}


def file_name(module: str) -> str:
    """The file (without .py) a module of rpt becomes in the folder."""
    return ENTRY.get(module) or module.replace(".", "_")


def _source_path(module: str) -> Path:
    rel = Path(*module.split(".")[1:])
    path = ROOT / rel.with_suffix(".py")
    return path if path.is_file() else ROOT / rel / "__init__.py"


def _rpt_imports(tree: ast.AST) -> list[ast.ImportFrom]:
    """Every `from rpt... import` below `tree`; `import rpt...` and imports of rpt modules by name are refused."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name == "rpt" or a.name.startswith("rpt.") for a in node.names):
            raise ValueError(f"line {node.lineno}: `import rpt...`: write `from rpt.x import y` (rpt.hf.bundle copies it)")
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                node.module == "rpt" or node.module.startswith("rpt.")):
            if node.module == "rpt" or _source_path(node.module).name == "__init__.py":
                raise ValueError(f"line {node.lineno}: `from {node.module} import ...`: import from the module itself")
            out.append(node)
    return out


def _bound(stmt: ast.stmt) -> set[str]:
    """The top-level names a module-level statement binds."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(
        stmt, (ast.AnnAssign, ast.AugAssign)) else []
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _used(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _statement_text(lines: list[str], stmt: ast.stmt) -> str:
    first = min([stmt.lineno, *(d.lineno for d in getattr(stmt, "decorator_list", []))])
    return "".join(lines[first - 1 : stmt.end_lineno])


class _Module:
    """One rpt module and the names the copied code imports from it (`wanted`)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.path = _source_path(name)
        self.text = self.path.read_text()
        self.tree = ast.parse(self.text, str(self.path))
        self.whole = name.startswith(WHOLE) or name in ENTRY
        self.wanted: set[str] = set()

    def where(self) -> str:
        return self.path.relative_to(ROOT.parent).as_posix()

    def render(self) -> str:
        """The copy's text (its imports of rpt still absolute: `_relative` rewrites them). A module that is not copied
        whole keeps the statements binding a wanted name and, transitively, the names those use; an import keeps only
        the names used; a name of STUBS is its stub."""
        header = (f"# {file_name(self.name)}.py: written by `rpt export` from {self.where()} of rpt {_version()}"
                  + ("" if self.whole else ", cut down to what the model's code uses") + "; imports of rpt made relative\n")
        if self.whole:
            return header + self.text
        binders: dict[str, ast.stmt] = {}
        for stmt in self.tree.body:
            for name in _bound(stmt):
                binders.setdefault(name, stmt)  # the first binding (a later one re-assigns: not needed)
        stubs = [STUBS[(self.name, n)] for n in sorted(self.wanted) if (self.name, n) in STUBS]
        missing = sorted(n for n in self.wanted if n not in binders)
        if missing:
            raise ValueError(f"{self.where()} defines no {', '.join(missing)} at module level (the model's code imports it)")
        todo = [n for n in self.wanted if (self.name, n) not in STUBS] + [n for t in stubs for n in _used(ast.parse(t))]
        used: set[str] = set()
        while todo:
            name = todo.pop()
            if name in used or name not in binders or (self.name, name) in STUBS:
                continue
            used.add(name)
            if not isinstance(binders[name], (ast.Import, ast.ImportFrom)):
                todo.extend(_used(binders[name]))
        kept = {id(binders[n]) for n in used}
        lines = self.text.splitlines(keepends=True)
        doc = (ast.get_docstring(self.tree) or "").split("\n\n")[0].replace("\n", " ")
        chunks: list[tuple[str, str]] = []  # (kind, text): "import", "def" (a function or class) or "other"
        for stmt in self.tree.body:
            if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
                chunks.append(("import", _statement_text(lines, stmt)))
            elif id(stmt) not in kept:
                continue
            elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
                names = [a for a in stmt.names if (a.asname or a.name).split(".")[0] in used]
                node = ast.Import(names) if isinstance(stmt, ast.Import) else ast.ImportFrom(stmt.module, names, stmt.level)
                chunks.append(("import", ast.unparse(node) + "\n"))
            else:
                kind = "def" if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else "other"
                chunks.append((kind, _statement_text(lines, stmt)))
        chunks += [("def", t) for t in stubs]
        out = [header, f'"""Part of {self.where()}: {doc}"""\n\n']
        previous = "import"
        for kind, text in chunks:
            out.append("\n\n" if "def" in (kind, previous) else "\n" if kind != previous else "")
            out.append(text)
            previous = kind
        return "".join(out)


def _version() -> str:
    from rpt.version import __version__

    return __version__


def _relative(text: str, where: str) -> str:
    """`from rpt.a.b import x` -> `from .rpt_a_b import x`, wherever it stands."""
    tree = ast.parse(text, where)
    lines = text.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    edits = []
    for node in _rpt_imports(tree):
        start = offsets[node.lineno - 1] + node.col_offset
        end = offsets[node.end_lineno - 1] + node.end_col_offset
        new = re.sub(r"^from\s+rpt(\.\w+)+", f"from .{file_name(node.module)}", text[start:end])
        edits.append((start, end, new))
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end:]
    return text


def _required(tree: ast.AST, text: str) -> dict[int, set[str]]:
    """id of each function -> the packages it asks `require` for (rpt.utils: an optional dependency)."""
    out: dict[int, set[str]] = {}
    for fn in ast.walk(tree) if "require(" in text else ():
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[id(fn)] = {c.args[0].value.split(".")[0] for c in ast.walk(fn) if isinstance(c, ast.Call)
                           and getattr(c.func, "id", getattr(c.func, "attr", None)) == "require" and c.args
                           and isinstance(c.args[0], ast.Constant) and isinstance(c.args[0].value, str)}
    return out


def check_imports(files: dict[str, str]) -> None:
    """Every import of the copied code: the standard library, torch, numpy, transformers, or a file of the folder; an
    optional dependency (Faiss, peft) only inside a function that asks `require` for it first, as rpt does."""
    for name, text in files.items():
        tree = ast.parse(text, name)
        required = _required(tree, text)
        stack: list[tuple[ast.AST, set[str]]] = [(tree, set())]
        while stack:
            node, optional = stack.pop()
            optional = optional | required.get(id(node), set())
            stack.extend((child, optional) for child in ast.iter_child_nodes(node))
            if isinstance(node, ast.ImportFrom) and node.level:
                target = f"{node.module}.py"
                if node.level != 1 or not node.module or target not in files:
                    raise ValueError(f"{name}, line {node.lineno}: a relative import of {target}, not in the folder")
                continue
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) else []
            for m in modules:
                top = m.split(".")[0]
                if top not in ALLOWED and top not in sys.stdlib_module_names and top not in optional:
                    raise ValueError(f"{name}, line {node.lineno}: imports {m}; the code of an exported model may import "
                                     f"only the standard library and {', '.join(sorted(ALLOWED))} (an optional "
                                     "package: after `require` in the same function)")


_BUILT: dict[tuple, dict[str, str]] = {}  # the last result, under the state of rpt's source files it was built from


def code_files() -> dict[str, str]:
    """File name -> text of every .py file an exported folder holds."""
    key = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(ROOT.rglob("*.py")))
    if key not in _BUILT:
        _BUILT.clear()
        _BUILT[key] = _build()
    return dict(_BUILT[key])


def _build() -> dict[str, str]:
    modules = {name: _Module(name) for name in ENTRY}
    texts: dict[str, str] = {}
    while True:  # render, follow the imports of rpt, until no module is new and none wants a new name
        before = {name: set(m.wanted) for name, m in modules.items()}
        for mod in list(modules.values()):
            if mod.whole and mod.name in texts:
                continue  # the same text whatever is wanted of it
            try:
                texts[mod.name] = mod.render()
                imports = _rpt_imports(mod.tree if mod.whole else ast.parse(texts[mod.name]))
            except ValueError as e:
                raise ValueError(f"{mod.where()}: {e}") from None
            for node in imports:
                if node.module not in modules:
                    modules[node.module] = _Module(node.module)
                modules[node.module].wanted |= {a.name for a in node.names}
        if {name: m.wanted for name, m in modules.items()} == before:
            break
    files = {f"{file_name(m.name)}.py": _relative(texts[m.name], m.where()) for m in modules.values()}
    check_imports(files)
    return dict(sorted(files.items()))


def write_code(folder: str | Path) -> list[Path]:
    """Write the model's code into `folder` (a saved RPTForCausalLM) and name it in its config.json (`auto_map`);
    returns the files written."""
    folder = Path(folder)
    written = []
    for name, text in code_files().items():
        path = folder / name
        path.write_text(text)
        written.append(path)
    config = folder / "config.json"
    if config.is_file():
        d = json.loads(config.read_text())
        d["auto_map"] = dict(AUTO_MAP)
        config.write_text(json.dumps(d, indent=2, sort_keys=True) + "\n")
    return written
