"""Megatron-LM and megatron-core integration: flags and a one-call loop hook.

Three ways in, from least to most code:

* ``extra_args_provider=torchprof_args.megatron.extra_args_provider`` (or
  :func:`compose_args_providers` with your own providers) adds every torchprof flag to Megatron's
  parser; options Megatron already defines (``--tensorboard-dir``, ``--log-interval``,
  ``--timing-log-level``, ``--wandb-project`` ...) are reused, not redefined.  Up to core_v0.17.x
  it goes to ``pretrain(..., extra_args_provider=...)``; from core_v0.18.0, where ``pretrain``
  takes a config container, to ``parse_and_validate_args(extra_args_provider=...)`` (see
  :func:`pretrain_takes_config_container`).  The flags are checked as soon as Megatron has parsed
  them (before it validates its own arguments or builds anything): a conflict such as
  ``--profile --use-pytorch-profiler`` with ``--torch-profile`` exits 2 with a one-line error.
* :func:`install` before ``pretrain(...)`` in ``pretrain_gpt.py`` patches Megatron-LM's
  ``megatron.training.training`` module at call time: ``train`` is wrapped to own the profiler
  for the whole loop, ``training_log`` (called once per iteration, with the global iteration
  that just finished) steps it, and ``checkpoint_and_decide_exit`` flushes a window still
  recording when Megatron decides to exit (``--exit-interval``, ``--exit-duration-in-mins``, its
  signal handler).  Megatron-LM's source is not edited; :func:`uninstall` undoes it.
* :class:`TrainingHook` is the same thing for forks whose loop differs: create it after the
  checkpoint is loaded, call ``hook.step(iteration)`` after each iteration, close it at the end.

Every flush of a trace window, scheduled or at exit, is timed with Megatron's own timers
(``torch-profile-flush``; Megatron's ``Timers.write`` names the scalar
``torch-profile-flush-time``) and written, max across ranks, through Megatron's TensorBoard and
wandb writers.  ``--torch-profile-parallel-ranks`` selects traced ranks by megatron-core's
parallel coordinates (:mod:`torchprof_args.runtime.ranks`).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import threading
from collections.abc import Callable, Iterable
from typing import Any

from torchprof_args.config import add_torch_profile_args, validate_args
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
    "installed",
    "pretrain_takes_config_container",
    "profiler_from_args",
    "uninstall",
]

ArgsProvider = Callable[[argparse.ArgumentParser], "argparse.ArgumentParser | None"]

#: Megatron timer name of the trace flush (Megatron's ``Timers.write`` writes ``torch-profile-flush-time``).
FLUSH_TIMER = "torch-profile-flush"

_CHECKED_PARSER = "_torchprof_args_checks"


# ---------------------------------------------------------------------------------------------
# Flags


def extra_args_provider(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Megatron-LM ``extra_args_provider``: adds the torchprof flag groups (profiler, timers, ...).

    The flags are also checked right after ``parser`` parses them (:func:`check_parsed_args`),
    i.e. when Megatron parses its arguments, before it validates them or builds the model: a bad
    combination exits 2 with a one-line ``error:`` (argparse style) on every rank.
    """
    parser = add_torch_profile_args(parser)
    _check_when_parsed(parser)
    return parser


def check_parsed_args(args: argparse.Namespace) -> None:
    """Every torchprof check plus the ones against Megatron's own profiling flags.

    Raises :class:`TorchProfileArgsError`.  Rank flags are checked against ``$WORLD_SIZE``.
    """
    check_megatron_args(args)
    if getattr(args, "torch_profile", None) is not None:
        validate_args(args)


