"""The loop hook: the profiler plus flush timing for a Megatron-style training loop.

Every flush of a trace window, scheduled or at exit, is timed with Megatron's own timers
(``torch-profile-flush``; Megatron's ``Timers.write`` names the scalar ``torch-profile-flush-time``)
and written, max across ranks, through Megatron's TensorBoard and wandb writers.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from typing import Any

from torchprof_args.capture.frameworks.hosted_profiling import FLUSH_TIMER
from torchprof_args.capture.frameworks.megatron_args import profiler_from_args
from torchprof_args.log import get_logger

__all__ = ["FLUSH_TIMER", "TrainingHook", "clean_exit", "pipeline_from_args"]

logger = get_logger(__name__)



def clean_exit(exc_type: type[BaseException] | None, exc: BaseException | None) -> bool:
    """A normal return, or ``sys.exit(0)`` (Megatron's exit-interval / duration exits)."""
    if exc_type is None:
        return True
    return isinstance(exc, SystemExit) and exc.code in (None, 0)


class TrainingHook:
    """Profiler plus flush timing for a Megatron-style loop (the manual patch for custom forks).

    Every rank must create it and call :meth:`step`: the flush timer is reduced across ranks.

    Args:
        args: Megatron's parsed namespace (checked here, with Megatron's own profiling flags).
        timers: Megatron's timers object (``get_timers()``; a ``torchprof_args.Timers`` works too).
        writers: Megatron's TensorBoard writer and wandb writer (None entries, as on ranks that do not
            write, are fine).
        start_iteration: optimizer steps already done (default ``args.iteration``).
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
        pipeline = pipeline_from_args(args)
        if pipeline is not None:
            self.prof.add_trace_metadata(pipeline=pipeline)
        self.timers = timers
        self.writers = list(writers)
        self._first_iteration: int | None = None
        self._ended = False  # after flush_at_exit(): step() does nothing

    def __enter__(self) -> TrainingHook:
        """Start the profiler (a collective) and return the hook."""
        self.start()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """Close: cleanly on a normal return or ``sys.exit(0)`` (Megatron's exit interval or
        duration), else without a barrier.
        """
        self.close(clean=clean_exit(exc_type, exc))

    def start(self) -> None:
        """Start the profiler (a collective: every rank, after ``init_process_group``)."""
        self.prof.start()

    def close(self, clean: bool = True) -> None:
        """Flush a partly recorded window, then wait for pending publications.

        Args:
            clean: ranks are in step (a normal end): flush the window still recording (timed, as
                :meth:`flush_at_exit`); False after an exception: no barrier, the window is dropped.
        """
        if clean:
            self.flush_at_exit()
        self.prof.stop(clean=clean)

    def step(self, iteration: int) -> None:
        """Call once after each training iteration; a flush iteration is timed with the Megatron timers and
        written through the writers.

        Args:
            iteration: the global iteration that just finished.
        """
        prof = self.prof
        if not prof.enabled or self._ended:
            return
        if self._first_iteration is None:
            self._first_iteration = iteration
        from torchprof_args.capture.runtime.schedule import Action

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


def pipeline_from_args(args: argparse.Namespace) -> dict[str, int] | None:
    """The pipeline schedule of a Megatron-LM run (``--pipeline-model-parallel-size``; micro-batches
    per step: global batch / (micro batch x data-parallel size)), None without pipeline parallelism
    or when Megatron has not filled in the sizes."""
    from torchprof_args.capture.runtime.metadata import pipeline_metadata

    stages = getattr(args, "pipeline_model_parallel_size", None)
    gbs, mbs = getattr(args, "global_batch_size", None), getattr(args, "micro_batch_size", None)
    dp = getattr(args, "data_parallel_size", None)
    if not (isinstance(stages, int) and isinstance(gbs, int) and isinstance(mbs, int)
            and isinstance(dp, int)):
        return None
    if stages < 2 or min(gbs, mbs, dp) <= 0:
        return None
    return pipeline_metadata(stages, max(gbs // (mbs * dp), 1))
