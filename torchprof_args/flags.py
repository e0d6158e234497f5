"""The one place where every ``--torch-profile-*`` (and related) flag is defined.

The argparse group, the single-flag validation (argparse ``type=`` functions), the help text
and the README flag table are all generated from :data:`FLAG_GROUPS`.  Cross-flag and
environment checks live in :func:`validate_args`.

Flags that a host framework may already define (Megatron-LM's ``--tensorboard-dir``,
``--log-interval``, ...) are marked ``host_owned``: when the host parser has the option we read
its value instead of redefining it, so the plugin never clashes with the host.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "Flag",
    "FlagGroup",
    "FLAG_GROUPS",
    "TorchProfileArgsError",
    "add_torch_profile_args",
    "validate_args",
    "flag_table_markdown",
    "non_negative_int",
    "positive_int",
    "positive_float",
]


class TorchProfileArgsError(ValueError):
    """A cross-flag or environment problem with the ``--torch-profile-*`` flags."""


# ---------------------------------------------------------------------------------------------
# argparse ``type=`` functions: single-flag errors surface inside parse_args as
# "error: argument --torch-profile-x: <message>" with exit code 2.


def non_negative_int(text: str) -> int:
    """An integer >= 0 (step counts)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """A number > 0 (seconds, sizes)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def rank_token(text: str) -> int | str:
    """A global rank (integer >= 0) or the word ``all``."""
    if text.lower() == "all":
        return "all"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected global ranks (whole numbers >= 0) or 'all', got {text!r}"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"ranks must be >= 0, got {value}")
    return value


def gzip_level(text: str) -> int:
    """A zlib compression level 1..9."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a level 1..9, got {text!r}") from None
    if not 1 <= value <= 9:
        raise argparse.ArgumentTypeError(f"must be between 1 and 9, got {value}")
    return value


# ---------------------------------------------------------------------------------------------
# The flag table.


@dataclasses.dataclass(frozen=True)
class Flag:
    """One command-line flag; ``argparse_kwargs`` go straight to ``add_argument``."""

    option: str
    help: str
    default: Any = None
    type: Callable[[str], Any] | None = None
    action: Any = None
    nargs: str | int | None = None
    choices: Sequence[Any] | None = None
    metavar: str | None = None
    #: A host framework (Megatron-LM) may define this option; reuse it if present.
    host_owned: bool = False
    #: What the README table shows as the default when ``default`` does not say it well.
    default_doc: str | None = None

    @property
    def dest(self) -> str:
        return self.option.lstrip("-").replace("-", "_")

    def argparse_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"help": self.help, "default": self.default}
        for key in ("type", "action", "nargs", "choices", "metavar"):
            value = getattr(self, key)
            if value is not None:
                kwargs[key] = value
        if self.action in ("store_true", "store_false"):
            kwargs.pop("type", None)
        return kwargs

    def default_text(self) -> str:
        if self.default_doc is not None:
            return self.default_doc
        if self.action == "store_true":
            return "off"
        if self.action is argparse.BooleanOptionalAction:
            return "on" if self.default else "off"
        if isinstance(self.default, list):
            return " ".join(str(v) for v in self.default)
        return "unset" if self.default is None else str(self.default)


@dataclasses.dataclass(frozen=True)
class FlagGroup:
    title: str
    description: str
    flags: tuple[Flag, ...]


