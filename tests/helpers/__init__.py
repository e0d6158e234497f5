"""Shared test helpers, imported as ``helpers.<module>`` by the tests (pytest puts ``tests/`` on
``sys.path``) and by the jobs they launch (``helpers.processes.subprocess_env`` puts it on
``PYTHONPATH``).  Fixtures stay in ``conftest.py``.

* :mod:`helpers.paths`: the repository and its test data;
* :mod:`helpers.processes`: free ports, the subprocess environment, a real ``torchrun`` launcher;
* :mod:`helpers.cuda`: skip markers for GPU tests and CPU-fallback tests;
* :mod:`helpers.logs`: a handler that collects the package's log records;
* :mod:`helpers.examples`: the documentation's worked examples, run verbatim;
* :mod:`helpers.megatron_lm`: Megatron-LM source trees and their CPU flags;
* :mod:`helpers.faults`, :mod:`helpers.fault_scenarios`: fault injection on real ranks.
"""
