"""Collectives on one rank: every collective instance of a trace, with what identifies and sizes it.

Input: a trace loaded with ``comms=True`` (its communication side table).  Which events are the
instances depends on what the trace recorded:

* **NCCL kernels** (GPU traces): one ``ncclKernel_*`` / ``ncclDevKernel_*`` kernel per collective;
  its start is when the GPU reached the collective (its arrival), its duration includes the wait
  for the other ranks.  Identity and size come from the kernel's own args (PyTorch >= 2.2:
  collective name, process group, sequence number, message sizes, dtype) or, for older traces,
  from the CPU records around the kernel's launch (``record_param_comms``, ``nccl:<op>``), found
  through the launch's correlation id.  Algorithm and protocol come from the kernel name.
* **gloo** (CPU jobs): ``gloo:<op>`` on gloo's worker threads, which run the collective and wait
  in it; sizes from ``Input Dims`` / ``Input type`` (recorded with ``record_shapes``); the kind is
  the issuing ``c10d::`` operator's (gloo runs FSDP2's reduce-scatter as an all-reduce).
* **host-side NCCL records only** (GPU activity not recorded): the ``nccl:<op>`` annotations, whose
  start is when the rank issued the collective (durations are then only the enqueue).

Times are absolute microseconds (``ts`` + ``baseTimeNanoseconds``), so ranks can be compared.
"""

from __future__ import annotations

import ast
import bisect
import dataclasses
import functools
import json
import math
import re
from collections import Counter, defaultdict
from collections.abc import Hashable, Sequence
from typing import Any, cast

import msgspec
import numpy as np

from torchprof_args.analysis.analyzers.origin import origin
from torchprof_args.analysis.analyzers.select import lookup, member
from torchprof_args.analysis.analyzers.steps import steps
from torchprof_args.analysis.decode.comm_events import COMM_FIELDS, is_comm_name
from torchprof_args.analysis.trace import StepSpan, Trace
from torchprof_args.errors import TraceError

__all__ = ["GPU_CHANNEL", "CommRecord", "CompactRecords", "RankComms", "absolute_steps", "backend_of",
           "canonical_kind", "collective_spans", "dtype_bytes", "match_issues", "rank_collectives",
           "run_kind", "tensor_bytes"]

SOURCE_KERNELS = "NCCL kernels on the GPU"
SOURCE_GLOO = "gloo collectives on the CPU (gloo:<op> on its worker threads)"
SOURCE_HOST = ("host-side nccl:<op> records only (no GPU activity in the trace: arrival = when the rank "
               "issued it)")

P2P_KINDS = frozenset({"send", "recv", "send_recv"})
#: how the channel of a record on a GPU stream starts (``stream 7``: an NCCL kernel's).
GPU_CHANNEL = "stream "

_KINDS = {
    "allreduce": "all_reduce", "allgather": "all_gather", "allgatherbase": "all_gather",
    "allgatherintotensor": "all_gather", "reducescatter": "reduce_scatter",
    "reducescatterbase": "reduce_scatter", "reducescattertensor": "reduce_scatter",
    "alltoall": "all_to_all", "alltoallbase": "all_to_all", "alltoallsingle": "all_to_all",
    "alltoallv": "all_to_all", "broadcast": "broadcast", "broadcastoop": "broadcast",
    "reduce": "reduce", "reduceoop": "reduce", "send": "send", "recv": "recv", "sendrecv": "send_recv",
    "barrier": "barrier", "gather": "gather", "scatter": "scatter", "allreducecoalesced": "all_reduce",
    "allgathercoalesced": "all_gather", "reducescattercoalesced": "reduce_scatter", "coalesced": "coalesced",
}
_ALGORITHMS = ("COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS_TREE", "NVLS", "RING", "TREE", "PAT")
_PROTOCOLS = ("LL128", "LL", "SIMPLE")
_KERNEL_RE = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)((?:_[A-Za-z0-9]+)*)")

