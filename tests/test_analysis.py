"""Trace toolkit: HTA agreement on real traces, input forms, split/merge round trips, bad input."""

from __future__ import annotations

import gzip
import json
import logging
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from helpers.hta_reference import temporal_breakdown
from helpers.paths import DATA, REPO
from msgspec.structs import replace

from torchprof_args.analysis import TraceError, format_operator_table, load_trace, summarize
from torchprof_args.analysis.decode.reader import TraceStream
from torchprof_args.analysis.tools.merge import merge_traces
from torchprof_args.analysis.tools.split import split_trace

TRACES = sorted(DATA.glob("*.json.gz"))
GPU_TRACES = [p for p in TRACES if p.name.startswith("gpu_")]
GPU_2RANK = DATA / "gpu_2rank_nccl_rank0.json.gz"


def test_real_traces_are_in_the_repository() -> None:
    """The HTA comparisons below run on every real trace: they must not silently vanish."""
    assert [p.name for p in TRACES] == [
        "cpu_2rank_ddp_rank0.json.gz", "cpu_2rank_ddp_rank1.json.gz",
        "cpu_2rank_gloo_rank0_iter3.json.gz", "cpu_2rank_gloo_rank0_iter5.json.gz",
        "cpu_2rank_manual_dp_rank0.json.gz", "gpu_128rank_sampled_rank0.json.gz",
        "gpu_128rank_sampled_rank1.json.gz",
        "gpu_1rank_alexnet.json.gz", "gpu_1rank_cuda_event_sync.json.gz",
        "gpu_1rank_cuda_event_sync_multistream.json.gz", "gpu_1rank_h200_torchprof_clean.json.gz",
        "gpu_1rank_h200_torchprof_faulty.json.gz", "gpu_1rank_simple_add_kineto.json.gz",
        "gpu_2rank_nccl_rank0.json.gz", "rocm_mi250_1rank_minitoy.json.gz",
    ]


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "torchprof_args", *args], capture_output=True, text=True, env=env, timeout=300
    )


def _events(path: Path) -> list[dict]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as fh:
        return json.load(fh)["traceEvents"]


def _key(e: dict) -> str:
    return json.dumps(e, sort_keys=True)


@pytest.mark.slow
@pytest.mark.parametrize("path", GPU_TRACES, ids=lambda p: p.name)
def test_summary_matches_hta(path: Path, tmp_path: Path) -> None:
    pytest.importorskip("hta")
    from hta.trace_analysis import TraceAnalysis

    logging.getLogger("hta").setLevel(logging.ERROR)
    shutil.copy(path, tmp_path / path.name)
    ta = TraceAnalysis(trace_dir=str(tmp_path))
    temporal = temporal_breakdown(ta)
    overlap = ta.get_comm_comp_overlap(visualize=False).iloc[0]["comp_comm_overlap_pctg"]
    kinds, _ = ta.get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True)
    hta_kinds = {k.upper(): v for k, v in zip(kinds["kernel_type"], kinds["sum"], strict=True)}

    trace = load_trace(path)
    summary = summarize(trace)
    gpu = summary.gpu
    assert gpu is not None
    # HTA calls a trace without distributedInfo (a job without torch.distributed) rank 0; we say unknown
    known = "distributedInfo" in trace.metadata
    assert summary.rank == (ta.t.get_ranks()[0] if known else None)
    assert gpu.idle_pct == pytest.approx(temporal["idle_time_pctg"], abs=0.5)
    assert gpu.compute_pct == pytest.approx(temporal["compute_time_pctg"], abs=0.5)
    assert gpu.non_compute_pct == pytest.approx(temporal["non_compute_time_pctg"], abs=0.5)
    assert gpu.idle_pct + gpu.compute_pct + gpu.non_compute_pct == pytest.approx(100.0)
    if overlap != overlap:  # NaN: HTA's answer for a trace without communication kernels
        assert gpu.comm_comp_overlap_pct is None
    else:
        assert gpu.comm_comp_overlap_pct == pytest.approx(overlap, abs=0.5)
    mine = {k.upper(): v for k, v in gpu.kernel_type_us.items()}
    mine.update({k.upper(): v for k, v in gpu.kernel_type_overlapping_us.items()})
    assert set(hta_kinds) == {k for k, v in mine.items() if v > 0}
    for kind, total in hta_kinds.items():
        assert mine[kind] == pytest.approx(total, rel=0.005), kind


