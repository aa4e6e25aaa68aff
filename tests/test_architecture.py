"""The import contract (docs/ARCHITECTURE.md), checked over the source's syntax trees, not by importing it.

    errors ─ ir ─ annotations/stage/samples ─ runtime ─ prepare ─ lift ─ place ─ calibrate ─ scales ─ lower
      ─ tensorrt/plugins ─ checks ─ verification ─ conversion ─ bench ─ manifest ─ cli ─ api

(``plugins`` is the repository's top-level ``plugins/`` folder, installed as ``trt_bridge.plugins``.)

- a module imports only from its own layer or the layers before it (left of it above);
- no import cycle between trt_bridge's modules, counting imports inside functions;
- trt_bridge's own modules are imported at module level; inside a function only third-party modules are
  (the heavy or optional ones: onnxruntime, tensorrt, polygraphy, cuda, ...), so the graph a reader sees at the
  top of a file is the whole graph;
- no name with a leading underscore is imported from another module;
- no module is longer than 400 lines.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "trt_bridge"
PLUGINS = ROOT / "plugins"  # the package trt_bridge.plugins
MAX_LINES = 400

#: layers, lowest first; the names are trt_bridge's top-level modules and packages
LAYERS = (
    ("__init__", "errors", "user_code", "choices"),  # user_code: the one place the user's own Python runs
    ("ir", "formats"),
    ("annotations", "stage", "samples"),
    ("runtime",),
    ("prepare",),
    ("lift",),
    ("place",),
    ("calibrate",),
    ("scales",),
    ("lower",),
    ("tensorrt", "plugins"),  # the parser and builder register the plugins; the plugins use the CUDA shim
    ("checks",),
    ("verification",),
    ("conversion",),
    ("bench",),
    ("manifest",),
    ("cli", "__main__"),
    ("api",),  # the Python API (trt_bridge.convert, ...): the CLI's own parsers and commands, called from Python
)
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in ((PACKAGE, ("trt_bridge",)), (PLUGINS, ("trt_bridge", "plugins"))):
        for path in sorted(folder.rglob("*.py")):
            parts = package + path.relative_to(folder).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _top(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    return parts[1]


def _owner(name: str) -> str | None:
    """The trt_bridge module ``name`` (a module, or a name inside one) lives in."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


class Import:
    def __init__(self, importer: str, target: str, name: str | None, line: int, in_function: bool):
        self.importer, self.target, self.name, self.line, self.in_function = (importer, target, name, line,
                                                                               in_function)

    def __str__(self) -> str:
        what = f"{self.target}.{self.name}" if self.name else self.target
        return f"{MODULES[self.importer].relative_to(ROOT)}:{self.line} imports {what}"


def _imports() -> list[Import]:
    found = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        top_level = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [(alias.name, None) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: resolve against this module's package
                    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                    base = base[: len(base) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                # a submodule imported from its package is a module import; anything else a name from a module
                targets = [(f"{source}.{alias.name}", None) if f"{source}.{alias.name}" in MODULES
                           else (source, alias.name) for alias in node.names]
            else:
                continue
            for target, name in targets:
                owner = _owner(target) if target.split(".")[0] == "trt_bridge" else None
                if owner is None or owner == module:
                    continue
                found.append(Import(module, owner, name, node.lineno, id(node) not in top_level))
    return found


IMPORTS = _imports()


def test_every_module_is_in_a_layer():
    assert sorted({_top(m) for m in MODULES} - set(LAYER)) == []


def test_imports_point_down_the_layers():
    upward = [f"{i} ({_top(i.importer)} is below {_top(i.target)})" for i in IMPORTS
              if LAYER[_top(i.importer)] < LAYER[_top(i.target)]]
    assert upward == []


def test_no_import_cycles():
    graph = defaultdict(set)
    for i in IMPORTS:
        graph[i.importer].add(i.target)
    cycles = _cycles(graph)
    assert cycles == []


def test_own_modules_are_imported_at_module_level():
    assert [str(i) for i in IMPORTS if i.in_function] == []


def test_no_private_name_crosses_modules():
    private = [str(i) for i in IMPORTS if i.name and i.name.startswith("_") and not i.name.startswith("__")]
    assert private == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_stay_short(module):
    lines = len(MODULES[module].read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{MODULES[module].relative_to(ROOT)} has {lines} lines (at most {MAX_LINES})"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


if __name__ == "__main__":  # python tests/test_architecture.py [PREFIX]: every violation, for the one fixing them
    import sys

    prefix = sys.argv[1] if len(sys.argv) > 1 else ""
    for i in IMPORTS:
        if not str(i).startswith(prefix):
            continue
        if LAYER[_top(i.importer)] < LAYER[_top(i.target)]:
            print("upward   ", i)
        if i.in_function:
            print("function ", i)
        if i.name and i.name.startswith("_") and not i.name.startswith("__"):
            print("private  ", i)
    for cycle in _cycles({m: {i.target for i in IMPORTS if i.importer == m} for m in MODULES}):
        print("cycle    ", " ".join(cycle))
    for path in MODULES.values():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES and str(path.relative_to(ROOT)).startswith(prefix):
            print("long     ", path.relative_to(ROOT), lines)
