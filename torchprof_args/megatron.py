"""Megatron-LM and megatron-core integration: flags and a one-call loop hook.

Three ways in, from least to most code:

* ``extra_args_provider=torchprof_args.megatron.extra_args_provider`` (or
  :func:`compose_args_providers` with your own providers) adds every torchprof flag to Megatron's
  parser; options Megatron already defines (``--tensorboard-dir``, ``--log-interval``,
  ``--timing-log-level``, ``--wandb-project`` ...) are reused, not redefined.
* :func:`install` before ``pretrain(...)`` in ``pretrain_gpt.py`` patches Megatron-LM's
  ``megatron.training.training`` module at call time: ``train`` is wrapped to own the profiler
  for the whole loop and ``training_log`` (called once per iteration, with the global iteration
  that just finished) steps it.  Megatron-LM's source is not edited; :func:`uninstall` undoes it.
* :class:`TrainingHook` is the same thing for forks whose loop differs: create it after the
  checkpoint is loaded, call ``hook.step(iteration)`` after each iteration, close it at the end.

The flush of a trace window is timed with Megatron's own timers (``torch-profile-flush``) and
written, max across ranks, through Megatron's TensorBoard and wandb writers.
``--torch-profile-parallel-ranks`` selects traced ranks by megatron-core's parallel coordinates
(:mod:`torchprof_args.runtime.ranks`).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import threading
from collections.abc import Callable, Iterable
from typing import Any

from torchprof_args.config import add_torch_profile_args
from torchprof_args.errors import MegatronIntegrationError, TorchProfileArgsError
from torchprof_args.log import get_logger

logger = get_logger(__name__)

__all__ = [
    "MegatronIntegrationError",
    "TrainingHook",
    "check_megatron_args",
    "compose_args_providers",
    "extra_args_provider",
    "install",
    "profiler_from_args",
    "uninstall",
]

ArgsProvider = Callable[[argparse.ArgumentParser], "argparse.ArgumentParser | None"]

#: Megatron timer name of the trace flush (written as ``torch-profile-flush-time``).
FLUSH_TIMER = "torch-profile-flush"


# ---------------------------------------------------------------------------------------------
# Flags


def extra_args_provider(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Megatron-LM ``extra_args_provider``: adds the torchprof flag groups (profiler, timers, ...)."""
    return add_torch_profile_args(parser)


