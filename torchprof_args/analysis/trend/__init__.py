"""Runs compared over time (``torchprof trend``): per-step samples of each run, a change test that knows
the run-to-run noise (:mod:`.change_test`), the series read from runs and cycles (:mod:`.series`),
the report (:mod:`.report`)."""
