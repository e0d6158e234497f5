"""The replay's inner loop (:func:`~.propagate.replay`), compiled where it can be.

:func:`kernel` is the reference, written in the subset of Python that numba compiles and that runs as
plain Python over lists (about 1 us per edge).  :func:`compiled` returns, in this order: the same loop
in C (``_replay.c``, an optional extension: :mod:`~torchprof_args.analysis.extensions`; about 10 ns
per edge, nothing to load); numba's compilation of :func:`kernel` for graphs of at least
:data:`COMPILE_FROM_EDGES` edges (loading numba and the cached kernel costs a process about 0.75 s
once, compiling it in a fresh environment about 1.5 s: what the plain loop takes for 5 replays of
~150k edges); else None, when the caller runs :func:`kernel` over lists.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, MutableSequence, Sequence
from typing import Any, cast

import numpy as np

from torchprof_args.analysis.extensions import extension

__all__ = ["COMPILE_FROM_EDGES", "NONE", "WINDOW", "compiled", "kernel"]

#: the label of the window's start (the first step's start: fixed, never moves).
WINDOW = -1
#: no label (a node nothing reaches).
NONE = -2
#: graphs with at least this many edges are replayed by the compiled kernel (see the module).
COMPILE_FROM_EDGES = 150_000


def kernel(order: Sequence[int], ptr: Sequence[int], ins: Sequence[int], src: Sequence[int],
           w: Sequence[float], done: Sequence[float], start_label: Sequence[int], early: Sequence[bool],
           restart: Sequence[int], t: Sequence[float],
           l1: MutableSequence[int], t1: MutableSequence[float], w1: MutableSequence[float],
           l2: MutableSequence[int], t2: MutableSequence[float], w2: MutableSequence[float],
           via: MutableSequence[int], s_l1: MutableSequence[int], s_t1: MutableSequence[float],
           s_w1: MutableSequence[float], s_l2: MutableSequence[int], s_t2: MutableSequence[float],
           s_w2: MutableSequence[float], s_via: MutableSequence[int]) -> None:
    """Each node's best and second-best (label, time, work) and the edge of its best, in ``order``.

    Inputs per node: ``ptr`` (its incoming edges ``ins[ptr[v]:ptr[v + 1]]``), ``start_label`` (a
    label it starts afresh with, else :data:`NONE`), ``early`` (before the window: its measured time),
    ``restart`` (a step end: the step's index, its values as a sink go to ``s_*[step]``; else -1),
    ``t`` (measured time); per edge ``src``, ``w`` (weight) and ``done`` (its own work).  Outputs
    ``l1``... ``via`` per node (filled with :data:`NONE`, -inf, 0 and -1 by the caller) and the sinks'
    ``s_*`` per step (``s_l1`` :data:`NONE` where the step's end was never computed).
    """
    minus_inf = -np.inf
    for i in range(len(order)):
        v = order[i]
        label = start_label[v]
        if label != NONE:
            l1[v] = label
            t1[v] = t[v]
            continue
        a = ptr[v]
        b = ptr[v + 1]
        if early[v] or a == b:
            l1[v] = WINDOW
            t1[v] = t[v]
            continue
        bl, bt, bw, sl, st, sw, be = NONE, minus_inf, 0.0, NONE, minus_inf, 0.0, -1
        for j in range(a, b):
            e = ins[j]
            u = src[e]
            we = w[e]
            mine = done[e]
            lx = l1[u]
            x = t1[u] + we
            if x > bt:  # the best slot of u (never NONE: every node visited has one)
                if lx != bl:
                    sl, st, sw = bl, bt, bw
                bl, bt, bw, be = lx, x, w1[u] + mine, e
            elif lx != bl and x > st:
                sl, st, sw = lx, x, w1[u] + mine
            lx = l2[u]
            if lx != NONE:
                x = t2[u] + we
                if x > bt:
                    if lx != bl:
                        sl, st, sw = bl, bt, bw
                    bl, bt, bw, be = lx, x, w2[u] + mine, e
                elif lx != bl and x > st:
                    sl, st, sw = lx, x, w2[u] + mine
        if bl == NONE:  # every edge in was cut: the node keeps its measured time
            bl, bt = WINDOW, t[v]
        k = restart[v]
        if k >= 0:  # a step's end: its value as a sink, then it starts afresh with the step's label
            s_l1[k], s_t1[k], s_w1[k], s_l2[k], s_t2[k], s_w2[k], s_via[k] = bl, bt, bw, sl, st, sw, be
            bl, bt, bw, sl, st, sw, be = -3 - k, t[v], 0.0, NONE, minus_inf, 0.0, -1
        l1[v], t1[v], w1[v], l2[v], t2[v], w2[v], via[v] = bl, bt, bw, sl, st, sw, be


def compiled(edges: int) -> Callable[..., Any] | None:
    """:func:`kernel` compiled for a graph of ``edges`` edges: the C extension's, else numba's (from
    :data:`COMPILE_FROM_EDGES` edges, where numba is installed), else None."""
    return _c_kernel() or (_numba_kernel() if edges >= COMPILE_FROM_EDGES else None)


def _c_kernel() -> Callable[..., Any] | None:
    module = extension("torchprof_args.analysis.critical_path._replay")
    return None if module is None else cast("Callable[..., Any]", module.kernel)


@functools.cache
def _numba_kernel() -> Callable[..., Any] | None:
    try:
        import numba
    except ImportError:
        return None
    return numba.njit(cache=True, nogil=True)(kernel)
