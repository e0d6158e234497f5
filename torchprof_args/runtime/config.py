"""The runtime's configs (traces, export, memory snapshots, nsys) and the flags that fill them.

Import-light (no torch): :mod:`torchprof_args.config` imports this to register the flag groups
and to turn a parsed namespace into the frozen configs below; nothing under ``runtime/`` ever
reads the namespace.
"""

from __future__ import annotations

import argparse
import dataclasses

from torchprof_args.errors import TorchProfileArgsError
from torchprof_args.flags import Flag, FlagGroup, flag_value, register_group, was_given
from torchprof_args.flags.types import gzip_level, non_negative_int, positive_float, positive_int, rank_token
from torchprof_args.naming import FLIGHT_RECORDER_SUBDIR, MEMORY_SNAPSHOT_SUBDIR
from torchprof_args.ondemand.config import OnDemandConfig
from torchprof_args.runtime.schedule import ProfileSchedule

__all__ = [
    "ExportConfig",
    "FlightRecorderConfig",
    "MemorySnapshotConfig",
    "NsysConfig",
    "PARALLEL_AXES",
    "ProfilerConfig",
    "TraceConfig",
    "parallel_selector",
    "profile_dir",
]

# -- flags ------------------------------------------------------------------------------------


def non_negative_float(text: str) -> float:
    """A number >= 0 (seconds)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


TORCH_PROFILE = Flag("--torch-profile", "Enable torch.profiler tracing.", default=False, action="store_true")
RANKS = Flag("--torch-profile-ranks", "Global ranks to trace, or 'all'.", default=[0], type=rank_token, nargs="+",
             metavar="R")
WAIT = Flag("--torch-profile-wait", "Steps to wait at the start of each cycle (torch.profiler.schedule wait).",
            default=0, type=non_negative_int, metavar="N")
WARMUP = Flag("--torch-profile-warmup", "Warmup steps before recording in each cycle (not recorded).",
              default=1, type=non_negative_int, metavar="N")
ACTIVE = Flag("--torch-profile-active",
              "Recorded steps per cycle. About 2 GB of trace per step for an 8B model: keep it small.",
              default=1, type=positive_int, metavar="N")
REPEAT = Flag("--torch-profile-repeat", "Number of cycles (0 = until the run ends).", default=1,
              type=non_negative_int, metavar="N")
SKIP_FIRST = Flag("--torch-profile-skip-first", "Steps of this run skipped before the first cycle.", default=1,
                  type=non_negative_int, metavar="N")
STEP_START = Flag("--torch-profile-step-start",
                  "First global iteration to record (Megatron style, resume-safe); replaces "
                  "--torch-profile-wait/-skip-first/-repeat.", type=non_negative_int, metavar="N")
STEP_END = Flag("--torch-profile-step-end",
                "Global iteration at which recording stops (exclusive); default step-start + active.",
                type=positive_int, metavar="N")
RECORD_SHAPES = Flag("--torch-profile-record-shapes", "Record operator input shapes.", default=False,
                     action="store_true")
PROFILE_MEMORY = Flag("--torch-profile-profile-memory", "Record tensor memory allocations and frees.",
                      default=False, action="store_true")
WITH_STACK = Flag("--torch-profile-with-stack", "Record Python source locations of operators.", default=False,
                  action="store_true")
WITH_FLOPS = Flag("--torch-profile-with-flops", "Estimate FLOPs of matrix multiplications and convolutions.",
                  default=False, action="store_true")
WITH_MODULES = Flag("--torch-profile-with-modules", "Record the nn.Module hierarchy of operators.", default=False,
                    action="store_true")
EXECUTION_TRACE = Flag("--torch-profile-execution-trace",
                       "Also record PyTorch's execution trace (ExecutionTraceObserver, Chakra input) of the same "
                       "windows on the traced ranks, published beside each trace with the suffix .et.json.gz.",
                       default=False, action="store_true")
ACTIVITIES = Flag("--torch-profile-activities", "Activities to record: cpu, cuda. Default: cpu, plus cuda when "
                  "available.", type=str.lower, nargs="+", choices=("cpu", "cuda"), metavar="A",
                  default_doc="cpu [cuda]")
PROFILE_DIR = Flag("--torch-profile-dir", "Output directory for traces and summaries.", metavar="DIR",
                   default_doc="`--tensorboard-dir` if set, else `./prof`")
GZIP = Flag("--torch-profile-gzip", "Gzip-compress published traces (.pt.trace.json.gz).", default=True,
            action=argparse.BooleanOptionalAction)
GZIP_LEVEL = Flag("--torch-profile-gzip-level", "Compression level 1..9 (runs off the training thread).",
                  default=6, type=gzip_level, metavar="L")
STAGING_DIR = Flag("--torch-profile-staging-dir",
                   "Node-local directory the raw trace is written to before the barrier (a private "
                   "torchprof-<uid>/pid<pid> directory is made in it). Default: /dev/shm while memory allows, else "
                   "the system temp directory; chosen again at every flush from the space and memory free then.",
                   metavar="DIR", default_doc="auto")
EXPORT = Flag("--torch-profile-export",
              "How the trace leaves the training process: 'fork' serialises it in a forked child (the "
              "training thread pays only for stop()); 'inline' serialises it on the training thread. "
              "Compression and publishing always run in a separate process. 'fork' falls back to inline for a "
              "flush when host memory cannot cover the child or the fork fails.",
              default="fork", choices=("fork", "inline"), metavar="MODE")
FLUSH_TIMEOUT = Flag("--torch-profile-flush-timeout",
                     "Seconds all ranks may wait at the fence (a dedicated gloo group, not NCCL): at flushes, "
                     "memory snapshots and the exit.",
                     default=1800.0, type=positive_float, metavar="S")
EXIT_TIMEOUT = Flag("--torch-profile-exit-timeout",
                    "Seconds a rank waits at a clean exit for its traces still being published, before every rank "
                    "meets at the fence (then they are stopped and cleaned up; 0: do not wait). Must be shorter "
                    "than --torch-profile-flush-timeout.",
                    default=600.0, type=non_negative_float, metavar="S")
TERM_GRACE = Flag("--torch-profile-term-grace",
                  "Seconds after SIGTERM within which profiling cleans up (pending traces may finish, the rest "
                  "are stopped, partial files removed) before the signal is delivered as without the profiler. "
                  "Keep it under the scheduler's kill wait (SLURM KillWait, 30 s by default).",
                  default=10.0, type=positive_float, metavar="S")
MIN_FREE_HOST_MB = Flag("--torch-profile-min-free-host-mb",
                        "Host memory to keep free (the job's cgroup limit less its working set, else MemAvailable). "
                        "Below it a recording window ends early on every rank at the same iteration, and a trace "
                        "is exported inline to disk instead of forked or staged in RAM. 0 turns the guard off.",
                        default=2048, type=non_negative_int, metavar="MB")
SUMMARY = Flag("--torch-profile-summary", "Write a per-rank operator summary next to each trace.", default=True,
               action=argparse.BooleanOptionalAction)
SUMMARY_ROWS = Flag("--torch-profile-summary-rows", "Rows in the per-rank operator summary.", default=30,
                    type=positive_int, metavar="N")
TENSORBOARD_DIR = Flag("--tensorboard-dir",
                       "TensorBoard log directory (Megatron-LM's flag, reused when the host defines it).",
                       metavar="DIR", host_owned=True)

PROFILE_FLAGS = register_group(FlagGroup(
    title="torch profiler",
    description="torch.profiler traces of chosen steps and ranks, flushed without tripping NCCL watchdog "
                "timeouts (torchprof-args).",
    flags=(TORCH_PROFILE, RANKS, WAIT, WARMUP, ACTIVE, REPEAT, SKIP_FIRST, STEP_START, STEP_END, RECORD_SHAPES,
           PROFILE_MEMORY, WITH_STACK, WITH_FLOPS, WITH_MODULES, EXECUTION_TRACE, ACTIVITIES, PROFILE_DIR, GZIP,
           GZIP_LEVEL, STAGING_DIR, EXPORT, FLUSH_TIMEOUT, EXIT_TIMEOUT, TERM_GRACE, MIN_FREE_HOST_MB, SUMMARY,
           SUMMARY_ROWS, TENSORBOARD_DIR),
    order=10,
))

MEMORY_SNAPSHOT = Flag("--torch-profile-memory-snapshot",
                       "Record CUDA allocator history on the --torch-profile-ranks and dump a snapshot pickle per "
                       "rank after each profiled cycle, every --torch-profile-memory-snapshot-interval iterations "
                       "and on CUDA out-of-memory errors. Needs CUDA.", default=False, action="store_true")
MEMORY_MAX_ENTRIES = Flag("--torch-profile-memory-snapshot-max-entries",
                          "Allocation/free events kept (a ring buffer; older ones are dropped).", default=100_000,
                          type=positive_int, metavar="N")
MEMORY_STACKS = Flag("--torch-profile-memory-snapshot-stacks",
                     "Stacks recorded per event: python (cheap) or all (adds C++ frames; symbolising them can "
                     "take minutes per dump).", default="python", type=str.lower, choices=("python", "all"),
                     metavar="S")
MEMORY_INTERVAL = Flag("--torch-profile-memory-snapshot-interval",
                       "Also dump every N iterations (0 = only after profiled cycles and on OOM).", default=0,
                       type=non_negative_int, metavar="N")
NSYS = Flag("--torch-profile-nsys",
            "Call cudaProfilerStart/Stop around the scheduled active steps and emit NVTX ranges for steps and "
            "timers, for `nsys profile --capture-range=cudaProfilerApi` (see `torchprof nsys`). Needs CUDA.",
            default=False, action="store_true")

MEMORY_NSYS_FLAGS = register_group(FlagGroup(
    title="torch profiler: memory snapshots, nsys",
    description="CUDA allocator snapshots per rank (pytorch.org/memory_viz) and Nsight Systems capture ranges "
                "around the scheduled steps (torchprof-args).",
    flags=(MEMORY_SNAPSHOT, MEMORY_MAX_ENTRIES, MEMORY_STACKS, MEMORY_INTERVAL, NSYS),
    order=20,
))

class FlightRecorderAction(argparse.Action):
    """Stores N and turns PyTorch's flight recorder on right away, at parse time: PyTorch reads its
    buffer size when the first process group is created, which may be the next line."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        from torchprof_args.runtime.flight_recorder import configure_environment

        configure_environment(int(values), profile_dir(namespace))  # type: ignore[call-overload]


