"""The C decoder (``_fastcolumns``) against the msgspec path it stands in for: the same columns, field
by field, for every trace in tests/data and for generated edge cases; None (the msgspec path) for
whatever it does not reproduce exactly; never a result where msgspec finds the text malformed."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from torchprof_args.analysis.decode import columns
from torchprof_args.analysis.decode.columns import ColumnBatch, decode_columns, decode_events, reduce_batch
from torchprof_args.analysis.decode.loader import load_trace
from torchprof_args.analysis.decode.reader import TraceStream
from torchprof_args.analysis.extensions import PURE_PYTHON_ENV

fast = pytest.importorskip("torchprof_args.analysis.decode._fastcolumns",
                           reason="the C extension is not built (python setup.py build_ext --inplace)")

DATA = Path(__file__).parent / "data"
TRACES = sorted(p for p in DATA.iterdir() if p.name.endswith((".json", ".json.gz")))
#: traces that take over ~0.5 s to compare batch by batch
LARGE = {p for p in TRACES if p.stat().st_size > 300_000}


#: the modes: (comms, flops): summary's, diagnose's, critical-path's and FLOPs alone
MODES = [(False, False), (True, True), (True, False), (False, True)]


def c_batch(text: Any, memory: bool = True, comms: bool = False, flops: bool = False) -> ColumnBatch | None:
    """The C decoder's columns, None where it leaves the batch to msgspec."""
    raw = fast.plain(text, memory, comms or flops)
    return None if raw is None else columns._fast_batch(text, comms, flops, *raw)


def py_batch(text: Any, memory: bool = True, comms: bool = False, flops: bool = False) -> ColumnBatch:
    return reduce_batch(decode_events(text, comms, flops), comms, memory_events=memory, flops=flops)


def assert_same(got: ColumnBatch, want: ColumnBatch) -> None:
    assert got.n_events == want.n_events
    for name in ("ts", "dur", "key", "stream", "corr"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype, name
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), name
        if a.dtype.kind == "f":  # the same bits: -0.0 is not 0.0
            assert np.array_equal(np.signbit(a), np.signbit(b)), name
    assert got.keys == want.keys
    assert [tuple(map(type, k)) for k in got.keys] == [tuple(map(type, k)) for k in want.keys]
    assert got.memory.keys() == want.memory.keys()
    for name in got.memory:
        assert got.memory[name].dtype == want.memory[name].dtype, name
        assert np.array_equal(got.memory[name], want.memory[name]), name
    for name in ("idx", "flop", "gb", "seq"):
        a, b = getattr(got.compiled_args, name), getattr(want.compiled_args, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert got.comms == want.comms
    assert [type(v) for row in got.comms for v in row] == [type(v) for row in want.comms for v in row]
    for a, b in zip(got.flops, want.flops, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert len(got.memory_rows) == len(want.memory_rows) == 0


def batches(path: Path, chunk: int = 1 << 16) -> list[bytes]:
    return [bytes(t) for t in TraceStream(path, validate=False, chunk_bytes=chunk).batches()]


def first_batch(path: Path, chunk: int) -> bytes:
    stream = TraceStream(path, validate=False, chunk_bytes=chunk).batches()
    try:
        return bytes(next(stream))
    finally:
        stream.close()


def event_text(*events: str) -> bytes:
    return ("[" + ",\n".join(events) + "]").encode()


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.slow) if p in LARGE else p
                                  for p in TRACES], ids=lambda p: p.name)
def test_every_trace_decodes_to_the_same_columns(path: Path) -> None:
    taken = 0
    for text in batches(path):
        for (comms, flops), memory in zip(MODES, (True, False, True, False), strict=True):
            want = py_batch(text, memory, comms, flops)
            got = c_batch(text, memory, comms, flops)
            if got is not None:
                assert_same(got, want)
                taken += 1
            assert_same(decode_columns(text, comms, memory, flops), want)
    assert taken  # every trace here, ROCm's string stream ids ("0x0") included


def _x(**fields: Any) -> str:
    return json.dumps({"ph": "X", **fields})


