"""The training-process side: the profiler, its schedule, the fence all ranks meet at, memory
snapshots, nsys ranges, and (in :mod:`~torchprof_args.capture.runtime.export`) the path a trace takes
from a stopped profiler to a published file.  Import-light: torch loads with the profiler."""
