"""The one lazy-import helper behind the package's facades (a PEP 562 module ``__getattr__``): a
public name loads the module that defines it on first use, so importing a facade (``torchprof_args``,
``torchprof_args.analysis``) imports neither torch nor the trace toolkit."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

__all__ = ["lazy_attribute"]


def lazy_attribute(namespace: dict[str, Any], table: Mapping[str, str], package: str, name: str) -> Any:
    """``name`` of ``package``, loaded from the module ``table`` names for it and kept in
    ``namespace`` (the facade's ``globals()``) so the next access is a plain lookup.

    Raises:
        AttributeError: ``name`` is not one of the facade's names."""
    module_name = table.get(name)
    if module_name is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    namespace[name] = value
    return value
