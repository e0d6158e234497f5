"""The runtime's flags (traces, export, memory snapshots, nsys, flight recorder, parallel rank
selection), declared as data and registered with :mod:`torchprof_args.capture.flags`.

Import-light (no torch).  :mod:`torchprof_args.capture.runtime.config` turns them into configs.
"""

from __future__ import annotations

import argparse

from torchprof_args.capture.flags import Flag, FlagGroup, flag_value, register_group
from torchprof_args.capture.flags.types import (
    gzip_level,
    non_negative_float,
    non_negative_int,
    port_number,
    positive_float,
    positive_int,
    rank_token,
)
from torchprof_args.naming import DEFAULT_PROFILE_DIR

__all__ = ["PARALLEL_AXES", "parallel_selector", "profile_dir"]

TORCH_PROFILE = Flag("--torch-profile", "Enable torch.profiler tracing.", default=False, action="store_true")
RANKS = Flag("--torch-profile-ranks",
             "Global ranks to trace, or 'all'.",
             default=[0], type=rank_token, nargs="+", metavar="R")
WAIT = Flag("--torch-profile-wait",
            "Steps to wait at the start of each cycle (torch.profiler.schedule wait).",
            default=0, type=non_negative_int, metavar="N")
WARMUP = Flag("--torch-profile-warmup", "Warmup steps before recording in each cycle (not recorded).",
              default=1, type=non_negative_int, metavar="N")
ACTIVE = Flag("--torch-profile-active",
              "Recorded steps per cycle. About 2 GB of trace per step for an 8B model: keep it small.",
              default=1, type=positive_int, metavar="N")
REPEAT = Flag("--torch-profile-repeat", "Number of cycles (0 = until the run ends).", default=1,
              type=non_negative_int, metavar="N")
SKIP_FIRST = Flag("--torch-profile-skip-first",
                  "Steps of this run skipped before the first cycle.",
                  default=1, type=non_negative_int, metavar="N")
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
MEMORY_CATEGORIES = Flag("--torch-profile-memory-categories",
                         "Which windows get PyTorch's own memory categorisation (parameter, gradient, "
                         "optimizer state, activation, temporary), computed in the forked exporter while the "
                         "profiler's results exist; it needs --torch-profile-profile-memory, -record-shapes "
                         "and -with-stack, and costs about 60x the trace's export in CPU (1.1 s for 3 steps "
                         "of a 40-layer MLP), taken from the steps after the flush. 'first': each rank's "
                         "first such window of the run; 'every': every window; 'off': none. Windows "
                         "without it are categorised from the trace (`torchprof mem` says what is less "
                         "certain).",
                         default="first", choices=("first", "every", "off"), metavar="WHEN")
WITH_FLOPS = Flag("--torch-profile-with-flops",
                  "Have torch.profiler estimate FLOPs of matrix multiplications and convolutions (in its "
                  "in-process results; the trace file carries none). Records shapes too, from which "
                  "`torchprof diagnose` computes FLOPs and MFU, and has inductor (torch.compile) write "
                  "its Triton kernels' FLOPs and bytes into the trace (its benchmark_kernel setting, "
                  "from the start of profiling: compile-time cost only).",
                  default=False, action="store_true")
WITH_MODULES = Flag("--torch-profile-with-modules",
                    "Record the nn.Module hierarchy of operators.",
                    default=False, action="store_true")
COMPILED_MODULES = Flag("--torch-profile-compiled-modules",
                        "Have inductor (torch.compile) note which FX nodes, and so which module, each kernel "
                        "it generates computes (its provenance tracking and the nodes' nn_module_stack), "
                        "written beside the traces as compiled_modules/<trace stem>.json, and record its C++ "
                        "kernels in CPU traces: the summary, the critical path and diagnose then give "
                        "compiled code's time on CPU to the innermost module (layers.2.attn) instead of "
                        "the region's (a GPU's Triton kernels are not matched yet). Compile-time cost only "
                        "(docs/guides/trace-toolkit.md measures it); graphs compiled before profiling "
                        "starts, or loaded from inductor's cache, have none.",
                        default=False, action="store_true")