FLIGHT_RECORDER = Flag("--torch-profile-flight-recorder",
                       "Keep PyTorch's flight recorder of the last N collectives per process group and dump it into "
                       "<profile dir>/flight_recorder/ on an NCCL watchdog timeout (PyTorch's own), a failed fence "
                       "barrier, an exception leaving the profiler, and SIGTERM; `torchprof hang DIR` reads the dumps. "
                       "Takes effect when the flags are parsed: parse them before init_process_group.",
                       type=positive_int, action=FlightRecorderAction, metavar="N")

FLIGHT_RECORDER_FLAGS = register_group(FlagGroup(
    title="hang forensics",
    description="PyTorch's flight recorder, dumped on every rank when a job hangs, for `torchprof hang` "
                "(torchprof-args).",
    flags=(FLIGHT_RECORDER,),
    order=25,
))

#: Megatron-core parallel axes a rank can be selected by.
PARALLEL_AXES = ("dp", "tp", "pp", "cp", "ep")


def parallel_selector(text: str) -> tuple[str, tuple[int, ...]]:
    """``AXIS=VALUES``: an axis of :data:`PARALLEL_AXES` and indices like ``0``, ``0,2`` or ``0-3``."""
    axis, sep, values = text.partition("=")
    axis = axis.strip().lower()
    if not sep or axis not in PARALLEL_AXES or not values.strip():
        raise argparse.ArgumentTypeError(
            f"expected AXIS=INDICES with AXIS one of {', '.join(PARALLEL_AXES)} (e.g. dp=0, tp=0-1, pp=0,3), "
            f"got {text!r}")
    indices: list[int] = []
    for part in values.split(","):
        low, dash, high = part.strip().partition("-")
        try:
            first, last = int(low), int(high if dash else low)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{axis}: expected indices like 0, 0,2 or 0-3, got {values!r}") from None
        if first < 0 or last < first:
            raise argparse.ArgumentTypeError(f"{axis}: bad index range {part.strip()!r}")
        indices.extend(range(first, last + 1))
    return axis, tuple(sorted(set(indices)))


