"""The other trace tools (layer 7 of :mod:`torchprof_args.analysis`, the top: may import every
layer): :mod:`.diff` (two runs compared), :mod:`.split` (a huge trace cut into standalone pieces),
:mod:`.merge` (one cycle's ranks on one timeline) and :mod:`.hang` (flight-recorder dumps)."""