@pytest.mark.slow
def test_json_and_gz_and_small_chunks_agree(tmp_path: Path) -> None:
    plain = tmp_path / "t.json"
    plain.write_bytes(gzip.decompress(GPU_2RANK.read_bytes()))
    a = summarize(load_trace(GPU_2RANK))
    b = summarize(load_trace(plain))
    assert replace(a, file="") == replace(b, file="")
    # Tiny chunks force many cuts, including inside nested objects (validated, then retried).
    stream = TraceStream(plain, chunk_bytes=4096)
    n = sum(len(batch) for batch in stream.batches())
    assert n == a.events == len(_events(plain))
    assert stream.metadata["baseTimeNanoseconds"] == 1711964646000000000
    assert a.world_size == 2 and a.steps[0].name == "ProfilerStep#4"


@pytest.mark.slow
def test_string_timestamps_relative_to_base(tmp_path: Path) -> None:
    """Kineto's "us.ns" string form: ts/dur strings, relative to baseTimeNanoseconds."""
    doc = json.loads(gzip.decompress(GPU_2RANK.read_bytes()))
    for e in doc["traceEvents"]:
        for key in ("ts", "dur"):
            if isinstance(e.get(key), (int, float)):
                e[key] = f"{e[key]:.3f}"
    path = tmp_path / "strings.json"
    path.write_text(json.dumps(doc))
    numeric = summarize(load_trace(GPU_2RANK))
    strings = summarize(load_trace(path))
    assert strings.gpu is not None and numeric.gpu is not None
    assert strings.gpu.kernel_type_us == numeric.gpu.kernel_type_us
    assert strings.gpu.idle_pct == pytest.approx(numeric.gpu.idle_pct)
    assert [s.dur_us for s in strings.steps] == pytest.approx([s.dur_us for s in numeric.steps])


def test_nested_layout_and_compact_form(tmp_path: Path) -> None:
    """Events whose args hold lists of objects ("}, {" inside an event) still cut correctly."""
    events = [
        {"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i * 10, "dur": 5,
         "args": {"nested": [{"a": 1}, {"b": [{"c": 2}, {"d": 3}]}]}}
        for i in range(3000)
    ]
    path = tmp_path / "nested.json"
    path.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 3, "world_size": 4}}))
    stream = TraceStream(path, chunk_bytes=2048)
    assert sum(len(b) for b in stream.batches()) == 3000
    s = summarize(load_trace(path))
    assert s.rank == 3 and s.gpu is None and s.top_cpu_ops[0].calls == 1
    assert s.cpu is not None and s.cpu.threads[0].busy_us == pytest.approx(3000 * 5)


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("indent", [None, 2])
def test_streamed_batches_hold_every_event_once(tmp_path: Path, compress: bool, indent: int | None) -> None:
    """Each streamed batch is read into its own buffer, ``[`` events ``]``: for any chunk size, the
    batches (validated or not) hold the document's events in order, events larger than a chunk and
    ``},`` inside strings included, and the keys after the array are the metadata."""
    tricky = ' "},[{" '  # a cut the validated reader tries and rejects ("}," then no object: not unvalidated)
    events = [{"ph": "X", "name": f"op{i}{tricky}", "ts": i, "dur": 1, "args": {"blob": "x" * (i % 7 * 900)}}
              if i % 3 else {"ph": "i", "name": "[memory]", "ts": i, "args": {"l": [{"a": i}, {"b": 2}]}}
              for i in range(200)]
    text = json.dumps({"schemaVersion": 1, "traceEvents": events, "baseTimeNanoseconds": 5}, indent=indent)
    path = tmp_path / ("t.json.gz" if compress else "t.json")
    path.write_bytes(gzip.compress(text.encode()) if compress else text.encode())
    raw = msgspec.json.Decoder(list[msgspec.Raw])
    want = [msgspec.json.decode(r) for r in raw.decode(json.dumps(events))]
    for chunk in (64, 1000, 4096, 1 << 20):
        validated = TraceStream(path, chunk_bytes=chunk)
        got = [msgspec.json.decode(r) for batch in validated.batches() for r in batch]
        assert got == want and validated.metadata == {"schemaVersion": 1, "baseTimeNanoseconds": 5}
        assert set(TraceStream(path, chunk_bytes=chunk).batches(lambda text: None)) == {None}
        texts = list(TraceStream(path, chunk_bytes=chunk, validate=False).batches())
        assert all(t[:1] == b"[" and t[-1:] == b"]" for t in texts)
        assert [msgspec.json.decode(r) for t in texts for r in raw.decode(t)] == want


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch = pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("cpu") / "cpu_trace.json"
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=3, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(out)),
        profile_memory=True,
        record_shapes=True,
        with_stack=True,
    ) as prof:
        for _ in range(4):
            loss = model(torch.randn(32, 64)).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    assert out.exists()
    return out