#: Bytes per element of the dtype names NCCL records and the ones ``Input type`` uses.
_DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "bfloat16": 2,
    "c10::half": 2, "c10::bfloat16": 2, "long": 8, "long int": 8, "int64": 8, "int": 4, "int32": 4,
    "short": 2, "short int": 2, "int16": 2, "byte": 1, "unsigned char": 1, "uint8": 1, "char": 1,
    "signed char": 1, "int8": 1, "bool": 1,
}


#: a step that waits at once for at most this many all-reduces issued at its top level waits for
#: metrics, which it could read later; more are the model's own communication (gradients reduced by
#: hand, tensor parallelism), whose result the step needs.
METRIC_REDUCES_PER_STEP = 2


def are_metrics(reduces: int, steps: int) -> bool:
    """Whether ``reduces`` all-reduces that ``steps`` steps issued at their top level and waited for
    are metrics (:data:`METRIC_REDUCES_PER_STEP`): the one rule of the critical path's removable
    waits and ``host_sync``'s CPU form."""
    return reduces <= METRIC_REDUCES_PER_STEP * max(steps, 1)


@functools.lru_cache(maxsize=4096)
def canonical_kind(name: str) -> str:
    """``all_reduce``, ``all_gather``, ... from any spelling (``allreduce``, ``nccl:all_reduce``,
    ``_allgather_base``, ``AllGather``); the spelling itself (lower case) when unknown.  Cached: a
    trace has few distinct names and many collectives."""
    text = name.split(":", 1)[-1].split(" ", 1)[0]
    key = re.sub(r"[^a-z]", "", text.lower())
    return _KINDS.get(key, _KINDS.get(key.removesuffix("coalesced"), text.lower().strip("_") or "unknown"))


def dtype_bytes(dtype: str | None) -> int | None:
    """Bytes per element of a dtype as traces spell it (``Float``, ``c10::BFloat16``, ``long int``)."""
    if not dtype:
        return None
    name = str(dtype).lower()
    if name.startswith("c10::float8") or name.startswith("float8"):
        return 1
    return _DTYPE_BYTES.get(name) or _DTYPE_BYTES.get(name.removeprefix("c10::"))


@dataclasses.dataclass
class CommRecord:
    """One collective instance as one rank saw it."""

    kind: str
    start_us: float
    dur_us: float
    channel: str
    step: str
    pg: str | None = None
    pg_desc: str | None = None
    pg_ranks: list[int] | None = None
    group_size: int | None = None
    seq: int | None = None
    nbytes: int | None = None
    dtype: str | None = None
    algorithm: str | None = None
    protocol: str | None = None
    #: The trace did not say the group's size: the world size was used for the message size.
    size_assumed: bool = False
    #: An all-to-all's bytes received by this rank (its output; ``nbytes``: what it sent), which
    #: differ between ranks when the split sizes do (MoE token dispatch); None elsewhere or unknown.
    recv_bytes: int | None = None
    #: An all-to-all's bytes per row of its tensors (a token's hidden state in an MoE dispatch: the
    #: dimensions after the first times the element size), from the shapes; None where not recorded.
    #: Rows (tokens) moved: ``nbytes`` or ``recv_bytes`` over it.
    row_bytes: int | None = None
    #: When the training thread issued it (gloo: its c10d operator; None where not known): the order
    #: of a process group's work, which the runs' starts on gloo's worker threads may swap.
    issued_us: float | None = None


_RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(CommRecord))


class CompactRecords(msgspec.Struct, frozen=True):
    """A rank's collective records as a table: ``fields`` names the columns of every row."""

    fields: list[str]
    rows: list[list[Any]]

    @classmethod
    def of(cls, records: Sequence[CommRecord]) -> CompactRecords:
        """The table of ``records``."""
        return cls(list(_RECORD_FIELDS), [[getattr(r, name) for name in _RECORD_FIELDS] for r in records])

    def records(self) -> list[CommRecord]:
        """The records again (columns this version does not know are dropped)."""
        known = [i for i, n in enumerate(self.fields) if n in _RECORD_FIELDS]
        return [CommRecord(**{self.fields[i]: row[i] for i in known}) for row in self.rows]