def compose_args_providers(*providers: ArgsProvider | None) -> ArgsProvider:
    """One ``extra_args_provider`` that applies ``providers`` in order (``None`` entries skipped).

    Each provider may return the parser (Megatron's convention) or ``None``.
    """

    def provider(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        for each in providers:
            if each is not None:
                result = each(parser)
                parser = parser if result is None else result
        return parser

    return provider


def check_megatron_args(args: argparse.Namespace) -> None:
    """Refuse combinations with Megatron's own profiling (raises :class:`TorchProfileArgsError`)."""
    if not getattr(args, "torch_profile", False) or not getattr(args, "profile", False):
        return
    if getattr(args, "use_pytorch_profiler", False):
        raise TorchProfileArgsError(
            "--torch-profile cannot run together with Megatron's --profile --use-pytorch-profiler: "
            "both drive torch.profiler in the same process. Drop --profile --use-pytorch-profiler "
            "(torchprof's --torch-profile-step-start/-end give the same window)."
        )
    logger.warning("Megatron's --profile (nsys range) and --torch-profile are both on: CUPTI is shared, "
                   "so kernel timings in either may be incomplete")


def profiler_from_args(args: argparse.Namespace, *, start_iteration: int | None = None) -> Any:
    """``TorchProfiler.from_args`` after the checks against Megatron's own profiling flags."""
    from torchprof_args.runtime.profiler import TorchProfiler

    check_megatron_args(args)
    return TorchProfiler.from_args(args, start_iteration=start_iteration)


# ---------------------------------------------------------------------------------------------
# The loop hook


def _clean_exit(exc_type: type[BaseException] | None, exc: BaseException | None) -> bool:
    """A normal return, or ``sys.exit(0)`` (Megatron's exit-interval / duration exits)."""
    if exc_type is None:
        return True
    return isinstance(exc, SystemExit) and exc.code in (None, 0)


class TrainingHook:
    """Profiler plus flush timing for a Megatron-style loop (the manual patch for custom forks).

    ``timers`` is Megatron's timers object (``get_timers()``; a ``torchprof_args.Timers`` works
    too); ``writers`` are Megatron's TensorBoard writer and wandb writer (``None`` entries, as on
    ranks that do not write, are fine).  Every rank must create it and call :meth:`step`: the
    flush timer is reduced across ranks.  ``start_iteration`` defaults to ``args.iteration``.
    """

    def __init__(
        self,
        args: argparse.Namespace,
        *,
        timers: Any = None,
        writers: Iterable[Any] = (),
        start_iteration: int | None = None,
    ) -> None:
        self.args = args
        self.prof = profiler_from_args(args, start_iteration=start_iteration)
        self.timers = timers
        self.writers = list(writers)
        self._first_iteration: int | None = None

    def __enter__(self) -> TrainingHook:
        self.start()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close(clean=_clean_exit(exc_type, exc))

    def start(self) -> None:
        self.prof.start()

    def close(self, clean: bool = True) -> None:
        """Flush a partly recorded window (``clean``) and wait for pending publications."""
        self.prof.stop(clean=clean)

    def step(self, iteration: int) -> None:
        """Call once after each training iteration with the global iteration that just finished."""
        prof = self.prof
        if not prof.enabled:
            return
        if self._first_iteration is None:
            self._first_iteration = iteration
        from torchprof_args.runtime.schedule import Action

        flushes = prof.schedule.action(iteration, self._first_iteration) is Action.RECORD_AND_SAVE
        if not flushes or self.timers is None:
            prof.step(iteration)
            return
        timer = self.timers(FLUSH_TIMER, log_level=0)
        timer.start()
        prof.step(iteration)
        timer.stop()
        self._write_flush_time(iteration)

    def _write_flush_time(self, iteration: int) -> None:
        """Every rank reaches this at the same iterations (the schedule is shared), as required."""
        try:
            writers = self.writers or [None]
            for index, writer in enumerate(writers):
                self.timers.write([FLUSH_TIMER], writer, iteration, normalizer=1.0,
                                  reset=index == len(writers) - 1)
        except Exception as err:  # metrics must never stop training
            logger.warning("could not write the %s timer at iteration %d: %s: %s", FLUSH_TIMER, iteration,
                           type(err).__name__, err)


# ---------------------------------------------------------------------------------------------
# install(): patch Megatron-LM's training module at call time

_TRAINING_MODULE = "megatron.training.training"
_PATCHED = "_torchprof_args_original"
_lock = threading.Lock()
_active: dict[str, Any] = {}


def _load_training_module() -> Any:
    try:
        training = importlib.import_module(_TRAINING_MODULE)
    except ImportError as err:
        raise MegatronIntegrationError(
            f"torchprof_args.megatron.install() needs Megatron-LM's {_TRAINING_MODULE} "
            f"(import failed: {err}). Put your Megatron-LM checkout on PYTHONPATH, or use "
            "torchprof_args.megatron.TrainingHook in your own loop."
        ) from err
    missing = [name for name in ("train", "training_log", "get_args", "get_timers")
               if not callable(getattr(training, name, None))]
    if not missing and "iteration" not in inspect.signature(
            getattr(training.training_log, _PATCHED, training.training_log)).parameters:
        missing = ["training_log(..., iteration, ...)"]
    if missing:
        raise MegatronIntegrationError(
            f"this Megatron-LM's {_TRAINING_MODULE} has no {', '.join(missing)}: its layout is unknown "
            "to torchprof_args.megatron.install(). Add the few lines of torchprof_args.megatron."
            "TrainingHook to your training loop instead (see the README)."
        )
    return training


def _optional(training: Any, name: str) -> Any:
    getter = getattr(training, name, None)
    return getter() if callable(getter) else None


def install() -> None:
    """Profile Megatron-LM's own training loop; call before ``pretrain(...)``.

    Idempotent; :func:`uninstall` restores the original functions.  Raises
    :class:`MegatronIntegrationError` when Megatron-LM is not importable or its layout is unknown.
    """
    training = _load_training_module()
    with _lock:
        if hasattr(training.train, _PATCHED):
            return
        original_train = training.train
        original_log = training.training_log
        log_signature = inspect.signature(original_log)

        @functools.wraps(original_train)
        def train(*args: Any, **kwargs: Any) -> Any:
            megatron_args = training.get_args()
            hook = TrainingHook(
                megatron_args,
                timers=training.get_timers(),
                writers=[_optional(training, "get_tensorboard_writer"), _optional(training, "get_wandb_writer")],
            )
            hook.start()
            _active["hook"] = hook
            clean = False
            try:
                result = original_train(*args, **kwargs)
                clean = True
                return result
            except SystemExit as exc:
                clean = exc.code in (None, 0)
                raise
            finally:
                _active.pop("hook", None)
                hook.close(clean=clean)

        @functools.wraps(original_log)
        def training_log(*args: Any, **kwargs: Any) -> Any:
            result = original_log(*args, **kwargs)
            hook = _active.get("hook")
            if hook is not None:
                iteration = log_signature.bind_partial(*args, **kwargs).arguments.get("iteration")
                if iteration is not None:
                    hook.step(int(iteration))
            return result

        setattr(train, _PATCHED, original_train)
        setattr(training_log, _PATCHED, original_log)
        training.train = train
        training.training_log = training_log
    logger.debug("installed the torchprof hook into %s", _TRAINING_MODULE)


def uninstall() -> None:
    """Undo :func:`install` (a no-op when it is not installed)."""
    try:
        training = importlib.import_module(_TRAINING_MODULE)
    except ImportError:
        return
    with _lock:
        for name in ("train", "training_log"):
            original = getattr(getattr(training, name, None), _PATCHED, None)
            if original is not None:
                setattr(training, name, original)


def installed() -> bool:
    """Whether :func:`install` is in effect."""
    try:
        training = importlib.import_module(_TRAINING_MODULE)
    except ImportError:
        return False
    return hasattr(getattr(training, "train", None), _PATCHED)