PARALLEL_RANKS = Flag("--torch-profile-parallel-ranks",
                      "Trace the ranks whose parallel coordinates match every AXIS=INDICES given (axes dp, tp, pp, "
                      "cp, ep; e.g. 'dp=0' traces one full model replica, 'dp=0 tp=0' its first tensor-parallel rank "
                      "of every stage). Replaces --torch-profile-ranks. Without megatron-core's parallel_state "
                      "every rank is a data-parallel replica (dp = global rank).",
                      type=parallel_selector, nargs="+", metavar="AXIS=I")

PARALLEL_FLAGS = register_group(FlagGroup(
    title="parallel rank selection",
    description="Choose traced ranks by their megatron-core parallel coordinates instead of global rank numbers "
                "(torchprof-args).",
    flags=(PARALLEL_RANKS,),
    order=40,
))


# -- configs ----------------------------------------------------------------------------------

#: ``(axis, indices)`` pairs of ``--torch-profile-parallel-ranks``.
ParallelSelectors = tuple[tuple[str, tuple[int, ...]], ...]


def profile_dir(args: argparse.Namespace) -> str:
    """``--torch-profile-dir``, else ``--tensorboard-dir`` when set, else ``./prof``."""
    return flag_value(args, PROFILE_DIR) or flag_value(args, TENSORBOARD_DIR) or "./prof"


