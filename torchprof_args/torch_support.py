"""Which torch release each feature needs, and the one-line message when the installed one is older.

The package works with torch >= :data:`MIN_TORCH` (``install_requires``); a few features need a
newer release (:data:`FEATURES`, the table of ``docs/getting-started.md``).  Import-light: the
installed version is read from the package metadata, torch is never imported here.
"""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version

__all__ = ["FEATURES", "MIN_TORCH", "WITH_MODULES_DEPRECATED", "installed_torch", "needs", "torch_at_least"]

#: The lowest torch release the package is tested with (setup.py's install_requires).
MIN_TORCH = (2, 9)

#: From this release on, ``with_modules`` does nothing in eager mode (a FutureWarning says to use
#: ``with_stack``, whose ``nn.Module`` events carry the hierarchy).
WITH_MODULES_DEPRECATED = (2, 14)

#: feature -> (the first torch release that has what it uses, what that is).
FEATURES: dict[str, tuple[tuple[int, int], str]] = {
    "--torch-profile-* tracing, export, on-demand, timers, trace toolkit": (
        MIN_TORCH, "torch.profiler, gloo process groups"),
    "--torch-profile-flight-recorder (gloo dumps)": ((2, 8), "torch._C._distributed_c10d._dump_fr_trace"),
    "torchprof hang": ((2, 10), "torch.distributed.flight_recorder (PyTorch's analyzer)"),
    "--torch-profile-debug-server": ((2, 13), "torch.distributed.debug.start_debug_server with handlers and "
                                              "periodic dumps"),
}


def installed_torch() -> tuple[int, int] | None:
    """``(major, minor)`` of the installed torch, None when torch is not installed or unparsable."""
    try:
        match = re.match(r"(\d+)\.(\d+)", version("torch"))
    except PackageNotFoundError:
        return None
    return (int(match.group(1)), int(match.group(2))) if match else None


def torch_at_least(release: tuple[int, int]) -> bool:
    """Whether the installed torch is ``release`` or newer (an unknown version counts as new)."""
    found = installed_torch()
    return found is None or found >= release


def needs(feature: str) -> str:
    """The one-line message: ``feature`` (a key of :data:`FEATURES`) needs a newer torch than this."""
    release, what = FEATURES[feature]
    found = installed_torch()
    here = "this torch" if found is None else f"torch {found[0]}.{found[1]}"
    return (f"{feature} needs torch >= {release[0]}.{release[1]} ({what} is missing in {here}); "
            f"upgrade torch to use it")
