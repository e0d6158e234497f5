"""Many traces and their results (layer 5 of :mod:`torchprof_args.analysis`: imports decode, the
summary and diagnose).

* :mod:`.discover`: the traces a command was given, grouped by profiled cycle;
* :mod:`.sidecar`: a trace's results kept beside it (``summaries/<stem>.summary.json``), used
  while its fingerprint matches;
* :mod:`.trace_results`: the one per-trace pipeline: one trace's parts (summary, rank
  diagnosis, critical path, memory) from one read of its sidecar, else by parsing it once;
* :mod:`.pool`: many traces' results, sidecars first, the rest parsed by a pool of processes;
* :mod:`.shard`: the parsing split between the tasks of a cluster job.
"""