PROFILE_FLAGS = FlagGroup(
    title="torch profiler",
    description=(
        "torch.profiler traces of chosen steps and ranks, flushed without tripping NCCL "
        "watchdog timeouts (torchprof-args)."
    ),
    flags=(
        Flag("--torch-profile", "Enable torch.profiler tracing.", default=False, action="store_true"),
        Flag(
            "--torch-profile-ranks",
            "Global ranks to trace, or 'all'.",
            default=[0],
            type=rank_token,
            nargs="+",
            metavar="R",
        ),
        Flag(
            "--torch-profile-wait",
            "Steps to wait at the start of each cycle (torch.profiler.schedule wait).",
            default=None,
            type=non_negative_int,
            metavar="N",
            default_doc="0",
        ),
        Flag(
            "--torch-profile-warmup",
            "Warmup steps before recording in each cycle (not recorded).",
            default=None,
            type=non_negative_int,
            metavar="N",
            default_doc="1",
        ),
        Flag(
            "--torch-profile-active",
            "Recorded steps per cycle. About 2 GB of trace per step for an 8B model: keep it small.",
            default=None,
            type=positive_int,
            metavar="N",
            default_doc="1",
        ),
        Flag(
            "--torch-profile-repeat",
            "Number of cycles (0 = until the run ends).",
            default=None,
            type=non_negative_int,
            metavar="N",
            default_doc="1",
        ),
        Flag(
            "--torch-profile-skip-first",
            "Steps of this run skipped before the first cycle.",
            default=None,
            type=non_negative_int,
            metavar="N",
            default_doc="1",
        ),
        Flag(
            "--torch-profile-step-start",
            "First global iteration to record (Megatron style, resume-safe); replaces "
            "--torch-profile-wait/-skip-first/-repeat.",
            type=non_negative_int,
            metavar="N",
        ),
        Flag(
            "--torch-profile-step-end",
            "Global iteration at which recording stops (exclusive); default step-start + active.",
            type=positive_int,
            metavar="N",
        ),
        Flag(
            "--torch-profile-record-shapes",
            "Record operator input shapes.",
            default=False,
            action="store_true",
        ),
        Flag(
            "--torch-profile-profile-memory",
            "Record tensor memory allocations and frees.",
            default=False,
            action="store_true",
        ),
        Flag(
            "--torch-profile-with-stack",
            "Record Python source locations of operators.",
            default=False,
            action="store_true",
        ),
        Flag(
            "--torch-profile-with-flops",
            "Estimate FLOPs of matrix multiplications and convolutions.",
            default=False,
            action="store_true",
        ),
        Flag(
            "--torch-profile-with-modules",
            "Record the nn.Module hierarchy of operators.",
            default=False,
            action="store_true",
        ),
        Flag(
            "--torch-profile-activities",
            "Activities to record: cpu, cuda. Default: cpu, plus cuda when available.",
            type=str.lower,
            nargs="+",
            choices=("cpu", "cuda"),
            metavar="A",
            default_doc="cpu [cuda]",
        ),
        Flag(
            "--torch-profile-dir",
            "Output directory for traces and summaries.",
            metavar="DIR",
            default_doc="`--tensorboard-dir` if set, else `./prof`",
        ),
        Flag(
            "--torch-profile-gzip",
            "Gzip-compress published traces (.pt.trace.json.gz).",
            default=True,
            action=argparse.BooleanOptionalAction,
        ),
        Flag(
            "--torch-profile-gzip-level",
            "Compression level 1..9 (runs off the training thread).",
            default=6,
            type=gzip_level,
            metavar="L",
        ),
        Flag(
            "--torch-profile-staging-dir",
            "Node-local directory the raw trace is written to before the barrier. Default: "
            "/dev/shm when it has room, else the system temp directory.",
            metavar="DIR",
            default_doc="auto",
        ),
        Flag(
            "--torch-profile-export",
            "How the trace leaves the training process: 'fork' serialises it in a forked child "
            "(the training thread pays only for stop()); 'inline' serialises it on the training "
            "thread. Compression and publishing always run in a separate process.",
            default="fork",
            choices=("fork", "inline"),
            metavar="MODE",
        ),
        Flag(
            "--torch-profile-flush-timeout",
            "Seconds all ranks may wait at the flush barrier (a dedicated gloo group, not NCCL).",
            default=1800.0,
            type=positive_float,
            metavar="S",
        ),
        Flag(
            "--torch-profile-exit-timeout",
            "Seconds to wait at exit for traces still being compressed and published.",
            default=600.0,
            type=positive_float,
            metavar="S",
        ),
        Flag(
            "--torch-profile-summary",
            "Write a per-rank operator summary next to each trace.",
            default=True,
            action=argparse.BooleanOptionalAction,
        ),
        Flag(
            "--torch-profile-summary-rows",
            "Rows in the per-rank operator summary.",
            default=30,
            type=positive_int,
            metavar="N",
        ),
        Flag(
            "--tensorboard-dir",
            "TensorBoard log directory (Megatron-LM's flag, reused when the host defines it).",
            metavar="DIR",
            host_owned=True,
        ),
    ),
)