EXECUTION_TRACE = Flag("--torch-profile-execution-trace",
                       "Also record PyTorch's execution trace (ExecutionTraceObserver, Chakra input) of the "
                       "same windows on the traced ranks, published in each cycle folder's "
                       "execution_traces/ as <stem>.et.json.gz.",
                       default=False, action="store_true")
ACTIVITIES = Flag("--torch-profile-activities",
                  "Activities to record: cpu, cuda. Default: cpu, plus cuda when available.",
                  type=str.lower, nargs="+", choices=("cpu", "cuda"), metavar="A", default_doc="cpu [cuda]")
PROFILE_DIR = Flag("--torch-profile-dir", "Output directory for traces and summaries.", metavar="DIR",
                   default_doc="`--tensorboard-dir` if set, else `./prof`")
GZIP = Flag("--torch-profile-gzip", "Gzip-compress published traces (.pt.trace.json.gz).", default=True,
            action=argparse.BooleanOptionalAction)
GZIP_LEVEL = Flag("--torch-profile-gzip-level",
                  "Compression level 1..9 (zlib's; runs off the training thread). Level 1 uses isal's "
                  "deflate where the analysis extra is installed: zlib level 1's ratio for about 4x less "
                  "CPU (9x less than level 6), traces about a third larger than level 6's.",
                  default=6, type=gzip_level, metavar="L")
STAGING_DIR = Flag("--torch-profile-staging-dir",
                   "Node-local directory the raw trace is written to before the barrier (a private "
                   "torchprof-<uid>/pid<pid> directory is made in it). Default: /dev/shm while memory "
                   "allows, else the system temp directory; chosen again at every flush from the space and "
                   "memory free then.",
                   metavar="DIR", default_doc="auto")
EXPORT = Flag("--torch-profile-export",
              "How the trace leaves the training process: 'fork' serialises it in a forked child (the "
              "training thread pays only for stop()); 'inline' serialises it on the training thread. "
              "Compression and publishing always run in a separate process. 'fork' falls back to inline for "
              "a flush when host memory cannot cover the child or the fork fails.",
              default="fork", choices=("fork", "inline"), metavar="MODE")
PUBLISHER_PRIORITY = Flag("--torch-profile-publisher-priority",
                          "CPU and I/O priority of the forked exporter and the publisher (compression, "
                          "summary, diagnosis): 'idle' runs them at nice 19, SCHED_IDLE and the idle I/O "
                          "class, so the steps after a flush keep the CPU and the disk (at exit, publishers "
                          "still running leave SCHED_IDLE where Linux allows it: root, CAP_SYS_NICE or "
                          "ulimit -e >= 1); 'normal' keeps the training process's priority (as before this "
                          "flag existed).",
                          default="idle", choices=("idle", "normal"), metavar="P")
PUBLISHER_SERVER = Flag("--torch-profile-publisher-server",
                        "Deprecated, does nothing (warns once): each traced rank now always has one "
                        "long-lived publisher process, started with the profiler. Kept so that launch "
                        "scripts that pass it (or --no-torch-profile-publisher-server) still parse; drop it.",
                        default=True, action=argparse.BooleanOptionalAction)
PUBLISH_WAIT = Flag("--torch-profile-publish-wait",
                    "Whether the step that writes a trace waits for this rank's publication (export, "
                    "compression, summary) before training resumes, for at most "
                    "--torch-profile-publish-wait-timeout: 'auto' waits when the node's CPUs were busy "
                    "since the last flush (fewer idle cores than ranks on the node: a publication in the "
                    "background would take its CPU time from the next steps anyway, and leave the trace "
                    "unwritten for as long as training keeps the cores); 'always'; 'never' publishes in the "
                    "background (as before this flag existed).",
                    default="auto", choices=("auto", "always", "never"), metavar="WHEN")
PUBLISH_WAIT_TIMEOUT = Flag("--torch-profile-publish-wait-timeout",
                            "The longest a flush step waits for its publication "
                            "(--torch-profile-publish-wait); past it the publication goes on in the "
                            "background.",
                            default=1.0, type=positive_float, metavar="S")
