"""``--torch-profile-compiled-modules`` on a real compiled job (tests/jobs/compiled_modules_job.py: a
2-layer model compiled whole, one graph, CPU inductor, on a gloo rank): the map inductor's provenance
gives is written beside the traces, each generated C++ kernel in the trace is given to the layer it
came from (layer 0's sigmoid kernels to layer 0, layer 1's tanh kernels to layer 1: the job's one
difference between them, which the analysis does not read), a trace without the map keeps the
region's attribution, and a corrupt map or one of another version is one line, not a traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.examples import run_doc_example
from helpers.paths import REPO
from helpers.processes import rank_results, run_torchrun, subprocess_env

from torchprof_args.analysis import load_trace
from torchprof_args.analysis.analyzers.compiled.kernel_modules import ROOT, kernel_module_match
from torchprof_args.analysis.analyzers.stepwise import context
from torchprof_args.console import main as torchprof
from torchprof_args.naming import COMPILED_MODULES_SUBDIR
from torchprof_args.shared.kernel_modules import read_kernel_modules


def _compiler() -> str | None:
    """Why inductor cannot compile C++ kernels here (None: it can)."""
    if shutil.which("g++") is None:
        return "no g++ on PATH: CPU inductor compiles its kernels with it"
    return None


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The profile folder of the trace toolkit's example, run verbatim (the job with the flag)."""
    if (why := _compiler()) is not None:
        pytest.skip(why)
    folder = tmp_path_factory.mktemp("compiled_modules")
    proc = run_doc_example("summary-compiled-modules", folder, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(rank_results(folder)) == [0]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("Kernels of compiled code per step by the module they came from"), proc.stdout
    assert any(" layers.0.attn " in line and "sigmoid" in line for line in lines), proc.stdout
    return folder / "prof"


def _summary(folder: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict:
    assert torchprof(["summary", str(folder), "--json", "--no-progress", *extra]) == 0
    (doc,) = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"compiled"' in line]
    return doc


def _trace(folder: Path) -> Path:
    (trace,) = folder.glob("iter*/*.pt.trace.json.gz")
    return trace


@pytest.mark.slow
def test_each_generated_kernel_goes_to_the_layer_it_came_from(profiled: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    (path,) = (profiled / COMPILED_MODULES_SUBDIR).glob("*.json")
    graphs = read_kernel_modules(path).graphs
    assert sorted(g.phase for g in graphs) == ["backward", "forward"]  # one graph: the model compiled whole
    trace = load_trace(_trace(profiled))
    match = kernel_module_match(trace)
    assert match.source == str(path)
    kernels = [i for i, name_id in enumerate(trace.name_id.tolist())
               if trace.names[name_id].startswith("graph_") and "_cpp_" in trace.names[name_id]]
    matched = set(match.idx.tolist())
    assert kernels and set(kernels) <= matched  # every generated kernel call matched
    graph_calls = [i for i, name_id in enumerate(trace.name_id.tolist())
                   if trace.names[name_id].startswith("## Call CompiledFxGraph ")]
    called_out = [i for i, name_id in enumerate(trace.name_id.tolist())  # extern_kernels.mm, .addmm
                  if trace.names[name_id] in ("aten::mm", "aten::addmm")
                  and any(trace.ts[g] <= trace.ts[i] < trace.ts[g] + trace.dur[g] for g in graph_calls)]
    assert called_out and matched <= set(kernels) | set(called_out)
    # an operator called out to is matched unless the map gives it no module (a node inductor's own
    # rewrites made, the backward's addmm_default, has no nn_module_stack)
    unknown = {"aten::" + k.name.removeprefix("extern_kernels.") for g in graphs for k in g.kernels
               if k.module is None and k.name.startswith("extern_kernels.")}
    assert {trace.names[trace.name_id[i]] for i in set(called_out) - matched} <= unknown
    assert len(set(called_out) & matched) > len(set(called_out) - matched)
    by_layer: dict[str, set[str]] = {"sigmoid": set(), "tanh": set()}
    for i, module in zip(match.idx.tolist(), match.module, strict=True):
        name = trace.names[trace.name_id[i]]
        for fn, modules in by_layer.items():
            if fn in name:
                modules.add(module)
    # layer 0's sigmoid and layer 1's tanh: in their own layer, or (fused with the next layer's
    # first kernel) in the module around both, never in the other layer
    assert "layers.0.attn" in by_layer["sigmoid"] and "layers.1.attn" in by_layer["tanh"], by_layer
    assert not any(m.startswith("layers.1") for m in by_layer["sigmoid"]), by_layer
    assert not any(m.startswith("layers.0") for m in by_layer["tanh"]), by_layer
    assert by_layer["sigmoid"] | by_layer["tanh"] <= {"layers.0.attn", "layers.1.attn", "layers", ROOT}
    doc = _summary(profiled, capsys)  # from the sidecar the publisher wrote
    assert doc == _summary(profiled, capsys, "--reparse")
    modules = {m["module"]: m for m in doc["compiled"]["modules"]}
    assert {"layers.0.attn", "layers.1.attn", "layers.0.mlp", "layers.1.mlp"} <= set(modules), modules
    for layer in (0, 1):  # its projections' matrix products, called out to aten
        assert {"aten::mm", "aten::addmm"} <= set(modules[f"layers.{layer}.attn.proj"]["kernels"]), modules
    assert doc["compiled"]["module_map"] == str(path)
    ctx = context(trace)
    in_steps = [i for i in matched if ctx.start <= trace.ts[i] < ctx.end]
    assert sum(m["calls"] for m in modules.values()) == len(in_steps)
    total_ms = sum(float(trace.dur[i]) for i in in_steps) / 1e3 / ctx.n_steps
    assert sum(m["ms_per_step"] for m in modules.values()) == pytest.approx(total_ms, rel=1e-6)
    assert any("sigmoid" in k for k in modules["layers.0.attn"]["kernels"])
    assert not any("tanh" in k for k in modules["layers.0.attn"]["kernels"])
    assert torchprof(["critical-path", str(profiled), "--no-progress"]) == 0  # call sites: the module
    sites = [line for line in capsys.readouterr().out.splitlines() if " at layers." in line]
    assert any("(aten::mm)" in line or "(aten::addmm)" in line for line in sites), sites


@pytest.mark.slow
def test_without_the_map_the_region_s_modules_remain(profiled: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    trace = _trace(profiled)
    alone = tmp_path / "prof" / trace.parent.name
    alone.mkdir(parents=True)
    shutil.copy(trace, alone / trace.name)
    doc = _summary(tmp_path / "prof", capsys)
    regions = {r["name"]: r for r in doc["compiled"]["regions"]}
    assert regions["Torch-Compiled Region: 0/0"]["modules"] == ["Model_0"]
    assert doc["compiled"]["modules"] == [] and doc["compiled"]["module_map"] is None


@pytest.mark.slow
@pytest.mark.parametrize("content", ["{not json", "other version"])
def test_a_corrupt_map_or_one_of_another_version_is_one_line(profiled: Path, tmp_path: Path,
                                                             content: str) -> None:
    copy = tmp_path / "prof"
    shutil.copytree(profiled, copy, ignore=shutil.ignore_patterns("summaries"))
    (path,) = (copy / COMPILED_MODULES_SUBDIR).glob("*.json")
    if content == "other version":
        doc = json.loads(path.read_text())
        path.write_text(json.dumps({**doc, "version": doc["version"] + 1}))
    else:
        path.write_text(content)
    proc = subprocess.run([sys.executable, "-m", "torchprof_args", "summary", str(copy), "--no-progress"],
                          capture_output=True, text=True, cwd=REPO, timeout=300, check=False,
                          env=subprocess_env())
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("Kernels of compiled code")]
    assert len(lines) == 1 and str(path) in lines[0], proc.stdout
    assert "no module map" in lines[0]
    if content == "other version":
        assert "version 2, this torchprof-args reads version 1" in lines[0]
    assert "Torch-Compiled Region: 0/0" in proc.stdout  # the region's attribution kept


@pytest.mark.slow
def test_a_graph_shared_by_blocks_names_the_block_of_each_call(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """FSDP2 with each block compiled (tests/jobs/modern_job.py): region 0/1's graph runs blocks 1-3,
    so its kernels' modules (``up``, ``down``: paths inside the block) are named with the block each
    call ran for, forward and backward (``up in Block_2 (backward)``); block 0's graph runs for it
    alone: its kernels keep their paths."""
    if (why := _compiler()) is not None:
        pytest.skip(why)
    result = run_torchrun(REPO / "tests" / "jobs" / "modern_job.py", "--shape", "fsdp2-compiled",
                          "--result-dir", str(tmp_path), "--torch-profile-dir", str(tmp_path / "prof"),
                          "--torch-profile", "--torch-profile-active", "2", "--torch-profile-with-stack",
                          "--torch-profile-with-modules", "--torch-profile-compiled-modules", nproc=1,
                          timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    doc = _summary(tmp_path / "prof", capsys)
    modules = {m["module"] for m in doc["compiled"]["modules"]}
    for block in (1, 2, 3):
        assert {f"up in Block_{block}", f"down in Block_{block}"} <= modules, modules
        assert f"up in Block_{block} (backward)" in modules, modules
    assert {"up", "down"} <= modules and not any("Block_0" in m for m in modules), modules
