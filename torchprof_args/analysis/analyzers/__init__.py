"""The analyses of one loaded :class:`~torchprof_args.analysis.trace.Trace`, one module each (layer 3
of :mod:`torchprof_args.analysis`: imports the trace model and decode's field names, nothing above).

Each analyzer is a function of the trace's columns; what a summary shows it returns as a typed msgspec
struct (:class:`~.gpu.GpuBreakdown`, :class:`~.cpu_ops.OperatorTotal`, ...), the sections of
:class:`~torchprof_args.analysis.summary.Summary`.
:func:`torchprof_args.analysis.summary.summarize` composes them, and the diagnose kinds
(:mod:`torchprof_args.analysis.diagnose.kinds`) build on them.  All are vectorised with numpy (no
per-event Python loop), so they keep up with multi-GB traces.  Tables that several of them need
(steps, the CPU tree, kernel classes, the diagnose kinds' step context) are computed once per trace
and kept in its :class:`~torchprof_args.analysis.trace.TraceMemo` (``trace.memo``).

* :mod:`.steps`: ``ProfilerStep#N`` spans;
* :mod:`.gpu`: GPU time breakdown, kernel types and top kernels, with Holistic Trace Analysis'
  definitions (the tests compare them with HTA);
* :mod:`.overlap`: communication/computation overlap (HTA's definition);
* :mod:`.cpu_ops`: the CPU operator tree, per-operator totals and self times, thread busy time;
* :mod:`.step_ops`: the operators and kernels inside the steps;
* :mod:`.memory_events`: peaks of the ``[memory]`` events per device;
* :mod:`.origin`: who wrote the trace (host, iterations, parallel coordinates);
* :mod:`.collectives` and :mod:`.collective_match`: one rank's collective instances (a trace
  loaded with ``comms=True``), then matched across ranks: arrival skew, last rank, bus bandwidth
  (``torchprof collectives``);
* :mod:`.stepwise` (the steps' region, kernels and launches, GPU busy and idle time, per mean step)
  and :mod:`.callsites` (Python call sites): what the diagnose kinds measure with;
* :mod:`.select`: vectorised selection by name (the interval algebra is
  :mod:`torchprof_args.analysis.intervals`).
"""
