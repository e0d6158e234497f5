"""Every rank's Python stacks, for hangs: ``file_format`` (the ``stacks_rank<R>.json`` file),
``dumper`` (writes it: every thread, native frames through py-spy), ``server`` (the per-rank thread
that answers ``torchprof trigger --stacks``), ``where`` (groups ranks by where they are)."""
