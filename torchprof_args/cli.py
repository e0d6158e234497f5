"""``torchprof_args.cli``: profiling for a ``main(args, profiling)`` entry point, from the command line.

    from torchprof_args import cli

    @cli(build_parser)                 # or bare @cli: an empty ArgumentParser
    def main(args, profiling):
        for iteration in range(1, args.steps + 1):
            with profiling.train_step():            # record_function("accelerator.train_step")
                loss = model(batch).sum(); loss.backward(); optimizer.step()
            profiling.step(iteration)

    if __name__ == "__main__":
        sys.exit(main())

The decorator adds ``--profiling`` (enable), ``--ptensorboard`` (TensorBoard output too),
``--prof_dir DIR`` (default ``./prof``) and the full ``--torch-profile-*`` group; bad flags exit 2
with a one-line error.  The profiler is created on first use (after your ``init_process_group``).
At the end it writes ``profiler_list.dat`` in the profile directory: the operator table of each of
this run's traces (top operators by device time, CPU time when there is none, and memory).  With DeepSpeed,
``profiling.attach_deepspeed(engine)`` steps on optimizer steps and writes ``profiler_ds.txt``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchprof_args import _dist
from torchprof_args.atomic import write_text_atomically
from torchprof_args.capture.config import RunConfig, add_torch_profile_args, configs_from_args
from torchprof_args.capture.flags import Flag, FlagGroup, add_flag_groups, flag_value, register_group
from torchprof_args.errors import TorchProfileArgsError
from torchprof_args.log import get_logger
from torchprof_args.naming import DEFAULT_PROFILE_DIR, PROFILER_LIST_NAME, profiler_list_name

if TYPE_CHECKING:  # loaded on first use: the decorator imports no torch
    from torch.utils.tensorboard import SummaryWriter

    from torchprof_args.capture.frameworks.deepspeed_engine import DeepSpeedProfilerHook
    from torchprof_args.capture.metrics.sinks import ScalarWriter
    from torchprof_args.capture.metrics.writer import MetricsWriter
    from torchprof_args.capture.runtime.profiler import TorchProfiler

logger = get_logger(__name__)

__all__ = ["PROFILER_LIST_NAME", "Profiling", "cli"]

#: Default region name wrapped around each training step (seed name).
TRAIN_STEP_REGION = "accelerator.train_step"

PROFILING = Flag("--profiling", "Enable profiling (same as --torch-profile).", default=False,
                 action="store_true")
PTENSORBOARD = Flag("--ptensorboard", "Also write TensorBoard output: step-time scalars and the traces in a "
                    "run directory TensorBoard's profiler plugin reads.", default=False, action="store_true")
PROF_DIR = Flag("--prof_dir", "Profile directory (same as --torch-profile-dir).", metavar="DIR",
                default_doc="`./prof`")

#: The decorator's own short flags (seed style); only the decorator adds them, next to the full set.
DECORATOR_FLAGS = register_group(FlagGroup(
    title="profiling decorator",
    description="Short flags added by the `torchprof_args.cli` decorator (torchprof-args).",
    flags=(PROFILING, PTENSORBOARD, PROF_DIR),
    order=0,
    standard=False,
))


def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The decorator's short flags plus the full flag set."""
    return add_torch_profile_args(add_flag_groups(parser, [DECORATOR_FLAGS]))


def apply_cli_aliases(args: argparse.Namespace) -> argparse.Namespace:
    """Map ``--profiling`` / ``--prof_dir`` onto ``--torch-profile`` / ``--torch-profile-dir``."""
    if flag_value(args, PROFILING):
        args.torch_profile = True
    prof_dir = flag_value(args, PROF_DIR)
    if prof_dir:
        if args.torch_profile_dir and os.path.abspath(args.torch_profile_dir) != os.path.abspath(prof_dir):
            raise TorchProfileArgsError("--prof_dir and --torch-profile-dir name different directories; "
                                        "give one.")
        args.torch_profile_dir = prof_dir
    elif not args.torch_profile_dir:
        args.torch_profile_dir = DEFAULT_PROFILE_DIR
    args.prof_dir = args.torch_profile_dir
    return args