#: Every group the plugin adds, in order.  Later features append their group here.
FLAG_GROUPS: list[FlagGroup] = [PROFILE_FLAGS]

MEMORY_NSYS_FLAGS = FlagGroup(
    title="torch profiler: memory snapshots, nsys",
    description=(
        "CUDA allocator snapshots per rank (pytorch.org/memory_viz) and Nsight Systems capture "
        "ranges around the scheduled steps (torchprof-args)."
    ),
    flags=(
        Flag(
            "--torch-profile-memory-snapshot",
            "Record CUDA allocator history on the --torch-profile-ranks and dump a snapshot pickle "
            "per rank after each profiled cycle, every --torch-profile-memory-snapshot-interval "
            "iterations and on CUDA out-of-memory errors. Needs CUDA.",
            default=False,
            action="store_true",
        ),
        Flag(
            "--torch-profile-memory-snapshot-max-entries",
            "Allocation/free events kept (a ring buffer; older ones are dropped).",
            type=positive_int,
            metavar="N",
            default_doc="100000",
        ),
        Flag(
            "--torch-profile-memory-snapshot-stacks",
            "Stacks recorded per event: python (cheap) or all (adds C++ frames; symbolising "
            "them can take minutes per dump).",
            type=str.lower,
            choices=("python", "all"),
            metavar="S",
            default_doc="python",
        ),
        Flag(
            "--torch-profile-memory-snapshot-interval",
            "Also dump every N iterations (0 = only after profiled cycles and on OOM).",
            type=non_negative_int,
            metavar="N",
            default_doc="0",
        ),
        Flag(
            "--torch-profile-nsys",
            "Call cudaProfilerStart/Stop around the scheduled active steps and emit NVTX ranges for "
            "steps and timers, for `nsys profile --capture-range=cudaProfilerApi` (see `torchprof "
            "nsys`). Needs CUDA.",
            default=False,
            action="store_true",
        ),
    ),
)
FLAG_GROUPS.append(MEMORY_NSYS_FLAGS)

