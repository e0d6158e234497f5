"""``gpu_check.py --sections analysis``: the trace tools on traces this package wrote on this GPU.

Two short single-GPU jobs of the demo GPT go through ``TorchProfiler`` (``--torch-profile-activities
cpu cuda``, record shapes, stacks and FLOPs, 3 active steps): a clean loop (no synchronisation in the
step), and the same loop with two real problems, a data loader that sleeps ``LOADER_SLEEP_S`` per
batch and a ``loss.item()`` in every step.  On each published trace:

- ``torchprof summary --json`` against HTA's temporal and kernel-type breakdowns, our idle-time
  breakdown and kernel launch statistics against HTA's (the same comparisons as tests/test_analysis.py
  and tests/test_diagnose_hta.py make on the stored traces);
- ``torchprof diagnose --json``: the faulty job must show ``dataloader_stall`` near the sleep,
  ranked first (``host_sync`` only where ``.item()`` found the GPU still busy); the clean one
  neither; ``low_mfu`` must find this GPU's peak.

The traces are copied to the results folder (``trace_clean.json.gz``, ``trace_faulty.json.gz``) so
they can become test data.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from gpu_workload import Row

from torchprof_args import TorchProfiler, add_torch_profile_args

LOADER_SLEEP_S = 0.030
#: Model size for these traces: small enough that a trace of 3 steps is a few MB (test data).
SIZES = {"vocab": 8192, "hidden": 1024, "layers": 4, "heads": 8, "seq_len": 1024}
#: ``--smoke`` (CPU): toy sizes, the plumbing only.
SMOKE_SIZES = {"vocab": 256, "hidden": 64, "layers": 2, "heads": 4, "seq_len": 64}
BATCH = 4


def section_analysis(model_module: Any, device: str, dtype: torch.dtype, out: Path) -> list[Row]:
    """Rows for the analysis section."""
    if device != "cuda":
        SIZES.update(SMOKE_SIZES)
    rows = []
    for name, faulty in (("clean", False), ("faulty", True)):
        with tempfile.TemporaryDirectory(dir=out) as scratch:
            trace = _profiled_job(model_module, device, dtype, Path(scratch), faulty)
            kept = out / f"trace_{name}.json.gz"
            shutil.copy(trace, kept)
        size = f"{kept.stat().st_size / 1e6:.1f} MB gz"
        if device == "cuda":  # HTA's breakdowns need GPU kernels
            rows += _hta_rows(kept, name, size)
        rows += _diagnose_rows(kept, name, faulty, device)
    return rows


class _SleepyBatches(torch.utils.data.Dataset):
    """Random token batches; ``sleep_s`` per item stands for a slow reader / tokenizer."""

    def __init__(self, length: int, sleep_s: float) -> None:
        self.length, self.sleep_s = length, sleep_s

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        generator = torch.Generator().manual_seed(index)
        return torch.randint(0, SIZES["vocab"], (BATCH, SIZES["seq_len"] + 1), generator=generator)


def _batches(faulty: bool, steps: int) -> Iterator[torch.Tensor]:
    dataset = _SleepyBatches(steps, LOADER_SLEEP_S if faulty else 0.0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=0, pin_memory=False)
    yield from loader


def _profiled_job(model_module: Any, device: str, dtype: torch.dtype, directory: Path, faulty: bool) -> Path:
    torch.manual_seed(0)
    model = model_module.TinyGPT(**SIZES).to(device=device, dtype=dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    flags = [
        "--torch-profile", "--torch-profile-dir", str(directory),
        "--torch-profile-activities", *(["cpu", "cuda"] if device == "cuda" else ["cpu"]),
        "--torch-profile-record-shapes", "--torch-profile-with-stack", "--torch-profile-with-flops",
        "--torch-profile-skip-first", "2", "--torch-profile-warmup", "1", "--torch-profile-active", "3",
    ]  # fmt: skip
    prof = TorchProfiler.from_args(add_torch_profile_args(argparse.ArgumentParser()).parse_args(flags))
    with prof:
        for step, tokens in enumerate(_batches(faulty, 8), start=1):
            tokens = tokens.to(device, non_blocking=True)
            logits = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, SIZES["vocab"]).float(), tokens[:, 1:].reshape(-1)
            )
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if faulty:
                loss.item()  # the classic hidden host synchronisation
            prof.step(step)
        if device == "cuda":
            torch.cuda.synchronize()
    if len(prof.published_traces) != 1:
        raise RuntimeError(f"TorchProfiler published {len(prof.published_traces)} traces, expected 1")
    return Path(prof.published_traces[0])


def _torchprof_json(*args: str) -> dict[str, Any]:
    command = [sys.executable, "-c", "from torchprof_args.console import main; main()", *args]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        raise RuntimeError(f"torchprof {' '.join(args)} exited {run.returncode}: {run.stderr[-300:]}")
    return json.loads(run.stdout)


def _hta_rows(path: Path, name: str, size: str) -> list[Row]:
    """Largest difference from HTA of each figure the suite compares on the stored traces."""
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError as err:
        return [Row("analysis", f"{name}: agreement with HTA", size, "n/a", f"HTA not importable: {err}")]
    from helpers.hta_reference import temporal_breakdown  # tests/helpers: HTA's breakdown, unasserted

    from torchprof_args.analysis import load_trace, summarize
    from torchprof_args.analysis.diagnose.kinds.gpu_idle import idle_time_breakdown
    from torchprof_args.analysis.diagnose.launches import launch_stats

    logging.getLogger("hta").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as folder:
        shutil.copy(path, Path(folder) / path.name)
        hta = TraceAnalysis(trace_dir=folder)
        rank = hta.t.get_ranks()[0]
        temporal = temporal_breakdown(hta)
        kinds, _ = hta.get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True)
        idle, _ = hta.get_idle_time_breakdown(ranks=[rank], visualize=False)
        launches = hta.get_cuda_kernel_launch_stats(ranks=[rank], visualize=False)[rank]
    trace = load_trace(path)
    gpu = summarize(trace).gpu
    assert gpu is not None, f"{path}: no kernels"
    ours = {**gpu.kernel_type_us, **gpu.kernel_type_overlapping_us}
    ours_kinds = {k.upper(): v for k, v in ours.items()}
    pct_diff = max(abs(getattr(gpu, f"{key}_pct") - temporal[f"{key}_time_pctg"])
                   for key in ("idle", "compute", "non_compute"))
    kind_rel = max(
        abs(ours_kinds.get(k.upper(), 0.0) - total) / max(total, 1.0)
        for k, total in zip(kinds["kernel_type"], kinds["sum"], strict=True)
    )
    mine_idle = idle_time_breakdown(trace)
    idle_us = max(
        abs(mine_idle.get(int(r["stream"]), {}).get(r["idle_category"], 0.0) - r["idle_time"])
        for _, r in idle.iterrows()
    ) if len(idle) else 0.0  # fmt: skip
    mine_launch = launch_stats(trace)
    by_corr = dict(
        zip(mine_launch["correlation"].tolist(), mine_launch["launch_delay"].tolist(), strict=True)
    )
    theirs = zip(launches["correlation"], launches["launch_delay"], strict=True)
    delay_us = max((abs(by_corr.get(c, float("inf")) - d) for c, d in theirs), default=0.0)
    same_launches = len(launches) == len(mine_launch["correlation"])
    ok = pct_diff <= 0.5 and kind_rel <= 0.005 and idle_us <= 1.0 and delay_us <= 1.0 and same_launches
    return [
        Row(
            "analysis",
            f"{name}: summary and analyzers vs HTA",
            size,
            "agree" if ok else "DIFFER",
            f"temporal breakdown max diff {pct_diff:.3f} pct points; "
            f"kernel types max rel diff {kind_rel:.4f}; "
            f"idle breakdown max diff {idle_us:.2f} us over {len(idle)} rows; launch delay max diff "
            f"{delay_us:.2f} us over {len(launches)} launches (ours {len(mine_launch['correlation'])})",
            pct_diff,
            ok,
        )
    ]


def _diagnose_rows(path: Path, name: str, faulty: bool, device: str) -> list[Row]:
    summary = _torchprof_json("summary", "--json", str(path))
    doc = _torchprof_json("diagnose", "--json", str(path))
    found = {f["kind"]: f for f in doc["findings"]}
    stall = found.get("dataloader_stall", {}).get("ms_per_step")
    listing = "; ".join(
        f"{f['kind']} {f['ms_per_step']:.1f} ms (save {f['saving_ms_per_step']:.1f})" for f in doc["findings"]
    )
    gaps = ", ".join(f"{g['kind']}: {g['reason']}" for g in doc.get("gaps", []))
    if faulty:  # loss.item() is there too: a finding only where the GPU still had work queued
        ok = stall is not None and abs(stall - LOADER_SLEEP_S * 1e3) <= 0.1 * LOADER_SLEEP_S * 1e3
        ok = ok and next(iter(found)) == "dataloader_stall"
        expect = f"expects dataloader_stall ~{LOADER_SLEEP_S * 1e3:.0f} ms, ranked first"
    else:
        ok = "dataloader_stall" not in found and "host_sync" not in found
        expect = "expects neither dataloader_stall nor host_sync"
    mfu = found.get("low_mfu", {}).get("evidence", {})
    steps = len(summary.get("steps") or [])
    return [
        Row(
            "analysis",
            f"{name}: torchprof diagnose",
            f"step {doc.get('step_ms') or 0:.1f} ms; summary: {steps} steps",
            ", ".join(found) or "no findings",
            f"{expect}. {listing}. gaps: {gaps or 'none'}. low_mfu evidence: "
            f"{json.dumps(mfu)[:200] if mfu else 'none'}",
            doc.get("step_ms"),
            ok and steps == 3,
        )
    ]
