"""From a stopped profiler to a published trace, without stalling training or filling the host.

``writer`` (training process: submit, fallbacks), ``plan`` (per flush: staging directory, fork or
inline, from what is free now), ``child`` (the forked exporter), ``reaper`` (waits on the
processes, reports, cleans up), ``job`` (the publish job, its checks, the status pipe),
``publisher`` (a fresh process: compress, publish atomically, summarise, extra files),
``staging`` (private, locked, swept node-local directories).
"""
