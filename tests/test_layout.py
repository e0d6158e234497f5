"""The repository's layout: imports point down the package's layers, no import cycle anywhere (the
package, ``benchmarks/``, ``tests/``, ``integrations/``), every import visible in the source, no
public name defined in two modules of one layer, no module or folder too big, every diagnose kind
of one shape and importing no other kind.  The checker is :mod:`helpers.layout`.

The layers of ``torchprof_args``, lowest first.  A module imports from its own layer or a lower
one, never from a higher one (a *back-arrow*); within a layer, no cycle.  The package is two sides
that meet at files: the offline side ``analysis/`` and the in-job side ``capture/``; the contract
between them is the foundation:

 1. foundation  ``errors``, ``naming``, ``atomic``, ``private_dir``, ``log``, ``_dist``,
                ``torch_support``, ``device_peaks``, ``import_state``, ``time_limit``, ``lazy``,
                ``shared/`` (what the job and the tools over its files agree on: the straggler rule,
                its heatmap, the metrics.jsonl records, the stacks file, the formats, the Prometheus
                names): shared by everything, no feature
 2. analysis    ``analysis/``: the tools over the job's files (the trace toolkit, memory, ``trend``,
                ``dashboard``, ``pyspy`` reports, "where is each rank" from the stacks files); below
                every module of ``capture/``, so it imports none of them
 3-8. capture   the in-job side, ``capture/``, lowest first: ``flags/`` (Flag, FlagGroup, the registry,
                argparse types, the flag table; knows no feature), ``ondemand/`` (its flags and config,
                the request protocol, the agreed window, inbox, controller, registry, the dynolog
                check), ``stacks/`` (the dumper, the per-rank server), ``runtime/`` (the training
                process: profiler, timeline, recorder, export, fence, ...), ``metrics/`` (timers, the
                rank gather, MFU, the metrics writer and sinks), ``config.py`` (THE boundary,
                ``argparse.Namespace`` in, frozen configs out)
 9. frameworks  ``capture/frameworks/``, ``megatron.py``, ``deepspeed.py``, ``huggingface.py``,
                ``accelerate.py``, ``lightning.py``, ``torchtitan.py``, ``cli.py``: the entry points
10. commands    ``commands/``, ``mcp_server/``, ``console.py``, ``__main__.py``: the ``torchprof`` command and
                its MCP server (the commands as tools), over both sides (``torchprof trigger`` and
                ``flags`` speak to the job and its options, the others read its files)
    facade      ``__init__.py``: the public names, loaded lazily (nothing in the package imports it)

Inside ``analysis/``, lowest first: the C extensions' loader (``extensions``) < the trace model
(``trace``, ``intervals``, ``jsonout``, ``beside``) < ``decode`` (which builds a ``Trace``) <
``analyzers``, ``memory`` < ``critical_path`` (the dependency graph over ranks: diagnose computes
its savings on it) < ``summary``, ``diagnose`` < ``collect`` < ``render`` < ``staged`` (the job's
one seam into the analysis: ``capture/`` imports nothing else of ``analysis/``) < ``tools``,
``trend``, ``dashboard``, ``pyspy`` < ``analysis/__init__.py`` (its facade).

Every module of ``analysis/diagnose/kinds/`` is a diagnose kind of the one shape (``KIND``,
``SCOPE``, ``THRESHOLD``, ``analyze`` with its scope's signature) and is in the registry
(``analysis/diagnose/registry.py``), and the registry has no other kind.  The kinds are plugins: none
imports another (what several share is in a module of ``analysis/diagnose/`` named for it, and a
kind that reads another's finding names it by ``analysis/diagnose/kind_names.py``).

One documented exception: a components' ``from_args`` class method (``TorchProfiler``, ``Timers``,
``MetricsWriter``, ``MemorySnapshotter``) imports ``torchprof_args.capture.config`` inside itself, a thin
adapter over ``configs_from_args`` kept for users' own loops; only an import of ``config.py``
inside a function named ``from_args`` is allowed, nothing else.  Everything else a component needs
from the flags reaches it as its typed config (``from_config``).

Imports are read from the source (``ast``): a function-level or ``TYPE_CHECKING`` import counts
like one at the top, and so does a string naming a module (the facade's lazy table).  A dynamic
import of a module the source does not name (``import_module(name)``) is allowed only where
:data:`HIDDEN_IMPORTS` says why.  The commands are imported by ``console.py`` like any module.

A public name (not ``_private``) is defined in one module of its layer: two meanings of one name,
or one meaning written twice, are both found.  The names every plugin of a kind defines
(:data:`PROTOCOL_NAMES`: a diagnose kind's ``analyze``, a command module's ``register``) are the
exception.  No module has 800 lines or more (a heap alarm, not a size to split at: a module is
split by concept, never to meet a line count), no package folder holds more than 20 modules directly.
"""