def _check_when_parsed(parser: argparse.ArgumentParser) -> None:
    """Wrap this parser object's ``parse_known_args`` (``parse_args`` goes through it too)."""
    if getattr(parser, _CHECKED_PARSER, False):
        return
    original = parser.parse_known_args

    def parse_known_args(args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = original(args, namespace)
        try:
            check_parsed_args(parsed)
        except TorchProfileArgsError as err:  # argparse's status and prefix, without Megatron's long usage
            parser.exit(2, f"{parser.prog}: error: {err}\n")
        return parsed, extras

    parser.parse_known_args = parse_known_args  # type: ignore[method-assign]
    setattr(parser, _CHECKED_PARSER, True)


def pretrain_takes_config_container(pretrain: Callable[..., Any] | None = None) -> bool:
    """Whether Megatron-LM's ``pretrain`` takes a config container (core_v0.18.0 and later).

    Then the flags go to ``parse_and_validate_args(extra_args_provider=...)`` before building the
    config; up to core_v0.17.x, to ``pretrain(..., extra_args_provider=...)``.  ``pretrain``
    defaults to ``megatron.training.pretrain``.
    """
    if pretrain is None:
        pretrain = _load_training_module().pretrain
    return "extra_args_provider" not in inspect.signature(pretrain).parameters


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
    """Refuse combinations with Megatron's own profiling (raises :class:`TorchProfileArgsError`).

    :func:`extra_args_provider` runs it when Megatron parses its arguments; :class:`TrainingHook`
    again when it is built (for loops that parse their arguments otherwise).
    """
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
        self._ended = False  # after flush_at_exit(): step() does nothing

    def __enter__(self) -> TrainingHook:
        self.start()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close(clean=_clean_exit(exc_type, exc))

    def start(self) -> None:
        self.prof.start()

    def close(self, clean: bool = True) -> None:
        """Flush a partly recorded window (``clean``: :meth:`flush_at_exit`), wait for pending publications."""
        if clean:
            self.flush_at_exit()
        self.prof.stop(clean=clean)

    def step(self, iteration: int) -> None:
        """Call once after each training iteration with the global iteration that just finished."""
        prof = self.prof
        if not prof.enabled or self._ended:
            return
        if self._first_iteration is None:
            self._first_iteration = iteration
        from torchprof_args.runtime.schedule import Action

        flushes = prof.schedule.action(iteration, self._first_iteration) is Action.RECORD_AND_SAVE
        if not flushes or self.timers is None:
            prof.step(iteration)
            return
        self._timed(prof.step, iteration)
        self._write_flush_time(iteration)

    def flush_at_exit(self) -> None:
        """End profiling at a clean early exit: a window still recording is flushed, timed and
        written like a scheduled flush.

        Every rank calls it at the same iteration (Megatron decides ``--exit-interval``,
        ``--exit-duration-in-mins`` and signal-handler exits together); :meth:`close` calls it too.
        """
        prof = self.prof
        self._ended = True
        if not prof.window_open or self.timers is None:
            prof.end_window()
            return
        iteration = prof.iteration
        if self._timed(prof.end_window):
            self._write_flush_time(iteration, flush_writers=True)

    def _timed(self, flush: Callable[..., Any], *args: Any) -> Any:
        timer = self.timers(FLUSH_TIMER, log_level=0)
        timer.start()
        try:
            return flush(*args)
        finally:
            timer.stop()

    def _write_flush_time(self, iteration: int, flush_writers: bool = False) -> None:
        """Every rank reaches this at the same iterations (the schedule is shared), as required."""
        writers = self.writers or [None]
        try:
            for index, writer in enumerate(writers):
                self.timers.write([FLUSH_TIMER], writer, iteration, normalizer=1.0,
                                  reset=index == len(writers) - 1)
            for writer in writers if flush_writers else ():
                if hasattr(writer, "flush"):
                    writer.flush()  # at exit Megatron has already flushed its writers
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


#: Patched when present; without it an early exit's flush happens when ``train`` returns or exits.
_EXIT_DECISION = "checkpoint_and_decide_exit"
_PATCHABLE = ("train", "training_log", _EXIT_DECISION)


def _hook_for(training: Any) -> TrainingHook:
    """The hook for one ``train()`` call, from Megatron's global args, timers and writers."""
    megatron_args = training.get_args()
    if not hasattr(megatron_args, "torch_profile"):
        raise MegatronIntegrationError(
            "Megatron's arguments have no --torch-profile flags: pass extra_args_provider="
            "torchprof_args.megatron.extra_args_provider to pretrain() (Megatron-LM up to core_v0.17) "
            "or to parse_and_validate_args() (core_v0.18.0 and later)."
        )
    return TrainingHook(
        megatron_args,
        timers=training.get_timers(),
        writers=[_optional(training, "get_tensorboard_writer"), _optional(training, "get_wandb_writer")],
    )


def _wrap_train(training: Any) -> Callable[..., Any]:
    original = training.train

    @functools.wraps(original)
    def train(*args: Any, **kwargs: Any) -> Any:
        hook = _hook_for(training)
        hook.start()
        _active["hook"] = hook
        clean = False
        try:
            result = original(*args, **kwargs)
            clean = True
            return result
        except SystemExit as exc:
            clean = exc.code in (None, 0)
            raise
        finally:
            _active.pop("hook", None)
            hook.close(clean=clean)

    return train


def _wrap_training_log(training: Any) -> Callable[..., Any]:
    original = training.training_log
    signature = inspect.signature(original)

    @functools.wraps(original)
    def training_log(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        hook = _active.get("hook")
        if hook is not None:
            iteration = signature.bind_partial(*args, **kwargs).arguments.get("iteration")
            if iteration is not None:
                hook.step(int(iteration))
        return result

    return training_log


def _wrap_exit_decision(training: Any) -> Callable[..., Any]:
    original = getattr(training, _EXIT_DECISION)

    @functools.wraps(original)
    def checkpoint_and_decide_exit(*args: Any, **kwargs: Any) -> Any:
        should_exit = original(*args, **kwargs)
        hook = _active.get("hook")
        if should_exit and hook is not None:  # every rank: Megatron reduces the decision
            hook.flush_at_exit()  # before train() finishes Megatron's wandb writer and exits
        return should_exit

    return checkpoint_and_decide_exit


_WRAPPERS = {"train": _wrap_train, "training_log": _wrap_training_log, _EXIT_DECISION: _wrap_exit_decision}


def install() -> None:
    """Profile Megatron-LM's own training loop; call before ``pretrain(...)``.

    Idempotent; :func:`uninstall` restores the original functions.  Raises
    :class:`MegatronIntegrationError` when Megatron-LM is not importable or its layout is unknown.
    Works with both call shapes of ``pretrain`` (see :func:`pretrain_takes_config_container`).
    """
    training = _load_training_module()
    with _lock:
        if hasattr(training.train, _PATCHED):
            return
        for name in _PATCHABLE:
            if callable(getattr(training, name, None)):
                wrapper = _WRAPPERS[name](training)
                setattr(wrapper, _PATCHED, getattr(training, name))
                setattr(training, name, wrapper)
    logger.debug("installed the torchprof hook into %s", _TRAINING_MODULE)


def uninstall() -> None:
    """Undo :func:`install` (a no-op when it is not installed)."""
    try:
        training = importlib.import_module(_TRAINING_MODULE)
    except ImportError:
        return
    with _lock:
        for name in _PATCHABLE:
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
