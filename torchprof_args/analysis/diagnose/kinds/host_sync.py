"""``host_sync``: the CPU blocked on the GPU inside the step.

``cudaStreamSynchronize`` / ``cudaDeviceSynchronize`` / ``cudaEventSynchronize`` (and their HIP
names) and blocking device-to-host copies (the runtime call of a ``Memcpy DtoH``: ``.item()``,
``.cpu()``, ``.tolist()``).  While the CPU waits it enqueues nothing, so once the queue drains
the GPU idles until the CPU launches again.  A synchronisation's cost is the GPU idle time while it
blocks and, when it found the GPU busy (it waited for the queue to drain), from its return to the
next kernel (the copy's own GPU time is the ``memcpy`` kind's); the time blocked is reported
beside it.  The calls and their windows are :mod:`..spans`' (``sync_events``, ``claimed``):
``gpu_idle`` and ``launch_bound`` leave those windows to this kind.  With
``--torch-profile-with-stack`` each is tied to its Python call site.

CPU-only traces (:func:`cpu_waits`) have no device to wait for; their synchronisation is the step's
thread waiting for a collective it issued itself, at the step's top level (not DDP's gradient
all-reduce inside backward), right away: ``dist.all_reduce(t, async_op=True).wait()`` or a
synchronous collective on a metric.  The thread runs no operator while it waits (``Work.wait`` is
not one; a Python frame around it, with ``--torch-profile-with-stack``, does not count) and gloo's
worker thread runs the collective meanwhile, so the cost is the time from the issuing operator's end
to the thread's next operator, while the collective runs.  Only a metric's all-reduces count, as on
the critical path (:func:`~..analyzers.collectives.are_metrics`: at most two a step): more
are the model's own communication (gradients reduced by hand), whose result the step needs.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from torchprof_args.analysis.analyzers.callsites import STACK_FLAG, call_sites, has_stacks
from torchprof_args.analysis.analyzers.collectives import are_metrics, canonical_kind
from torchprof_args.analysis.analyzers.cpu_ops import cpu_tree
from torchprof_args.analysis.analyzers.event_names import COLLECTIVE_ISSUE_RE as _ISSUE_RE
from torchprof_args.analysis.analyzers.event_names import COLLECTIVE_RUN_RE as _RUN_RE
from torchprof_args.analysis.analyzers.select import lookup
from torchprof_args.analysis.analyzers.steps import STEP_RE, steps
from torchprof_args.analysis.analyzers.stepwise import (
    StepContext,
    context,
    cpu_spans,
    top_names,
)
from torchprof_args.analysis.diagnose.context import DEFAULT_CONTEXT, KindContext, Scope
from torchprof_args.analysis.diagnose.finding import Finding, Gap, Threshold, no_gpu_gap
from torchprof_args.analysis.diagnose.spans import loader_spans, sync_events, sync_window_end
from torchprof_args.analysis.intervals import covered, merge_intervals, subtract
from torchprof_args.analysis.trace import Trace

__all__ = ["KIND", "SCOPE", "THRESHOLD", "analyze", "cpu_waits"]

KIND = "host_sync"
SCOPE = Scope.PER_RANK
#: the GPU idle time the synchronisations cause (CPU-only: the thread's wait) must reach 2 % of the step.
THRESHOLD = Threshold(share_of_step=0.02)
#: call sites are looked up for this many of the costliest calls (each is a search of the frames).
SITES_OF = 32


def _idle_caused(trace: Trace, ctx: StepContext, ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per call, the GPU idle time from its start to the first kernel after it returns, except
    while the data loader runs (``dataloader_stall``'s: the CPU fetching a batch is what keeps the
    GPU idle then, whatever drained the queue before; no idle time is counted twice)."""
    return covered(subtract(ctx.idle, loader_spans(trace, ctx)), ts, sync_window_end(ctx, ts, end))