@pytest.mark.slow
def test_real_cpu_trace_operator_table(cpu_trace: Path) -> None:
    s = summarize(load_trace(cpu_trace), top=30)
    assert s.gpu is None and s.cpu is not None and s.cpu.threads
    assert len(s.steps) == 3 and all(step.dur_us > 0 for step in s.steps)
    names = {op.name for op in s.top_cpu_ops}
    assert "aten::linear" in names and "aten::addmm" in names
    addmm = next(op for op in s.top_cpu_ops if op.name == "aten::addmm")
    assert addmm.calls == 6  # two Linear layers x three active steps
    assert 0 < addmm.self_cpu_us <= addmm.cpu_total_us
    assert s.memory and s.memory[0].device == "cpu" and s.memory[0].peak_allocated_bytes > 0
    text = format_operator_table(s, rows=30)
    assert "Self CPU total" in text and "CPU total" in text and "Self device total" not in text
    assert "aten::addmm" in text and "ProfilerStep#" in text
    assert text.rstrip().splitlines()[-1].startswith("  cpu")  # memory overview at the end


def test_operator_table_sorted_by_device_time() -> None:
    s = summarize(load_trace(GPU_2RANK), top=20)
    text = format_operator_table(s, rows=20)
    assert "Self device total" in text and "Memory:" in text
    device = [op.device_total_us for op in s.top_ops_by_device]
    assert device == sorted(device, reverse=True) and device[0] > 0


@pytest.mark.slow
def test_split_round_trip(tmp_path: Path) -> None:
    pieces = split_trace(GPU_2RANK, max_mb=2.0, out_dir=tmp_path / "pieces")
    assert len(pieces) > 3
    original = _events(GPU_2RANK)
    complete = sorted(_key(e) for e in original if e.get("ph") == "X")
    union: list[str] = []
    meta = json.loads(gzip.decompress(GPU_2RANK.read_bytes()))
    for piece in pieces:
        assert piece.stat().st_size <= 2.0e6
        doc = json.loads(piece.read_text())
        for key in ("distributedInfo", "deviceProperties", "baseTimeNanoseconds"):
            assert doc[key] == meta[key]
        assert any(e.get("name") == "process_name" for e in doc["traceEvents"])
        union += [_key(e) for e in doc["traceEvents"] if e.get("ph") == "X"]
    assert sorted(union) == complete
    # Pieces are real traces: each one loads and the tools accept it.
    assert load_trace(pieces[0]).n_events > 0


def test_split_too_small(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="too small"):
        split_trace(GPU_2RANK, max_mb=0.01, out_dir=tmp_path)


