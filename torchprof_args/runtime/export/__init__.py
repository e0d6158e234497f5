"""From a stopped profiler to a published trace, without stalling training.

``writer`` (training process: submit, reap, time out), ``child`` (the forked exporter),
``publisher`` (a fresh process: compress, publish atomically, summarise), ``staging``
(node-local scratch space).
"""