from __future__ import annotations

import importlib
import inspect
import types
import typing
from pathlib import Path

import pytest
from helpers.layout import (
    Layering,
    defined_twice,
    find_cycles,
    heaps,
    hidden_imports,
    import_graph,
    import_sites,
    imports_with_function,
    long_modules,
    module_files,
    reachable,
    shorten,
    sibling_imports,
)
from helpers.paths import REPO

import torchprof_args

PACKAGE = "torchprof_args"
ROOT = Path(torchprof_args.__file__).resolve().parent
FILES = module_files(ROOT, PACKAGE)

#: The package's layers, lowest first: each a name and the first components of its modules' dotted
#: names below ``torchprof_args`` ("" is the package's own ``__init__``, the facade on top).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("errors", "naming", "atomic", "private_dir", "log", "_dist", "torch_support",
                    "device_peaks", "import_state", "time_limit", "lazy", "shared")),
    ("analysis", ("analysis",)),
    ("flags", ("capture", "capture.flags")),
    ("ondemand", ("capture.ondemand",)),
    ("stacks", ("capture.stacks",)),
    ("runtime", ("capture.runtime",)),
    ("metrics", ("capture.metrics",)),
    ("config", ("capture.config",)),
    ("frameworks", ("capture.frameworks", "megatron", "deepspeed", "huggingface", "accelerate",
                    "lightning", "torchtitan", "cli")),
    ("commands", ("commands", "mcp_server", "console", "__main__")),
    ("facade", ("",)),
)

#: ``analysis/``'s layers, lowest first, by the first component below ``torchprof_args.analysis``.
ANALYSIS = f"{PACKAGE}.analysis"
ANALYSIS_LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("compiled paths", ("extensions",)),
    ("trace model", ("trace", "intervals", "jsonout", "beside")),
    ("decode", ("decode",)),
    ("analyzers", ("analyzers", "memory")),
    ("critical path", ("critical_path",)),
    ("compositions", ("summary", "diagnose")),
    ("collect", ("collect",)),
    ("render", ("render",)),
    ("the job's seam", ("staged",)),
    ("tools", ("tools", "trend", "dashboard", "pyspy")),
    ("analysis facade", ("",)),
)

#: The one allowed back-arrow: ``config.py`` imported inside a function of this name.
FROM_ARGS = "from_args"
CONFIG = f"{PACKAGE}.capture.config"

PACKAGE_LAYERS = Layering(PACKAGE, LAYERS, allowed=(CONFIG, FROM_ARGS))
ANALYSIS_LAYERING = Layering(ANALYSIS, ANALYSIS_LAYERS)

#: The layers that run in the training job: they reach the tools over its files only through the
#: analysis's one seam (``analysis/staged.py``: summarise a trace just written).
JOB_LAYERS = frozenset({"flags", "ondemand", "stacks", "runtime", "metrics", "config", "frameworks"})
JOB_SEAM = f"{ANALYSIS}.staged"
OFFLINE_LAYER = "analysis"

#: The dynamic imports whose module is not a string in the call, and why each is safe.
HIDDEN_IMPORTS = {
    f"{PACKAGE}.lazy": "the facades' lazy names: each module is a string in their _LAZY tables",
    f"{PACKAGE}.capture.frameworks.megatron_install": "Megatron-LM's training module, outside the package",
    f"{PACKAGE}.analysis.extensions": "the C extensions (built from .c sources): each caller names its own",
}

#: Names every plugin of one kind defines: a diagnose kind's shape, a command module's ``register``,
#: a framework's callback (``torchprof_args.huggingface.TorchProfileCallback``, ``...lightning...``);
#: and every module's own: its ``logger``, the ``main`` of one run with ``python -m``.
PROTOCOL_NAMES = frozenset({"KIND", "SCOPE", "THRESHOLD", "REMEDY", "analyze", "register",
                            "TorchProfileCallback", "logger", "main"})

#: The folders of scripts beside the package, each a tree of its own (they import by bare name).
SCRIPT_FOLDERS = ("benchmarks", "tests", *(f"integrations/{p.name}"
                                           for p in sorted((REPO / "integrations").iterdir()) if p.is_dir()))

MAX_LINES = 800
MAX_MODULES_PER_FOLDER = 20