def analyze(trace: Trace, kind_ctx: KindContext = DEFAULT_CONTEXT) -> Finding | Gap | None:
    """The GPU idle time host synchronisations cause per step (CPU-only: :func:`cpu_waits`).

    Args:
        trace: one rank's trace (with ``--torch-profile-with-stack``: call sites).
        kind_ctx: the kind's context (thresholds).

    Returns:
        The finding; a gap on a CPU-only trace without such waits; None below :data:`THRESHOLD`.
    """
    threshold = kind_ctx.threshold(THRESHOLD)
    ctx = context(trace)
    if not ctx.has_gpu:
        return cpu_waits(trace, threshold) or no_gpu_gap(KIND)
    idx = sync_events(trace, ctx)
    if len(idx) == 0:
        return None
    ts, end = trace.ts[idx], trace.ts[idx] + trace.dur[idx]
    cost = _idle_caused(trace, ctx, ts, end)
    caused_us = float(cost.sum())
    if not threshold.reached(ctx.ms(caused_us), ctx.share(caused_us)):
        return None
    blocked = cpu_spans(trace, idx, ctx)
    blocked_us = float((blocked[1] - blocked[0]).sum())
    worst = int(np.argmax(cost))
    evidence = {**ctx.evidence(), "blocked_ms_per_step": round(ctx.ms(blocked_us), 3),
                "calls_per_step": round(len(idx) / ctx.n_steps, 2),
                "top_calls": top_names(trace, idx, cost, ctx), "perfetto_ts_us": round(float(ts[worst]), 3)}
    remedy = "remove the host synchronisation (.item(), .cpu(), torch.cuda.synchronize()) from the step"
    if has_stacks(trace):
        costliest = np.argsort(-cost, kind="stable")[:SITES_OF]
        sites = _by_site(cost[costliest], call_sites(trace, idx[costliest]), ctx)
        evidence["call_sites"] = sites
        if sites and sites[0]["name"] != "unknown":
            remedy = f"remove the synchronisation (.item() / .cpu() / synchronize) at {sites[0]['name']}"
    else:
        evidence["call_sites_need"] = STACK_FLAG
    ms = ctx.ms(caused_us)
    return Finding(
        kind=KIND, ranks=(trace.rank or 0,),
        summary=f"host synchronisations leave the GPU idle {ms:.1f} ms per step "
                f"({100 * ctx.share(caused_us):.0f} %)",
        ms_per_step=ms, share_of_step=ctx.share(caused_us), saving_ms_per_step=ms,
        saving_bound="GPU idle from each synchronisation to the next kernel after it",
        remedy=remedy, evidence=evidence)


def _by_site(cost: np.ndarray, sites: list[str | None], ctx: StepContext,
             top: int = 3) -> list[dict[str, float | str]]:
    sums: dict[str, float] = defaultdict(float)
    for site, us in zip(sites, cost.tolist(), strict=True):
        sums[site or "unknown"] += us
    ranked = sorted(sums.items(), key=lambda kv: -kv[1])[:top]
    return [{"name": name, "ms_per_step": round(ctx.ms(us), 3)} for name, us in ranked]