#: batches the C decoder must take, each with what it must get right
COVERED = {
    "empty": b"[]",
    "empty_spaced": b" \n[ \t\r\n] \n",
    "escapes": event_text(r'{"ph": "X", "name": "a\"b\\c\/d\u00e9\ud83d\ude00\n\t\b\f\r", "cat": "k\u0000",'
                          r' "ts": 1, "dur": 2, "pid": "p\u0031", "tid": 3}',
                          r'{"ph": "X", "name": "a\"b\\c\/d\u00e9\ud83d\ude00\n\t\b\f\r", "cat": "k\u0000",'
                          r' "ts": 1, "dur": 2, "pid": "p1", "tid": 3}'),
    "escaped_keys": event_text(r'{"\u0070h": "\u0058", "n\u0061me": "x", "cat": "c", "ts": 1, "dur": 2,'
                               r' "args": {"str\u0065am": 7, "Sequence\u0020number": 3}}'),
    "unicode": event_text(_x(name="naïve ☃ 😀 名前", cat="ĉat", ts=1.5, dur=2.5, pid="ρ", tid="τ"),
                          json.dumps({"ph": "X", "name": "naïve ☃ 😀 名前", "cat": "ĉat", "ts": 2, "dur": 1,
                                      "pid": "ρ", "tid": "τ"}, ensure_ascii=False)),
    "nested_args": event_text(
        '{"ph": "X", "name": "n", "cat": "c", "ts": 1, "dur": 1, "args": {"x": {"y": [1, {"z": "},"}, "]"],'
        ' "w": "},{\\"ph\\": \\"X\\"}"}, "stream": 7, "correlation": 9, "Input Dims": [[1, 2], []],'
        ' "e": {}, "f": [], "t": true, "u": false, "v": null, "flops": 5}}',
        '{"ph": "X", "name": "n", "cat": "c", "ts": 3, "dur": 1, "args": {}}'),
    "numbers": event_text(
        _x(name="a", cat="c", ts=1.5e3, dur=2e-1),
        '{"ph": "X", "name": "a", "cat": "c", "ts": 1E22, "dur": 2.5E+2}',
        '{"ph": "X", "name": "a", "cat": "c", "ts": 123456789012345678901234, "dur": -0}',
        '{"ph": "X", "name": "a", "cat": "c", "ts": -0.0, "dur": 0.000001234}',
        '{"ph": "X", "name": "a", "cat": "c", "ts": 1695835573040620.123456789, "dur": 9007199254740993}',
        '{"ph": "X", "name": "a", "cat": "c", "ts": 1e-300, "dur": 4.9406564584124654e-324}',
        '{"ph": "X", "name": "a", "cat": "c", "ts": 9223372036854775807, "dur": -9223372036854775808}',
        '{"ph": "X", "name": "a", "cat": "c", "ts": 18446744073709551616, "dur": 0.1e1}',
        '{"ph": "X", "name": "a", "cat": "c", "ts": 1.7976931348623157e308, "dur": 12345678901234567890.5}',
        '{"ph": "X", "name": "a", "cat": "c", "ts": -0e5, "dur": 1e-400}',
        '{"ph": "X", "name": "a", "cat": "c", "ts": 2.4703282292062328e-324, "dur": 0.1e-330}',
        '{"ph": "X", "name": "a", "cat": "c", "ts": 18446744073709551615, "dur": -9223372036854775809}'),
    "ints_and_strings": event_text(
        _x(name="a", cat="c", ts=1, dur=2, pid=5, tid="5"),
        _x(name="a", cat="c", ts=1, dur=2, pid="5", tid=5),
        _x(name="a", cat="c", ts=1, dur=2, pid=-3, tid=9223372036854775807),
        _x(name="a", cat="c", ts=1, dur=2), _x(name="a", cat="c", ts=1, dur=2, pid=0, tid=0)),
    "dropped": event_text(
        _x(name="nocat", ts=1, dur=2), _x(name="nots", cat="c", dur=2), _x(name="nodur", cat="c", ts=1),
        _x(name="triton_k", ts=1, dur=2, args={"kernel_flop": 10}),
        _x(name="triton_k", cat="kernel", ts=5, dur=2, args={"kernel_flop": 11, "kernel_num_gb": 0.5}),
        _x(name="kept", cat="c", ts=1, dur=2), _x(name="zero_cat", cat="\x00", ts=1, dur=2)),
    "compiled": event_text(
        _x(name="triton_poi_fused", cat="kernel", ts=1, dur=2, args={"kernel_flop": 1e9, "kernel_num_gb": 2,
                                                                     "Sequence number": 4}),
        _x(name="triton_red", cat="kernel", ts=1, dur=2, args={"stream": 7}),
        _x(name="triton", cat="kernel", ts=1, dur=2, args={"kernel_num_gb": 0}),
        _x(name="CompiledFunction", cat="cpu_op", ts=1, dur=2,
           args={"Sequence number": 12, "kernel_flop": 3}),
        _x(name="CompiledFunctionBackward", cat="cpu_op", ts=1, dur=2, args={"Sequence number": 2**60 + 1}),
        _x(name="CompiledFunctionX", cat="cpu_op", ts=1, dur=2, args={"Sequence number": 5}),
        _x(name="Triton", cat="kernel", ts=1, dur=2, args={"kernel_flop": 5})),
    "args_types": event_text(
        _x(name="k", cat="kernel", ts=1, dur=2, args={"stream": 7, "correlation": 2**40, "flops": 3,
                                                      "device": 0, "grid": [1, 2, 3]}),
        _x(name="k", cat="kernel", ts=1, dur=2, args={"stream": -1, "correlation": -(2**63)}),
        _x(name="k", cat="kernel", ts=1, dur=2, args={"stream": 4294967295, "correlation": 1})),
    "memory": event_text(
        '{"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 2, "ts": 5, "cat": 7, "dur": "x",'
        ' "args": {"Total Allocated": 100, "Total Reserved": 200, "Device Type": 1, "Device Id": 0,'
        ' "Addr": 123, "Bytes": -4}}',
        '{"ph": "I", "name": "[memory]", "ts": 6, "args": {"Total Allocated": 300, "Device Type": 1,'
        ' "Device Id": 0}}',
        '{"ph": "i", "name": "[memory]", "ts": 7, "args": {"Total Reserved": 50}}',
        '{"ph": "i", "name": "[memory]", "ts": 7, "args": {"Addr": 5}}',
        '{"ph": "i", "name": "[memory]", "ts": 7}',
        '{"ph": "i", "name": "other", "ts": 8, "args": {"Total Allocated": 999}}',
        '{"ph": "i", "ts": 8}',
        _x(name="k", cat="kernel", ts=1, dur=2)),
    "skipped_phases": event_text(*(
        json.dumps({"ph": ph, "name": ["not", "a", "string"], "cat": {"x": 1}, "ts": "late", "id": 3,
                    "args": {"stream": "s", "nested": {"a": [{"b": "},"}]}}})
        for ph in "BEbnestfPNODMVvRcC()"), _x(name="k", cat="c", ts=1, dur=2)),
    "comms": event_text(
        _x(name="ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
           cat="kernel", ts=10, dur=5, pid=0, tid=7, args={"stream": 7, "correlation": 11,
           "Collective name": "allreduce", "Process Group Name": "0", "Process Group Ranks": [0, 1],
           "Group size": 2, "Seq": 3, "In msg nelems": 1024, "Out msg nelems": 1024, "dtype": "Float"}),
        _x(name="record_param_comms", cat="cpu_op", ts=9, dur=7, args={"Collective name": "allreduce",
           "Process Group Description": "default_pg", "Input Dims": [[1024]], "Input type": ["float"]}),
        _x(name="gloo:all_reduce", cat="user_annotation", ts=9, dur=7, pid=5, tid=6,
           args={"Input Dims": [[4, 8], []], "Input type": ["float", ""]}),
        _x(name="c10d::allreduce_", cat="cpu_op", ts=8, dur=9, args={"Collective name": None}),
        _x(name="marked_only", cat="cpu_op", ts=8, dur=9, args={"Collective name": ["odd", 1]}),
        _x(name="not_marked", cat="cpu_op", ts=8, dur=9, args={"Collective name": None}),
        _x(name="nccl:all_gather", ts=8, dur=9, args={"Collective name": "allgather"}),
        _x(name="NCCL late", cat="cpu_op", dur=9, args={"Seq": 5}),
        _x(name="xccl:broadcast", cat="cpu_op", ts=8, dur=9, args={"Seq": "x", "dtype": {"a": 1}})),
    "flops": event_text(
        _x(name="aten::mm", cat="cpu_op", ts=1, dur=2, args={"Input Dims": [[64, 128], [128, 32]]}),
        _x(name="aten::mm", cat="cpu_op", ts=1, dur=2,
           args={"Input Dims": [[64, 128], [128, 32]], "flops": 7}),
        _x(name="aten::addmm", cat="cpu_op", ts=1, dur=2, args={"Input Dims": [[32], [64, 128], [128, 32]]}),
        _x(name="aten::bmm", cat="cpu_op", ts=1, dur=2, args={"Input Dims": "odd"}),
        _x(name="aten::bmm", cat="cpu_op", ts=1, dur=2),
        _x(name="aten::mm", cat="kernel", ts=1, dur=2, args={"Input Dims": [[2, 2], [2, 2]]}),
        _x(name="aten::mm", ts=1, dur=2, args={"Input Dims": [[2, 2], [2, 2]]}),
        _x(name="aten::_scaled_dot_product_flash_attention", cat="cpu_op", ts=1, dur=2,
           args={"Input Dims": [[2, 4, 128, 64], [2, 4, 128, 64], [2, 4, 128, 64]]}),
        _x(name="triton_mm", cat="kernel", ts=1, dur=2, args={"kernel_flop": 1e6, "flops": 0}),
        _x(name="conv", cat="cpu_op", ts=1, dur=2, args={"flops": 1.5e9})),
    "ph_last": event_text('{"name": "k", "cat": "c", "ts": 1, "dur": 2, "args": {"stream": 3}, "ph": "X"}'),
    # strings int() refuses in the integer fields: their defaults, as on the loose path (ROCm's streams)
    "int_fields_int_refuses": event_text(
        _x(name="k", cat="kernel", ts=1, dur=2, args={"stream": "0x0", "correlation": "c7"}),
        _x(name="k", cat="kernel", ts=3, dur=2, args={"stream": "0x1a", "correlation": 9}),
        _x(name="CompiledFunction", cat="cpu_op", ts=5, dur=2, args={"Sequence number": "n/a"}),
        json.dumps({"ph": "i", "name": "[memory]", "ts": 6, "pid": 1, "tid": 1,
                    "args": {"Total Allocated": "x", "Total Reserved": 4096, "Device Type": "cuda",
                             "Device Id": "0x0", "Addr": "0x7f00", "Bytes": "-1.5e3"}})),
    "whitespace": b'[\n  {\n\t"ph" :\r\n "X" , "name":"k","cat"  :"c","ts":1,"dur":2 }\n,\n{"ph":"M"}  ]  ',
}


