"""The layout checker ``tests/test_layout.py`` runs: an import graph read from the source (``ast``),
its cycles, layers and their back-arrows, plugins importing each other, names defined twice, modules
too long, folders too full.

It reads any tree of Python files, the package (``torchprof_args``) or a folder of scripts that
import each other by bare name (``benchmarks/``, ``tests/``).  What counts as an import:

* an ``import`` / ``from ... import`` anywhere (top, function, ``TYPE_CHECKING``);
* a string that is exactly one of the tree's dotted module names (``importlib.import_module("x.y")``,
  a lazy-loading table, ``python -m x.y``): a module named in the source is a dependency (a bare
  name like the package's own is too common a word to count);
* not a submodule's implicit import of its parent package (every package would be a cycle with its
  ``__init__`` re-exports).

A dynamic import whose module is not written in the source (``import_module(name)``) is invisible
to all of this: :func:`hidden_imports` finds them.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterable, Iterator
from pathlib import Path

#: Calls that import a module named by their first argument.
IMPORT_CALLS = frozenset({"import_module", "__import__"})


def module_files(root: Path, package: str) -> dict[str, Path]:
    """Every module below ``root`` by dotted name (a package by its ``__init__.py``); ``package``
    prefixes the names ("" for a folder of scripts)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join([package, *parts] if package else parts)] = path
    return out


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """Dotted names ``node`` imports: a module, or for ``from M import x`` M.x when that is one."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        here = module.split(".") if is_package else module.split(".")[:-1]
        base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
    return [f"{base}.{alias.name}" for alias in node.names] + [base]


Site = ast.Import | ast.ImportFrom | ast.Constant


def imports_with_function(tree: ast.AST) -> Iterator[tuple[Site, str | None]]:
    """Each import statement and string constant with the innermost function around it (None: none)."""
    def walk(node: ast.AST, function: str | None) -> Iterator[tuple[Site, str | None]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)) or (
                    isinstance(child, ast.Constant) and isinstance(child.value, str)):
                yield child, function
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            yield from walk(child, inner)
    return walk(tree, None)


def import_sites(files: dict[str, Path]) -> dict[str, dict[str, set[str | None]]]:
    """Module -> the tree's modules it imports -> the functions the imports sit in (None: top)."""
    sites: dict[str, dict[str, set[str | None]]] = {}
    for module, path in files.items():
        deps = sites.setdefault(module, {})
        for node, function in imports_with_function(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant):  # a module named in a string
                text = str(node.value)
                if "." in text and text in files and text != module:
                    deps.setdefault(text, set()).add(function)
                continue
            names = _imported(node, module, path.name == "__init__.py")
            if isinstance(node, ast.ImportFrom):  # M.x when x is a submodule, else M itself
                submodules = [n for n in names[:-1] if n in files]
                names = submodules if len(submodules) == len(names) - 1 else [*submodules, names[-1]]
            for name in names:
                while name and name not in files:  # ``import a.b.c`` of a non-module: its module
                    name = name.rpartition(".")[0]
                if name and name != module:
                    deps.setdefault(name, set()).add(function)
    return sites


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the tree's modules it imports, anywhere in its source."""
    return {module: set(deps) for module, deps in import_sites(files).items()}


