"""The in-job side: what runs inside the training processes and writes the job's files.

``flags/`` and ``config.py`` (every ``--torch-profile-*`` option, parsed into frozen configs),
``runtime/`` (the profiler, the fence, the export and the rank's publisher), ``ondemand/`` (traces
on request), ``stacks/`` (every thread's stacks at a hang), ``metrics/`` (step timers, MFU, the
metrics writer and its sinks) and ``frameworks/`` (behind the entry points ``megatron.py``,
``deepspeed.py``, ...).  It reaches the offline side (:mod:`torchprof_args.analysis`) through one
call, :mod:`torchprof_args.analysis.staged`; what both sides agree on (file names, the sidecar,
``metrics.jsonl``, the stacks file) is in the foundation (:mod:`torchprof_args.naming`,
:mod:`torchprof_args.shared`).  Importing this package imports nothing.
"""