ANALYSIS_BUDGET = Flag("--torch-profile-analysis-budget",
                       "The CPU time the analyses published with each trace may take, as a share of the "
                       "CPU time of the trace's own export (at least 1 s): the publisher's decoding and "
                       "the summary sidecar's diagnosis, critical path and memory (before them, PyTorch's "
                       "memory categorisation in the exporter gets half as much). What does not fit is left "
                       "out of the sidecar (it says which), and `torchprof diagnose` / `critical-path` / "
                       "`mem` compute it from the trace when asked; the exit waits for the files, never "
                       "for an analysis. 0: no budget.",
                       default=2.0, type=non_negative_float, metavar="SHARE")
FLUSH_TIMEOUT = Flag("--torch-profile-flush-timeout",
                     "Seconds all ranks may wait at the fence (a dedicated gloo group, not NCCL): at "
                     "flushes, memory snapshots and the exit.",
                     default=1800.0, type=positive_float, metavar="S")
EXIT_TIMEOUT = Flag("--torch-profile-exit-timeout",
                    "Seconds a rank waits at a clean exit for its traces still being published, before "
                    "every rank meets at the fence (then they are stopped and cleaned up; 0: do not wait). "
                    "Must be shorter than --torch-profile-flush-timeout.",
                    default=600.0, type=non_negative_float, metavar="S")
TERM_GRACE = Flag("--torch-profile-term-grace",
                  "Seconds after SIGTERM within which profiling cleans up (pending traces may finish, the "
                  "rest are stopped, partial files removed) before the signal is delivered as without the "
                  "profiler. Keep it under the scheduler's kill wait (SLURM KillWait, 30 s by default).",
                  default=10.0, type=positive_float, metavar="S")
MIN_FREE_HOST_MB = Flag("--torch-profile-min-free-host-mb",
                        "Host memory to keep free (the job's cgroup limit less its working set, else "
                        "MemAvailable). Below it a recording window ends early on every rank at the same "
                        "iteration, and a trace is exported inline to disk instead of forked or staged in "
                        "RAM. 0 turns the guard off.",
                        default=2048, type=non_negative_int, metavar="MB")
MAX_PUBLISHING = Flag("--torch-profile-max-publishing",
                      "Traces a rank may have being published (a staged file each, waiting for the rank's "
                      "publisher) when a window would start; when any rank has that many, the window is "
                      "skipped on every rank (rank 0 says how far behind publishing is). 0: no bound.",
                      default=2, type=non_negative_int, metavar="N")
OPERATOR_TABLE = Flag("--torch-profile-operator-table",
                      "Publish with each trace, in its cycle folder's summaries/, its operator table "
                      "(<stem>.operator_table.txt: steps, top operators, memory) and its summary sidecar "
                      "(<stem>.summary.json).",
                      default=True, action=argparse.BooleanOptionalAction,
                      aliases=("--torch-profile-summary",))
OPERATOR_TABLE_ROWS = Flag("--torch-profile-operator-table-rows",
                           "Operators listed in each operator table.",
                           default=30, type=positive_int, metavar="N",
                           aliases=("--torch-profile-summary-rows",))
TENSORBOARD_DIR = Flag("--tensorboard-dir",
                       "TensorBoard log directory (Megatron-LM's flag, reused when the host defines it).",
                       metavar="DIR", host_owned=True)

PROFILE_FLAGS = register_group(FlagGroup(
    title="torch profiler",
    description="torch.profiler traces of chosen steps and ranks, flushed without tripping NCCL watchdog "
                "timeouts (torchprof-args).",
    flags=(TORCH_PROFILE, RANKS, WAIT, WARMUP, ACTIVE, REPEAT, SKIP_FIRST, STEP_START, STEP_END,
           RECORD_SHAPES, PROFILE_MEMORY, WITH_STACK, MEMORY_CATEGORIES, WITH_FLOPS, WITH_MODULES,
           COMPILED_MODULES, EXECUTION_TRACE, ACTIVITIES,
           PROFILE_DIR, GZIP, GZIP_LEVEL, STAGING_DIR, EXPORT, PUBLISHER_PRIORITY, PUBLISHER_SERVER,
           PUBLISH_WAIT, PUBLISH_WAIT_TIMEOUT, ANALYSIS_BUDGET,
           FLUSH_TIMEOUT, EXIT_TIMEOUT, TERM_GRACE, MIN_FREE_HOST_MB, MAX_PUBLISHING, OPERATOR_TABLE,
           OPERATOR_TABLE_ROWS, TENSORBOARD_DIR),
    order=10,
))