@dataclasses.dataclass
class RankComms:
    """One rank's collectives (time order) and what its trace says about the job."""

    rank: int
    file: str
    source: str | None
    records: list[CommRecord]
    world_size: int | None
    pg_config: list[dict[str, Any]]
    #: the host it ran on (None: its trace does not say): ranks on one host share a clock.
    host: str | None = None
    #: its ``ProfilerStep`` spans in absolute us, like the records (the clocks' step-boundary fallback).
    steps: list[StepSpan] = dataclasses.field(default_factory=list)


def absolute_steps(spans: Sequence[StepSpan], base_us: float) -> list[StepSpan]:
    """``spans`` (trace-relative) in absolute us."""
    return [StepSpan(name=s["name"], start_us=s["start_us"] + base_us, dur_us=s["dur_us"]) for s in spans]


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None


def _ranks(value: Any) -> list[int] | None:
    if isinstance(value, list):
        return [int(v) for v in value if _int(v) is not None] or None
    if isinstance(value, str) and value.strip().startswith("["):
        try:
            return [int(v) for v in ast.literal_eval(value)] or None
        except (ValueError, SyntaxError, TypeError):
            return None
    return None


def _numel(dims_text: str | None, index: int | None = None) -> int | None:
    """Elements of the tensors in an ``Input Dims`` text (all of them, or only input ``index``)."""
    if not dims_text:
        return None
    try:
        dims = json.loads(dims_text)
    except ValueError:
        return None
    if index is not None:
        dims = dims[index : index + 1] if isinstance(dims, list) and len(dims) > index else []

    def count(node: Any) -> int:
        if isinstance(node, list) and node and all(isinstance(x, int) for x in node):
            return math.prod(node)
        return sum(count(x) for x in node) if isinstance(node, list) else 0

    return count(dims) or None


def tensor_bytes(dims_text: str | None, types_text: str | None, index: int) -> int | None:
    """Bytes of an operator's input ``index`` from its ``Input Dims`` / ``Input type`` texts (None:
    not recorded)."""
    count = _numel(dims_text, index)
    try:
        types = json.loads(types_text) if types_text else []
    except ValueError:
        return None
    elem = dtype_bytes(types[index]) if isinstance(types, list) and len(types) > index else None
    return count * elem if count is not None and elem else None


def _first_type(types_text: str | None) -> str | None:
    try:
        types = json.loads(types_text) if types_text else []
    except ValueError:
        return None
    not_tensors = ("Scalar", "TensorList", "ScalarList")
    return next((t for t in types if isinstance(t, str) and t and t not in not_tensors), None)


def _message_bytes(kind: str, row: dict[str, Any], group_size: int | None) -> int | None:
    """The message size ``S`` of nccl-tests (all-gather: the gathered output; reduce-scatter: the
    scattered input; all-to-all: what one rank sends; others: the buffer)."""
    if kind == "barrier":
        return None
    elem = dtype_bytes(row.get("dtype")) or dtype_bytes(_first_type(row.get("input_type")))
    nelems = [n for n in (_int(row.get("in_nelems")), _int(row.get("out_nelems"))) if n]
    if nelems:
        return max(nelems) * elem if elem else None
    count = _numel(row.get("input_dims"))
    if count is None or not elem:
        return None
    if kind == "all_gather" and group_size:  # Input Dims hold one rank's input
        count *= group_size
    return count * elem


def _kernel_algorithm(name: str) -> tuple[str | None, str | None, str | None]:
    """(kind, algorithm, protocol) from ``ncclDevKernel_AllGather_RING_LL(...)``-style names."""
    match = _KERNEL_RE.search(name)
    if not match:
        return None, None, None
    tail = match.group(2).upper()
    algorithm = next((a for a in _ALGORITHMS if f"_{a}" in tail), None)
    protocol = next((p for p in _PROTOCOLS if re.search(rf"_{p}(_|$)", tail)), None)
    return canonical_kind(match.group(1)), algorithm, protocol


