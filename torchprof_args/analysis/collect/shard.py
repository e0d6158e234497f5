"""``--shard K/N``: the K-th of N stable shares of a list of traces, for sharded sidecar writing.

``srun -N 16 --ntasks-per-node 8 torchprof summary --write-sidecars --shard auto /lustre/run7``
starts 128 tasks that each parse their share of the run's traces on the nodes that already see
the files: no cluster of our own, the scheduler's.  Every task lists the same files (a shared
filesystem) and computes the same split, so the shares cover every trace exactly once whatever
order the tasks run in; a task does not consult another's progress.

Shares are balanced by bytes (traces of one job differ little, but cycles and ranks can):
traces are taken largest first and each goes to the share with the fewest bytes so far, ties
by file path, then share number.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Mapping
from pathlib import Path

from torchprof_args.errors import TraceError

__all__ = ["parse_shard", "shard_files"]

#: where ``--shard auto`` reads K and N, in order: SLURM (srun), then torchrun and most launchers.
AUTO_SOURCES = (("SLURM_PROCID", "SLURM_NTASKS"), ("RANK", "WORLD_SIZE"))


def parse_shard(text: str, environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """``"K/N"`` (0 <= K < N) or ``"auto"`` -> (K, N); :class:`TraceError` naming ``--shard`` otherwise."""
    environ = os.environ if environ is None else environ
    if text == "auto":
        for index_var, count_var in AUTO_SOURCES:
            index, count = environ.get(index_var, ""), environ.get(count_var, "")
            if index.isdigit() and count.isdigit():
                where = f"--shard auto ({index_var}={index}, {count_var}={count})"
                return _checked(int(index), int(count), where)
        raise TraceError("--shard auto: neither SLURM_PROCID/SLURM_NTASKS (srun) nor RANK/WORLD_SIZE "
                         "(torchrun) is set; give --shard K/N")
    k, sep, n = text.partition("/")
    if not sep or not k.strip().isdigit() or not n.strip().isdigit():
        raise TraceError(f"--shard {text!r}: expected K/N (e.g. 3/16, shard 3 of 0..15) or auto")
    return _checked(int(k), int(n), f"--shard {text}")


def _checked(k: int, n: int, what: str) -> tuple[int, int]:
    if n < 1 or not 0 <= k < n:
        raise TraceError(f"{what}: the shard number must be in 0..N-1 and N at least 1")
    return k, n


def shard_files(files: list[Path], k: int, n: int) -> list[Path]:
    """The files of share ``k`` of ``n`` (in their input order); see the module docstring."""
    if n == 1:
        return list(files)
    sized = []
    for f in files:
        try:
            size = f.stat().st_size
        except OSError:
            size = 0
        sized.append((-size, str(f), f))
    sized.sort()
    loads = [(0, share) for share in range(n)]
    mine: set[str] = set()
    for neg_size, name, _ in sized:
        load, share = heapq.heappop(loads)
        if share == k:
            mine.add(name)
        heapq.heappush(loads, (load - neg_size, share))
    return [f for f in files if str(f) in mine]
