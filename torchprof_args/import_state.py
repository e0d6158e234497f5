"""What the process looked like when ``torchprof_args`` was first imported.

The package's ``__init__`` imports this module before anything else, so the values are those of
the first ``import torchprof_args...`` in the process.  :mod:`torchprof_args.capture.ondemand.dynolog`
reads them when torch's own state cannot say whether ``KINETO_USE_DAEMON`` came too late.
"""

from __future__ import annotations

import dataclasses
import os
import sys

__all__ = ["AT_FIRST_IMPORT", "ImportState"]


@dataclasses.dataclass(frozen=True)
class ImportState:
    """Whether torch was already imported, and ``KINETO_USE_DAEMON``'s value (None: unset) then."""

    torch_imported: bool
    kineto_use_daemon: str | None


#: The state when this package was first imported.
AT_FIRST_IMPORT = ImportState(torch_imported="torch" in sys.modules,
                              kineto_use_daemon=os.environ.get("KINETO_USE_DAEMON"))