class _Enclosing:
    """CPU communication records per thread, to find the ones around a kernel's launch."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self._by_thread: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
        for row in rows:
            self._by_thread[(row["pid"], row["tid"])].append(row)
        self._starts = {}
        for thread, found in self._by_thread.items():
            found.sort(key=lambda r: r["ts"])
            self._starts[thread] = [r["ts"] for r in found]

    def around(self, thread: tuple[Any, Any], ts: float) -> list[dict[str, Any]]:
        """Records on ``thread`` running at ``ts`` (innermost last)."""
        found = self._by_thread.get(thread, [])
        stop = bisect.bisect_right(self._starts.get(thread, []), ts)
        return [row for row in found[max(0, stop - 8) : stop] if row["ts"] + row["dur"] >= ts]


def _launches(trace: Trace, correlations: list[int]) -> dict[int, tuple[float, tuple[Any, Any]]]:
    """correlation id -> (launch ts, launching thread) of the CPU runtime calls of these kernels."""
    wanted = np.array(sorted({c for c in correlations if c >= 0}), dtype=np.int64)
    if not len(wanted):
        return {}
    idx = np.flatnonzero((trace.stream == -1) & member(trace.corr.astype(np.int64), wanted))
    return {int(trace.corr[i]): (float(trace.ts[i]), trace.threads[trace.thread_id[i]]) for i in idx}


class _Steps:
    def __init__(self, trace: Trace) -> None:
        found = steps(trace)
        self._starts = [s["start_us"] for s in found]
        self._spans = found

    def at(self, ts: float) -> str:
        i = bisect.bisect_right(self._starts, ts) - 1
        if i >= 0 and ts <= self._spans[i]["start_us"] + self._spans[i]["dur_us"]:
            return self._spans[i]["name"]
        return "-"


def _collective_fields(row: dict[str, Any], context: list[dict[str, Any]]) -> dict[str, Any]:
    """What identifies the collective (name, process group, sequence number, sizes) from ``row``,
    completed from the CPU records around its launch."""
    out = {key: row.get(key) for key in ("collective", "pg_name", "pg_desc", "pg_ranks", "group_size", "seq",
                                          "in_nelems", "out_nelems", "dtype", "input_dims", "input_type")}
    for other in reversed(context):  # innermost first: it wins
        for key, value in other.items():
            if key in out and out[key] is None and value is not None:
                out[key] = value
        if other["name"].startswith("nccl:") and not out.get("annotation"):
            out["annotation"] = other["name"]
    return out


def _record(kind: str, row: dict[str, Any], fields: dict[str, Any], base_us: float, step: str, channel: str,
            world_size: int | None, algorithm: str | None = None, protocol: str | None = None) -> CommRecord:
    ranks = _ranks(fields.get("pg_ranks"))
    size = _int(fields.get("group_size")) or (len(ranks) if ranks else None)
    pg = fields.get("pg_name")
    return CommRecord(
        kind=kind, start_us=row["ts"] + base_us, dur_us=row["dur"], channel=channel, step=step,
        pg=None if pg is None else str(pg), pg_desc=fields.get("pg_desc"), pg_ranks=ranks, group_size=size,
        seq=_int(fields.get("seq")), nbytes=_message_bytes(kind, fields, size or world_size),
        dtype=fields.get("dtype") or _first_type(fields.get("input_type")), algorithm=algorithm,
        protocol=protocol,
        size_assumed=size is None and kind == "all_gather" and not fields.get("out_nelems"))


def _from_kernels(trace: Trace, kernels: list[dict[str, Any]], cpu: list[dict[str, Any]], base_us: float,
                  step_of: _Steps) -> list[CommRecord]:
    launches = _launches(trace, [k["corr"] for k in kernels])
    enclosing = _Enclosing(cpu)
    records = []
    for row in kernels:
        launch = launches.get(row["corr"])
        context = enclosing.around(launch[1], launch[0]) if launch else []
        fields = _collective_fields(row, context)
        kind, algorithm, protocol = _kernel_algorithm(row["name"])
        if fields.get("collective"):
            kind = canonical_kind(str(fields["collective"]))
        elif fields.get("annotation"):
            kind = canonical_kind(fields["annotation"])  # e.g. all_to_all run as SendRecv kernels
        step = step_of.at(launch[0] if launch else row["ts"])
        records.append(_record(kind or "unknown", row, fields, base_us, step, f"{GPU_CHANNEL}{row['stream']}",
                               trace.world_size, algorithm, protocol))
    return records


def run_kind(operator: str, backend: str = "gloo") -> str:
    """The collective ``backend`` runs for the c10d operator ``operator``: its own kind, but gloo runs
    the reduce-scatter of one tensor (``_reduce_scatter_base_``, ``reduce_scatter_tensor_coalesced_``:
    FSDP2's) as an all-reduce."""
    kind = canonical_kind(operator)
    if backend == "gloo" and kind == "reduce_scatter" and ("base" in operator or "tensor" in operator):
        return "all_reduce"
    return kind


def backend_of(runs: Sequence[str]) -> str:
    """The backend that ran these collectives (``gloo:all_reduce`` -> ``gloo``), the most common one."""
    found = Counter(name.split(":", 1)[0] for name in runs)
    return found.most_common(1)[0][0] if found else "gloo"


#: how many of a queue's issues, from its first not yet run, a run may be matched to: gloo's worker
#: threads (2 by default) run a process group's queue in order but may start two runs out of order.
ISSUE_WINDOW = 4


def match_issues(issues: Sequence[tuple[Hashable, float]], runs: Sequence[tuple[Hashable, float]],
                 issue_shapes: Sequence[frozenset[str]] | None = None,
                 run_shapes: Sequence[str | None] | None = None) -> dict[int, int]:
    """Which issue each run is: ``run index -> issue index``, where each is ``(key, start)`` and the key
    says which queue (the process and the collective gloo runs, :func:`run_kind`).  gloo runs a
    process group's work in the order it was issued, so the n-th run of a key is the n-th issue of
    it, once that issue has started (a run whose issue is before the trace is not matched, and does
    not shift the others).  Its worker threads may start two queued runs out of order (an MoE
    dispatch and the expert ids sent beside it): with shapes (``run_shapes``: a run's tensor shape;
    ``issue_shapes``: the shapes of its operator's tensors), a run takes the first of the next
    :data:`ISSUE_WINDOW` issues whose tensors include its own, else the next one."""
    queues: dict[Hashable, list[int]] = defaultdict(list)
    for index in sorted(range(len(issues)), key=lambda i: issues[i][1]):
        queues[issues[index][0]].append(index)
    taken: set[int] = set()
    head: dict[Hashable, int] = defaultdict(int)
    found: dict[int, int] = {}
    for index in sorted(range(len(runs)), key=lambda i: runs[i][1]):
        key, start = runs[index]
        queue = queues.get(key, [])
        while head[key] < len(queue) and queue[head[key]] in taken:
            head[key] += 1
        window = [i for i in queue[head[key]:head[key] + 2 * ISSUE_WINDOW] if i not in taken][:ISSUE_WINDOW]
        started = [i for i in window if issues[i][1] <= start]
        if not started:
            continue
        shape = run_shapes[index] if run_shapes is not None else None
        same = [i for i in started if issue_shapes is not None and shape in issue_shapes[i]]
        chosen = same[0] if shape is not None and same else started[0]
        found[index] = chosen
        taken.add(chosen)
    return found


def _run_shape(row: dict[str, Any]) -> str | None:
    """A run's tensor shape (its first), as text; None where the shapes were not recorded."""
    shapes = _shapes(row.get("input_dims"))
    return shapes[0] if shapes else None


def _shapes(dims: str | None) -> list[str]:
    """The non-empty tensor shapes of an event's ``Input Dims`` (recorded JSON), each as text."""
    try:
        found = json.loads(dims or "null")
    except ValueError:
        return []
    if not isinstance(found, list):
        return []
    return [json.dumps(d) for d in found if isinstance(d, list) and d and all(isinstance(x, int) for x in d)]


def _issuers(rows: list[dict[str, Any]], issued: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
    """Per row of ``rows`` (gloo's collectives, on its worker threads), the c10d operator that issued
    it (``issued``: on the training threads), or None (:func:`match_issues`, with their shapes)."""
    backend = backend_of([row["name"] for row in rows])
    found = match_issues([(run_kind(op["name"], backend), op["ts"]) for op in issued],
                         [(canonical_kind(row["name"]), row["ts"]) for row in rows],
                         [frozenset(_shapes(op.get("input_dims"))) for op in issued],
                         [_run_shape(row) for row in rows])
    return [issued[found[i]] if i in found else None for i in range(len(rows))]


def _received_bytes(operator: dict[str, Any], dtype: str | None) -> int | None:
    """An all-to-all's bytes received: its operator's output tensor (``c10d::alltoall_base_``'s first
    input), whose rows are what the split sizes gave this rank."""
    count = _numel(operator.get("input_dims"), 0)
    elem = dtype_bytes(dtype) or dtype_bytes(_first_type(operator.get("input_type")))
    return count * elem if count is not None and elem else None


def _row_bytes(operator: dict[str, Any], dtype: str | None) -> int | None:
    """An all-to-all's bytes per row (dimension 0) of its output tensor: one token's share in an MoE
    dispatch (None: the shapes were not recorded)."""
    try:
        dims = json.loads(operator.get("input_dims") or "null")
    except ValueError:
        return None
    first = dims[0] if isinstance(dims, list) and dims else None
    if not isinstance(first, list) or not first or not all(isinstance(d, int) for d in first):
        return None
    elem = dtype_bytes(dtype) or dtype_bytes(_first_type(operator.get("input_type")))
    return math.prod(first[1:]) * elem if elem else None


def _from_cpu(rows: list[dict[str, Any]], params: list[dict[str, Any]], base_us: float, step_of: _Steps,
              world_size: int | None, algorithm: str | None,
              issued: list[dict[str, Any]] | None = None) -> list[CommRecord]:
    enclosing = _Enclosing(params)
    issuers = _issuers(rows, issued) if issued else [None] * len(rows)
    records = []
    for row, issuer in zip(rows, issuers, strict=True):
        fields = _collective_fields(row, enclosing.around((row["pid"], row["tid"]), row["ts"]))
        # what the operator asked for (gloo runs FSDP2's reduce-scatter as an all-reduce)
        kind = canonical_kind(issuer["name"] if issuer is not None else row["name"])
        channel = f"pg {fields['pg_name']}" if fields.get("pg_name") is not None else kind
        step = step_of.at(row["ts"])
        record = _record(kind, row, fields, base_us, step, channel, world_size, algorithm)
        if issuer is not None:
            record.issued_us = issuer["ts"] + base_us
        if kind == "all_to_all" and issuer is not None:
            record.recv_bytes = _received_bytes(issuer, record.dtype)
            record.row_bytes = _row_bytes(issuer, record.dtype)
        records.append(record)
    return records


def rank_collectives(trace: Trace, rank: int | None = None) -> RankComms:
    """Every collective instance of one rank's trace, in time order: from the NCCL kernels (with the
    host-side records around their launch), else gloo's CPU events, else the host-side records.

    Args:
        trace: loaded with ``comms=True``.
        rank: overrides the trace's ``distributedInfo.rank`` (for traces that lack it).

    Returns:
        The rank's :class:`RankComms` (without ``rank``: computed once per trace, kept in its memo and
        shared by every caller, which must not change it).

    Raises:
        TraceError: the trace was loaded without its communication events.
    """
    if trace.comms is None:
        raise TraceError(f"{trace.path}: loaded without communication events; "
                         "use load_trace(..., comms=True)")
    if rank is None:  # as the trace says: kept in its memo (diagnose and the critical path both read it)
        if trace.memo.rank_comms is None:
            trace.memo.rank_comms = _rank_collectives(trace, None)
        return cast(RankComms, trace.memo.rank_comms)
    return _rank_collectives(trace, rank)


#: the category of the NCCL kernels that are collective instances.
KERNEL_CAT = "kernel"
#: the CPU events that are collective instances where no NCCL kernel is: gloo's (and XCCL's) worker
#: threads' ``gloo:<op>``, else the host-side ``nccl:<op>`` records.
GLOO_OPS = ("gloo:", "xccl:")
HOST_OPS = "nccl:"


def _is_nccl(name: str) -> bool:
    return "nccl" in name.lower()


def collective_spans(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """The rank's collective instances' intervals, from the trace's columns alone (no ``comms=True``).

    The same instances as :func:`rank_collectives`'s records, from the same source: NCCL kernels,
    else gloo's CPU events, else the host-side records.

    Args:
        trace: one rank's trace.

    Returns:
        Their starts and ends (trace-relative us, float64), in file order.
    """
    comm = lookup(trace.names, is_comm_name)
    cpu = trace.stream == -1
    kernel = lookup(trace.cats, {KERNEL_CAT})[trace.cat_id]
    sources = (
        (lookup(trace.names, _is_nccl) & comm)[trace.name_id] & kernel,
        lookup(trace.names, lambda n: n.startswith(GLOO_OPS))[trace.name_id] & cpu,
        lookup(trace.names, lambda n: n.startswith(HOST_OPS))[trace.name_id] & cpu,
    )
    for mask in sources:
        idx = np.flatnonzero(mask)
        if len(idx):
            starts = trace.ts[idx].astype(np.float64)
            return starts, starts + np.maximum(trace.dur[idx].astype(np.float64), 0.0)
    return np.zeros(0), np.zeros(0)


def _rank_collectives(trace: Trace, rank: int | None) -> RankComms:
    """:func:`rank_collectives`, computed."""
    assert trace.comms is not None
    rows = [dict(zip(COMM_FIELDS, row, strict=True)) for row in trace.comms]
    kernels = [r for r in rows if r["cat"] == KERNEL_CAT and _is_nccl(r["name"])]
    cpu = [r for r in rows if r["stream"] == -1]
    gloo = [r for r in cpu if r["name"].startswith(GLOO_OPS)]
    host = [r for r in cpu if r["name"].startswith(HOST_OPS)]
    params = [r for r in cpu if r["name"] == "record_param_comms"]
    issued = [r for r in cpu if r["name"].startswith("c10d::")]
    base_us = trace.base_time_ns / 1000.0
    step_of = _Steps(trace)
    if kernels:
        source, records = SOURCE_KERNELS, _from_kernels(trace, kernels, host + params, base_us, step_of)
    elif gloo:
        source, records = SOURCE_GLOO, _from_cpu(gloo, params, base_us, step_of, trace.world_size, "gloo",
                                                 issued)
    elif host:
        source, records = SOURCE_HOST, _from_cpu(host, params, base_us, step_of, trace.world_size, None)
    else:
        source, records = None, []
    records.sort(key=lambda r: r.start_us)
    info = trace.metadata.get("distributedInfo")
    pg_config = info.get("pg_config") if isinstance(info, dict) else None
    if not isinstance(pg_config, list):
        pg_config = []
    found_rank = rank if rank is not None else trace.rank
    return RankComms(rank=found_rank if found_rank is not None else -1, file=str(trace.path), source=source,
                     records=records, world_size=trace.world_size, pg_config=pg_config,
                     host=origin(trace).host, steps=absolute_steps(steps(trace), base_us))
