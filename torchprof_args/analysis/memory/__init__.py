"""CUDA memory snapshots (``torch.cuda.memory._dump_snapshot`` pickles, read without running
code): :mod:`.snapshot`.  Layer 3 of :mod:`torchprof_args.analysis`, beside the analyzers: it
imports nothing else of the analysis package."""