def _short(module: str) -> str:
    return shorten(module, PACKAGE)


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
    graph = import_graph(FILES)
    analysis = ANALYSIS
    assert f"{analysis}.decode.parallel" in graph[f"{analysis}.decode.loader"]  # from package import module
    assert f"{analysis}.render.svg" in graph[f"{analysis}.render.report"]
    assert f"{analysis}.trace" in graph[f"{analysis}.analyzers.steps"]  # from module import name
    assert f"{analysis}.decode.loader" in graph[analysis]  # the package's own re-exports
    timers = f"{PACKAGE}.capture.metrics.timers"
    assert f"{PACKAGE}.capture.config" in graph[timers]  # inside a function (from_args)
    assert f"{PACKAGE}.capture.runtime.nsys" in graph[timers]  # inside a method's branch
    assert f"{PACKAGE}.capture.config" in graph[PACKAGE]  # the facade's imports
    assert f"{PACKAGE}.capture.runtime.profiler" in graph[PACKAGE]  # named in the facade's lazy table
    assert f"{PACKAGE}.commands.diagnose" in graph[f"{PACKAGE}.console"]  # the commands it registers
    assert PACKAGE not in graph[f"{PACKAGE}.capture.runtime.profiler"]  # the implicit parent import is none


def test_the_import_graph_sees_type_checking_imports_and_named_modules(tmp_path: Path) -> None:
    tree_text = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from a import b\n"
                 "def from_args():\n    import c\n")
    import ast
    found = {(n.names[0].name, f) for n, f in imports_with_function(ast.parse(tree_text))
             if not isinstance(n, ast.Constant)}
    assert found == {("TYPE_CHECKING", None), ("b", None), ("c", "from_args")}
    root = _tree(tmp_path / "p", {"__init__.py": 0, "a.py": 0, "b.py": 0})
    (root / "a.py").write_text("import importlib\nimportlib.import_module('p.b')\n")
    (root / "b.py").write_text("import importlib\nname = 'p.a'\nimportlib.import_module(name)\nX = 'p'\n")
    files = module_files(root, "p")
    # named in strings; 'p' alone is a word, not an import
    assert import_graph(files) == {"p": set(), "p.a": {"p.b"}, "p.b": {"p.a"}}
    assert hidden_imports(files) == {"p.b": [3]}


def _tree(root: Path, files: dict[str, int]) -> Path:
    """A package at ``root`` holding ``files`` (relative path -> lines)."""
    for name, lines in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x = 1\n" * lines)
    return root


def test_a_module_of_800_lines_and_a_folder_of_21_modules_are_found(tmp_path: Path) -> None:
    root = _tree(tmp_path / PACKAGE, {"__init__.py": 1, "ok.py": MAX_LINES - 1, "big.py": MAX_LINES,
                                      **{f"heap/m{i}.py": 1 for i in range(MAX_MODULES_PER_FOLDER + 1)},
                                      **{f"fine/m{i}.py": 1 for i in range(MAX_MODULES_PER_FOLDER)}})
    assert long_modules(module_files(root, PACKAGE), MAX_LINES, PACKAGE) == {"big": MAX_LINES}
    assert heaps(root, MAX_MODULES_PER_FOLDER) == {f"{PACKAGE}/heap": MAX_MODULES_PER_FOLDER + 1}


def test_a_new_back_arrow_and_a_new_cycle_in_the_source_are_found(tmp_path: Path) -> None:
    root = _tree(tmp_path / PACKAGE, {"__init__.py": 0, "capture/__init__.py": 0,
                                      "capture/flags/__init__.py": 0, "capture/runtime/__init__.py": 0,
                                      "capture/runtime/timeline.py": 0})
    (root / "capture" / "flags" / "table.py").write_text(
        "def f():\n    from torchprof_args.capture.runtime import timeline\n")
    (root / "capture" / "runtime" / "schedule.py").write_text("from . import plan\n")
    (root / "capture" / "runtime" / "plan.py").write_text(
        "from torchprof_args.capture.runtime.schedule import x\n")
    files = module_files(root, PACKAGE)
    assert PACKAGE_LAYERS.back_arrows(import_sites(files), PACKAGE) == [
        "capture.flags.table -> capture.runtime.timeline (layer runtime above flags)"]
    assert find_cycles(import_graph(files)) == [
        [f"{PACKAGE}.capture.runtime.plan", f"{PACKAGE}.capture.runtime.schedule",
         f"{PACKAGE}.capture.runtime.plan"]]


