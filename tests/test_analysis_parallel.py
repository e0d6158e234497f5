"""The fast loader's paths agree: 1 vs 2 processes, range cuts vs streaming, plain vs gzip, bad cuts."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from helpers.paths import DATA
from msgspec.structs import replace

from torchprof_args.analysis import Summary, load_trace, summarize
from torchprof_args.analysis.decode import loader

GPU_2RANK = DATA / "gpu_2rank_nccl_rank0.json.gz"


def _summary(path: Path, workers: int) -> Summary:
    return replace(summarize(load_trace(path, workers=workers)), file="")


@pytest.fixture()
def small_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cut a 10 MB trace into ~40 ranges and small blocks, so every path is exercised."""
    monkeypatch.setattr(loader, "SEGMENT_BYTES", 256 << 10)
    monkeypatch.setattr(loader, "BLOCK_EVENTS", 5000)


@pytest.mark.slow
def test_workers_and_forms_agree(tmp_path: Path, small_segments: None) -> None:
    plain = tmp_path / "t.json"
    plain.write_bytes(gzip.decompress(GPU_2RANK.read_bytes()))
    reference = _summary(GPU_2RANK, 1)
    assert reference.gpu is not None and reference.gpu.kernels > 0 and reference.top_cpu_ops
    assert _summary(plain, 1) == reference
    assert _summary(plain, 2) == reference
    assert _summary(GPU_2RANK, 2) == reference
    trace = load_trace(plain, workers=2)
    assert trace.uncompressed_bytes == plain.stat().st_size
    assert trace.metadata["baseTimeNanoseconds"] == 1711964646000000000


@pytest.mark.slow
def test_nested_objects_fool_cuts_then_fall_back(tmp_path: Path, small_segments: None) -> None:
    """"},{" inside args at every cut point: wrong range cuts are detected and the load redone."""
    blob = [{"k": "x" * 40}] * 2000  # ~100 KB of "}, {" in one event's args
    events = [
        {"ph": "X", "cat": "cpu_op", "name": f"op{i % 7}", "pid": 1, "tid": 1 + i % 2, "ts": i * 10.0,
         "dur": 4.0, "args": {"blob": blob} if i % 50 == 0 else {"External id": i}}
        for i in range(6000)
    ]
    events.insert(0, {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1.0, "s": "t",
                      "args": {"Total Allocated": 123, "Total Reserved": 456, "Device Type": 0,
                               "Device Id": -1}})
    path = tmp_path / "nested.json"
    path.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 1}}))
    one, two = _summary(path, 1), _summary(path, 2)
    assert one == two
    assert one.events == 6001 and one.rank == 1
    assert sum(op.calls for op in one.top_cpu_ops) == 6000
    assert one.memory[0].peak_reserved_bytes == 456


def test_odd_values_take_the_loose_path(tmp_path: Path) -> None:
    """Unknown phases, missing ph, string numbers, non-object elements: same as HTA-style rules."""
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": "10.5", "dur": "2"},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 11, "dur": 1,
         "args": {"stream": "7", "correlation": 3}},
        {"ph": "Z", "name": "unknown phase"},
        17,
        {"name": "no phase"},
        {"ph": "X", "name": "no category", "ts": 1, "dur": 1},
    ]
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"traceEvents": events}))
    trace = load_trace(path)
    assert trace.n_events == 6
    assert sorted(trace.names[i] for i in trace.name_id) == ["a", "k"]
    assert trace.stream.tolist() == [-1, 7] and trace.ts.tolist() == [10.5, 11.0]


@pytest.mark.parametrize("decoder", ["shapes", "comms"])
def test_recorded_shapes_decode_on_the_typed_path_as_the_loose_path_would(decoder: str) -> None:
    """A real trace with record_shapes: every operator's ``Input Dims`` / ``Input type`` arrays are kept
    raw by the typed decoder (msgspec's ``Raw | None`` took only null: each such batch fell to the
    loose, per-event path), with the same values as the loose path gives (its raw JSON re-encoded
    without the trace's spaces: read only by JSON parsers)."""
    import msgspec

    from torchprof_args.analysis.decode import comm_events, events

    def values(event: msgspec.Struct) -> list:
        return [msgspec.json.decode(bytes(v)) if isinstance(v, msgspec.Raw) and v else v
                for v in (*msgspec.structs.astuple(event)[:-1], *msgspec.structs.astuple(event.args))]

    text = json.dumps(json.loads(gzip.decompress((DATA / "cpu_2rank_gloo_rank0_iter3.json.gz").read_bytes()))
                      ["traceEvents"]).encode()
    typed, loose, kind = {
        "shapes": (events._typed_shapes, events._tighten_shapes, events.XShapeEvent),
        "comms": (comm_events._typed, comm_events._tighten_comm, comm_events.XComm),
    }[decoder]
    fast = typed.decode(text)  # raised msgspec.ValidationError before
    slow = [loose(e) for e in events._loose.decode(text)]
    complete = [e for e in fast if isinstance(e, kind)]
    assert list(map(values, complete)) == [values(e) for e in slow if isinstance(e, kind)]
    with_shapes = [e for e in complete if e.args.input_dims]
    assert len(with_shapes) > 1000 and bytes(with_shapes[0].args.input_dims).startswith(b"[")
    assert any(not e.args.input_dims for e in complete)  # the events without shapes: NO_RAW