@pytest.mark.parametrize("name", sorted(COVERED))
def test_edge_cases_are_decoded_in_c_as_msgspec_decodes_them(name: str) -> None:
    text = COVERED[name]
    for (comms, flops), memory in [(mode, memory) for mode in MODES for memory in (True, False)]:
        got = c_batch(text, memory, comms, flops)
        assert got is not None, "the C decoder left a batch it covers"
        assert_same(got, py_batch(text, memory, comms, flops))
        assert_same(c_batch(bytearray(text), memory, comms, flops) or got, got)
        assert_same(c_batch(memoryview(text), memory, comms, flops) or got, got)


#: batches the C decoder leaves to msgspec (None): unusual types, unknown phases, duplicates ...
UNCOVERED = {
    "unknown_ph": event_text(_x(name="k", cat="c", ts=1, dur=2), '{"ph": "Q", "name": "x"}'),
    "missing_ph": event_text(_x(name="k", cat="c", ts=1, dur=2), '{"name": "x", "ts": 1}'),
    "ph_not_string": event_text('{"ph": 1}'),
    "long_ph": event_text('{"ph": "XX"}'),
    # strings int() may take (whitespace, underscores, signs, Unicode digits, escapes) and strings in
    # the float fields: the loose path's rules
    "stream_spaced_digits": event_text(_x(name="k", cat="c", ts=1, dur=2, args={"stream": " 7 "})),
    "stream_underscore": event_text(_x(name="k", cat="c", ts=1, dur=2, args={"stream": "1_0"})),
    "stream_empty": event_text(_x(name="k", cat="c", ts=1, dur=2, args={"stream": ""})),
    "stream_unicode_digit": event_text(_x(name="k", cat="c", ts=1, dur=2, args={"stream": "\u0663"})),
    "stream_raw_unicode": event_text(json.dumps({"ph": "X", "name": "k", "cat": "c", "ts": 1, "dur": 2,
                                                 "args": {"stream": "\u0663"}}, ensure_ascii=False)),
    "flops_hex_string": event_text(_x(name="k", cat="c", ts=1, dur=2, args={"flops": "0x0"})),
    "stream_float": event_text(_x(name="k", cat="c", ts=1, dur=2, args={"stream": 7.0})),
    "stream_huge": event_text(_x(name="k", cat="c", ts=1, dur=2, args={"stream": 2**64 - 1})),
    "ts_string": event_text(_x(name="k", cat="c", ts="12", dur=2)),
    "ts_null": event_text(_x(name="k", cat="c", ts=None, dur=2)),
    "dur_bool": event_text(_x(name="k", cat="c", ts=1, dur=True)),
    "ts_out_of_range": event_text('{"ph": "X", "name": "k", "cat": "c", "ts": 1e400, "dur": 2}'),
    "pid_float": event_text(_x(name="k", cat="c", ts=1, dur=2, pid=1.0)),
    "pid_huge": event_text(_x(name="k", cat="c", ts=1, dur=2, pid=2**64 - 1)),
    "name_number": event_text(_x(name=5, cat="c", ts=1, dur=2)),
    "cat_null": event_text(_x(name="k", cat=None, ts=1, dur=2)),
    "args_null": event_text(_x(name="k", cat="c", ts=1, dur=2, args=None)),
    "flops_string": event_text(_x(name="k", cat="c", ts=1, dur=2, args={"flops": "many"})),
    "memory_float": event_text('{"ph": "i", "name": "[memory]", "ts": 1, "args": {"Total Allocated": 1.5}}'),
    "memory_string": event_text('{"ph": "i", "name": "[memory]", "ts": 1,'
                                ' "args": {"Total Allocated": "12"}}'),
    "duplicate_key": event_text('{"ph": "X", "name": "a", "name": "b", "cat": "c", "ts": 1, "dur": 2}'),
    "duplicate_ph": event_text('{"ph": "X", "ph": "i", "name": "a"}'),
    "not_an_object": b'[1, {"ph": "X"}]',
    "deep": event_text('{"ph": "X", "name": "k", "cat": "c", "ts": 1, "dur": 2, "args": {"x": '
                       + "[" * 100 + "]" * 100 + "}}"),
}


