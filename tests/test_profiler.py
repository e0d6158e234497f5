"""TorchProfiler in one process: which iterations are traced, file names, metadata, publication
modes, partial windows, errors, and that nothing half-written is left in the output directory."""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from helpers.processes import subprocess_env

from torchprof_args import TorchProfiler, add_torch_profile_args
from torchprof_args.analysis import load_trace, summarize
from torchprof_args.analysis.collect.trace_results import SUMMARY, read_results
from torchprof_args.atomic import PARTIAL_PREFIX, partial_path
from torchprof_args.capture.runtime.config import ExportConfig
from torchprof_args.capture.runtime.export.staging import StagingArea
from torchprof_args.capture.runtime.export.writer import Route, TraceWriter
from torchprof_args.naming import STACKS_CONTROL_SUBDIR, operator_table_path


def make_args(tmp_path: Path, *argv: str) -> argparse.Namespace:
    parser = add_torch_profile_args(argparse.ArgumentParser())
    return parser.parse_args(["--torch-profile", "--torch-profile-dir", str(tmp_path / "prof"),
                              "--no-torch-profile-operator-table", *argv])


def train(prof: TorchProfiler, iterations: range, fail_at: int | None = None) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with prof:
        for iteration in iterations:
            model(torch.randn(8, 32)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            if iteration == fail_at:
                raise RuntimeError("training failed")
            prof.step(iteration)


def read_trace(path: str | Path) -> dict:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as handle:
        return json.load(handle)


def profiler_steps(path: str | Path) -> list[int]:
    events = read_trace(path)["traceEvents"]
    return sorted(int(e["name"].split("#")[1]) for e in events
                  if e.get("name", "").startswith("ProfilerStep#"))


def output_files(tmp_path: Path) -> list[str]:
    """Every file under the profile directory, as paths relative to it; not the stacks server's
    control directory (its job.json says the job stopped: state, not output)."""
    prof_dir = tmp_path / "prof"
    return sorted(p.relative_to(prof_dir).as_posix() for p in prof_dir.rglob("*")
                  if p.is_file() and p.relative_to(prof_dir).parts[0] != STACKS_CONTROL_SUBDIR)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fork", "inline"])
def test_cycles_are_traced_and_published(tmp_path, mode):
    args = make_args(tmp_path, "--torch-profile-active", "2", "--torch-profile-repeat", "2",
                     "--torch-profile-wait", "1", "--torch-profile-export", mode,
                     "--torch-profile-record-shapes")
    prof = TorchProfiler.from_args(args)
    train(prof, range(1, 13))
    traces = prof.published_traces
    assert len(traces) == 2
    # skip 1, then (wait 1, warmup 1, active 2) twice: records 4-5 and 8-9.
    assert [profiler_steps(t) for t in traces] == [[4, 5], [8, 9]]
    assert [Path(t).relative_to(tmp_path / "prof").as_posix() for t in traces] == [
        f"iter000004-000005/rank00000_{os.uname().nodename.split('.')[0]}_pid{os.getpid()}.pt.trace.json.gz",
        f"iter000008-000009/rank00000_{os.uname().nodename.split('.')[0]}_pid{os.getpid()}.pt.trace.json.gz",
    ]
    metadata = read_trace(traces[0])["torchprof_args"]
    assert metadata["iterations"] == [4, 5] and metadata["rank"] == 0 and metadata["record_shapes"] is True
    assert not any(Path(name).name.startswith(PARTIAL_PREFIX) for name in output_files(tmp_path))
    assert prof.stats["traces_written"] == 2 and prof.stats["trace_mb"] > 0


@pytest.mark.slow
def test_resume_continues_numbering_and_absolute_window(tmp_path):
    args = make_args(tmp_path, "--torch-profile-step-start", "105", "--torch-profile-step-end", "107")
    prof = TorchProfiler.from_args(args, start_iteration=100)
    train(prof, range(101, 111))
    assert [profiler_steps(t) for t in prof.published_traces] == [[105, 106]]
    assert "iter000105-000106" in prof.published_traces[0]


@pytest.mark.slow
def test_relative_schedule_follows_callers_numbering(tmp_path):
    """args.iteration unknown: the first step() call anchors skip-first to this run."""
    prof = TorchProfiler.from_args(make_args(tmp_path, "--torch-profile-skip-first", "2"))
    train(prof, range(501, 506))
    assert [profiler_steps(t) for t in prof.published_traces] == [[504]]


@pytest.mark.slow
def test_uncompressed_output(tmp_path):
    prof = TorchProfiler.from_args(make_args(tmp_path, "--no-torch-profile-gzip"))
    train(prof, range(1, 5))
    assert prof.published_traces[0].endswith(".pt.trace.json")
    assert profiler_steps(prof.published_traces[0]) == [3]


@pytest.mark.slow
def test_partial_window_is_flushed_at_a_clean_exit(tmp_path):
    prof = TorchProfiler.from_args(make_args(tmp_path, "--torch-profile-active", "5"))
    train(prof, range(1, 6))  # records 3, 4, 5 of 3..7, then the loop ends
    (trace,) = prof.published_traces
    assert "/iter000003-000005/" in trace
    # torch.profiler opens the next step's marker right after step(5); it is empty.
    assert profiler_steps(trace)[:3] == [3, 4, 5]


def test_exception_exit_drops_partial_window_and_leaves_nothing_half_written(tmp_path):
    prof = TorchProfiler.from_args(make_args(tmp_path, "--torch-profile-active", "5"))
    with pytest.raises(RuntimeError, match="training failed"):
        train(prof, range(1, 10), fail_at=5)
    assert prof.published_traces == []
    assert output_files(tmp_path) == []


def test_disabled_and_unselected_ranks_write_nothing(tmp_path, monkeypatch):
    off = TorchProfiler.from_args(argparse.Namespace(**{**vars(make_args(tmp_path)), "torch_profile": False}))
    train(off, range(1, 6))
    assert not off.enabled and off.published_traces == []
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    unselected = TorchProfiler.from_args(make_args(tmp_path, "--torch-profile-ranks", "0"))
    train(unselected, range(1, 6))
    assert unselected.enabled and not unselected.record
    assert output_files(tmp_path) == []


@pytest.mark.slow
def test_export_failure_is_logged_and_training_continues(tmp_path, caplog):
    args = make_args(tmp_path, "--torch-profile-repeat", "2", "--torch-profile-wait", "1")
    prof = TorchProfiler.from_args(args)
    # Break the output directory after validation: publication fails, training must not.
    (tmp_path / "prof").rmdir()
    (tmp_path / "prof").write_text("not a directory any more")
    train(prof, range(1, 10))
    assert prof.published_traces == []
    assert prof.stats["publish_failures"] == 2
    assert "trace" in caplog.text and "was not written" in caplog.text and "rank 0" in caplog.text


def test_profiler_options_reach_torch(tmp_path):
    args = make_args(tmp_path, "--torch-profile-profile-memory", "--torch-profile-with-stack",
                     "--torch-profile-with-modules", "--torch-profile-with-flops")
    prof = TorchProfiler.from_args(args)
    train(prof, range(1, 5))
    events = read_trace(prof.published_traces[0])["traceEvents"]
    assert any(e.get("name") == "[memory]" for e in events)
    assert any(e.get("cat") == "python_function" for e in events)
    # torch 2.13 on CPU does not write FLOP estimates into the trace; the setting is recorded.
    assert read_trace(prof.published_traces[0])["torchprof_args"]["with_flops"] is True


def test_with_modules_gives_the_module_hierarchy_on_this_torch(tmp_path, logs, recwarn):
    """Where with_modules does nothing in eager mode (torch 2.14+), with_stack records the
    ``nn.Module`` events instead: one line on rank 0, no FutureWarning."""
    prof = TorchProfiler.from_args(make_args(tmp_path, "--torch-profile-with-modules"))
    train(prof, range(1, 5))
    trace = read_trace(prof.published_traces[0])
    said = [m for m in logs.at(logging.INFO) if "--torch-profile-with-modules" in m]
    assert not [w for w in recwarn if "with_modules" in str(w.message)]
    if prof.config.trace.modules_via_stack:
        assert len(said) == 1 and "with_stack" in said[0], said
        assert trace["torchprof_args"]["with_stack"] and not trace["torchprof_args"]["with_modules"]
        assert trace["torchprof_args"]["module_hierarchy"].startswith("with_stack")
        assert any(e.get("cat") == "python_function" and "nn.Module: Linear" in e.get("name", "")
                   for e in trace["traceEvents"])
    else:
        assert not said and trace["torchprof_args"]["with_modules"]


def test_cuda_activity_request_degrades_on_cpu(tmp_path, caplog):
    if torch.cuda.is_available():
        pytest.skip("this checks the CPU-only fallback")
    prof = TorchProfiler.from_args(make_args(tmp_path, "--torch-profile-activities", "cpu", "cuda"))
    train(prof, range(1, 5))
    assert "CUDA is not available" in caplog.text
    assert len(prof.published_traces) == 1


@pytest.mark.slow
def test_writer_close_stops_slow_publishers_without_leaving_partial_files(tmp_path):
    """A publisher still compressing at exit is stopped after the timeout and cleans up."""
    out = tmp_path / "out"
    out.mkdir()
    staging = StagingArea(str(tmp_path / "staging"))
    staging.open()
    (staged_dir,) = [d for d in staging.dirs if str(d).startswith(str(tmp_path))]
    writer = TraceWriter(out, staging, ExportConfig(mode="inline", gzip_level=9, operator_table_rows=None),
                         rank=0)

    def export(path: str) -> None:  # ~400 MB of incompressible-ish JSON: gzip -9 takes seconds
        with open(path, "wb") as handle:
            handle.write(b'{"traceEvents": [')
            chunk = os.urandom(1 << 20).hex().encode()
            for _ in range(200):
                handle.write(b'{"name": "' + chunk + b'"},')
            handle.write(b"{}]}")

    assert writer.submit(export, "iter000001-000001", "rank00000_slow").route is Route.INLINE
    time.sleep(1.0)
    assert any(p.name.startswith(PARTIAL_PREFIX) for p in out.rglob("*")), "publisher should be mid-write"
    writer.close(time.monotonic() + 0.1, "the test's deadline")
    # No file (the cycle folder, shared with the other ranks, may stay: removing it could race
    # with another rank's publisher creating its trace there).
    assert [p for p in out.rglob("*") if not p.is_dir()] == []
    assert not staged_dir.exists()
    assert writer.stats["publish_failures"] == 1


@pytest.mark.slow
def test_sigterm_finishes_pending_traces_before_exit(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        import argparse, sys, time, torch
        from torchprof_args import TorchProfiler, add_torch_profile_args
        args = add_torch_profile_args(argparse.ArgumentParser()).parse_args(
            ["--torch-profile", "--torch-profile-dir", {str(tmp_path / 'prof')!r},
             "--no-torch-profile-operator-table"])
        model = torch.nn.Linear(16, 16)
        with TorchProfiler.from_args(args) as prof:
            for iteration in range(1, 100000):
                model(torch.randn(4, 16)).sum().backward()
                prof.step(iteration)
                if iteration == 4:
                    print("flushed", flush=True)
                time.sleep(0.01)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            env=subprocess_env())
    assert proc.stdout.readline().strip() == "flushed"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == -signal.SIGTERM  # delivered again, with the default action
    files = output_files(tmp_path)
    assert len(files) == 1 and files[0].startswith("iter000003-000003/rank00000_"), files
    assert files[0].endswith(".pt.trace.json.gz"), files
    assert profiler_steps(tmp_path / "prof" / files[0]) == [3]


def test_partial_path_is_hidden():
    assert partial_path("/x/y/trace.json.gz") == Path("/x/y/.partial-trace.json.gz")


@pytest.mark.slow
def test_summary_sidecar_and_operator_table_are_written_in_the_summaries_folder(tmp_path):
    parser = add_torch_profile_args(argparse.ArgumentParser())
    args = parser.parse_args(["--torch-profile", "--torch-profile-dir", str(tmp_path / "prof"),
                              "--torch-profile-profile-memory", "--torch-profile-operator-table-rows", "12"])
    prof = TorchProfiler.from_args(args)
    train(prof, range(1, 5))
    (trace,) = prof.published_traces
    # the trace itself is whole (tells a recording problem from a summary one)
    assert profiler_steps(trace) == [3]
    stem = Path(trace).name.replace(".pt.trace.json.gz", "")
    # Nothing but the trace sits in the cycle folder (HTA reads every .json/.gz there as a trace).
    assert sorted(output_files(tmp_path)) == [f"iter000003-000003/{Path(trace).name}",
                                              f"iter000003-000003/summaries/{stem}.operator_table.txt",
                                              f"iter000003-000003/summaries/{stem}.summary.json"]
    sidecar = read_results(trace, (SUMMARY,), top=None)
    assert sidecar is not None and sidecar.summary == summarize(load_trace(trace), top=None)
    table = operator_table_path(trace).read_text()
    assert table.startswith(f"Trace: {trace}")
    # 12 rows, as asked (which small operators make the 12 depends on the machine's timing)
    lines = table.split("Top 12 operators by CPU total:\n", 1)[1].splitlines()
    rows = lines[2:lines.index("")]
    assert len(rows) == 12 and rows[0].startswith("ProfilerStep#3 "), table
    assert "Memory (from [memory] events)" in table and "peak allocated" in table
    assert not any(Path(name).name.startswith(PARTIAL_PREFIX) for name in output_files(tmp_path))


@pytest.mark.parametrize("value", ["-1", "two"])
def test_max_publishing_takes_a_count_and_says_so_in_one_line(tmp_path, capsys, value):
    with pytest.raises(SystemExit):
        make_args(tmp_path, "--torch-profile-max-publishing", value)
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "argument --torch-profile-max-publishing:" in error, error
    assert make_args(tmp_path).torch_profile_max_publishing == 2  # the default: 2 traces in flight