@dataclasses.dataclass(frozen=True)
class TraceConfig:
    """What torch.profiler records, on which ranks, by which schedule, and where traces go.

    ``ranks`` (None: every rank) also selects the ranks that take memory snapshots;
    ``parallel_ranks``, when given, replaces ``ranks`` once the ranks' coordinates are known.
    """

    enabled: bool = False
    ranks: tuple[int, ...] | None = (0,)
    parallel_ranks: ParallelSelectors = ()
    schedule: ProfileSchedule = ProfileSchedule()
    activities: tuple[str, ...] = ()
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    execution_trace: bool = False
    output_dir: str = "./prof"

    def profiler_options(self) -> dict[str, bool]:
        """Keyword arguments of ``torch.profiler.profile`` besides activities and schedule."""
        return {name: getattr(self, name)
                for name in ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")}

    def selects(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks

    @classmethod
    def from_namespace(cls, args: argparse.Namespace) -> TraceConfig:
        ranks = list(flag_value(args, RANKS) or [0])
        if "all" in ranks and len(ranks) > 1:
            raise TorchProfileArgsError("--torch-profile-ranks: give either 'all' or rank numbers, not both.")
        return cls(
            enabled=bool(flag_value(args, TORCH_PROFILE)),
            ranks=None if "all" in ranks else tuple(sorted(set(ranks))),
            parallel_ranks=tuple(flag_value(args, PARALLEL_RANKS) or ()),
            schedule=_schedule(args),
            activities=tuple(flag_value(args, ACTIVITIES) or ()),
            **{name: bool(flag_value(args, flag)) for name, flag in (
                ("record_shapes", RECORD_SHAPES), ("profile_memory", PROFILE_MEMORY), ("with_stack", WITH_STACK),
                ("with_flops", WITH_FLOPS), ("with_modules", WITH_MODULES), ("execution_trace", EXECUTION_TRACE))},
            output_dir=profile_dir(args),
        )


def _schedule(args: argparse.Namespace) -> ProfileSchedule:
    """The schedule, after the checks that tie its flags together."""
    start, end = flag_value(args, STEP_START), flag_value(args, STEP_END)
    active = flag_value(args, ACTIVE)
    if start is not None or end is not None:
        if start is None:
            raise TorchProfileArgsError("--torch-profile-step-end needs --torch-profile-step-start.")
        given = [flag.option for flag in (WAIT, SKIP_FIRST, REPEAT) if was_given(args, flag)]
        if given:
            raise TorchProfileArgsError(
                f"--torch-profile-step-start/-end cannot be combined with {', '.join(given)}: choose absolute "
                "iterations or a relative schedule.")
        if end is not None and was_given(args, ACTIVE):
            raise TorchProfileArgsError("--torch-profile-active cannot be combined with --torch-profile-step-end "
                                        "(the window is step-end - step-start).")
        if end is not None and end <= start:
            raise TorchProfileArgsError(f"--torch-profile-step-end ({end}) must be greater than "
                                        f"--torch-profile-step-start ({start}).")
        end = start + active if end is None else end
        active = end - start
    return ProfileSchedule(wait=flag_value(args, WAIT), warmup=flag_value(args, WARMUP), active=active,
                           repeat=flag_value(args, REPEAT), skip_first=flag_value(args, SKIP_FIRST),
                           step_start=start, step_end=end)


@dataclasses.dataclass(frozen=True)
class ExportConfig:
    """How a stopped trace reaches the output directory (see :mod:`torchprof_args.runtime.export`),
    and the job-safety budgets: fence timeout, exit wait, SIGTERM grace, host memory reserve."""

    mode: str = "fork"
    staging_dir: str | None = None
    gzip_level: int | None = 6  # None: published uncompressed
    summary_rows: int | None = 30  # None: no per-trace operator summary
    flush_timeout: float = 1800.0
    exit_timeout: float = 600.0
    term_grace: float = 10.0
    min_free_host_mb: int = 2048

    @classmethod
    def from_namespace(cls, args: argparse.Namespace) -> ExportConfig:
        config = cls(
            mode=flag_value(args, EXPORT),
            staging_dir=flag_value(args, STAGING_DIR),
            gzip_level=flag_value(args, GZIP_LEVEL) if flag_value(args, GZIP) else None,
            summary_rows=flag_value(args, SUMMARY_ROWS) if flag_value(args, SUMMARY) else None,
            flush_timeout=float(flag_value(args, FLUSH_TIMEOUT)),
            exit_timeout=float(flag_value(args, EXIT_TIMEOUT)),
            term_grace=float(flag_value(args, TERM_GRACE)),
            min_free_host_mb=int(flag_value(args, MIN_FREE_HOST_MB)),
        )
        if config.exit_timeout >= config.flush_timeout:
            raise TorchProfileArgsError(
                f"--torch-profile-exit-timeout ({config.exit_timeout:g} s) must be shorter than "
                f"--torch-profile-flush-timeout ({config.flush_timeout:g} s): at exit every rank waits at the fence "
                "while the slowest rank waits for its publishers.")
        return config


@dataclasses.dataclass(frozen=True)
class MemorySnapshotConfig:
    """CUDA allocator history and the snapshots dumped from it (on the traced ranks)."""

    enabled: bool = False
    max_entries: int = 100_000
    stacks: str = "python"
    interval: int = 0
    output_dir: str = f"./prof/{MEMORY_SNAPSHOT_SUBDIR}"

    @classmethod
    def from_namespace(cls, args: argparse.Namespace) -> MemorySnapshotConfig:
        enabled = bool(flag_value(args, MEMORY_SNAPSHOT))
        options = (MEMORY_MAX_ENTRIES, MEMORY_STACKS, MEMORY_INTERVAL)
        given = [flag.option for flag in options if was_given(args, flag)]
        if given and not enabled:
            raise TorchProfileArgsError(
                f"{', '.join(given)} only take effect with --torch-profile-memory-snapshot; add it or drop them.")
        return cls(enabled=enabled, max_entries=flag_value(args, MEMORY_MAX_ENTRIES),
                   stacks=flag_value(args, MEMORY_STACKS), interval=flag_value(args, MEMORY_INTERVAL),
                   output_dir=f"{profile_dir(args)}/{MEMORY_SNAPSHOT_SUBDIR}")


@dataclasses.dataclass(frozen=True)
class NsysConfig:
    """Nsight Systems capture range around the recorded steps, NVTX ranges for steps and timers."""

    enabled: bool = False

    @classmethod
    def from_namespace(cls, args: argparse.Namespace) -> NsysConfig:
        return cls(enabled=bool(flag_value(args, NSYS)))


@dataclasses.dataclass(frozen=True)
class FlightRecorderConfig:
    """PyTorch's flight recorder (``--torch-profile-flight-recorder``): entries per process group
    (0: off) and where the dumps go."""

    entries: int = 0
    output_dir: str = f"./prof/{FLIGHT_RECORDER_SUBDIR}"

    @property
    def enabled(self) -> bool:
        return self.entries > 0

    @classmethod
    def from_namespace(cls, args: argparse.Namespace) -> FlightRecorderConfig:
        return cls(entries=flag_value(args, FLIGHT_RECORDER) or 0,
                   output_dir=f"{profile_dir(args)}/{FLIGHT_RECORDER_SUBDIR}")


@dataclasses.dataclass(frozen=True)
class ProfilerConfig:
    """Everything :class:`~torchprof_args.runtime.profiler.TorchProfiler` follows."""

    trace: TraceConfig = TraceConfig()
    export: ExportConfig = ExportConfig()
    memory: MemorySnapshotConfig = MemorySnapshotConfig()
    nsys: NsysConfig = NsysConfig()
    on_demand: OnDemandConfig = OnDemandConfig()
    flight_recorder: FlightRecorderConfig = FlightRecorderConfig()

    @property
    def follows_schedule(self) -> bool:
        """Whether a feature that follows the schedule is on (traces, memory snapshots, nsys)."""
        return self.trace.enabled or self.memory.enabled or self.nsys.enabled

    @property
    def enabled(self) -> bool:
        return self.follows_schedule or self.on_demand.enabled