def test_back_arrows_are_named_with_their_layers() -> None:
    sites: dict[str, dict[str, set[str | None]]] = {
             f"{PACKAGE}.capture.runtime.x": {f"{PACKAGE}.capture.metrics.y": {None},
                                               f"{PACKAGE}.log": {None}},
             f"{PACKAGE}.capture.metrics.y": {CONFIG: {FROM_ARGS}},  # the exception
             f"{PACKAGE}.capture.ondemand.z": {CONFIG: {FROM_ARGS, "helper"}, PACKAGE: {None}},
             f"{PACKAGE}.analysis.tools.w": {f"{PACKAGE}.capture.stacks.dumper": {None}}}
    assert PACKAGE_LAYERS.back_arrows(sites, PACKAGE) == [
        "analysis.tools.w -> capture.stacks.dumper (layer stacks above analysis)",
        "capture.ondemand.z -> torchprof_args (__init__) (layer facade above ondemand)",
        "capture.ondemand.z -> capture.config (layer config above ondemand)",
        "capture.runtime.x -> capture.metrics.y (layer metrics above runtime)",
    ]


def test_a_name_defined_in_two_modules_of_one_group_is_found(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "a.py").write_text("POLL = 1\ndef analyze(): ...\nclass Row: ...\n_own = 2\n")
    (root / "b.py").write_text("POLL: int = 1\ndef analyze(): ...\n_own = 2\n")
    (root / "c.py").write_text("from a import Row\n")  # an import defines nothing
    found = defined_twice([("layer", module_files(root, ""))], frozenset({"analyze"}))
    assert found == ["layer: POLL in a, b"]


# -- the package -----------------------------------------------------------------------------------


def test_every_module_is_in_a_layer() -> None:
    for module in FILES:
        PACKAGE_LAYERS.layer(module)
        ANALYSIS_LAYERING.layer(module)


def test_no_import_points_up_the_package_layers() -> None:
    arrows = PACKAGE_LAYERS.back_arrows(import_sites(FILES), PACKAGE)
    assert not arrows, "imports up the layers (move what is shared down, or hand the lower layer " \
        "what it needs; the order is in tests/test_layout.py's docstring):\n" + "\n".join(arrows)


def test_no_import_points_up_the_analysis_layers() -> None:
    arrows = ANALYSIS_LAYERING.back_arrows(import_sites(FILES), PACKAGE)
    assert not arrows, "imports up analysis/'s layers (the order is in tests/test_layout.py's " \
        "docstring):\n" + "\n".join(arrows)


def seam_crossings(sites: dict[str, dict[str, set[str | None]]]) -> list[str]:
    """``a -> b`` for each import from a module of the job (:data:`JOB_LAYERS`) into the tools over
    its files (``analysis/``, ``pyspy/``) other than :data:`JOB_SEAM`."""
    found = []
    for module, deps in sorted(sites.items()):
        here = PACKAGE_LAYERS.layer(module)
        if here is None or here[1] not in JOB_LAYERS:
            continue
        for dep in sorted(deps):
            there = PACKAGE_LAYERS.layer(dep)
            if there is not None and there[1] == OFFLINE_LAYER and dep != JOB_SEAM:
                found.append(f"{_short(module)} -> {_short(dep)}")
    return found


def test_a_job_import_past_the_seam_is_found() -> None:
    sites: dict[str, dict[str, set[str | None]]] = {
        f"{PACKAGE}.capture.runtime.recorder": {JOB_SEAM: {None}, f"{ANALYSIS}.memory.exported": {"f"}},
        f"{PACKAGE}.commands.mem": {f"{ANALYSIS}.memory.exported": {None}},
    }
    assert seam_crossings(sites) == ["capture.runtime.recorder -> analysis.memory.exported"]


def test_the_job_reaches_the_analysis_only_through_its_seam() -> None:
    crossings = seam_crossings(import_sites(FILES))
    assert not crossings, "the job imports the analysis past analysis/staged.py (add what it needs " \
        "there, the one seam between the two sides in ARCHITECTURE.md):\n" + "\n".join(crossings)


def test_the_package_has_no_import_cycle() -> None:
    cycles = find_cycles(import_graph(FILES))
    assert not cycles, "import cycles in torchprof_args (move what is shared to the module that owns " \
        "it):\n" + "\n".join(" -> ".join(map(_short, c)) for c in cycles)


@pytest.mark.parametrize("folder", SCRIPT_FOLDERS)
def test_no_import_cycle_beside_the_package(folder: str) -> None:
    cycles = find_cycles(import_graph(module_files(REPO / folder, "")))
    assert not cycles, f"import cycles in {folder}/ (move what both need to a module of its own):\n" + \
        "\n".join(" -> ".join(c) for c in cycles)