def _top_level_issues(trace: Trace) -> dict[str, list[tuple[str, float, float]]]:
    """Per step (its name), (name, end of the issuing operator, next operator's start on the thread,
    at most the step's end) of every collective the step's thread issued at the step's top level:
    a c10d operator whose parent in the operator tree (:func:`cpu_tree`: operators and annotations,
    not Python frames) is the step's ``ProfilerStep`` annotation.  One pass over the tree, one binary
    search per issue."""
    tree = cpu_tree(trace)
    idx, parent, bounds = tree["idx"], tree["parent"], tree["bounds"]
    if not len(idx):
        return {}
    names = trace.name_id[idx]
    is_step = lookup(trace.names, STEP_RE.match)[names]
    is_issue = lookup(trace.names, _ISSUE_RE.match)[names]
    issued = np.flatnonzero(is_issue & (parent >= 0))
    issued = issued[is_step[parent[issued]]]
    ts = trace.ts[idx]
    out: dict[str, list[tuple[str, float, float]]] = defaultdict(list)
    thread_of = np.searchsorted(bounds, issued, side="right") - 1  # events sorted by thread, then start
    for k, th in zip(issued.tolist(), thread_of.tolist(), strict=True):
        step = int(parent[k])
        t1 = float(ts[k] + trace.dur[idx[k]])
        hi = float(ts[step] + trace.dur[idx[step]])
        lo_, hi_ = int(bounds[th]), int(bounds[th + 1])
        j = lo_ + int(np.searchsorted(ts[lo_:hi_], t1, side="left"))
        nxt = float(ts[j]) if j < hi_ else hi
        out[trace.names[names[step]]].append((trace.names[names[k]], t1, min(nxt, hi)))
    return out


def _metric_reduces(issues: dict[str, list[tuple[str, float, float]]],
                    n_steps: int) -> dict[str, list[tuple[str, float, float]]]:
    """The all-reduces among ``issues`` when they are few enough a step to be metrics the step need
    not wait for (:func:`are_metrics`, the critical path's rule too); more are the model's own
    communication (gradients reduced by hand, tensor parallelism), whose result the step needs."""
    reduces = {step: [issue for issue in found if canonical_kind(issue[0]) == "all_reduce"]
               for step, found in issues.items()}
    return reduces if are_metrics(sum(len(found) for found in reduces.values()), n_steps) else {}


def cpu_waits(trace: Trace, threshold: Threshold = THRESHOLD) -> Finding | None:
    """On a CPU-only trace: the step's thread blocked on collectives it issued at the step's top
    level (see the module); None below ``threshold`` or without steps."""
    spans = steps(trace)
    if not spans:
        return None
    runs = np.flatnonzero(lookup(trace.names, _RUN_RE.match)[trace.name_id])
    running = merge_intervals(trace.ts[runs], trace.ts[runs] + trace.dur[runs])
    issues = _metric_reduces(_top_level_issues(trace), len(spans))
    waits: dict[str, float] = defaultdict(float)
    worst, worst_at, calls = 0.0, None, 0
    for span in spans:
        found = issues.get(span["name"], [])
        if not found:
            continue
        t1 = np.array([f[1] for f in found])
        nxt = np.array([f[2] for f in found])
        blocked_each = covered(running, t1, np.maximum(nxt, t1))
        for (name, at, _), blocked in zip(found, blocked_each.tolist(), strict=True):
            if blocked <= 0:
                continue
            waits[name] += blocked
            calls += 1
            if blocked > worst:
                worst, worst_at = blocked, at
    n = len(spans)
    step_us = sum(s["dur_us"] for s in spans) / n
    total_us = sum(waits.values())
    share = total_us / n / step_us if step_us else 0.0
    ms = total_us / n / 1e3
    if not threshold.reached(ms, share):
        return None
    return Finding(
        kind=KIND, ranks=(trace.rank or 0,),
        summary=(f"the step's thread waits {ms:.1f} ms per step ({100 * share:.0f} %) for collectives it "
                 "issued itself at the step's top level, right after issuing them"),
        ms_per_step=ms, share_of_step=share, saving_ms_per_step=ms,
        saving_bound="the time the thread sat blocked while gloo ran the collective (it records nothing)",
        remedy=("do not wait for a metric's collective in the step: wait (or .item()) where the value is "
                "needed, e.g. at the logging interval, or reduce it less often"),
        evidence={"steps": n, "step_ms": round(step_us / 1e3, 3), "calls_per_step": round(calls / n, 2),
                  "top_calls": [{"name": k, "ms_per_step": round(v / n / 1e3, 3)}
                                for k, v in sorted(waits.items(), key=lambda kv: -kv[1])[:3]],
                  "perfetto_ts_us": worst_at})
