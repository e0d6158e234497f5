"""The DeepSpeed integration behind :mod:`torchprof_args.deepspeed` (its docstring says how to use it):
the hook that wraps one engine's optimizer step, its timers and flops-profiler report."""

from __future__ import annotations

import argparse
import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchprof_args.atomic import partial_path
from torchprof_args.capture.config import configs_from_args
from torchprof_args.log import get_logger

if TYPE_CHECKING:
    from torchprof_args.capture.metrics.sinks import ScalarWriter
    from torchprof_args.capture.metrics.writer import MetricsWriter

logger = get_logger(__name__)

__all__ = ["DeepSpeedProfilerHook", "FLOPS_REPORT_NAME", "attach", "is_pipeline_engine"]

#: The flops profiler's report in the profile directory (seed name).
FLOPS_REPORT_NAME = "profiler_ds.txt"
#: The per-rank figure carrying the model FLOPs of one optimizer step to the metrics writer.
MODEL_FLOPS_FIGURE = "throughput/model-flops-per-iteration"


class DeepSpeedProfilerHook:
    """The profiler attached to one engine; a context manager (see :func:`attach`).

    Args:
        engine: the ``deepspeed.initialize`` engine (DeepSpeed ships no types).
        args: the namespace with the ``--torch-profile-*`` flags (checked here).
        metrics: where DeepSpeed's wall-clock timers and the profiler's figures go.
        start_iteration: optimizer steps already done (default ``engine.global_steps``).
        log_interval: optimizer steps between metric writes (default: the flags').
    """

    def __init__(
        self,
        engine: Any,  # a DeepSpeed engine (DeepSpeed ships no types)
        args: argparse.Namespace,
        *,
        metrics: MetricsWriter | ScalarWriter | None = None,
        start_iteration: int | None = None,
        log_interval: int | None = None,
    ) -> None:
        self.engine = engine
        self.metrics = metrics
        self.start_iteration = int(engine.global_steps) if start_iteration is None else start_iteration
        from torchprof_args.capture.runtime.profiler import TorchProfiler

        run = configs_from_args(args)
        self.prof = TorchProfiler.from_config(run, start_iteration=self.start_iteration)
        self.log_interval = log_interval or run.metrics.log_interval
        self.profile_dir = Path(self.prof.output_dir)
        self.flops_report: Path | None = None
        self._flops_partial: Path | None = None
        self._wrapped: str | None = None
        #: model FLOPs of one optimizer step (all ranks), from DeepSpeed's flops profiler (rank 0)
        self.model_flops: float | None = None
        self._configure_flops_profiler()

    # -- lifecycle --------------------------------------------------------------------------

    def __enter__(self) -> DeepSpeedProfilerHook:
        """Start (:meth:`start`, a collective) and return the hook."""
        self.start()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """Close: cleanly when no exception left the context, else without a barrier."""
        self.close(clean=exc_type is None)

    def start(self) -> None:
        """Start the profiler and wrap ``engine.step`` (``train_batch`` on pipeline engines); idempotent."""
        if self._wrapped is not None:
            return
        engine = self.engine
        if is_pipeline_engine(engine):
            from torchprof_args.capture.runtime.metadata import pipeline_metadata

            self.prof.add_trace_metadata(pipeline=pipeline_metadata(
                engine.num_stages, engine.micro_batches, getattr(engine, "stage_id", None)))
        self.prof.start()
        if is_pipeline_engine(engine):
            self._wrap("train_batch", lambda: True)
        else:
            self._wrap("step", engine.is_gradient_accumulation_boundary)

    def _wrap(self, name: str, takes_optimizer_step: Any) -> None:
        """Replace ``engine.<name>`` on this object with a call that steps the profiler after it."""
        engine = self.engine
        original = getattr(engine, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            boundary, before = takes_optimizer_step(), int(engine.global_steps)
            result = original(*args, **kwargs)
            if boundary and int(engine.global_steps) > before:
                self.after_optimizer_step(int(engine.global_steps))
            return result

        call.__doc__ = original.__doc__
        setattr(engine, name, call)
        self._wrapped = name

    def close(self, clean: bool = True) -> None:
        """Restore ``engine.step`` (``train_batch``), finish the profiler, publish the flops report.

        Args:
            clean: ranks are in step (a normal end): flush a window still recording and meet at the
                fence; False after an exception.
        """
        if self._wrapped is None:
            return
        with contextlib.suppress(AttributeError):
            delattr(self.engine, self._wrapped)  # the instance attribute; the class method shows through
        self._wrapped = None
        self._publish_flops_report()
        if self.metrics is not None and hasattr(self.metrics, "flush"):
            with contextlib.suppress(Exception):
                self.metrics.flush()
        self.prof.stop(clean=clean)

    # -- per optimizer step -----------------------------------------------------------------

    def after_optimizer_step(self, global_step: int) -> None:
        """Step the profiler after an optimizer step (and write the metrics every ``log_interval``); public
        for loops that bypass ``engine.step``.

        Args:
            global_step: the engine's ``global_steps`` after the step.
        """
        self.prof.step(global_step)
        if self._flops_partial is not None:
            self._publish_flops_report()
        if self.metrics is not None and global_step % self.log_interval == 0:
            self._write_metrics(global_step)

    def wall_clock_timers(self) -> dict[str, float]:
        """DeepSpeed's timers of the last optimizer step.

        Returns:
            Milliseconds by timer name (empty without ``wall_clock_breakdown``).
        """
        if not self.engine.wall_clock_breakdown():
            return {}
        cache = self.engine.get_wall_clock_timers() or {}
        global_names = set(getattr(getattr(self.engine, "engine_timers", None), "global_timers", ()) or cache)
        return {f"deepspeed/{name}-ms": float(value) for name, value in cache.items() if name in global_names}

    def _write_metrics(self, global_step: int) -> None:
        metrics = self.metrics
        if metrics is None:
            return
        figures = {**self.wall_clock_timers(), **{f"profiler/{k}": v for k, v in self.prof.stats.items()}}
        if self.model_flops:  # rank 0 measured it; the gather's max gives every rank the figure
            figures[MODEL_FLOPS_FIGURE] = self.model_flops
        try:
            if hasattr(metrics, "log_step"):  # torchprof_args.MetricsWriter: max across ranks
                metrics.log_step(global_step, extra=figures)
            else:
                for tag, value in figures.items():
                    metrics.add_scalar(tag, value, global_step)
        except Exception as err:  # metrics must never stop training
            logger.warning("could not write DeepSpeed metrics at step %d: %s: %s", global_step,
                           type(err).__name__, err)

    # -- flops profiler ---------------------------------------------------------------------

    def _configure_flops_profiler(self) -> None:
        engine = self.engine
        if not engine.flops_profiler_enabled():
            return
        config = engine._config.flops_profiler_config  # noqa: SLF001  (DeepSpeed keeps it there)
        if config.output_file:
            logger.info("DeepSpeed flops profiler writes to its own output_file %s", config.output_file)
            return
        if engine.global_rank != 0:
            return  # DeepSpeed profiles and writes the report on global rank 0 only
        if engine.global_steps > engine.flops_profiler_profile_step():  # resumed past it
            logger.info("DeepSpeed flops profiler: its profile_step %d is before this run's first step "
                        "(resumed at global step %d): no report and no model FLOPs from it in this run "
                        "(--metrics-flops-per-iteration gives TFLOP/s)",
                        engine.flops_profiler_profile_step(), engine.global_steps)
            return
        self._capture_model_flops()
        self.profile_dir.mkdir(parents=True, exist_ok=True)
        self.flops_report = self.profile_dir / FLOPS_REPORT_NAME
        self._flops_partial = partial_path(self.flops_report)
        config.output_file = str(self._flops_partial)
        logger.info("DeepSpeed flops profiler report (step %d) goes to %s",
                    engine.flops_profiler_profile_step(), self.flops_report)

    def _capture_model_flops(self) -> None:
        """Read the profiled forward FLOPs before DeepSpeed's ``end_profile`` drops them."""
        profiler = getattr(self.engine, "flops_profiler", None)
        original = getattr(profiler, "end_profile", None)
        if profiler is None or original is None:
            return

        def end_profile(*args: Any, **kwargs: Any) -> Any:
            try:
                forward = float(profiler.get_total_flops())
                engine = self.engine
                self.model_flops = (3.0 * forward * engine.gradient_accumulation_steps()
                                    * engine.world_size) or None
            except Exception as err:  # noqa: BLE001 - metrics never stop training
                logger.warning("could not read the flops profiler's FLOPs: %s: %s", type(err).__name__, err)
            return original(*args, **kwargs)

        profiler.end_profile = end_profile

    def _publish_flops_report(self) -> None:
        """Move the finished report into place (DeepSpeed writes it in the step, on rank 0)."""
        partial, report = self._flops_partial, self.flops_report
        if partial is None or report is None or not partial.exists():
            return
        if self.engine.global_steps <= self.engine.flops_profiler_profile_step():
            return
        try:
            os.replace(partial, report)
            self._flops_partial = None
            logger.info("DeepSpeed flops profile written to %s", self.flops_report)
        except OSError as err:
            logger.warning("could not publish %s: %s", self.flops_report, err)


def is_pipeline_engine(engine: Any) -> bool:
    """Whether an engine is DeepSpeed's pipeline-parallel ``PipelineEngine`` (optimizer steps in
    ``train_batch``, not ``step``).

    Args:
        engine: a DeepSpeed engine.

    Returns:
        True for a ``PipelineEngine`` (False when DeepSpeed is not installed).
    """
    try:
        from deepspeed.runtime.pipe.engine import PipelineEngine
    except ImportError:
        return False
    return isinstance(engine, PipelineEngine)


def attach(
    engine: Any,  # a DeepSpeed engine (DeepSpeed ships no types)
    args: argparse.Namespace,
    *,
    metrics: MetricsWriter | ScalarWriter | None = None,
    start_iteration: int | None = None,
    log_interval: int | None = None,
) -> DeepSpeedProfilerHook:
    """Profile a DeepSpeed engine by the ``--torch-profile-*`` flags; use as a context manager.

    Call on every rank after ``deepspeed.initialize`` (and after ``engine.load_checkpoint``:
    numbering continues from ``engine.global_steps``); a ``PipelineEngine`` (every stage) too.

    Args:
        engine: the engine.
        args: the namespace with the flags (checked here).
        metrics: a :class:`torchprof_args.MetricsWriter` (or anything with ``add_scalar(tag, value,
            step)``) that receives DeepSpeed's wall-clock timers and the profiler's figures.
        start_iteration: optimizer steps already done (default ``engine.global_steps``).
        log_interval: optimizer steps between metric writes (default: the flags').

    Returns:
        The :class:`DeepSpeedProfilerHook`, not started (``with`` starts it).
    """
    return DeepSpeedProfilerHook(engine, args, metrics=metrics, start_iteration=start_iteration,
                                 log_interval=log_interval)
