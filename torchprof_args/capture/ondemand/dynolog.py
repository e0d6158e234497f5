"""dynolog: ``KINETO_USE_DAEMON`` must be set before torch is imported.

Kineto registers with the dynolog daemon (and torch installs the optimizer-step hook that
``dyno gputrace --iterations`` counts) only if the variable was in the environment when torch
was imported; set later, it silently does nothing.  This says so once per rank.
"""

from __future__ import annotations

import os
import sys

from torchprof_args.import_state import AT_FIRST_IMPORT
from torchprof_args.log import get_logger

__all__ = ["check_kineto_daemon_env", "kineto_daemon_env_too_late"]

logger = get_logger(__name__)

_kineto_warned = False


def kineto_daemon_env_too_late() -> bool:
    """True when ``KINETO_USE_DAEMON`` is set now but torch was imported before it was set.

    Observed from what torch's import did: ``torch.profiler`` installs its optimizer-step hook
    (which dynolog's iteration-based traces need) only if the variable was set at import time.
    Falls back to what :mod:`torchprof_args` saw at its first import
    (:data:`~torchprof_args.import_state.AT_FIRST_IMPORT`).
    """
    if not os.environ.get("KINETO_USE_DAEMON") or "torch" not in sys.modules:
        return False
    try:
        import torch.optim.optimizer as optimizer_module
        import torch.profiler as torch_profiler

        hook = torch_profiler._optimizer_post_hook  # noqa: SLF001
        hooks = optimizer_module._global_optimizer_post_hooks  # noqa: SLF001
        return hook not in hooks.values()
    except (ImportError, AttributeError):
        return AT_FIRST_IMPORT.torch_imported and not AT_FIRST_IMPORT.kineto_use_daemon


def check_kineto_daemon_env(rank: int) -> bool:
    """Warn once (with the rank) when ``KINETO_USE_DAEMON`` was set after torch was imported."""
    global _kineto_warned
    if _kineto_warned or not kineto_daemon_env_too_late():
        return False
    _kineto_warned = True
    logger.warning(
        "rank %d: KINETO_USE_DAEMON is set, but only after torch was imported, so torch did not "
        "register with dynolog at start-up and 'dyno gputrace --iterations' cannot count steps. "
        "Set it in the environment before Python starts, e.g. with "
        "integrations/dynolog/run_with_dynolog_env.sh, not in the training script.", rank)
    return True
