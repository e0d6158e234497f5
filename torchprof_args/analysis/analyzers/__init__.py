"""The analyses of one loaded :class:`~torchprof_args.analysis.trace.Trace`, one module each.

Each analyzer is a function of the trace's columns that returns plain, JSON-ready values;
:func:`torchprof_args.analysis.summary.summarize` composes them.  All are vectorised with numpy
(no per-event Python loop), so they keep up with multi-GB traces.  Tables that several of them
need (steps, the CPU tree, kernel classes) are computed once per trace and kept in its
:class:`~torchprof_args.analysis.trace.TraceMemo` (``trace.memo``).

* :mod:`.steps`: ``ProfilerStep#N`` spans;
* :mod:`.gpu`: GPU time breakdown, kernel types and top kernels, with Holistic Trace Analysis'
  definitions (the tests compare them with HTA);
* :mod:`.overlap`: communication/computation overlap (HTA's definition);
* :mod:`.cpu_ops`: the CPU operator tree, per-operator totals and self times, thread busy time;
* :mod:`.memory`: peaks of the ``[memory]`` events per device;
* :mod:`.cross_rank`: step time per rank, slowest rank and spread, from per-rank summaries;
* :mod:`.collectives` and :mod:`.collective_match`: one rank's collective instances (a trace
  loaded with ``comms=True``), then matched across ranks: arrival skew, last rank, bus bandwidth
  (``torchprof collectives``);
* :mod:`.intervals` and :mod:`.select`: the vectorised building blocks they share;
* ``torchprof diagnose``'s per-rank kinds, one module each (:mod:`.gpu_idle`, :mod:`.exposed_comm`,
  :mod:`.launch_bound`, :mod:`.host_sync`, :mod:`.dataloader_stall`, :mod:`.low_mfu`,
  :mod:`.memcpy`), each ``analyze(trace) -> Finding | Gap | None`` with a documented
  ``THRESHOLD``, over :mod:`.stepwise` (steps, kernels and launches, GPU idle) and
  :mod:`.callsites` (Python call sites); :mod:`torchprof_args.analysis.diagnose.rank` runs them.
"""