class Profiling:
    """What the decorated function receives: the profiler (created on first use) and helpers.

    Args:
        args: the parsed namespace (the decorator's flags and the full ``--torch-profile-*`` set).
        run: its checked configs (default:
            :func:`~torchprof_args.capture.config.configs_from_args` of ``args``).
    """

    def __init__(self, args: argparse.Namespace, run: RunConfig | None = None) -> None:
        self.args = args
        run = run or configs_from_args(args)
        self.enabled = run.profiler.trace.enabled
        self.prof_dir = Path(run.profiler.trace.output_dir)
        self.tensorboard = bool(flag_value(args, PTENSORBOARD))
        self.prof: TorchProfiler | None = None
        self.deepspeed: DeepSpeedProfilerHook | None = None
        self._last_step_time: float | None = None
        self._tensorboard: SummaryWriter | None = None
        self._iteration = 0

    # -- the profiler -----------------------------------------------------------------------

    def start(self, start_iteration: int | None = None) -> TorchProfiler:
        """Create and start the profiler now, on every rank (a collective: after ``init_process_group``).

        Args:
            start_iteration: optimizer steps already done (a resumed run); default: the flags' /
                Megatron's ``args.iteration``, else 0.

        Returns:
            The started :class:`~torchprof_args.capture.runtime.profiler.TorchProfiler` (the same one
            on later calls).
        """
        if self.prof is None:
            from torchprof_args.capture.runtime.profiler import TorchProfiler

            self.prof = TorchProfiler.from_args(self.args, start_iteration=start_iteration)
            self.prof.start()
        return self.prof

    def step(self, iteration: int | None = None) -> None:
        """Mark the end of an optimizer step (starting the profiler on the first call).

        Args:
            iteration: the 1-based global step just finished (default: the previous one + 1).  Ignored
                once a DeepSpeed engine is attached: its hook steps on the engine's optimizer steps.
        """
        if self.deepspeed is not None:
            return  # the DeepSpeed hook steps on the engine's optimizer steps
        iteration = self._iteration + 1 if iteration is None else iteration
        self._iteration = iteration
        prof = self.prof if self.prof is not None else self.start(iteration - 1)
        prof.step(iteration)
        self._log_step_time(iteration)

    @contextlib.contextmanager
    def region(self, name: str) -> Iterator[None]:
        """A named range in the trace (``torch.profiler.record_function``); free when profiling is off.

        Args:
            name: the range's name in the trace.

        Returns:
            A context manager around the range.
        """
        if not self.enabled:
            yield
            return
        import torch

        with torch.profiler.record_function(name):
            yield

    def train_step(self) -> contextlib.AbstractContextManager[None]:
        """The ``accelerator.train_step`` region around one training step; starts the profiler if needed.

        Returns:
            The context manager (:meth:`region`).
        """
        if self.enabled and self.prof is None and self.deepspeed is None:
            self.start()
        return self.region(TRAIN_STEP_REGION)

    def attach_deepspeed(self, engine: Any,  # a DeepSpeed engine (DeepSpeed ships no types)
                         metrics: MetricsWriter | ScalarWriter | None = None) -> DeepSpeedProfilerHook:
        """Step on a DeepSpeed engine's optimizer steps and write ``profiler_ds.txt`` (its flops profiler).

        Args:
            engine: the ``deepspeed.initialize`` engine (``PipelineEngine`` too).
            metrics: where its step times, TFLOP/s and MFU go (default: none).

        Returns:
            The started :class:`~torchprof_args.capture.frameworks.deepspeed_engine.DeepSpeedProfilerHook`.

        Raises:
            RuntimeError: the profiler already started (attach before the first ``step()``).
        """
        from torchprof_args.deepspeed import attach

        if self.prof is not None:
            raise RuntimeError("attach_deepspeed(engine) must come before the first step() or train_step().")
        self.deepspeed = attach(engine, self.args, metrics=metrics)
        self.deepspeed.start()
        self.prof = self.deepspeed.prof
        self._iteration = self.deepspeed.start_iteration
        return self.deepspeed

    # -- TensorBoard --------------------------------------------------------------------------

    def _log_step_time(self, iteration: int) -> None:
        if not self.tensorboard:
            return
        now = time.perf_counter()
        if self._last_step_time is not None:
            if self._tensorboard is None:
                from torch.utils.tensorboard import SummaryWriter

                log_dir = self.prof_dir / "tensorboard" / f"rank{_dist.rank():05d}"
                self._tensorboard = SummaryWriter(str(log_dir))
            self._tensorboard.add_scalar("step-time-seconds", now - self._last_step_time, iteration)
        self._last_step_time = now

    # -- the end ----------------------------------------------------------------------------

    def finish(self, clean: bool) -> None:
        """Stop the profiler, then write ``profiler_list.dat`` (each trace's operator table, from its sidecar)
        and the TensorBoard output.  A table that cannot be written is logged; the traces stay published.

        Args:
            clean: the function returned normally (False on an exception: no barrier, a partly
                recorded window is dropped).
        """
        if self.deepspeed is not None:
            self.deepspeed.close(clean=clean)
        elif self.prof is not None:
            self.prof.stop(clean=clean)
        if self._tensorboard is not None:
            self._tensorboard.close()
        prof = self.prof
        traces = list(prof.published_traces) if prof is not None else []
        if prof is None or not traces:
            return
        if self.tensorboard:
            self._link_traces_for_tensorboard(traces)
        try:
            write_operator_tables(traces, self.prof_dir / profiler_list_name(prof.rank))
        except Exception as err:  # the traces are published; a table failure is reported only
            logger.warning("could not write %s: %s: %s", PROFILER_LIST_NAME, type(err).__name__, err)

    def _link_traces_for_tensorboard(self, traces: list[str]) -> None:
        """TensorBoard's profiler plugin reads
        ``<logdir>/<run>/plugins/profile/<session>/*.pt.trace.json.gz``: one session per profiled
        cycle (its folder's name, ``iter000003-000004``), one worker per rank."""
        for trace in traces:
            session = self.prof_dir / "tensorboard" / "plugins" / "profile" / Path(trace).parent.name
            session.mkdir(parents=True, exist_ok=True)
            target = session / Path(trace).name
            with contextlib.suppress(FileExistsError):
                try:
                    os.link(trace, target)
                except OSError:
                    os.symlink(os.path.abspath(trace), target)


