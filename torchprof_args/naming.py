"""File names shared by the runtime that writes files and the tools that read them.

One module, so that a trace written by :mod:`torchprof_args.capture.runtime` is found by
:mod:`torchprof_args.analysis`, ``torchprof trigger`` predicts the right path, and a change of
layout happens in one place.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

__all__ = [
    "COMPANION_SUBDIRS",
    "CYCLE_DIR_PREFIX",
    "DEBUG_SERVER_DUMPS",

    "DEBUG_SERVER_SUBDIR",
    "DEFAULT_PROFILE_DIR",
    "EXECUTION_TRACE_SUFFIX",
    "EXPERT_TOKENS_SUBDIR",
    "EXPERT_TOKENS_SUFFIX",
    "FLIGHT_RECORDER_PREFIXES",
    "COMPILED_MODULES_SUBDIR",
    "FLIGHT_RECORDER_SUBDIR",
    "GZIP_SUFFIX",
    "MEMORY_SNAPSHOT_SUBDIR",
    "METRICS_FILENAME",
    "OPERATOR_TABLE_SUFFIX",
    "PROFILER_LIST_NAME",
    "SIDECAR_SUFFIX",
    "STACKS_CONTROL_SUBDIR",
    "SUMMARIES_SUBDIR",
    "TRACE_FILE_SUFFIXES",
    "TRACE_SUFFIX",
    "WANDB_RUN_FILENAME",
    "cycle_dir_name",
    "cycle_of_name",
    "flight_recorder_info_name",
    "memory_snapshot_name",
    "operator_table_path",
    "profiler_list_name",
    "companion_file_name",
    "companion_path",
    "companion_relpath",
    "rank_from_file_name",
    "safe_token",
    "host_from_file_name",
    "short_hostname",
    "sidecar_path",
    "stacks_file_name",
    "strip_trace_suffixes",
    "trace_file_name",
    "trace_relpath",
    "trace_stem",
]

#: torch.profiler's own suffix for Chrome-trace JSON (TensorBoard's plugin looks for it).
TRACE_SUFFIX = ".pt.trace.json"
GZIP_SUFFIX = ".gz"
#: Every suffix a trace reader accepts (traces of other tools included).
TRACE_FILE_SUFFIXES = (".json", ".json.gz")
#: PyTorch's execution trace (Chakra input) of a window, published with its Kineto trace.
EXECUTION_TRACE_SUFFIX = ".et.json"
#: The operator table of each published trace (steps, top operators, memory: the
#: ``profiler_list.dat`` layout), in the ``summaries/`` folder beside it.
OPERATOR_TABLE_SUFFIX = ".operator_table.txt"
#: The per-trace summary sidecar: what ``torchprof summary --json`` prints, and the trace's size
#: and mtime, so the tools read it instead of parsing a trace that has not changed.
SIDECAR_SUFFIX = ".summary.json"
#: The folder, inside a trace's folder, that holds what is derived from each trace (summary
#: sidecars, operator tables): nothing but traces may sit beside traces, since HTA reads every
#: .json/.gz of a folder as one.
SUMMARIES_SUBDIR = "summaries"
#: One folder per profiled cycle: ``iter000120-000121`` holds every rank's trace of iterations
#: 120..121, so HTA's ``TraceAnalysis(trace_dir=...)`` reads a cycle as it is.
CYCLE_DIR_PREFIX = "iter"
#: Files published with a trace that are not traces go into a subfolder of the cycle folder
#: named for what they hold (a ``.json.gz`` beside the traces would be read by HTA as a trace).
#: Each traced rank's routed tokens per expert over a window (torchtitan's MoE layers), in the cycle
#: folder's ``expert_tokens/`` (``shared/expert_tokens_file.py``).
EXPERT_TOKENS_SUFFIX = ".expert_tokens.json"
EXPERT_TOKENS_SUBDIR = "expert_tokens"
COMPANION_SUBDIRS = {EXECUTION_TRACE_SUFFIX: "execution_traces", EXPERT_TOKENS_SUFFIX: EXPERT_TOKENS_SUBDIR}
#: The file of the ``torchprof_args.cli`` decorator's run-level operator tables (its seed name).
PROFILER_LIST_NAME = "profiler_list.dat"
#: Where traces go without --torch-profile-dir (or Megatron-LM's --tensorboard-dir).
DEFAULT_PROFILE_DIR = "./prof"
MEMORY_SNAPSHOT_SUBDIR = "memory_snapshots"
#: ``<profile dir>/flight_recorder/``: PyTorch flight-recorder dumps, ``<prefix><rank>`` each.
FLIGHT_RECORDER_SUBDIR = "flight_recorder"
#: ``<profile dir>/compiled_modules/<trace stem>.json``: which module each kernel inductor generated in
#: that process came from (``--torch-profile-compiled-modules``; :mod:`torchprof_args.shared.kernel_modules`).
COMPILED_MODULES_SUBDIR = "compiled_modules"
#: Dump file prefixes by recorder: NCCL's is PyTorch's own default name (its watchdog writes it);
#: the CPU backends' recorder (gloo) is dumped by torchprof-args under the other.
FLIGHT_RECORDER_PREFIXES = {"nccl": "nccl_trace_rank_", "gloo": "gloo_trace_rank_"}
#: ``<profile dir>/stacks/``: the control directory of ``torchprof trigger --stacks`` (requests,
#: and each request's answers: one stacks file per rank).
STACKS_CONTROL_SUBDIR = "stacks"
#: ``<profile dir>/debug_server/``: the periodic dumps of PyTorch's debug server
#: (``--torch-profile-debug-server``), ``<name>_<YYYYmmdd_HHMMSS>.txt`` each (PyTorch's naming).
DEBUG_SERVER_SUBDIR = "debug_server"
#: The dumps ``torchprof hang`` reads there: PyTorch's every rank's stacks (faulthandler's text per
#: rank) and this package's every rank's flight recorder (JSON, as each rank's worker serves it).
DEBUG_SERVER_DUMPS = {"stacks": "stacks", "flight_recorder": "torchprof_fr_trace"}
#: The metrics writer's local record, one JSON object per logged iteration.
METRICS_FILENAME = "metrics.jsonl"
#: Written next to metrics.jsonl by the wandb sink: which wandb run holds these metrics.
WANDB_RUN_FILENAME = "wandb_run.json"

_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
_HOST_IN_NAME = re.compile(r"^rank\d+_(.+)_pid\d+")
_CYCLE_DIR = re.compile(r"^iter(\d+)-(\d+)$")
#: a cycle stated in a file name of the flat layout (``..._iter000003-000004.pt.trace.json.gz``).
_CYCLE_IN_NAME = re.compile(r"_iter(\d+)-(\d+)(?=[._]|$)")


def short_hostname() -> str:
    """The host name up to its first dot (``node17`` for ``node17.cluster.local``)."""
    return socket.gethostname().split(".")[0] or "host"


def safe_token(text: str) -> str:
    """``text`` with every character that is not alphanumeric, ``-`` or ``.`` replaced by ``-``."""
    return "".join(c if c.isalnum() or c in "-." else "-" for c in text)


def trace_stem(rank: int, *, host: str | None = None, pid: int | None = None) -> str:
    """The file-name stem of a rank's traces: unique per rank, host and process.

    Sorted listings group by rank; TensorBoard's profiler plugin reads the whole stem as the
    worker name.  Example: ``rank00003_node17_pid4242``.  The cycle is the folder
    (:func:`trace_relpath`).
    """
    host = host or short_hostname()
    pid = os.getpid() if pid is None else pid
    return f"rank{rank:05d}_{host}_pid{pid}"


def trace_relpath(rank: int, first_iteration: int, last_iteration: int, *, gzip: bool,
                  host: str | None = None, pid: int | None = None) -> str:
    """Where, under the profile directory, a rank's trace of one cycle is published:
    ``iter000120-000121/rank00003_node17_pid4242.pt.trace.json.gz``."""
    name = trace_file_name(trace_stem(rank, host=host, pid=pid), gzip)
    return f"{cycle_dir_name(first_iteration, last_iteration)}/{name}"


def trace_file_name(stem: str, gzip: bool) -> str:
    """``<stem>.pt.trace.json`` or ``<stem>.pt.trace.json.gz``."""
    return stem + TRACE_SUFFIX + (GZIP_SUFFIX if gzip else "")


def companion_file_name(stem: str, suffix: str, gzip: bool) -> str:
    """A file published beside the trace ``<stem>.pt.trace.json[.gz]``: ``<stem><suffix>[.gz]``."""
    return stem + suffix + (GZIP_SUFFIX if gzip else "")


def companion_relpath(stem: str, suffix: str, gzip: bool) -> str:
    """A file published with the trace ``<stem>``, relative to its cycle folder:
    ``execution_traces/<stem>.et.json.gz`` for an execution trace (:data:`COMPANION_SUBDIRS`),
    ``companions/<stem><suffix>`` otherwise."""
    return f"{COMPANION_SUBDIRS.get(suffix, 'companions')}/{companion_file_name(stem, suffix, gzip)}"


def companion_path(trace_path: str | os.PathLike[str], suffix: str, gzip: bool) -> Path:
    """Where a file published with ``trace_path`` lies (:func:`companion_relpath` in its folder)."""
    trace_path = Path(trace_path)
    return trace_path.parent / companion_relpath(strip_trace_suffixes(trace_path.name), suffix, gzip)


def strip_trace_suffixes(name: str, *, pt_trace: bool = True) -> str:
    """A trace file's name without ``.gz``, ``.json`` and (unless ``pt_trace`` is False) ``.pt.trace``."""
    for suffix in (GZIP_SUFFIX, ".json", ".pt.trace") if pt_trace else (GZIP_SUFFIX, ".json"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def cycle_dir_name(first_iteration: int, last_iteration: int) -> str:
    """``iter000120-000121``: the folder of one cycle's traces."""
    return f"{CYCLE_DIR_PREFIX}{first_iteration:06d}-{last_iteration:06d}"


def cycle_of_name(name: str, *, folder: bool) -> tuple[int, int] | None:
    """(first, last) iteration of a cycle folder's name (``folder``) or of a trace file name of
    the flat layout (``rank00000_node1_pid42_iter000003-000004.pt.trace.json.gz``), else None."""
    match = (_CYCLE_DIR.match if folder else _CYCLE_IN_NAME.search)(name)
    return (int(match.group(1)), int(match.group(2))) if match else None


def sidecar_path(trace_path: str | os.PathLike[str]) -> Path:
    """``<folder>/summaries/<stem>.summary.json``: where the summary of ``trace_path`` is kept."""
    trace_path = Path(trace_path)
    return trace_path.parent / SUMMARIES_SUBDIR / (strip_trace_suffixes(trace_path.name) + SIDECAR_SUFFIX)


def operator_table_path(trace_path: str | os.PathLike[str]) -> Path:
    """``<folder>/summaries/<stem>.operator_table.txt``: the operator table of ``trace_path``."""
    trace_path = Path(trace_path)
    name = strip_trace_suffixes(trace_path.name) + OPERATOR_TABLE_SUFFIX
    return trace_path.parent / SUMMARIES_SUBDIR / name


def rank_from_file_name(name: str) -> int | None:
    """The rank a file name states (``rank00003_...``, ``rank_3.json``), or None."""
    match = _RANK_IN_NAME.search(name)
    return int(match.group(1)) if match else None


def host_from_file_name(name: str) -> str | None:
    """The host a trace's file name states (``rank00003_node17_pid4242...``: ``node17``), or None."""
    match = _HOST_IN_NAME.match(name)
    return match.group(1) if match else None


def profiler_list_name(rank: int) -> str:
    """``profiler_list.dat`` for rank 0, ``profiler_list.rank00003.dat`` for the others."""
    return PROFILER_LIST_NAME if rank == 0 else f"profiler_list.rank{rank:05d}.dat"


def memory_snapshot_name(host: str, rank: int, iteration: int, reason: str | None = None) -> str:
    """``memory_snapshot_<host>_rank<R>_iter<I>[_<reason>].pickle`` (iteration zero-padded so
    the files sort in order)."""
    host = safe_token(host.split(".")[0]) or "host"
    suffix = f"_{reason}" if reason else ""
    return f"memory_snapshot_{host}_rank{rank}_iter{iteration:07d}{suffix}.pickle"


def flight_recorder_info_name(rank: int) -> str:
    """``dump_info_rank<R>.json``: why and when rank R dumped, and its process-group table."""
    return f"dump_info_rank{rank}.json"


def stacks_file_name(rank: int) -> str:
    """``stacks_rank<R>.json``: every Python thread's stack of rank R (in ``flight_recorder/`` at a
    hang, in the request's answer folder on demand; :mod:`torchprof_args.shared.stacks_file`)."""
    return f"stacks_rank{rank}.json"
