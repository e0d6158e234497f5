"""The package's layout: imports point down the layers, no import cycle, no module or folder too big,
every diagnose kind of one shape.

The layers of ``torchprof_args``, lowest first.  A module imports from its own layer or a lower
one, never from a higher one (a *back-arrow*); within a layer, no cycle:

 1. foundation  ``errors``, ``naming``, ``atomic``, ``private_dir``, ``log``, ``_dist``,
                ``torch_support``, ``device_peaks``, ``import_state``, ``time_limit``, ``shared/`` (what
                ``metrics/`` and ``analysis/`` agree on: the straggler rule): shared by everything, no feature
 2. flags       ``flags/``: Flag, FlagGroup, the registry, argparse types, the flag table; knows no feature
 3. ondemand    ``ondemand/``: its flags and config, the request protocol, the agreed window and its
                wire format, inbox, controller, registry, the dynolog check
 4. stacks      ``stacks/``: the stacks file, the dumper, the per-rank server, "where is each rank"
 5. analysis    ``analysis/`` (the trace toolkit) and ``pyspy/`` (py-spy profiles): tools over files
 6. runtime     ``runtime/``: the training process (profiler, timeline, recorder, export, fence, ...)
 7. metrics     ``metrics/``: timers, the rank gather, MFU, the metrics writer and sinks, the dashboard
 8. config      ``config.py``: THE boundary, ``argparse.Namespace`` in, frozen configs out
 9. frameworks  ``frameworks/``, ``megatron.py``, ``deepspeed.py``, ``huggingface.py``, ``accelerate.py``,
               ``lightning.py``, ``torchtitan.py``, ``cli.py``: the entry points
10. commands    ``commands/``, ``console.py``, ``__main__.py``: the ``torchprof`` command
    facade      ``__init__.py``: the public names, loaded lazily (nothing in the package imports it)

Inside ``analysis/``, lowest first: the trace model (``trace``, ``intervals``, ``jsonout``) <
``decode`` (which builds a ``Trace``) < ``analyzers``, ``memory`` < ``critical_path`` (the dependency
graph over ranks: diagnose computes its savings on it) < ``summary``, ``diagnose`` < ``collect`` <
``render`` < ``tools`` < ``analysis/__init__.py`` (its facade).

Every module of ``analysis/diagnose/kinds/`` is a diagnose kind of the one shape (``KIND``,
``SCOPE``, ``THRESHOLD``, ``analyze`` with its scope's signature) and is in the registry
(``analysis/diagnose/registry.py``), and the registry has no other kind.

One documented exception: a components' ``from_args`` class method (``TorchProfiler``, ``Timers``,
``MetricsWriter``, ``MemorySnapshotter``) imports ``torchprof_args.config`` inside itself, a thin
adapter over ``configs_from_args`` kept for users' own loops; only an import of ``config.py``
inside a function named ``from_args`` is allowed, nothing else.  Everything else a component needs
from the flags reaches it as its typed config (``from_config``).

Imports are read from the source (``ast``): a function-level or ``TYPE_CHECKING`` import counts
like one at the top.  A submodule's implicit import of its parent package is not an edge (every
package would be a cycle with its ``__init__`` re-exports).  No module has 400 lines or more, no
package folder holds more than 20 modules directly.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import types
import typing
from collections.abc import Iterator
from pathlib import Path

import torchprof_args

PACKAGE = "torchprof_args"
ROOT = Path(torchprof_args.__file__).resolve().parent

#: The package's layers, lowest first: each a name and the first components of its modules' dotted
#: names below ``torchprof_args`` ("" is the package's own ``__init__``, the facade on top).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("errors", "naming", "atomic", "private_dir", "log", "_dist", "torch_support",
                    "device_peaks", "import_state", "time_limit", "shared")),
    ("flags", ("flags",)),
    ("ondemand", ("ondemand",)),
    ("stacks", ("stacks",)),
    ("analysis", ("analysis", "pyspy")),
    ("runtime", ("runtime",)),
    ("metrics", ("metrics",)),
    ("config", ("config",)),
    ("frameworks", ("frameworks", "megatron", "deepspeed", "huggingface", "accelerate", "lightning",
                    "torchtitan", "cli")),
    ("commands", ("commands", "console", "__main__")),
    ("facade", ("",)),
)

#: ``analysis/``'s layers, lowest first, by the first component below ``torchprof_args.analysis``.
ANALYSIS = f"{PACKAGE}.analysis"
ANALYSIS_LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("trace model", ("trace", "intervals", "jsonout")),
    ("decode", ("decode",)),
    ("analyzers", ("analyzers", "memory")),
    ("critical path", ("critical_path",)),
    ("compositions", ("summary", "diagnose")),
    ("collect", ("collect",)),
    ("render", ("render",)),
    ("tools", ("tools",)),
    ("analysis facade", ("",)),
)

#: The one allowed back-arrow: ``config.py`` imported inside a function of this name.
FROM_ARGS = "from_args"
CONFIG = f"{PACKAGE}.config"

MAX_LINES = 400
MAX_MODULES_PER_FOLDER = 20


def module_files(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """Every module below ``root`` by dotted name (a package by its ``__init__.py``)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join([package, *parts])] = path
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