MEMORY_SNAPSHOT = Flag("--torch-profile-memory-snapshot",
                       "Record CUDA allocator history on the --torch-profile-ranks and dump a snapshot "
                       "pickle per rank after each profiled cycle, every "
                       "--torch-profile-memory-snapshot-interval iterations and on CUDA out-of-memory "
                       "errors. Needs CUDA.",
                       default=False, action="store_true")
MEMORY_MAX_ENTRIES = Flag("--torch-profile-memory-snapshot-max-entries",
                          "Allocation/free events kept (a ring buffer; older ones are dropped).",
                          default=100_000, type=positive_int, metavar="N")
MEMORY_STACKS = Flag("--torch-profile-memory-snapshot-stacks",
                     "Stacks recorded per event: python (cheap) or all (adds C++ frames; symbolising them "
                     "can take minutes per dump).",
                     default="python", type=str.lower, choices=("python", "all"), metavar="S")
MEMORY_INTERVAL = Flag("--torch-profile-memory-snapshot-interval",
                       "Also dump every N iterations (0 = only after profiled cycles and on OOM).", default=0,
                       type=non_negative_int, metavar="N")
NSYS = Flag("--torch-profile-nsys",
            "Call cudaProfilerStart/Stop around the scheduled active steps and emit NVTX ranges for steps "
            "and timers, for `nsys profile --capture-range=cudaProfilerApi` (see `torchprof nsys`). Needs "
            "CUDA.",
            default=False, action="store_true")

MEMORY_NSYS_FLAGS = register_group(FlagGroup(
    title="torch profiler: memory snapshots, nsys",
    description="CUDA allocator snapshots per rank (pytorch.org/memory_viz) and Nsight Systems capture "
                "ranges around the scheduled steps (torchprof-args).",
    flags=(MEMORY_SNAPSHOT, MEMORY_MAX_ENTRIES, MEMORY_STACKS, MEMORY_INTERVAL, NSYS),
    order=20,
))

