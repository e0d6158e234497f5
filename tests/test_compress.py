"""Compressing a published trace: isal where it is installed and as good as the zlib level asked, zlib
otherwise, the same content either way; the fallback in a real process without isal."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import zlib
from pathlib import Path

import msgspec
import pytest
from helpers.publishing import served

from torchprof_args.capture.runtime.export import publisher
from torchprof_args.capture.runtime.export.compress import (
    ISAL_LEVELS,
    Compressor,
    compressor_for,
    copy_compressed,
)
from torchprof_args.capture.runtime.export.job import PublishJob
from torchprof_args.capture.runtime.export.status import PublishStatus

isal = pytest.importorskip("isal.igzip", reason="isal (the analysis extra) is not installed")

DATA = Path(__file__).parent / "data"
#: a real torch.profiler trace of a 2-rank gloo job (stacks, shapes), 3.5 MB uncompressed
REAL_TRACE = DATA / "cpu_2rank_gloo_rank0_iter3.json.gz"


@pytest.fixture(scope="module")
def raw_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("raw") / "rank0.pt.trace.json"
    path.write_bytes(gzip.decompress(REAL_TRACE.read_bytes()))
    return path


def test_the_level_picks_isal_only_where_it_compresses_about_as_well() -> None:
    assert compressor_for(None) == Compressor("copy", 0)
    assert [compressor_for(level, isal=True) for level in range(1, 10)] == [
        Compressor("isal", 1), *(Compressor("zlib", level) for level in range(2, 10))]
    assert [compressor_for(level, isal=False) for level in range(1, 10)] == [
        Compressor("zlib", level) for level in range(1, 10)]
    assert compressor_for(1) == Compressor("isal", 1)  # isal is installed here


@pytest.mark.parametrize("level", [None, 1, 2, 3, 6, 9])
@pytest.mark.parametrize("use_isal", [True, False])
def test_isal_and_zlib_write_one_valid_gzip_member_with_the_trace_s_content(
        raw_trace: Path, tmp_path: Path, level: int | None, use_isal: bool) -> None:
    target = tmp_path / "out" / "rank0.pt.trace.json.gz"
    used = copy_compressed(raw_trace, target, level, isal=use_isal)
    assert used == compressor_for(level, isal=use_isal)
    data = target.read_bytes()
    if level is None:
        assert data == raw_trace.read_bytes()
        return
    # zlib's own decoder, strictly: exactly one gzip member and nothing after it
    decoder = zlib.decompressobj(wbits=31)
    assert decoder.decompress(data) == raw_trace.read_bytes() and decoder.eof and decoder.unused_data == b""
    assert isal.decompress(data) == raw_trace.read_bytes()
    assert data[4:8] == b"\0\0\0\0"  # mtime 0: the same trace gives the same bytes
    json.loads(gzip.decompress(data))  # still the trace's JSON
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]  # no partial file left


@pytest.mark.parametrize("level", sorted(ISAL_LEVELS))
def test_isal_at_the_mapped_level_is_no_more_than_5_percent_larger_than_zlib_at_the_level_asked(
        raw_trace: Path, tmp_path: Path, level: int) -> None:
    with_isal = copy_compressed(raw_trace, tmp_path / "isal.gz", level, isal=True)
    copy_compressed(raw_trace, tmp_path / "zlib.gz", level, isal=False)
    assert with_isal.library == "isal"
    assert (tmp_path / "isal.gz").stat().st_size <= 1.05 * (tmp_path / "zlib.gz").stat().st_size


def test_a_failed_write_leaves_nothing_under_the_target(raw_trace: Path, tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    with pytest.raises(OSError):
        copy_compressed(raw_trace, blocked / "rank0.pt.trace.json.gz", 1)
    with pytest.raises(FileNotFoundError):
        copy_compressed(tmp_path / "missing.json", tmp_path / "out.json.gz", 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def _staged_job(raw_trace: Path, tmp_path: Path, summaries: bool = False) -> tuple[Path, Path, PublishJob]:
    """A private staging directory holding a copy of ``raw_trace`` and its job (gzip level 1, with
    the operator table and sidecar when ``summaries``): (staging, output, the job)."""
    staging, output = tmp_path / "staging", tmp_path / "out"
    staging.mkdir(mode=0o700)
    output.mkdir()
    staged = staging / "r.pt.trace.json"
    staged.write_bytes(raw_trace.read_bytes())
    summary = output / "summaries"
    job = PublishJob(str(staged), str(output / "r.pt.trace.json.gz"), gzip_level=1,
                     operator_table_path=str(summary / "r.operator_table.txt") if summaries else None,
                     sidecar_path=str(summary / "r.summary.json") if summaries else None)
    return staging, output, job


_WITHOUT_ISAL = """
import runpy, sys
sys.modules["isal"] = None  # as if the analysis extra were not installed: `import isal` fails
sys.argv[0] = "publisher"
runpy.run_module("torchprof_args.capture.runtime.export.publisher", run_name="__main__")
"""


@pytest.mark.slow
def test_a_publisher_without_isal_compresses_with_zlib_at_the_level_asked(raw_trace: Path,
                                                                          tmp_path: Path) -> None:
    """A real publisher process where isal cannot be imported: zlib, the same content."""
    staging, output, job = _staged_job(raw_trace, tmp_path)
    argv = [sys.executable, "-c", _WITHOUT_ISAL, "--staging", str(staging), "--output", str(output)]
    run = subprocess.run(argv, env=publisher.publisher_env(), input=job.encode(), capture_output=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    status = msgspec.json.decode(run.stdout.strip(), type=PublishStatus)
    assert status.published and status.compressor == "zlib 1"
    assert gzip.decompress((output / "r.pt.trace.json.gz").read_bytes()) == raw_trace.read_bytes()
    assert list(staging.iterdir()) == []


def test_the_publisher_reports_its_cpu_time_by_phase_and_its_compressor(raw_trace: Path,
                                                                        tmp_path: Path) -> None:
    staging, output, job = _staged_job(raw_trace, tmp_path, summaries=True)
    (status,) = served(staging, output, job)
    assert status.published and status.summary_error is None
    assert status.compressor == "isal 1" and status.cpu is not None
    cpu = status.cpu
    assert cpu.start > 0 and cpu.trace >= 0 and cpu.summary > 0 and cpu.extra >= 0  # decoding takes CPU
    assert cpu.total == pytest.approx(cpu.start + cpu.trace + cpu.summary + cpu.extra)
