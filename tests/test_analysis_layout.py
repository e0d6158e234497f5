"""The trace toolkit's layout: no import cycle between its modules, none over 400 lines, every
diagnose kind of one shape.

Dependencies point one way (reading and decoding -> the trace model -> analyzers -> summary and
compositions -> commands); a cycle, even through a function-level or ``TYPE_CHECKING`` import,
means a module does not own what it shares.  Imports are read from the source (``ast``), so a
function-level import counts like one at the top.  A submodule's implicit import of its parent
package is not an edge (every package would be a cycle with its ``__init__`` re-exports).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import types
import typing
from pathlib import Path

import torchprof_args

PACKAGE = "torchprof_args.analysis"
ROOT = Path(torchprof_args.__file__).resolve().parent / "analysis"


def module_files() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__.py``)."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join([PACKAGE, *parts])] = path
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


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, anywhere in its source."""
    files = module_files()
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        deps = graph.setdefault(module, set())
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            names = _imported(node, module, path.name == "__init__.py")
            if isinstance(node, ast.ImportFrom):  # M.x when x is a submodule, else M itself
                submodules = [n for n in names[:-1] if n in files]
                names = submodules if len(submodules) == len(names) - 1 else [*submodules, names[-1]]
            for name in names:
                while name and name not in files:  # ``import a.b.c`` of a non-module: its module
                    name = name.rpartition(".")[0]
                if name.startswith(PACKAGE) and name != module:
                    deps.add(name)
    return graph


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


def _short(module: str) -> str:
    return module.removeprefix(PACKAGE + ".")


def test_the_cycle_finder_finds_and_names_cycles() -> None:
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_the_import_graph_sees_every_kind_of_import() -> None:
    graph = import_graph()
    assert f"{PACKAGE}.decode.parallel" in graph[f"{PACKAGE}.decode.loader"]  # from package import submodule
    assert f"{PACKAGE}.render.svg" in graph[f"{PACKAGE}.render.report"]
    assert f"{PACKAGE}.trace" in graph[f"{PACKAGE}.analyzers.steps"]  # from module import name
    assert f"{PACKAGE}.decode.loader" in graph[PACKAGE]  # the package's own re-exports


def test_analysis_has_no_import_cycle() -> None:
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles in torchprof_args/analysis (move what is shared to the module " \
        "that owns it):\n" + "\n".join(" -> ".join(map(_short, c)) for c in cycles)


def test_analysis_modules_stay_under_400_lines() -> None:
    long = {_short(m): n for m, p in module_files().items() if (n := len(p.read_text().splitlines())) >= 400}
    assert not long, f"split these modules: {long}"


# -- the diagnose kinds' one shape ------------------------------------------------------------

KINDS_PACKAGE = f"{PACKAGE}.diagnose.kinds"


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


def test_the_shape_check_names_what_a_kind_lacks() -> None:
    from torchprof_args.analysis.diagnose.context import Scope
    from torchprof_args.analysis.diagnose.kinds import straggler

    bad = types.ModuleType(f"{KINDS_PACKAGE}.half_done")
    bad.KIND, bad.SCOPE = "half_done", Scope.CROSS_RANK
    bad.analyze = lambda ranks, threshold=0.05: None  # the old shape: a bare float, no types
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