class FlightRecorderAction(argparse.Action):
    """Stores N and turns PyTorch's flight recorder on right away, at parse time: PyTorch reads its
    buffer size when the first process group is created, which may be the next line."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        from torchprof_args.capture.runtime.flight_recorder_env import configure_environment

        configure_environment(int(str(values)), profile_dir(namespace))  # values: the flag's int


FLIGHT_RECORDER = Flag("--torch-profile-flight-recorder",
                       "Keep PyTorch's flight recorder of the last N collectives per process group and dump "
                       "it into <profile dir>/flight_recorder/ on an NCCL watchdog timeout (PyTorch's own), "
                       "a failed fence barrier, an exception leaving the profiler, and SIGTERM; `torchprof "
                       "hang DIR` reads the dumps. Takes effect when the flags are parsed: parse them "
                       "before init_process_group.",
                       type=positive_int, action=FlightRecorderAction, metavar="N")

STACKS = Flag("--torch-profile-stacks",
               "Write every rank's Python stacks (all threads, main first; native frames through py-spy "
               "when it may attach) into <profile dir>/flight_recorder/ wherever the flight recorder "
               "dumps (a failed fence barrier, an exception leaving the profiler, SIGTERM). On with "
               "--torch-profile-flight-recorder; this flag alone gives stacks without it.",
               default=False, action="store_true")
STACKS_SERVER = Flag("--torch-profile-stacks-server",
                     "Answer `torchprof trigger --stacks` (every rank's Python stacks, within 2 s, even from "
                     "a hung job) from a background thread on every rank wherever the profiler runs: any "
                     "--torch-profile* feature, on-demand included. Costs one stat of <profile "
                     "dir>/stacks/requests a second (benchmarks/bench_stacks.py: noise). "
                     "--no-torch-profile-stacks-server turns it off (not with "
                     "--torch-profile-flight-recorder, whose dumps at an NCCL timeout ride on its thread).",
                     default=True, action=argparse.BooleanOptionalAction)

FLIGHT_RECORDER_FLAGS = register_group(FlagGroup(
    title="hang forensics",
    description="PyTorch's flight recorder and every rank's stacks, dumped on every rank when a job hangs, "
                "for `torchprof hang`; every rank's stacks on request, for `torchprof trigger --stacks` "
                "(torchprof-args).",
    flags=(FLIGHT_RECORDER, STACKS, STACKS_SERVER),
    order=25,
))

DEBUG_SERVER = Flag("--torch-profile-debug-server",
                    "Start PyTorch's distributed debug server (torch.distributed.debug, torch >= 2.13, pip "
                    "install 'torchprof-args[debugserver]'): a worker on every rank and, on rank 0, a web "
                    "frontend on --torch-profile-debug-server-port showing every rank's stacks, flight "
                    "recorder, py-spy and torch.profiler, with this package's pages beside them (an "
                    "on-demand trace of the next N iterations, the last cycle's brief); its periodic dumps "
                    "go to <profile dir>/debug_server/ for `torchprof hang`. PyTorch's security note: "
                    "only for trusted networks, the server is not secure (no authentication; every rank's "
                    "worker listens on all interfaces) and must not be exposed to the internet; "
                    "experimental, it may change with any torch release. `torchprof trigger` keeps its "
                    "private channel by default (--debug-server HOST:PORT goes through this server).",
                    default=False, action="store_true")
DEBUG_SERVER_PORT = Flag("--torch-profile-debug-server-port",
                         "Port of the debug server's web frontend on rank 0's node (PyTorch's default).",
                         default=25999, type=port_number, metavar="PORT")
DEBUG_SERVER_DUMP_INTERVAL = Flag("--torch-profile-debug-server-dump-interval",
                                  "Seconds between the debug server's dumps of every rank's stacks and "
                                  "flight recorder into <profile dir>/debug_server/ (the newest "
                                  "few kept; `torchprof hang` reads the newest); 0: no dumps.",
                                  default=60.0, type=non_negative_float, metavar="S")

DEBUG_SERVER_FLAGS = register_group(FlagGroup(
    title="PyTorch's debug server",
    description="PyTorch's own distributed debug server, with this package's pages beside its own; "
                "combine with --torch-profile-flight-recorder N for every rank's collectives and with "
                "--torch-profile-on-demand for traces on request (torchprof-args).",
    flags=(DEBUG_SERVER, DEBUG_SERVER_PORT, DEBUG_SERVER_DUMP_INTERVAL),
    order=26,
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
            raise argparse.ArgumentTypeError(
                f"{axis}: expected indices like 0, 0,2 or 0-3, got {values!r}") from None
        if first < 0 or last < first:
            raise argparse.ArgumentTypeError(f"{axis}: bad index range {part.strip()!r}")
        indices.extend(range(first, last + 1))
    return axis, tuple(sorted(set(indices)))


PARALLEL_RANKS = Flag("--torch-profile-parallel-ranks",
                      "Trace the ranks whose parallel coordinates match every AXIS=INDICES given (axes dp, "
                      "tp, pp, cp, ep; e.g. 'dp=0' traces one full model replica, 'dp=0 tp=0' its first "
                      "tensor-parallel rank of every stage). Replaces --torch-profile-ranks. Without "
                      "megatron-core's parallel_state every rank is a data-parallel replica (dp = global "
                      "rank).",
                      type=parallel_selector, nargs="+", metavar="AXIS=I")

PARALLEL_FLAGS = register_group(FlagGroup(
    title="parallel rank selection",
    description="Choose traced ranks by their megatron-core parallel coordinates instead of global rank "
                "numbers (torchprof-args).",
    flags=(PARALLEL_RANKS,),
    order=40,
))


def profile_dir(args: argparse.Namespace) -> str:
    """``--torch-profile-dir``, else ``--tensorboard-dir`` when set, else ``./prof``."""
    return flag_value(args, PROFILE_DIR) or flag_value(args, TENSORBOARD_DIR) or DEFAULT_PROFILE_DIR
