"""Every exception a user of torchprof-args may catch, in one import-light module.

Messages are sentences that name the flag or file at fault and say what to do.
"""

from __future__ import annotations

import enum

__all__ = [
    "CommandError",
    "ExitStatus",
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


class ExitStatus(enum.IntEnum):
    """What a ``torchprof`` command's exit status means, the same in every command (the console's
    ``--help`` says it: docs/reference/commands.md)."""

    #: Done.
    OK = 0
    #: It ran, but part of the work failed: some of several traces could not be read (the others
    #: were reported), a job rejected the request, did not answer in time or stopped.
    PARTLY_FAILED = 1
    #: It cannot run as asked: a bad argument or value, a path that does not exist, an input that
    #: is not what the command reads (argparse's own usage errors are 2 too).
    CANNOT_RUN = 2
    #: A CI gate failed: ``trend --fail-on-regression`` found a regression, ``diff --fail-above PCT``
    #: a step or an operator slower by more than PCT (the error line names them); the report is
    #: printed first, as without the gate.
    REGRESSION = 3
    #: The external tool it runs (nsys, py-spy) is not installed, as a shell says "not found".
    TOOL_MISSING = 127
    #: Interrupted (Ctrl-C).
    INTERRUPTED = 130


class CommandError(Exception):
    """A problem a ``torchprof`` command reports to its user: one sentence that names the flag or
    file and says what to do, and the exit status (:class:`ExitStatus`).

    Raised anywhere under a command; :func:`torchprof_args.console.main` alone prints it, as
    ``torchprof <command>: error: <message>``, and returns ``status``.
    """

    def __init__(self, message: str, status: int = ExitStatus.CANNOT_RUN) -> None:
        super().__init__(message)
        self.status = int(status)

    def __reduce__(self) -> tuple[type[CommandError], tuple[str, int]]:
        return type(self), (str(self), self.status)  # across a process pool with its status


class TraceError(CommandError):
    """Bad input for a trace tool (not JSON, truncated, not a Kineto trace, no such file...).

    The message is one sentence that names the file and the problem; a command reports it as a
    :class:`CommandError` (exit status 2: it cannot run on that input).
    """
