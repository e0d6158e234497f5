"""Build a multi-GB Kineto trace by replicating the steps of a real one from tests/data.

Every copy of the source's events is shifted in time by the source's span (plus a gap) and gets
fresh correlation / External ids, so the result looks like a long run of the same job: ProfilerStep
annotations, CPU ops, runtime calls, kernels, NCCL kernels, memcpy/memset and flows.

    python benchmarks/make_big_trace.py --size-mb 1100 -o benchmarks/out/big.pt.trace.json [--gzip]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import sys
from pathlib import Path

import msgspec

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = REPO / "tests" / "data" / "gpu_2rank_nccl_rank0.json.gz"
_STEP = re.compile(r"ProfilerStep#(\d+)")


def _id_span(events: list[dict], key: str) -> int:
    """max - min + 1 of the integer ids under ``key`` (an event field for flows, else an arg)."""
    if key == "id":
        ids = [e["id"] for e in events if isinstance(e.get("id"), int)]
    else:
        ids = [e["args"][key] for e in events
               if isinstance(e.get("args"), dict) and isinstance(e["args"].get(key), int)]
    return max(ids) - min(ids) + 1 if ids else 0


def build(source: Path, out: Path, size_mb: float, compress: bool) -> int:
    """Write the replicated trace to ``out``; returns its uncompressed size in bytes."""
    with gzip.open(source, "rb") if source.suffix == ".gz" else open(source, "rb") as fh:
        doc = json.load(fh)
    events = doc.pop("traceEvents")
    meta_events = [e for e in events if e.get("ph") == "M"]
    body = [e for e in events if e.get("ph") != "M"]
    stamps = [float(e["ts"]) for e in body if "ts" in e and e.get("ts") != ""]
    ends = [float(e["ts"]) + float(e.get("dur", 0)) for e in body if "ts" in e and e.get("ts") != ""]
    start, span = min(stamps), max(ends) - min(stamps)
    period = span * 1.01
    # Each id space is shifted by its own range per copy, so ids stay as compact as in one long
    # run (a correlation id grows by about the number of launches per cycle, not by its value).
    spans = {key: _id_span(body, key) for key in ("correlation", "External id", "id")}
    encoder = msgspec.json.Encoder()
    head = {k: v for k, v in doc.items()}
    steps_per_copy = max(1, len({e["name"] for e in body if _STEP.fullmatch(str(e.get("name", "")))}))
    target = int(size_mb * 1e6)
    tmp = out.with_name(out.name + ".tmp")
    opener = gzip.open(tmp, "wb", compresslevel=1) if compress else open(tmp, "wb")  # noqa: SIM115
    written = 0
    with opener as fh:

        def emit(data: bytes) -> None:
            nonlocal written
            fh.write(data)
            written += len(data)

        emit(b'{\n  "schemaVersion": 1,\n')
        for key in ("deviceProperties", "distributedInfo"):
            if key in head:
                emit(b'  "' + key.encode() + b'": ' + encoder.encode(head[key]) + b",\n")
        emit(b'  "traceEvents": [\n')
        first = True
        copy = 0
        step_base = 0
        while copy == 0 or written < target:  # at least one copy of the steps
            shift = copy * period
            batch = []
            for e in body:
                e2 = dict(e)
                if "ts" in e2 and e2["ts"] != "":
                    e2["ts"] = round(float(e2["ts"]) + shift, 3)
                if isinstance(e2.get("id"), int):
                    e2["id"] = e2["id"] + copy * spans["id"]
                args = e2.get("args")
                if isinstance(args, dict):
                    args = dict(args)
                    for k in ("correlation", "External id"):
                        if isinstance(args.get(k), int):
                            args[k] = args[k] + copy * spans[k]
                    e2["args"] = args
                m = _STEP.fullmatch(str(e2.get("name", "")))
                if m:
                    e2["name"] = f"ProfilerStep#{int(m.group(1)) + step_base}"
                batch.append(e2)
            chunk = b",\n".join(b"  " + encoder.encode(e) for e in batch)
            emit(chunk if first else b",\n" + chunk)
            first = False
            copy += 1
            step_base += steps_per_copy
        for e in meta_events:
            emit(b",\n  " + encoder.encode(e))
        emit(b"\n  ],\n")
        in_head = ("deviceProperties", "distributedInfo", "schemaVersion")
        tail = {k: v for k, v in head.items() if k not in in_head}
        parts = [b'  "' + k.encode() + b'": ' + encoder.encode(v) for k, v in tail.items()]
        emit(b",\n".join(parts) + b"\n}\n")
    os.replace(tmp, out)
    print(f"wrote {out} ({written / 1e6:.0f} MB uncompressed, {copy} copies of {start:.0f}+{span:.0f} us)")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    parser.add_argument("--size-mb", type=float, default=1100)
    parser.add_argument("-o", "--output", type=Path,
                        default=REPO / "benchmarks" / "out" / "big.pt.trace.json")
    parser.add_argument("--gzip", action="store_true", help="write .json.gz (level 1)")
    args = parser.parse_args(argv)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    build(args.source, args.output, args.size_mb, args.gzip)
    return 0


if __name__ == "__main__":
    sys.exit(main())
