"""The package's optional C extensions: compiled fast paths, each beside a pure-Python fallback that
gives the same results (the decoder's columns, the critical path's replay).

``pip install`` builds them where a C compiler exists (``setup.py``: optional extensions, so an
install without one still succeeds); :func:`extension` returns one, or None where it was not built
or where :data:`PURE_PYTHON_ENV` is ``1``, which makes every caller take its fallback (the
benchmarks' side-by-side runs, a suspected extension bug).
"""

from __future__ import annotations

import importlib
import os
import types

__all__ = ["PURE_PYTHON_ENV", "extension"]

#: set to ``1``: no C extension is used, every fast path takes its pure-Python fallback.
PURE_PYTHON_ENV = "TORCHPROF_PURE_PYTHON"


def extension(name: str) -> types.ModuleType | None:
    """The C extension module ``name`` (its full dotted name), if it is built and allowed.

    Args:
        name: e.g. ``"torchprof_args.analysis.critical_path._replay"``.

    Returns:
        The module, or None (not built, or :data:`PURE_PYTHON_ENV` is ``1``).
    """
    if os.environ.get(PURE_PYTHON_ENV) == "1":
        return None
    try:
        return importlib.import_module(name)
    except ImportError:  # not built (no compiler at install), or built for another Python
        return None
