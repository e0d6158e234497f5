"""From a trace file to a :class:`~torchprof_args.analysis.trace.Trace` (layer 2 of
:mod:`torchprof_args.analysis`: imports only the trace model).

:mod:`.reader` streams a ``.json`` / ``.json.gz`` file in batches of event text; :mod:`.events`
and :mod:`.comm_events` decode a batch into msgspec structs (communication fields and input shapes
only when asked), :mod:`.op_flops` counts FLOPs from shapes, :mod:`.columns` turns a batch into
numpy columns; :mod:`.loader` (``load_trace``) builds the Trace, with :mod:`.parallel`'s decoding
processes for large files.
"""