def test_every_import_is_in_the_source() -> None:
    hidden = {m: lines for m, lines in hidden_imports(FILES).items() if m not in HIDDEN_IMPORTS}
    assert not hidden, "dynamic imports of modules the source does not name (write the module's name " \
        f"in a string, or import it): { {_short(m): lines for m, lines in hidden.items()} }"
    stale = set(HIDDEN_IMPORTS) - set(hidden_imports(FILES))
    assert not stale, f"HIDDEN_IMPORTS names modules without a hidden import: {sorted(stale)}"


def test_every_command_module_is_registered() -> None:
    commands = {m for m, p in FILES.items() if m.startswith(f"{PACKAGE}.commands.")
                and "def register(" in p.read_text()}
    unseen = commands - reachable(import_graph(FILES), f"{PACKAGE}.console")
    assert not unseen, f"command modules console.py does not import: {sorted(map(_short, unseen))}"


def test_no_public_name_is_defined_twice_in_a_layer() -> None:
    def group(module: str) -> str:
        layer = PACKAGE_LAYERS.layer(module)
        assert layer is not None
        return layer[1]

    groups: dict[str, dict[str, Path]] = {}
    for module, path in FILES.items():
        groups.setdefault(group(module), {})[_short(module)] = path
    twice = defined_twice(sorted(groups.items()), PROTOCOL_NAMES)
    assert not twice, "public names defined in two modules of one layer (one meaning: define it once " \
        "and import it; two meanings: name each for what it is):\n" + "\n".join(twice)


def test_the_flags_registry_knows_no_feature() -> None:
    graph = import_graph(FILES)
    foundation = {m for m in graph if PACKAGE_LAYERS.layer(m) == (0, "foundation")}
    for module, deps in graph.items():
        if module.startswith(f"{PACKAGE}.capture.flags"):
            outside = {d for d in deps if not d.startswith(f"{PACKAGE}.capture.flags")} - foundation
            assert not outside, f"{_short(module)} imports a feature: {sorted(map(_short, outside))}"


def test_no_module_is_a_heap() -> None:
    long = long_modules(FILES, MAX_LINES, PACKAGE)
    assert not long, f"split these modules by concept: {long}"


def test_no_package_folder_is_a_heap() -> None:
    found = heaps(ROOT, MAX_MODULES_PER_FOLDER)
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


def test_a_kind_that_imports_another_kind_is_found(tmp_path: Path) -> None:
    kinds = "analysis/diagnose/kinds"
    root = _tree(tmp_path / PACKAGE, {"__init__.py": 0, "analysis/__init__.py": 0,
                                      "analysis/diagnose/__init__.py": 0, "analysis/diagnose/spans.py": 0,
                                      f"{kinds}/__init__.py": 0, f"{kinds}/a.py": 0, f"{kinds}/d.py": 0})
    (root / kinds / "b.py").write_text(f"from {KINDS_PACKAGE} import a\n"
                                       "from torchprof_args.analysis.diagnose.spans import x\n")
    (root / kinds / "c.py").write_text("def f():\n    from .a import y\n")  # relative, in a function
    (root / kinds / "d.py").write_text("from torchprof_args.analysis.diagnose import spans\n")  # shared: fine
    assert sibling_imports(import_graph(module_files(root, PACKAGE)), KINDS_PACKAGE, PACKAGE) == [
        "analysis.diagnose.kinds.b -> analysis.diagnose.kinds.a",
        "analysis.diagnose.kinds.c -> analysis.diagnose.kinds.a"]


def test_no_diagnose_kind_imports_another() -> None:
    found = sibling_imports(import_graph(FILES), KINDS_PACKAGE, PACKAGE)
    assert not found, "diagnose kinds importing other kinds (they are plugins: move what several share " \
        "to a module of analysis/diagnose/ named for it; name another kind by diagnose/kind_names.py):\n" \
        + "\n".join(found)


def test_every_diagnose_kind_has_the_one_shape_and_is_registered() -> None:
    from torchprof_args.analysis.diagnose.registry import KINDS

    modules = sorted(m for m in FILES if m.startswith(KINDS_PACKAGE + "."))
    problems = {_short(m): p for m in modules if (p := kind_shape_problems(importlib.import_module(m)))}
    assert not problems, f"diagnose kinds not of the one shape (diagnose/registry.py): {problems}"
    assert sorted(KINDS) == sorted(m.rpartition(".")[2] for m in modules), \
        "every module of diagnose/kinds/ is a kind in diagnose/registry.py's REGISTRY, and only those"