def timing_log_level(text: str) -> int:
    """Megatron's timer log level: 0, 1 or 2."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 0, 1 or 2, got {text!r}") from None
    if value not in (0, 1, 2):
        raise argparse.ArgumentTypeError(f"must be 0, 1 or 2, got {value}")
    return value


TIMER_FLAGS = FlagGroup(
    title="step timers and metrics",
    description=(
        "Megatron-compatible step timers (CUDA events, no device synchronize per start/stop) "
        "written to wandb, TensorBoard and a local metrics.jsonl (torchprof-args)."
    ),
    flags=(
        Flag(
            "--timing-log-level",
            "Timers up to this level are measured; higher ones are free no-ops (Megatron-LM's flag).",
            default=0,
            type=timing_log_level,
            metavar="{0,1,2}",
            host_owned=True,
        ),
        Flag(
            "--timing-log-option",
            "How timers are reduced across ranks: max, minmax, or all (Megatron-LM's flag).",
            default="minmax",
            choices=("max", "minmax", "all"),
            host_owned=True,
        ),
        Flag(
            "--log-interval",
            "Iterations between two metric writes (Megatron-LM's flag).",
            default=100,
            type=positive_int,
            metavar="N",
            host_owned=True,
        ),
        Flag(
            "--timing-synchronize",
            "Synchronize the device at every timer start/stop (Megatron's behaviour) instead of "
            "timing with CUDA events resolved at log time.",
            default=False,
            action="store_true",
        ),
        Flag(
            "--wandb-project",
            "wandb project (Megatron-LM's flag).",
            metavar="NAME",
            host_owned=True,
            default_doc="torchprof",
        ),
        Flag("--wandb-exp-name", "wandb run name (Megatron-LM's flag).", metavar="NAME", host_owned=True),
        Flag("--wandb-entity", "wandb entity (team or user).", metavar="NAME", host_owned=True),
        Flag(
            "--wandb-save-dir",
            "Directory for wandb's local run files (Megatron-LM's flag).",
            metavar="DIR",
            host_owned=True,
            default_doc="the metrics directory",
        ),
        Flag(
            "--wandb-mode",
            "online uploads live; offline writes locally for a later `wandb sync`; disabled skips "
            "wandb.",
            choices=("online", "offline", "disabled"),
            default_doc="online with wandb credentials, else offline",
        ),
        Flag(
            "--metrics-dir",
            "Directory for metrics.jsonl and the TensorBoard event files.",
            metavar="DIR",
            default_doc="`--torch-profile-dir`'s default",
        ),
        Flag(
            "--metrics-sinks",
            "Where the metrics writer writes.",
            default=["wandb", "tensorboard", "jsonl"],
            type=str.lower,
            nargs="+",
            choices=("wandb", "tensorboard", "jsonl"),
            metavar="SINK",
        ),
        Flag(
            "--metrics-rank",
            "Global rank that writes the metrics (wandb, TensorBoard, metrics.jsonl); default the "
            "last rank, as in Megatron-LM.",
            type=non_negative_int,
            metavar="R",
            default_doc="last rank",
        ),
        Flag(
            "--metrics-flops-per-iteration",
            "Model FLOPs of one training iteration (all ranks together), for TFLOP/s per GPU.",
            type=positive_float,
            metavar="F",
        ),
    ),
)
FLAG_GROUPS.append(TIMER_FLAGS)

# -- framework integrations (torchprof_args.megatron / .deepspeed / .decorator) ----------------

#: Megatron-core parallel axes a rank can be selected by.
PARALLEL_AXES = ("dp", "tp", "pp", "cp", "ep")


def parallel_selector(text: str) -> tuple[str, tuple[int, ...]]:
    """``AXIS=VALUES``: an axis of :data:`PARALLEL_AXES` and indices like ``0``, ``0,2`` or ``0-3``."""
    axis, sep, values = text.partition("=")
    axis = axis.strip().lower()
    if not sep or axis not in PARALLEL_AXES or not values.strip():
        raise argparse.ArgumentTypeError(
            f"expected AXIS=INDICES with AXIS one of {', '.join(PARALLEL_AXES)} (e.g. dp=0, tp=0-1, "
            f"pp=0,3), got {text!r}"
        )
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


PARALLEL_FLAGS = FlagGroup(
    title="parallel rank selection",
    description=(
        "Choose traced ranks by their megatron-core parallel coordinates instead of global rank "
        "numbers (torchprof-args)."
    ),
    flags=(
        Flag(
            "--torch-profile-parallel-ranks",
            "Trace the ranks whose parallel coordinates match every AXIS=INDICES given (axes dp, tp, "
            "pp, cp, ep; e.g. 'dp=0' traces one full model replica, 'dp=0 tp=0' its first tensor-"
            "parallel rank of every stage). Replaces --torch-profile-ranks. Without megatron-core's "
            "parallel_state every rank is a data-parallel replica (dp = global rank).",
            type=parallel_selector,
            nargs="+",
            metavar="AXIS=I",
        ),
    ),
)
FLAG_GROUPS.append(PARALLEL_FLAGS)

ON_DEMAND_FLAGS = FlagGroup(
    title="torch profiler: on-demand",
    description=(
        "Trace chosen ranks for a few iterations while the job runs, when `torchprof trigger` asks; "
        "no relaunch, no daemon (torchprof-args)."
    ),
    flags=(
        Flag(
            "--torch-profile-on-demand",
            "Accept trace requests from `torchprof trigger --job-dir DIR` (or `--pid PID` on the "
            "node) while the job runs. Works with or without --torch-profile.",
            default=False,
            action="store_true",
        ),
        Flag(
            "--torch-profile-on-demand-dir",
            "Control directory for requests and answers: private to your user, on a filesystem "
            "that rank 0 and the trigger both reach.",
            metavar="DIR",
            default_doc="`<profile dir>/ondemand`",
        ),
        Flag(
            "--torch-profile-on-demand-check-seconds",
            "Check for requests about every S seconds of training (rank 0 turns this into "
            "iterations from the measured step time; one small asynchronous broadcast per check).",
            default=10.0,
            type=positive_float,
            metavar="S",
        ),
        Flag(
            "--torch-profile-on-demand-interval",
            "Fewest iterations between two request checks (also the spacing of the first checks).",
            default=10,
            type=positive_int,
            metavar="N",
        ),
        Flag(
            "--torch-profile-on-demand-max-iterations",
            "Most iterations one request may trace (larger requests are rejected).",
            default=20,
            type=positive_int,
            metavar="N",
        ),
    ),
)
FLAG_GROUPS.append(ON_DEMAND_FLAGS)

#: The ``torchprof_args.cli`` decorator's own short flags (seed-style); only the decorator adds
#: them, next to the full flag set, so they are not part of :data:`FLAG_GROUPS`.
CLI_DECORATOR_FLAGS = FlagGroup(
    title="profiling decorator",
    description="Short flags added by the `torchprof_args.cli` decorator (torchprof-args).",
    flags=(
        Flag("--profiling", "Enable profiling (same as --torch-profile).", default=False, action="store_true"),
        Flag(
            "--ptensorboard",
            "Also write TensorBoard output: step-time scalars and the traces in a run directory "
            "TensorBoard's profiler plugin reads.",
            default=False,
            action="store_true",
        ),
        Flag(
            "--prof_dir",
            "Profile directory (same as --torch-profile-dir).",
            metavar="DIR",
            default_doc="`./prof`",
        ),
    ),
)


#: The schedule defaults applied by :func:`validate_args` (``None`` in argparse so that
#: explicitly given values can be told apart from defaults).
SCHEDULE_DEFAULTS = {"wait": 0, "warmup": 1, "active": 1, "repeat": 1, "skip_first": 1}
#: Attribute on ``args`` naming the schedule options :func:`validate_args` filled in, so a
#: second call does not mistake them for options the user gave.
_FILLED_DEFAULTS = "_torch_profile_filled_defaults"


def _host_has_option(parser: argparse.ArgumentParser, option: str) -> bool:
    return option in parser._option_string_actions  # noqa: SLF001  (stable since Python 2.7)


def add_torch_profile_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the torchprof-args flag groups to ``parser`` and return it.

    Usable as Megatron-LM's ``extra_args_provider``, beside DeepSpeed's
    ``deepspeed.add_config_arguments`` and on any plain parser.  Options the host parser
    already defines are reused, never redefined.
    """
    for group_spec in FLAG_GROUPS:
        group = None
        for flag in group_spec.flags:
            if _host_has_option(parser, flag.option):
                continue
            if group is None:
                group = parser.add_argument_group(group_spec.title, group_spec.description)
            group.add_argument(flag.option, **flag.argparse_kwargs())
    return parser