def write_operator_tables(traces: list[str], path: Path) -> Path:
    """The operator table of each trace (top operators by device time, else CPU time, and memory), one
    after the other in one file, written atomically.

    Args:
        traces: the published traces; each one's summary comes from the sidecar its publisher wrote
            when it matches the trace, else the trace is parsed.
        path: the file (``profiler_list.dat``).

    Returns:
        ``path``.

    Raises:
        TraceError: a trace cannot be read.
    """
    from torchprof_args.analysis.staged import summarise_trace

    parts = [f"# {Path(trace).parent.name}/{Path(trace).name}\n{summarise_trace(trace).operator_table()}"
             for trace in traces]
    write_text_atomically(path, "\n".join(parts))
    logger.info("operator tables written to %s", path)
    return path


def cli(
    parser_or_factory: Callable[..., Any] | argparse.ArgumentParser | None = None,
) -> Any:
    """Decorate an entry point ``main(args, profiling)`` with the profiling flags (module docstring).

    ``@cli`` (bare), ``@cli()``, ``@cli(parser)`` or ``@cli(build_parser)``.  Bad flags exit 2 with a
    one-line error, before ``main`` runs.

    Args:
        parser_or_factory: the application's parser, a function that builds it, or (bare ``@cli``) the
            decorated function itself; None: an empty parser.

    Returns:
        The decorator (or, bare, the decorated function): it takes ``argv`` (default
        ``sys.argv[1:]``) and returns ``main``'s return value; :class:`Profiling` is finished in any case.
    """

    def decorate(function: Callable[[argparse.Namespace, Profiling], Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def run(argv: list[str] | None = None) -> Any:
            if isinstance(parser_or_factory, argparse.ArgumentParser):
                parser = parser_or_factory
            elif callable(parser_or_factory):
                parser = parser_or_factory()
            else:
                parser = argparse.ArgumentParser(description=function.__doc__)
            add_cli_args(parser)
            args = parser.parse_args(argv)
            try:
                apply_cli_aliases(args)
                run = configs_from_args(args)  # before training starts; the profiler checks again when built
            except TorchProfileArgsError as err:
                print(f"{parser.prog}: error: {err}", file=sys.stderr)  # one line, argparse's status
                raise SystemExit(2) from None
            profiling = Profiling(args, run)
            clean = False
            try:
                result = function(args, profiling)
                clean = True
                return result
            finally:
                profiling.finish(clean=clean)

        return run

    if callable(parser_or_factory) and not isinstance(parser_or_factory, argparse.ArgumentParser) \
            and _takes_args_and_profiling(parser_or_factory):
        function, parser_or_factory = parser_or_factory, None
        return decorate(function)
    return decorate


def _takes_args_and_profiling(candidate: Callable[..., Any]) -> bool:
    """Bare ``@cli``: the decorated entry point takes two parameters; a parser factory none."""
    import inspect

    try:
        return len(inspect.signature(candidate).parameters) >= 2
    except (TypeError, ValueError):
        return False


class _CallableModule(types.ModuleType):
    """``torchprof_args.cli`` is this module and, called, the :func:`cli` decorator itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return cli(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
