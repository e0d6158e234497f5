"""Every exception a user of torchprof-args may catch, in one import-light module.

Messages are sentences that name the flag or file at fault and say what to do.
"""

from __future__ import annotations

__all__ = [
    "MegatronIntegrationError",
    "OnDemandError",
    "TimerError",
    "TimerNamesMismatchError",
    "TorchProfileArgsError",
    "TraceError",
]


class TorchProfileArgsError(ValueError):
    """A bad flag value, a cross-flag conflict or an unusable directory, found before training."""


class OnDemandError(TorchProfileArgsError):
    """The on-demand control directory or registry cannot be used safely."""


class MegatronIntegrationError(RuntimeError):
    """Megatron-LM is missing or its training module does not look as expected."""


class TimerError(RuntimeError, AssertionError):
    """A timer used the wrong way (started twice, stopped while not running, ...).

    Also an ``AssertionError`` because Megatron's timers assert in these cases, so code that
    catches those keeps working.
    """


class TimerNamesMismatchError(RuntimeError):
    """Ranks called ``Timers.log``/``write`` with different timer names."""


class TraceError(Exception):
    """Bad input for a trace tool (not JSON, truncated, not a Kineto trace...).

    The message is one sentence that names the file and the problem; the command line prints it
    as is and exits with status 1.
    """
