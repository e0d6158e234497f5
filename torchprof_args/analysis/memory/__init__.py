"""Where the memory goes and why it ran out (``torchprof mem``): layer 3 of
:mod:`torchprof_args.analysis`, beside the analyzers (it reads the trace model and the analyzers'
selection helpers, nothing above).

* :mod:`.categories`: the six categories, the phases, the memory part of a sidecar (its documents);
* :mod:`.breakdown`: one device's allocations (:class:`~.breakdown.Allocations`) -> the peak, what
  was live then, each step, tensors kept across steps, a timeline;
* :mod:`.pytorch_profile` (PyTorch's categorisation of a live profiler's results, corrected),
  :mod:`.exported` (its way from the forked exporter to the sidecar), :mod:`.trace_memory` (from a
  trace's ``[memory]`` events), :mod:`.places` and :mod:`.nesting` (where an allocation was made);
* :mod:`.snapshot` and :mod:`.snapshot_history`: CUDA memory snapshot pickles, read without running
  code, their history as columns; :mod:`.oom`: an OOM explained;
* :mod:`.findings` (what would free memory, with remedies), :mod:`.ranks` (outlier ranks),
  :mod:`.allocator` (every rank's allocator peaks from metrics.jsonl), :mod:`.report` (the
  ``torchprof mem --json`` document).
"""
