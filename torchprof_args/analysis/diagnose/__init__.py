"""``torchprof diagnose``: what to fix, ranked by the step time it would save (layer 4 of
:mod:`torchprof_args.analysis`: imports the trace model, decode's field names and the analyzers).

* :mod:`.finding`: :class:`~.finding.Finding`, :class:`~.finding.Gap` and the
  :class:`~.finding.Threshold` below which a kind reports nothing;
* :mod:`.kinds`: one module per kind, every one of one shape (``KIND``, ``SCOPE``, ``THRESHOLD``,
  ``analyze``), and :mod:`.registry`: the one ordered list of them that everything reads;
* what several kinds share (a kind is a plugin: it imports no other kind): :mod:`.spans` (the spans
  of a rank's steps one kind explains and the others leave alone, the computation kernels' union),
  :mod:`.launches` (HTA's launch table, the launch-bound verdict) and :mod:`.kind_names` (the names
  of the kinds whose findings later kinds read);
* :mod:`.context` (what a kind is told: earlier findings, the GPU peak) and :mod:`.cycle` (one
  cycle's rank parts, as the cross-rank kinds read them);
* :mod:`.documents`: the rank's part (kept in its sidecar) and the job's diagnosis (``--json``);
* :mod:`.rank` (per rank, from a trace), :mod:`.job_findings` (per cycle, from the rank parts) and
  :mod:`.changes` (two runs' findings compared, for ``diff``).

Reading sidecars and parsing traces is :mod:`torchprof_args.analysis.collect`'s.
"""