# ---------------------------------------------------------------------------------------------
# Cross-flag and environment validation.


def _world_size() -> int | None:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size()
    except ImportError:
        pass
    env = os.environ.get("WORLD_SIZE")
    return int(env) if env and env.isdigit() else None


def any_profiling_feature(args: argparse.Namespace) -> bool:
    """Whether a flag that follows the schedule is on (traces, memory snapshots, nsys ranges)."""
    return any(getattr(args, name, False) for name in
               ("torch_profile", "torch_profile_memory_snapshot", "torch_profile_nsys"))


def resolve_profile_dir(args: argparse.Namespace) -> str:
    """``--torch-profile-dir``, else ``--tensorboard-dir`` when set, else ``./prof``."""
    explicit = getattr(args, "torch_profile_dir", None)
    if explicit:
        return explicit
    tensorboard_dir = getattr(args, "tensorboard_dir", None)
    return tensorboard_dir or "./prof"


def _check_writable_dir(path: str, flag: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        raise TorchProfileArgsError(
            f"{flag} {path!r} cannot be created ({err.strerror or err}); "
            "choose a directory you can write to."
        ) from None
    probe = os.path.join(path, f".torchprof-write-probe-{os.getpid()}")
    try:
        with open(probe, "w") as handle:
            handle.write("ok")
        os.remove(probe)
    except OSError as err:
        raise TorchProfileArgsError(
            f"{flag} {path!r} is not writable ({err.strerror or err}); "
            "choose a directory you can write to."
        ) from None


def validate_args(args: argparse.Namespace, world_size: int | None = None) -> argparse.Namespace:
    """Check cross-flag and environment constraints; fill in schedule defaults.

    Raises :class:`TorchProfileArgsError` (a ``ValueError``) whose message names the flags.
    ``world_size`` defaults to the initialised process group's, else ``$WORLD_SIZE``.
    Returns ``args`` so it can be chained.
    """
    start = getattr(args, "torch_profile_step_start", None)
    end = getattr(args, "torch_profile_step_end", None)
    if start is not None or end is not None:
        if start is None:
            raise TorchProfileArgsError(
                "--torch-profile-step-end needs --torch-profile-step-start."
            )
        filled = getattr(args, _FILLED_DEFAULTS, set())  # validate_args may run more than once
        given = [
            f"--torch-profile-{name.replace('_', '-')}"
            for name in ("wait", "skip_first", "repeat")
            if getattr(args, f"torch_profile_{name}", None) is not None and name not in filled
        ]
        if given:
            raise TorchProfileArgsError(
                f"--torch-profile-step-start/-end cannot be combined with {', '.join(given)}: "
                "choose absolute iterations or a relative schedule."
            )
        if end is not None and getattr(args, "torch_profile_active", None) is not None and "active" not in filled:
            raise TorchProfileArgsError(
                "--torch-profile-active cannot be combined with --torch-profile-step-end "
                "(the window is step-end - step-start)."
            )
        if end is not None and end <= start:
            raise TorchProfileArgsError(
                f"--torch-profile-step-end ({end}) must be greater than "
                f"--torch-profile-step-start ({start})."
            )
    from torchprof_args.metrics import validate_timer_args

    validate_timer_args(args, world_size)
    filled = set(getattr(args, _FILLED_DEFAULTS, set()))
    for name, default in SCHEDULE_DEFAULTS.items():
        attr = f"torch_profile_{name}"
        if getattr(args, attr, None) is None:
            setattr(args, attr, default)
            filled.add(name)
    setattr(args, _FILLED_DEFAULTS, filled)

    from torchprof_args.memory import check_memory_snapshot_args

    check_memory_snapshot_args(args)
    if getattr(args, "torch_profile_on_demand_dir", None) and not getattr(args, "torch_profile_on_demand", False):
        raise TorchProfileArgsError("--torch-profile-on-demand-dir needs --torch-profile-on-demand.")
    if getattr(args, "torch_profile_on_demand", False):
        _check_writable_dir(resolve_profile_dir(args), "--torch-profile-dir")
    if not any_profiling_feature(args):
        return args

    world_size = world_size if world_size is not None else _world_size()
    ranks = getattr(args, "torch_profile_ranks", [0]) or [0]
    if "all" in ranks and len(ranks) > 1:
        raise TorchProfileArgsError("--torch-profile-ranks: give either 'all' or rank numbers, not both.")
    if world_size is not None and "all" not in ranks:
        outside = sorted(r for r in ranks if r >= world_size)
        if outside:
            raise TorchProfileArgsError(
                f"--torch-profile-ranks {' '.join(map(str, outside))} outside the world size "
                f"{world_size} (valid ranks are 0..{world_size - 1})."
            )

    _check_writable_dir(resolve_profile_dir(args), "--torch-profile-dir")
    staging = getattr(args, "torch_profile_staging_dir", None)
    if staging:
        _check_writable_dir(staging, "--torch-profile-staging-dir")
    return args


# ---------------------------------------------------------------------------------------------
# Documentation.


def flag_table_markdown() -> str:
    """The README's flag table, generated from :data:`FLAG_GROUPS`."""
    lines: list[str] = []
    for group in FLAG_GROUPS:
        lines += [f"**{group.title}**: {group.description}", "", "| flag | default | meaning |", "|---|---|---|"]
        for flag in group.flags:
            option = flag.option
            if flag.action is argparse.BooleanOptionalAction:
                option = f"{option}, --no-{flag.option[2:]}"
            elif flag.metavar:
                option += f" {flag.metavar}" + (f" [{flag.metavar} ...]" if flag.nargs == "+" else "")
            meaning = flag.help
            if flag.choices:
                meaning += f" Choices: {', '.join(map(str, flag.choices))}."
            if flag.host_owned:
                meaning += " Reused if the host parser defines it."
            lines.append(f"| `{option}` | {flag.default_text()} | {meaning} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