@pytest.mark.parametrize("name", sorted(UNCOVERED))
def test_what_c_does_not_cover_goes_through_msgspec(name: str) -> None:
    text = UNCOVERED[name]
    assert fast.plain(text, True, False) is None
    for comms, flops in MODES:
        assert_same(decode_columns(text, comms, True, flops), py_batch(text, True, comms, flops))


#: malformed texts: msgspec raises DecodeError (a wrong cut, for the reader), so must decode_columns
MALFORMED = [
    b"", b"[", b"]", b"[,]", b"[{},]", b'[{"ph": "X",}]', b'[{"ph": "X"}', b'[{"ph": "X"}] x', b"[{}] []",
    b'[{"ph": "X", "ts": 01}]', b'[{"ph": "X", "ts": 1.}]', b'[{"ph": "X", "ts": .5}]',
    b'[{"ph": "X", "ts": -}]',
    b'[{"ph": "X", "ts": 1e}]', b'[{"ph": "X", "ts": +1}]', b'[{"ph": "X", "name": "a\\x"}]',
    b'[{"ph": "X", "name": "a\x01"}]', b'[{"ph": "X", "name": "\xff"}]', b'[{"ph": "X", "name": "\xc0\x80"}]',
    b'[{"ph": "X", "name": "\xed\xa0\x80"}]', b'[{"ph": "X", "name": "\\ud800"}]',
    b'[{"ph": "X", "name": "\\udc00x"}]', b'[{"ph": "X", "name": "\\ud800\\u0041"}]',
    b'[{"ph": "X", "name": "a}]',
    b'[{"ph": "X" "name": "a"}]', b'[{"ph" "X"}]', b'[{"ph": "X", "args": {"a": tru}}]',
    b'[{"ph": "X", "args": {"a": [1,]}}]', b'[{"ph": "M", "args": {"a": {"b": 1,}}}]', b"[{'ph': 'X'}]",
    b'[{"ph": "X"}\x00]', b'[{"ph": "X", "ts": NaN}]', b'[{"ph": "X", "ts": Infinity}]',
]


