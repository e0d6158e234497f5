"""MFU, allocator health and GPU hardware readings beside the step timers (issue 19).

What cannot exist on this machine is replaced by stand-ins (tests/helpers/nvml.py: the pynvml
module and torch.cuda.memory_stats); the gather, the writer, the warnings and the 2-rank gloo job
are real.  tests/gpu/test_gpu_hardware.py runs the real paths where CUDA is present."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.nvml import StandInNvml, memory_stats
from helpers.paths import REPO
from helpers.processes import rank_results, run_torchrun

from torchprof_args import MetricsWriter, add_torch_profile_args
from torchprof_args.capture.config import configs_from_args
from torchprof_args.capture.metrics.config import MetricsConfig
from torchprof_args.capture.metrics.hardware import DeviceReadings, hardware_reason, throttle_text
from torchprof_args.capture.metrics.health import AllocRetryWatch
from torchprof_args.capture.metrics.mfu import PeakResolver, flops_value, throughput_figures
from torchprof_args.capture.metrics.straggler_tracker import StragglerTracker
from torchprof_args.console import main as torchprof
from torchprof_args.shared.metrics_log import read_records

GIB = 2**30


def _allocator(retries: int = 0) -> dict[str, float]:
    return {"allocated_bytes.all.peak": 30 * GIB, "reserved_bytes.all.peak": 34 * GIB,
            "num_alloc_retries": retries, "num_ooms": 1}


def test_readings_from_stand_in_nvml_and_memory_stats() -> None:
    nvml = StandInNvml(clock=1410, power_mw=612_500, temperature=87, throttle=0x20 | 0x04, ecc=2)
    nvml.xids = 3
    readings = DeviceReadings(memory_stats=memory_stats(_allocator(5)), nvml=nvml)
    figures = readings.read()
    assert figures == {
        "memory/max-allocated-gb": 30.0, "memory/max-reserved-gb": 34.0, "memory/fragmentation-gb": 4.0,
        "memory/alloc-retries": 5.0, "memory/ooms": 1.0,
        "gpu/sm-clock-mhz": 1410.0, "gpu/power-w": 612.5, "gpu/temperature-c": 87.0,
        "gpu/throttle-reasons": float(0x24), "gpu/ecc-uncorrected": 2.0, "gpu/xid-errors": 3.0}
    nvml.xids = 1
    del nvml.readings["ecc"]  # a field this GPU does not support is left out, the rest goes on
    again = readings.read()
    assert again["gpu/xid-errors"] == 4.0 and "gpu/ecc-uncorrected" not in again
    assert nvml.initialised == 1  # NVML set up once
    assert throttle_text(again["gpu/throttle-reasons"]) == "thermal slowdown, power cap"


def test_without_nvidia_ml_py_one_info_line_and_no_gpu_fields(monkeypatch, caplog) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    readings = DeviceReadings(memory_stats=memory_stats(_allocator()))
    readings._nvml_given = True  # as if CUDA were up: NVML is asked for
    with caplog.at_level(logging.INFO, logger="torchprof_args"):
        first, second = readings.read(), readings.read()
    assert not any(key.startswith("gpu/") for key in {**first, **second})
    assert first["memory/alloc-retries"] == 0.0
    lines = [r.getMessage() for r in caplog.records if "nvidia-ml-py" in r.getMessage()]
    assert len(lines) == 1 and "torchprof-args[gpu]" in lines[0]
    # --metrics-gpu-hardware off: NVML is never imported
    assert not DeviceReadings(hardware=False, nvml=StandInNvml(clock=1)).read()


def test_hardware_reason_names_clock_throttling_and_errors() -> None:
    fast = {"gpu/sm-clock-mhz": 1980.0, "gpu/throttle-reasons": 0.0}
    per_rank = [fast, fast, {"gpu/sm-clock-mhz": 1410.0, "gpu/throttle-reasons": float(0x20),
                             "gpu/xid-errors": 2.0}, fast]
    assert hardware_reason(per_rank, 2) == (
        "SM clock 1410 MHz vs median 1980 MHz, thermal slowdown, 2 XID errors")
    assert hardware_reason(per_rank, 0) == ""
    assert hardware_reason([None, None], 1) == ""
    tracker = StragglerTracker(1.2, 1, rank=1)
    times = [[1.0], [1.0], [2.0], [1.0]]
    scores = {"stragglers/step-score": [1.0, 1.0, 2.0, 1.0]}
    warning, = tracker.update(7, ["step"], times, scores, [0, 1, 37, 3], hardware=per_rank)
    assert warning.endswith("; rank 37: SM clock 1410 MHz vs median 1980 MHz, thermal slowdown, 2 XID errors")


def test_alloc_retry_warning_once_per_episode(caplog) -> None:
    watch = AllocRetryWatch(rank=0)
    series = [[0, 0], [0, 3], [0, 6], [0, 6], [0, 6], [2, 9]]
    with caplog.at_level(logging.WARNING, logger="torchprof_args"):
        issued = [watch.update(10 * (i + 1), [{"memory/alloc-retries": a}, {"memory/alloc-retries": b}])
                  for i, (a, b) in enumerate(series)]
    assert [i for i, message in enumerate(issued) if message] == [1, 5]
    assert "iterations 10-20: rank 1 3 (total 3)" in issued[1]
    assert "rank 0 2 (total 2), rank 1 3 (total 9)" in issued[5]
    assert "expandable_segments" in issued[1]
    assert len([r for r in caplog.records if "allocator retries" in r.getMessage()]) == 2
    quiet = AllocRetryWatch(rank=1)  # every rank computes it; only rank 0 logs
    quiet.update(1, [{"memory/alloc-retries": 0}]), quiet.update(2, [{"memory/alloc-retries": 1}])
    assert len(quiet.warnings) == 1


def test_mfu_from_the_peak_table_the_flag_or_a_warning(caplog) -> None:
    assert throughput_figures(2.0, 2, 4e12, 1.0) == {"throughput": 1.0, "mfu": 100.0}
    h100 = PeakResolver(None, "bf16", device_name=lambda: "NVIDIA H100 80GB HBM3")
    assert throughput_figures(1.0, 8, 8 * 494.7e12, h100)["mfu"] == pytest.approx(50.0)
    assert PeakResolver(None, "fp8", device_name=lambda: "NVIDIA H100 80GB HBM3").peak() == 1978.9
    assert PeakResolver(700.0, device_name=lambda: "NVIDIA H100 80GB HBM3").peak() == 700.0
    unknown = PeakResolver(None, device_name=lambda: "NVIDIA GeForce RTX 3090")
    with caplog.at_level(logging.WARNING, logger="torchprof_args"):
        assert throughput_figures(1.0, 1, 1e12, unknown) == {"throughput": 1.0}
        throughput_figures(1.0, 1, 1e12, unknown)
    warnings = [r.getMessage() for r in caplog.records if "MFU is not logged" in r.getMessage()]
    assert len(warnings) == 1 and "--metrics-peak-tflops" in warnings[0] and "RTX 3090" in warnings[0]
    assert flops_value(lambda iteration: iteration * 1e12, 3) == 3e12 and flops_value(None, 1) is None


def test_flags_fill_the_metrics_config(tmp_path: Path) -> None:
    parser = add_torch_profile_args(__import__("argparse").ArgumentParser())
    args = parser.parse_args(["--metrics-dir", str(tmp_path), "--metrics-peak-tflops", "989.4",
                              "--metrics-peak-dtype", "fp8", "--metrics-gpu-hardware", "off"])
    config = configs_from_args(args).metrics
    assert (config.peak_tflops, config.peak_dtype, config.gpu_hardware) == (989.4, "fp8", False)
    default = configs_from_args(parser.parse_args(["--metrics-dir", str(tmp_path)])).metrics
    assert (default.peak_tflops, default.peak_dtype, default.gpu_hardware) == (None, "bf16", True)


def test_single_process_writer_logs_mfu_allocator_and_gpu_series(tmp_path: Path) -> None:
    config = MetricsConfig(str(tmp_path), sinks=("jsonl",), flops_per_iteration=lambda i: 2e12,
                           peak_tflops=8.0)
    writer = MetricsWriter(config, rank=0, world_size=1, console=False)
    nvml = StandInNvml(clock=1980, power_mw=500_000, temperature=60, throttle=0)
    writer.readings = DeviceReadings(memory_stats=memory_stats(_allocator(2)), nvml=nvml)
    metrics = writer.log_step(10, iteration_time=0.5)
    writer.close()
    assert metrics["throughput"] == pytest.approx(4.0) and metrics["mfu"] == pytest.approx(50.0)
    assert metrics["gpu/sm-clock-mhz"] == metrics["gpu/sm-clock-mhz-min"] == 1980.0
    assert metrics["memory/fragmentation-gb"] == 4.0 and metrics["memory/alloc-retries"] == 2.0
    record, = read_records(tmp_path / "metrics.jsonl")
    assert record.per_rank["gpu/temperature-c"] == [60.0]


@pytest.mark.slow
def test_two_ranks_one_collective_reasons_and_allocator_warning(tmp_path: Path) -> None:
    """Real gloo ranks: the hardware and allocator readings ride in the timers' one all-gather per
    interval; rank 0 names the throttled rank's clock and thermal slowdown, and warns about
    allocation retries once per episode (intervals 2-3, then 5)."""
    result = run_torchrun(REPO / "tests" / "jobs" / "hardware_job.py", str(tmp_path), timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ranks = rank_results(tmp_path)
    for rank, entry in ranks.items():
        assert [i["collectives"] for i in entry["intervals"]] == [3, 1, 1, 1, 1, 1], rank
        metrics = entry["intervals"][-1]["metrics"]
        assert metrics["gpu/sm-clock-mhz"] == 1980.0 and metrics["gpu/sm-clock-mhz-min"] == 1410.0
        assert metrics["gpu/power-w"] == 700.0 and metrics["gpu/temperature-c"] == 88.0
        assert metrics["throughput"] == pytest.approx(4.0) and metrics["mfu"] == pytest.approx(40.0)
        assert metrics["memory/alloc-retries"] == 9.0
        reason = "; rank 1: SM clock 1410 MHz vs median 1695 MHz, thermal slowdown"
        assert entry["stragglers"] and all(w.endswith(reason) for w in entry["stragglers"])
        assert [w.split(":")[0] for w in entry["alloc_warnings"]] == [
            "CUDA allocator retries grew in iterations 1-2", "CUDA allocator retries grew in iterations 4-5"]
    records = read_records(tmp_path / "metrics" / "metrics.jsonl")
    assert [r.per_rank["gpu/sm-clock-mhz"] for r in records] == [[1980.0, 1410.0]] * 6
    assert records[-1].per_rank["memory/alloc-retries"] == [0.0, 9.0]
    stderr = result.stderr
    assert stderr.count("[torchprof rank 0] CUDA allocator retries grew") == 2
    assert "[torchprof rank 1] CUDA allocator retries grew" not in stderr
    assert "thermal slowdown" in stderr and records[0].metrics["mfu"] == pytest.approx(40.0)

    # the dashboard of the same run: MFU and allocator panels, per-rank heatmaps of clock, power and
    # temperature relative to each interval's median (rank 1's clock: 1410 / 1695 = 0.83x)
    page_path = tmp_path / "timings.html"
    assert torchprof(["dashboard", str(tmp_path / "metrics"), "-o", str(page_path)]) == 0
    page = page_path.read_text()
    for title in ("MFU (model FLOPs utilisation)", "allocator fragmentation", "allocator retries and OOMs",
                  "SM clock", "power", "temperature"):
        assert f'class="title">{title}' in page, title
    assert page.count('class="panel heatmap"') == 4  # 3 hardware + forward-backward's straggler scores
    assert "rank 1, iteration 6: 0.83x</title>" in page and "(white: the median)" in page
    if shutil.which("chromium"):
        dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                              f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page_path.as_uri()],
                             capture_output=True, text=True, timeout=120, check=True).stdout
        assert dom.count('class="panel heatmap"') == 4 and "SM clock" in dom


@pytest.mark.slow
def test_readings_failing_on_one_rank_mid_run_do_not_stop_training(tmp_path: Path) -> None:
    """Rank 1's NVML and memory_stats raise on every call from interval 4 on: both ranks log all 6
    intervals, rank 1's readings are absent from then on (the layout is agreed anew once), rank 0's
    go on."""
    result = run_torchrun(REPO / "tests" / "jobs" / "hardware_job.py", str(tmp_path), "readings-fail",
                          timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank, entry in rank_results(tmp_path).items():
        assert [i["collectives"] for i in entry["intervals"]] == [3, 1, 1, 4, 1, 1], rank
        assert entry["intervals"][-1]["metrics"]["gpu/sm-clock-mhz-min"] == 1980.0  # rank 0's only
    records = read_records(tmp_path / "metrics" / "metrics.jsonl")
    assert [r.iteration for r in records] == [1, 2, 3, 4, 5, 6]
    assert [r.per_rank["gpu/sm-clock-mhz"] for r in records[2:]] == [
        [1980.0, 1410.0], [1980.0, None], [1980.0, None], [1980.0, None]]
    assert records[-1].per_rank["memory/alloc-retries"] == [0.0, None]
