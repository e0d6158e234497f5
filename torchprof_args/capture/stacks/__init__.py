"""Every rank's Python stacks, for hangs: ``dumper`` (writes the stacks file,
:mod:`torchprof_args.shared.stacks_file`: every thread, native frames through py-spy), ``server``
(the per-rank thread that answers ``torchprof trigger --stacks``).  Where each rank is, read from
the files, is :mod:`torchprof_args.analysis.analyzers.where`."""