@pytest.mark.parametrize("text", MALFORMED, ids=range(len(MALFORMED)))
def test_malformed_text_raises_as_msgspec_does(text: bytes) -> None:
    assert fast.plain(text, True, True) is None
    for comms, flops in MODES:
        with pytest.raises(msgspec.DecodeError):
            decode_events(text, comms, flops)
        with pytest.raises(msgspec.DecodeError):
            decode_columns(text, comms, True, flops)


def _random_number(rng: random.Random) -> str:
    kind = rng.randrange(6)
    if kind == 0:
        return repr(rng.uniform(-1e6, 1e16))
    if kind == 1:
        return str(rng.randrange(-(2**70), 2**70))
    if kind == 2:
        return f"{rng.randrange(10**rng.randrange(1, 25))}.{rng.randrange(10**rng.randrange(1, 25))}"
    if kind == 3:
        sign = rng.choice(["", "-"])
        return f"{sign}{rng.randrange(1, 10**rng.randrange(1, 20))}e{rng.randrange(-330, 310)}"
    if kind == 4:
        return f"{rng.randrange(10**16)}.{rng.randrange(1000):03d}"
    return repr(rng.random() * 10.0 ** rng.randrange(-320, 300))


def test_numbers_are_rounded_as_msgspec_rounds_them() -> None:
    rng = random.Random(34)
    events = [f'{{"ph": "X", "name": "n", "cat": "c", "ts": {_random_number(rng)},'
              f' "dur": {_random_number(rng)}}}' for _ in range(2000)]
    for i in range(0, len(events), 50):
        text = event_text(*events[i : i + 50])
        want = py_batch(text) if fast.plain(text, True, False) is not None else None
        if want is None:  # a number out of range: check the others one by one
            for event in events[i : i + 50]:
                one = event_text(event)
                got = c_batch(one)
                if got is not None:
                    assert_same(got, py_batch(one))
            continue
        got = c_batch(text)
        assert got is not None
        assert_same(got, want)