def hidden_imports(files: dict[str, Path]) -> dict[str, list[int]]:
    """Module -> the lines of its dynamic imports whose module is not a string in the call."""
    found: dict[str, list[int]] = {}
    for module, path in files.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            first = node.args[0]
            named = isinstance(first, ast.Constant) and isinstance(first.value, str)
            if name in IMPORT_CALLS and not named:
                found.setdefault(module, []).append(node.lineno)
    return found


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """The modules ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (first node repeated at the end) per back edge of a depth-first search."""
    state: dict[str, str] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append([*stack[stack.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


@dataclasses.dataclass(frozen=True)
class Layering:
    """Layers over the modules below ``package``, lowest first: which layer a module is in, by rank.

    A layer's members are dotted names below ``package`` (``"capture.runtime"``); a module is in
    the layer of the longest member that is it or one of its folders (``""``: the package's own
    ``__init__`` only).

    ``allowed``: the one documented back-arrow, ``(module, function)``: that module imported inside
    a function of that name only.
    """

    package: str
    layers: tuple[tuple[str, tuple[str, ...]], ...]
    allowed: tuple[str, str] | None = None

    def layer(self, module: str) -> tuple[int, str] | None:
        """(rank, name) of ``module``'s layer; None outside ``package``; fails on a module no layer names."""
        if module != self.package and not module.startswith(self.package + "."):
            return None
        rest = module.removeprefix(self.package).lstrip(".")
        found: tuple[int, int, str] | None = None  # (length of the member matched, rank, name)
        for rank, (name, members) in enumerate(self.layers):
            for member in members:
                matches = rest == member or (member != "" and rest.startswith(member + "."))
                if matches and (found is None or len(member) > found[0]):
                    found = len(member), rank, name
        if found is None:
            raise AssertionError(f"{module} is in no layer: add {rest.split('.')[0]!r} to one in "
                                 "tests/test_layout.py (and to the order in its docstring)")
        return found[1], found[2]

    def back_arrows(self, sites: dict[str, dict[str, set[str | None]]], short: str) -> list[str]:
        """``a -> b (layer X above Y)`` for each import from a module up to a higher layer (names
        without the ``short.`` prefix)."""
        found = []
        for module, deps in sorted(sites.items()):
            here = self.layer(module)
            if here is None:
                continue
            for dep, functions in sorted(deps.items()):
                there = self.layer(dep)
                if there is None or there[0] <= here[0]:
                    continue
                if self.allowed is not None and dep == self.allowed[0] and functions == {self.allowed[1]}:
                    continue
                found.append(f"{shorten(module, short)} -> {shorten(dep, short)} "
                             f"(layer {there[1]} above {here[1]})")
        return found


def sibling_imports(graph: dict[str, set[str]], plugins: str, short: str) -> list[str]:
    """``a -> b`` for each import of one module below ``plugins`` (a package of plugins, which
    import none of each other) by another (names without the ``short.`` prefix)."""
    def inside(module: str) -> bool:
        return module.startswith(plugins + ".")
    return [f"{shorten(module, short)} -> {shorten(dep, short)}" for module, deps in sorted(graph.items())
            if inside(module) for dep in sorted(deps) if inside(dep)]


def shorten(module: str, package: str) -> str:
    """``module`` without its ``package.`` prefix (the package itself: ``package (__init__)``)."""
    return module.removeprefix(package + ".") if module != package else f"{package} (__init__)"


def public_definitions(path: Path) -> Iterator[str]:
    """The names ``path`` defines at its top level for others to import (not ``_private``)."""
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names = [node.target.id]
        else:
            continue
        yield from (name for name in names if not name.startswith("_"))


def defined_twice(groups: Iterable[tuple[str, dict[str, Path]]], protocol: frozenset[str]) -> list[str]:
    """``group: name in a, b`` for each public name two modules of one group define, but those of
    ``protocol`` (the names every plugin of a kind defines: a diagnose kind's ``analyze``)."""
    found = []
    for group, files in groups:
        where: dict[str, list[str]] = {}
        for module, path in files.items():
            for name in public_definitions(path):
                where.setdefault(name, []).append(module)
        found += [f"{group}: {name} in {', '.join(modules)}" for name, modules in sorted(where.items())
                  if len(modules) > 1 and name not in protocol]
    return found


def long_modules(files: dict[str, Path], max_lines: int, package: str) -> dict[str, int]:
    """The modules of ``max_lines`` lines or more, with their lengths."""
    lengths = {shorten(m, package): len(p.read_text().splitlines()) for m, p in files.items()}
    return {m: n for m, n in lengths.items() if n >= max_lines}


def heaps(root: Path, max_modules: int) -> dict[str, int]:
    """The package folders with more than ``max_modules`` modules directly in them."""
    counts: dict[str, int] = {}
    for path in root.rglob("*.py"):
        if path.name != "__init__.py":
            folder = str(path.parent.relative_to(root.parent))
            counts[folder] = counts.get(folder, 0) + 1
    return {folder: n for folder, n in counts.items() if n > max_modules}
