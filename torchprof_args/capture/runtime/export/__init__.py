"""From a stopped profiler to a published trace, without stalling training or filling the host.

``writer`` (training process: submit, the inline fallback, the publish wait, the exit's wait),
``plan`` (per flush: staging directory, fork or inline, from what is free now), ``child`` (the
forked exporter), ``publication`` (one thread owning every publication: exporters, the rank's
publisher, timeouts, clean-up, outcomes), ``job`` (the publish job and its checks), ``publisher``
(the rank's long-lived process: compress, publish atomically, summarise, extra files), ``staging``
(private, locked, swept node-local directories).
"""
