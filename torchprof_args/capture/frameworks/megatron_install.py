"""``install()``: profile Megatron-LM's own training loop by patching ``megatron.training.training``
at call time (``train``, ``training_log``, ``checkpoint_and_decide_exit``); ``uninstall()`` undoes it.
Megatron-LM's source is never edited."""

from __future__ import annotations

import functools
import importlib
import inspect
import threading
from collections.abc import Callable
from typing import Any

from torchprof_args.capture.frameworks.megatron_loop import TrainingHook
from torchprof_args.capture.frameworks.megatron_metrics import MegatronIntervalMetrics
from torchprof_args.errors import MegatronIntegrationError
from torchprof_args.log import get_logger

__all__ = ["install", "installed", "pretrain_takes_config_container", "uninstall"]

logger = get_logger(__name__)


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
            "TrainingHook to your training loop instead (see docs/frameworks/megatron.md)."
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
        metrics = _active["metrics"] = MegatronIntervalMetrics(training, hook.args, hook.timers, hook.writers)
        metrics.attach()
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
            _active.pop("metrics", None)
            metrics.detach()
            hook.close(clean=clean)

    return train


def _wrap_training_log(training: Any) -> Callable[..., Any]:
    original = training.training_log
    signature = inspect.signature(original)

    @functools.wraps(original)
    def training_log(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        hook, metrics = _active.get("hook"), _active.get("metrics")
        if hook is not None:
            arguments = signature.bind_partial(*args, **kwargs).arguments
            iteration = arguments.get("iteration")
            if iteration is not None:
                if metrics is not None:  # first: a flush's timer write must not replace the interval's read
                    metrics.after_training_log(int(iteration), arguments)
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
    """Whether :func:`install` is in effect.

    Returns:
        True when Megatron-LM's ``train`` is the wrapped one.
    """
    try:
        training = importlib.import_module(_TRAINING_MODULE)
    except ImportError:
        return False
    return hasattr(getattr(training, "train", None), _PATCHED)


def pretrain_takes_config_container(pretrain: Callable[..., Any] | None = None) -> bool:
    """Whether Megatron-LM's ``pretrain`` takes a config container (core_v0.18.0 and later): then the
    flags go to ``parse_and_validate_args(extra_args_provider=...)`` before building the config; up to
    core_v0.17.x, to ``pretrain(..., extra_args_provider=...)``.

    Args:
        pretrain: the function to look at (default ``megatron.training.pretrain``).

    Returns:
        True when it has no ``extra_args_provider`` parameter.
    """
    if pretrain is None:
        pretrain = _load_training_module().pretrain
    return "extra_args_provider" not in inspect.signature(pretrain).parameters