@pytest.mark.slow
def test_merge_keeps_every_event(tmp_path: Path) -> None:
    ranks = [p for p in TRACES if "128rank" in p.name]
    for p in ranks:
        shutil.copy(p, tmp_path / p.name)
    out = tmp_path / "merged.pt.trace.json.gz"
    result = merge_traces(tmp_path, out)
    assert result["ranks"] == {0: len(_events(ranks[0])), 1: len(_events(ranks[1]))}
    merged = _events(out)
    names = {e["args"]["name"] for e in merged if e.get("name") == "process_name"}
    assert any(n.startswith("rank 0") for n in names) and any(n.startswith("rank 1") for n in names)
    originals = sum(len(_events(p)) for p in ranks)
    added = sum(1 for e in merged if e.get("ph") == "M") - sum(
        1 for p in ranks for e in _events(p) if e.get("ph") == "M"
    )
    assert len(merged) == originals + added
    complete = [e for e in merged if e.get("ph") == "X"]
    assert len(complete) == sum(1 for p in ranks for e in _events(p) if e.get("ph") == "X")
    pids0 = {e["pid"] for e in complete if e["pid"] // 1_000_000 == 1}
    pids1 = {e["pid"] for e in complete if e["pid"] // 1_000_000 == 2}
    assert pids0 and pids1 and not pids0 & pids1


@pytest.mark.slow
def test_cli_summary_json_and_report(tmp_path: Path) -> None:
    ranks = [p for p in TRACES if "128rank" in p.name]
    for p in ranks:
        shutil.copy(p, tmp_path / p.name)
    proc = _cli("summary", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [s["rank"] for s in lines[:2]] == [0, 1]
    for s in lines[:2]:
        assert s["world_size"] == 128 and s["steps"] and s["top_kernels"] and s["top_cpu_ops"]
        assert set(s["gpu"]["kernel_type_us"]) == {"computation", "communication", "memory"}
    assert lines[2]["cross_rank"]["slowest_rank"] == 1
    report = tmp_path / "report.html"
    proc = _cli("report", str(tmp_path), "-o", str(report))
    assert proc.returncode == 0, proc.stderr
    page = report.read_text()
    assert page.count("<svg") >= 3 and "Stragglers" in page
    assert "http" not in page.replace("http://www.w3.org", "")


@pytest.mark.parametrize(
    "content, message",
    [
        (b"not json at all", "not a JSON trace"),
        (b'{"schemaVersion": 1}', "no 'traceEvents'"),
        (b'{"traceEvents": [{"ph": "X", "ts": 1', "not valid JSON"),
        (b"", "empty"),
    ],
)
@pytest.mark.slow
def test_bad_input_one_line_error(tmp_path: Path, content: bytes, message: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    proc = _cli("summary", str(bad))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and str(bad) in proc.stderr and message in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_bad_gzip_and_empty_dir(tmp_path: Path) -> None:
    trunc = tmp_path / "t.json.gz"
    trunc.write_bytes(GPU_2RANK.read_bytes()[:50_000])
    proc = _cli("summary", str(trunc))
    assert proc.returncode == 2 and "truncated" in proc.stderr and "Traceback" not in proc.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    for args in (["summary", str(empty)], ["merge", str(empty), "-o", str(tmp_path / "m.json")]):
        proc = _cli(*args)
        assert proc.returncode == 2 and "no .json" in proc.stderr


def _snapshot() -> dict:
    frames = [{"filename": "train.py", "line": 42, "name": "forward"}]
    return {
        "segments": [
            {
                "device": 0, "address": 1 << 30, "total_size": 8 << 20, "allocated_size": 5 << 20,
                "active_size": 5 << 20, "requested_size": 5 << 20, "stream": 0, "segment_type": "large",
                "segment_pool_id": (0, 0), "is_expandable": False,
                "blocks": [
                    {"address": 1 << 30, "size": 4 << 20, "requested_size": 4 << 20,
                     "state": "active_allocated", "frames": frames},
                    {"address": (1 << 30) + (4 << 20), "size": 1 << 20, "requested_size": 1 << 20,
                     "state": "inactive", "frames": []},
                    {"address": (1 << 30) + (5 << 20), "size": 1 << 20, "requested_size": 1 << 20,
                     "state": "active_allocated",
                     "frames": [{"filename": "model.py", "line": 7, "name": "attn"}]},
                    {"address": (1 << 30) + (6 << 20), "size": 2 << 20, "requested_size": 2 << 20,
                     "state": "inactive", "frames": []},
                ],
            }
        ],
        "device_traces": [[
            {"action": "alloc", "addr": 1 << 30, "size": 4 << 20, "stream": 0, "time_us": 1,
             "frames": frames},
            {"action": "alloc", "addr": 1 << 29, "size": 3 << 20, "stream": 0, "time_us": 2,
             "frames": frames},
            {"action": "free_completed", "addr": 1 << 29, "size": 3 << 20, "stream": 0, "time_us": 3,
             "frames": frames},
        ]],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""},
    }


def test_mem_snapshot_summary(tmp_path: Path) -> None:
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(_snapshot()))
    proc = _cli("mem", str(path), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["version"] == 1 and out["peak"] is None  # no trace: no profiled peak
    (snap,) = out["snapshots"]
    dev = snap["devices"][0]
    assert dev["reserved_bytes"] == 8 << 20 and dev["allocated_bytes"] == 5 << 20
    # the 1 MiB block allocated before the history began, then 4 + 3 MiB
    assert dev["peak_allocated_in_history_bytes"] == 8 << 20
    assert dev["fragmentation_pct"] == pytest.approx(100 * (1 - 2 / 3))
    assert snap["top_sites"][0]["site"].startswith("train.py:42")
    assert [f["kind"] for f in out["findings"]] == ["fragmentation"]


class _Evil:
    def __reduce__(self):  # noqa: D105
        return (os.system, (f"touch {os.environ.get('EVIL_MARKER', '/nonexistent/x')}",))


def test_mem_refuses_malicious_pickle(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    os.environ["EVIL_MARKER"] = str(marker)
    try:
        evil = pickle.dumps({"segments": [], "x": _Evil()})
    finally:
        del os.environ["EVIL_MARKER"]
    path = tmp_path / "evil.pickle"
    path.write_bytes(evil)
    proc = _cli("mem", str(path))
    assert proc.returncode == 2 and "refusing to load" in proc.stderr and "Traceback" not in proc.stderr
    assert not marker.exists()