def _mutations(text: bytes, rng: random.Random, n: int) -> list[bytes]:
    """``text`` with one byte changed, inserted or removed, at random: mostly JSON syntax."""
    alphabet = b'{}[],:"\\ 0123456789.eE-+tfnulX\x00\x1f\x80\xff'
    out = []
    for _ in range(n):
        at = rng.randrange(len(text))
        op = rng.randrange(3)
        byte = bytes([rng.choice(alphabet)])
        if op == 0:
            out.append(text[:at] + byte + text[at + 1 :])
        elif op == 1:
            out.append(text[:at] + byte + text[at:])
        else:
            out.append(text[:at] + text[at + 1 :])
    return out


def _check_mutation(text: bytes) -> None:
    """C gives either None or msgspec's result, and None whenever msgspec rejects the text."""
    try:
        want = py_batch(text, True, True, True)
    except msgspec.DecodeError:
        assert fast.plain(text, True, True) is None, text
        return
    got = c_batch(text, True, True, True)
    if got is not None:
        assert_same(got, want)


def test_mutated_batches_never_give_another_result() -> None:
    text = COVERED["nested_args"] + b""
    text = text[:-1] + b"," + COVERED["memory"][1:-1] + b"," + COVERED["escapes"][1:]
    for mutated in _mutations(text, random.Random(7), 400):
        _check_mutation(mutated)


@pytest.mark.slow
def test_mutated_real_batches_never_give_another_result() -> None:
    rng = random.Random(11)
    for path in TRACES:
        text = first_batch(path, 1 << 12)
        for mutated in _mutations(text, rng, 60):
            _check_mutation(mutated)


def test_the_environment_variable_forces_the_msgspec_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PURE_PYTHON_ENV, "1")
    assert columns.fast_decoder() is None
    monkeypatch.setenv(PURE_PYTHON_ENV, "0")
    assert columns.fast_decoder() is fast


@pytest.mark.parametrize("workers", [1, 2])
def test_a_loaded_trace_is_the_same_either_way(monkeypatch: pytest.MonkeyPatch, workers: int) -> None:
    path = DATA / "gpu_1rank_simple_add_kineto.json.gz"
    with_c = load_trace(path, workers=workers)
    monkeypatch.setenv(PURE_PYTHON_ENV, "1")
    without = load_trace(path, workers=workers)
    for name in ("ts", "dur", "name_id", "cat_id", "thread_id", "stream", "corr"):
        assert np.array_equal(getattr(with_c, name), getattr(without, name), equal_nan=True), name
    assert (with_c.names, with_c.cats, with_c.threads, with_c.n_events) == (
        without.names, without.cats, without.threads, without.n_events)