def _imports_with_function(tree: ast.AST) -> Iterator[tuple[ast.Import | ast.ImportFrom, str | None]]:
    """Each import statement with the name of the innermost function around it (None: none)."""
    def walk(node: ast.AST, function: str | None) -> Iterator[tuple[ast.Import | ast.ImportFrom, str | None]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, function
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            yield from walk(child, inner)
    return walk(tree, None)


def import_sites(files: dict[str, Path] | None = None) -> dict[str, dict[str, set[str | None]]]:
    """Module -> the package's modules it imports -> the functions the imports sit in (None: top).

    ``files``: the modules to read (default: the package's, :func:`module_files`)."""
    files = module_files() if files is None else files
    sites: dict[str, dict[str, set[str | None]]] = {}
    for module, path in files.items():
        deps = sites.setdefault(module, {})
        for node, function in _imports_with_function(ast.parse(path.read_text(), str(path))):
            names = _imported(node, module, path.name == "__init__.py")
            if isinstance(node, ast.ImportFrom):  # M.x when x is a submodule, else M itself
                submodules = [n for n in names[:-1] if n in files]
                names = submodules if len(submodules) == len(names) - 1 else [*submodules, names[-1]]
            for name in names:
                while name and name not in files:  # ``import a.b.c`` of a non-module: its module
                    name = name.rpartition(".")[0]
                if name.startswith(PACKAGE) and name != module:
                    deps.setdefault(name, set()).add(function)
    return sites


def import_graph(files: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, anywhere in its source."""
    return {module: set(deps) for module, deps in import_sites(files).items()}


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
    """Layers over the modules below ``package``: which layer a module is in, by rank."""

    package: str
    layers: tuple[tuple[str, tuple[str, ...]], ...]

    def layer(self, module: str) -> tuple[int, str] | None:
        """(rank, name) of ``module``'s layer; None outside ``package``; fails on a module no layer names."""
        if module != self.package and not module.startswith(self.package + "."):
            return None
        first = module.removeprefix(self.package).lstrip(".").split(".")[0]
        for rank, (name, members) in enumerate(self.layers):
            if first in members:
                return rank, name
        raise AssertionError(f"{module} is in no layer: add {first!r} to one in tests/test_layout.py "
                             "(and to the order in its docstring)")

    def back_arrows(self, sites: dict[str, dict[str, set[str | None]]]) -> list[str]:
        """``a -> b (layer X above Y)`` for each import from a module up to a higher layer."""
        found = []
        for module, deps in sorted(sites.items()):
            here = self.layer(module)
            if here is None:
                continue
            for dep, functions in sorted(deps.items()):
                there = self.layer(dep)
                if there is None or there[0] <= here[0]:
                    continue
                if dep == CONFIG and functions == {FROM_ARGS}:  # the documented exception
                    continue
                found.append(f"{_short(module)} -> {_short(dep)} (layer {there[1]} above {here[1]})")
        return found


PACKAGE_LAYERS = Layering(PACKAGE, LAYERS)
ANALYSIS_LAYERING = Layering(ANALYSIS, ANALYSIS_LAYERS)


def _short(module: str) -> str:
    return module.removeprefix(PACKAGE + ".") if module != PACKAGE else f"{PACKAGE} (__init__)"


def long_modules(files: dict[str, Path]) -> dict[str, int]:
    """The modules of :data:`MAX_LINES` lines or more, with their lengths."""
    return {_short(m): n for m, p in files.items() if (n := len(p.read_text().splitlines())) >= MAX_LINES}


def heaps(root: Path) -> dict[str, int]:
    """The package folders with more than :data:`MAX_MODULES_PER_FOLDER` modules directly in them."""
    counts: dict[str, int] = {}
    for path in root.rglob("*.py"):
        if path.name != "__init__.py":
            folder = str(path.parent.relative_to(root.parent))
            counts[folder] = counts.get(folder, 0) + 1
    return {folder: n for folder, n in counts.items() if n > MAX_MODULES_PER_FOLDER}


KINDS_PACKAGE = f"{ANALYSIS}.diagnose.kinds"


def kind_shape_problems(module: types.ModuleType) -> list[str]:
    """What ``module`` lacks of a diagnose kind's one shape (``diagnose/registry.py``): ``KIND``
    (the module's name), ``SCOPE`` (a ``Scope``), ``THRESHOLD`` (a ``Threshold``) and ``analyze``
    with its scope's signature: ``(Trace, KindContext) -> Finding | Gap | None`` per rank,
    ``(CycleRanks, KindContext) -> ...`` across ranks."""
    from torchprof_args.analysis.diagnose.context import KindContext, Scope
    from torchprof_args.analysis.diagnose.cycle import CycleRanks
    from torchprof_args.analysis.diagnose.finding import Finding, Gap, Threshold
    from torchprof_args.analysis.trace import Trace

    name = module.__name__.rpartition(".")[2]
    problems = []
    if getattr(module, "KIND", None) != name:
        problems.append(f"KIND must be {name!r}")
    scope = getattr(module, "SCOPE", None)
    if not isinstance(scope, Scope):
        problems.append("SCOPE must be a Scope")
    if not isinstance(getattr(module, "THRESHOLD", None), Threshold):
        problems.append("THRESHOLD must be a Threshold")
    analyze = getattr(module, "analyze", None)
    if not callable(analyze):
        return [*problems, "analyze() is missing"]
    hints = typing.get_type_hints(analyze)
    params = list(inspect.signature(analyze).parameters)
    wanted = {Scope.PER_RANK: Trace, Scope.CROSS_RANK: CycleRanks}.get(scope)  # type: ignore[arg-type]
    if len(params) != 2 or [hints.get(p) for p in params] != [wanted, KindContext]:
        problems.append(f"analyze must take ({getattr(wanted, '__name__', '?')}, KindContext)")
    if hints.get("return") != Finding | Gap | None:
        problems.append("analyze must return Finding | Gap | None")
    return problems


# -- the checker checks ----------------------------------------------------------------------------


def test_the_cycle_finder_finds_and_names_cycles() -> None:
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_the_import_graph_sees_every_kind_of_import() -> None:
    graph = import_graph()
    analysis = ANALYSIS
    assert f"{analysis}.decode.parallel" in graph[f"{analysis}.decode.loader"]  # from package import module
    assert f"{analysis}.render.svg" in graph[f"{analysis}.render.report"]
    assert f"{analysis}.trace" in graph[f"{analysis}.analyzers.steps"]  # from module import name
    assert f"{analysis}.decode.loader" in graph[analysis]  # the package's own re-exports
    assert f"{PACKAGE}.config" in graph[f"{PACKAGE}.metrics.timers"]  # inside a function (from_args)
    assert f"{PACKAGE}.runtime.nsys" in graph[f"{PACKAGE}.metrics.timers"]  # inside a method's branch
    assert f"{PACKAGE}.config" in graph[PACKAGE]  # the facade's imports
    assert PACKAGE not in graph[f"{PACKAGE}.runtime.profiler"]  # the implicit parent import is none


def test_the_import_graph_sees_type_checking_imports(tmp_path: Path) -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from a import b\n"
                     "def from_args():\n    import c\n")
    found = {(n.names[0].name, f) for n, f in _imports_with_function(tree)}
    assert found == {("TYPE_CHECKING", None), ("b", None), ("c", "from_args")}


def _tree(root: Path, files: dict[str, int]) -> Path:
    """A package at ``root`` holding ``files`` (relative path -> lines)."""
    for name, lines in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x = 1\n" * lines)
    return root


def test_a_module_of_400_lines_and_a_folder_of_21_modules_are_found(tmp_path: Path) -> None:
    root = _tree(tmp_path / PACKAGE, {"__init__.py": 1, "ok.py": MAX_LINES - 1, "big.py": MAX_LINES,
                                      **{f"heap/m{i}.py": 1 for i in range(MAX_MODULES_PER_FOLDER + 1)},
                                      **{f"fine/m{i}.py": 1 for i in range(MAX_MODULES_PER_FOLDER)}})
    assert long_modules(module_files(root, PACKAGE)) == {"big": MAX_LINES}
    assert heaps(root) == {f"{PACKAGE}/heap": MAX_MODULES_PER_FOLDER + 1}


def test_a_new_back_arrow_and_a_new_cycle_in_the_source_are_found(tmp_path: Path) -> None:
    root = _tree(tmp_path / PACKAGE, {"__init__.py": 0, "flags/__init__.py": 0, "runtime/__init__.py": 0,
                                      "runtime/timeline.py": 0})
    (root / "flags" / "table.py").write_text("def f():\n    from torchprof_args.runtime import timeline\n")
    (root / "runtime" / "schedule.py").write_text("from . import plan\n")
    (root / "runtime" / "plan.py").write_text("from torchprof_args.runtime.schedule import x\n")
    files = module_files(root, PACKAGE)
    assert PACKAGE_LAYERS.back_arrows(import_sites(files)) == [
        "flags.table -> runtime.timeline (layer runtime above flags)"]
    assert find_cycles(import_graph(files)) == [
        [f"{PACKAGE}.runtime.plan", f"{PACKAGE}.runtime.schedule", f"{PACKAGE}.runtime.plan"]]


def test_back_arrows_are_named_with_their_layers() -> None:
    sites = {f"{PACKAGE}.runtime.x": {f"{PACKAGE}.metrics.y": {None}, f"{PACKAGE}.log": {None}},
             f"{PACKAGE}.metrics.y": {CONFIG: {FROM_ARGS}},  # the exception
             f"{PACKAGE}.ondemand.z": {CONFIG: {FROM_ARGS, "helper"}, PACKAGE: {None}}}
    assert PACKAGE_LAYERS.back_arrows(sites) == [
        "ondemand.z -> torchprof_args (__init__) (layer facade above ondemand)",
        "ondemand.z -> config (layer config above ondemand)",
        "runtime.x -> metrics.y (layer metrics above runtime)",
    ]


# -- the package -----------------------------------------------------------------------------------


def test_every_module_is_in_a_layer() -> None:
    for module in module_files():
        PACKAGE_LAYERS.layer(module)
        ANALYSIS_LAYERING.layer(module)


def test_no_import_points_up_the_package_layers() -> None:
    arrows = PACKAGE_LAYERS.back_arrows(import_sites())
    assert not arrows, "imports up the layers (move what is shared down, or hand the lower layer " \
        "what it needs; the order is in tests/test_layout.py's docstring):\n" + "\n".join(arrows)


def test_no_import_points_up_the_analysis_layers() -> None:
    arrows = ANALYSIS_LAYERING.back_arrows(import_sites())
    assert not arrows, "imports up analysis/'s layers (the order is in tests/test_layout.py's " \
        "docstring):\n" + "\n".join(arrows)


def test_the_package_has_no_import_cycle() -> None:
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles in torchprof_args (move what is shared to the module that owns " \
        "it):\n" + "\n".join(" -> ".join(map(_short, c)) for c in cycles)


def test_the_flags_registry_knows_no_feature() -> None:
    graph = import_graph()
    foundation = {m for m in graph if PACKAGE_LAYERS.layer(m) == (0, "foundation")}
    for module, deps in graph.items():
        if module.startswith(f"{PACKAGE}.flags"):
            outside = {d for d in deps if not d.startswith(f"{PACKAGE}.flags")} - foundation
            assert not outside, f"{_short(module)} imports a feature: {sorted(map(_short, outside))}"


def test_modules_stay_under_400_lines() -> None:
    long = long_modules(module_files())
    assert not long, f"split these modules: {long}"


def test_no_package_folder_is_a_heap() -> None:
    found = heaps(ROOT)
    assert not found, f"more than {MAX_MODULES_PER_FOLDER} modules directly in these folders " \
        f"(group them by concept or layer): {found}"


# -- the diagnose kinds' one shape -----------------------------------------------------------------


def test_the_shape_check_names_what_a_kind_lacks() -> None:
    from torchprof_args.analysis.diagnose.context import Scope
    from torchprof_args.analysis.diagnose.kinds import straggler

    bad = types.ModuleType(f"{KINDS_PACKAGE}.half_done")
    bad.KIND, bad.SCOPE = "half_done", Scope.CROSS_RANK  # type: ignore[attr-defined]
    bad.analyze = lambda ranks, threshold=0.05: None  # type: ignore[attr-defined]  # the old shape
    assert kind_shape_problems(bad) == ["THRESHOLD must be a Threshold",
                                        "analyze must take (CycleRanks, KindContext)",
                                        "analyze must return Finding | Gap | None"]
    assert kind_shape_problems(straggler) == []


def test_every_diagnose_kind_has_the_one_shape_and_is_registered() -> None:
    from torchprof_args.analysis.diagnose.registry import KINDS

    modules = sorted(m for m in module_files() if m.startswith(KINDS_PACKAGE + "."))
    problems = {_short(m): p for m in modules if (p := kind_shape_problems(importlib.import_module(m)))}
    assert not problems, f"diagnose kinds not of the one shape (diagnose/registry.py): {problems}"
    assert sorted(KINDS) == sorted(m.rpartition(".")[2] for m in modules), \
        "every module of diagnose/kinds/ is a kind in diagnose/registry.py's REGISTRY, and only those"
